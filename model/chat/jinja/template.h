// JinjaTemplate: a parsed Jinja template, as Hugging Face checkpoints ship
// their chat_template (tokenizer_config.json), rendered by kvserve's own
// interpreter (model/jinja_*.cc) since Debian has no C++ Jinja library.
//
// The subset is what chat templates use, with the semantics of Python Jinja2
// under transformers' settings (trim_blocks, lstrip_blocks, loop controls,
// transformers' tojson, raise_exception and strftime_now):
//   - statements: if/elif/else, for (tuple targets, `if` filter, else, loop.*
//     incl. index/index0/revindex/first/last/length/previtem/nextitem/cycle),
//     break/continue, set (names, tuples, namespace attributes, blocks),
//     macro (defaults, varargs, kwargs), call blocks, filter blocks,
//     {% generation %}, comments, {%- -%} {{- -}} {%+ whitespace control;
//   - expressions: literals (strings with Python escapes, ints, floats,
//     lists, dicts, tuples), attribute/item access, slices ([::-1]), calls
//     with keyword arguments, arithmetic, ~, comparisons (chained), in /
//     not in, and/or/not, a if b else c, filters and tests (`is not none`);
//   - filters: tojson, trim, length/count, default/d, first, last, list,
//     join, items, dictsort, sort, unique, min, max, sum, map, select,
//     reject, selectattr, rejectattr, attr, upper, lower, title, capitalize,
//     replace, indent, int, float, abs, round, string, safe, escape,
//     reverse, wordcount;
//   - tests: defined, undefined, none, boolean, true, false, string, number,
//     integer, float, mapping, iterable, sequence, callable, lower, upper,
//     odd, even, divisibleby, eq/ne/lt/le/gt/ge, in, sameas;
//   - methods: str.strip/lstrip/rstrip/split/rsplit/startswith/endswith/
//     upper/lower/title/capitalize/replace/find/rfind/index/count/join/
//     splitlines/removeprefix/removesuffix/is*; dict.get/items/keys/values;
//   - globals: namespace, range, dict, raise_exception, strftime_now.
// Not supported: extends/include/import/block, recursive loops, {% raw %},
// autoescaping, the `%` string format operator.
//
// Where @huggingface/jinja (the JavaScript port used as the test reference,
// tests/model/chat/jinja/jinja_reference_test.cc) departs from Python Jinja2, kvserve
// follows Python: str.strip(chars) strips only `chars`; output before a
// break/continue is kept; a `set` in a loop body lasts one iteration;
// none/true print as None/True and lists/dicts/tuples as Python's repr;
// 'a' + 1 is an error; floats stay floats (1.0). None of these shows in the
// real templates tested. More lenient than Python: attributes of undefined
// are undefined rather than an error. Case mapping is per code point (no
// 'ß'.upper() == 'SS').
//
// Errors: a template that does not parse, or fails while rendering, gives
// InvalidArgument "chat template line N: ..."; raise_exception(msg) gives
// InvalidArgument with msg verbatim (IsRaisedError tells the two apart).
//
// Thread-safety: immutable after Parse; Render may run concurrently.
//
// Example:
//   auto t = JinjaTemplate::Parse("{% for m in messages %}{{ m.content }}{% endfor %}");
//   auto text = t->Render({{"messages", {{{"role", "user"}, {"content", "hi"}}}}});  // "hi"
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

namespace jinja {
struct Program;
}

class JinjaTemplate {
 public:
  static absl::StatusOr<JinjaTemplate> Parse(std::string_view source);

  // `context` (a JSON object) supplies the template's variables.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  // Whether a Render error came from the template's raise_exception().
  static bool IsRaisedError(const absl::Status& status);

 private:
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace kvserve
