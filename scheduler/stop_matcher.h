// StopMatcher: finds a request's stop strings in its generated text, across
// token boundaries, and makes sure no part of a stop string is ever emitted.
//
// Text arrives in pieces (the detokenizer's output). The matcher releases the
// text that cannot be part of a stop string and holds back the longest tail
// that is still a prefix of one. When a stop string completes, the text
// before it is released and the rest (the stop string and anything after it)
// is dropped. At the end of a sequence that did not stop on a string, Flush()
// releases the held-back tail.
//
// Only generated text is searched (never the prompt), as in the OpenAI API.
// Held-back text always ends on a UTF-8 character boundary so the released
// pieces stay valid UTF-8.
//
// Thread-safety: value type owned by one sequence on the engine thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

class StopMatcher {
 public:
  // Empty stop strings are ignored (the engine rejects them at Submit).
  explicit StopMatcher(std::vector<std::string> stops);

  bool empty() const { return stops_.empty(); }

  // Feeds new text; appends what is safe to emit to *out. Returns true when a
  // stop string completed (the sequence must finish; later calls are
  // ignored).
  bool Add(std::string_view text, std::string* out);
  // Releases the held-back tail (end of sequence without a stop string).
  void Flush(std::string* out);

  bool stopped() const { return stopped_; }
  // Which stop string matched (index into the constructor's list), or -1.
  int matched() const { return matched_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
  int matched_ = -1;
};

}  // namespace kvserve
