// Structured-output fields of an OpenAI request -> GrammarSpec
// (model/grammar/grammar_spec.h), which the engine compiles at Submit.
//
//   response_format: {"type": "text"} (none), {"type": "json_object"} (any
//     JSON object), {"type": "json_schema", "json_schema": {"name", "schema",
//     "strict"}} (the schema; errors inside it name
//     response_format.json_schema.schema.<path>);
//   vLLM's guided_json (a schema object or its JSON text), guided_regex,
//   guided_choice (strings), guided_grammar (refused: GBNF/EBNF is not
//   supported yet), and the newer structured_outputs {"json", "regex",
//   "choice", "grammar", "json_object"}.
// At most one of them may constrain a request; a second is a 400 naming it.
// Schemas keep their member order (the raw body is parsed again ordered), so
// properties are generated in the order the client wrote them.
//
// Thread-safety: free function.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/grammar/grammar_spec.h"
#include "server/openai/openai_protocol.h"

namespace kvserve {

// body: the parsed request; raw_body: its text. Leaves *out empty when the
// request asks for no structure.
std::optional<ApiError> ParseStructuredOutput(const nlohmann::json& body,
                                              const std::string& raw_body, GrammarSpec* out);

}  // namespace kvserve
