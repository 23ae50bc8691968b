#include "scheduler/stop_matcher.h"

#include <algorithm>

namespace kvserve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

bool StopMatcher::Add(std::string_view text, std::string* out) {
  if (stopped_) return true;
  if (stops_.empty()) {
    out->append(text);
    return false;
  }
  held_.append(text);
  // Every occurrence must start inside held_: text before it was released
  // only because no stop string could start there.
  size_t best = std::string::npos;
  int best_index = -1;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const size_t pos = held_.find(stops_[k]);
    if (pos < best) {
      best = pos;
      best_index = static_cast<int>(k);
    }
  }
  if (best != std::string::npos) {
    out->append(held_, 0, best);
    held_.clear();
    stopped_ = true;
    matched_ = best_index;
    return true;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  const size_t limit = std::min(held_.size(), max_len_ - 1);
  for (size_t len = limit; len > 0; --len) {
    std::string_view tail(held_.data() + held_.size() - len, len);
    bool is_prefix = false;
    for (const std::string& s : stops_) {
      if (s.size() > len && std::string_view(s).substr(0, len) == tail) {
        is_prefix = true;
        break;
      }
    }
    if (is_prefix) {
      keep = len;
      break;
    }
  }
  size_t release = held_.size() - keep;
  // Never split a UTF-8 character: back up over continuation bytes.
  while (release > 0 && release < held_.size() &&
         (static_cast<unsigned char>(held_[release]) & 0xC0) == 0x80) {
    --release;
  }
  out->append(held_, 0, release);
  held_.erase(0, release);
  return false;
}

void StopMatcher::Flush(std::string* out) {
  if (!stopped_) out->append(held_);
  held_.clear();
}

}  // namespace kvserve
