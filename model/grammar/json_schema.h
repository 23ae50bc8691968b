// JSON Schema -> grammar (model/grammar/grammar.h): the JSON texts a schema
// accepts, as bytes. Every text the grammar generates validates against the
// schema (the grammar may be narrower: object properties come in the schema's
// order, each at most once, and no property outside `properties` is produced).
//
// Supported: type (one or a list), properties, required, additionalProperties
// (false, or a schema for an object without properties), enum, const,
// minLength/maxLength, minimum/maximum/exclusiveMinimum/exclusiveMaximum for
// integers, items with minItems/maxItems, nested objects, anyOf/oneOf
// (oneOf's branches are not checked for overlap), allOf with one member,
// $ref to #/$defs/... or #/definitions/... (recursion allowed), format for
// strings (date, time with Z, date-time, uuid), and {} / true
// for any JSON value. Annotations (title, description, default, examples,
// $schema, $id, $comment, strict) are ignored.
//
// Anything else is refused with InvalidArgument naming the schema path:
// "<path>.properties.a.pattern: the JSON Schema keyword 'pattern' is not
// supported". Lengths and counts above kMaxRepeat are refused likewise.
//
// Whitespace: at most kMaxJsonWhitespace of space, tab, newline or carriage
// return between tokens (enough for a newline and a two-space indent), so a
// model cannot pad forever: small models left free emit runs of newlines
// until max_tokens, and the output never closes.
//
// Thread-safety: free functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "model/grammar/grammar.h"

namespace kvserve {

inline constexpr int32_t kMaxJsonWhitespace = 3;

// Sets the body of `rule` to the JSON texts `schema` accepts. `path` prefixes
// error messages (e.g. "response_format.json_schema.schema").
// The schema is JSON text (parsed here, keeping the order of properties).
absl::Status BuildJsonSchemaGrammar(std::string_view schema_text, const std::string& path,
                                    GrammarBuilder* builder, RuleId rule);

// Any JSON object (response_format json_object).
void BuildJsonObjectGrammar(GrammarBuilder* builder, RuleId rule);

}  // namespace kvserve
