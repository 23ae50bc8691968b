#include "scheduler/detokenizer.h"

namespace kvserve {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence that starts with lead byte `c`, or 0 when `c`
// cannot start one. The allowed range of the second byte excludes overlong
// forms and surrogates (RFC 3629).
int SequenceLength(unsigned char c, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) {
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

size_t DecodeUtf8Prefix(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      // ASCII fast path.
      size_t j = i + 1;
      while (j < n && static_cast<unsigned char>(bytes[j]) < 0x80) ++j;
      out->append(bytes.data() + i, j - i);
      i = j;
      continue;
    }
    unsigned char lo, hi;
    const int len = SequenceLength(c, &lo, &hi);
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    // Check the continuation bytes that are present.
    int have = 1;
    bool bad = false;
    for (; have < len && i + have < n; ++have) {
      const auto d = static_cast<unsigned char>(bytes[i + have]);
      const unsigned char l = have == 1 ? lo : 0x80;
      const unsigned char h = have == 1 ? hi : 0xBF;
      if (d < l || d > h) {
        bad = true;
        break;
      }
    }
    if (bad) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    if (have < len) {
      // Valid so far but incomplete: wait for more, unless nothing follows.
      if (!final) return i;
      out->append(kReplacement);
      ++i;
      continue;
    }
    out->append(bytes.data() + i, len);
    i += len;
  }
  return i;
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  DecodeUtf8Prefix(bytes, /*final=*/true, &out);
  return out;
}

bool IsValidUtf8(std::string_view text) { return SanitizeUtf8(text) == text; }

void Detokenizer::Add(int32_t id, std::string* out) {
  std::string bytes = tokenizer_->TokenBytes(id, prev_);
  prev_ = id;
  if (pending_.empty()) {
    const size_t used = DecodeUtf8Prefix(bytes, /*final=*/false, out);
    pending_.assign(bytes, used, std::string::npos);
    return;
  }
  pending_ += bytes;
  const size_t used = DecodeUtf8Prefix(pending_, /*final=*/false, out);
  pending_.erase(0, used);
}

void Detokenizer::Finish(std::string* out) {
  DecodeUtf8Prefix(pending_, /*final=*/true, out);
  pending_.clear();
}

}  // namespace kvserve
