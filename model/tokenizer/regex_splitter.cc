#include "model/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// Unicode White_Space (PropList.txt), as a character-class body.
constexpr char kWhiteSpaceBody[] =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Per-thread match state: match data for the whole match only, and a JIT
// stack big enough for long runs of whitespace or punctuation.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

size_t Utf8Advance(std::string_view s, size_t i) {
  ++i;
  while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  return i;
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string OnigurumaWhitespace(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceBody;
        } else {
          absl::StrAppend(&out, "[", kWhiteSpaceBody, "]");
        }
      } else if (e == 'S' && !in_class) {
        absl::StrAppend(&out, "[^", kWhiteSpaceBody, "]");
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // A POSIX class [:name:] inside a class.
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i + 1, end + 1 - i));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

absl::StatusOr<RegexSplitter> RegexSplitter::Compile(const std::string& pattern, bool literal,
                                                     Behavior behavior, const std::string& field) {
  const std::string source = literal ? pattern : OnigurumaWhitespace(pattern);
  // PCRE2_LITERAL does not combine with PCRE2_UCP (nor need it).
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options,
                             &error, &offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(field, ": regex ", pattern,
                                                   " does not compile at offset ", offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // Without JIT (a platform PCRE2 has none for) matching falls back to the
  // interpreter: slower, same results.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return RegexSplitter(std::move(code), behavior);
}

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* out) const {
  ThreadMatchState& st = MatchState();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, 0, st.data, st.context);
    // rc == 0: matched, with more groups than the ovector holds (only the
    // whole match is wanted). rc < 0: no further match, or a limit hit: the
    // rest is a gap.
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      // An empty match splits nothing; look again one character on.
      pos = Utf8Advance(text, begin);
      continue;
    }
    if (begin > gap_start) out->push_back(text.substr(gap_start, begin - gap_start));
    if (behavior_ == Behavior::kIsolated) out->push_back(text.substr(begin, end - begin));
    gap_start = pos = end;
  }
  if (gap_start < text.size()) out->push_back(text.substr(gap_start));
}

}  // namespace kvserve
