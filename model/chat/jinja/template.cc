#include "model/chat/jinja/template.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "model/chat/jinja/ast.h"
#include "model/chat/jinja/builtins.h"
#include "model/chat/jinja/interpreter.h"

namespace kvserve {
namespace {

constexpr absl::string_view kRaisedPayload = "kvserve.jinja/raise_exception";

absl::Status ToStatus(const jinja::Error& e) {
  if (e.raised()) {
    absl::Status s = absl::InvalidArgumentError(e.what());
    s.SetPayload(kRaisedPayload, absl::Cord("1"));
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", e.line(), ": ", e.what()));
}

}  // namespace

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source) {
  JinjaTemplate t;
  try {
    t.program_ = jinja::Parse(source);
  } catch (const jinja::Error& e) {
    return ToStatus(e);
  }
  return t;
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("the render context must be an object");
  }
  try {
    jinja::Object globals;
    jinja::AddGlobals(&globals);
    for (const auto& [k, v] : context.items()) globals.Set(k, jinja::FromJson(v));
    jinja::Interpreter interpreter;
    return interpreter.Render(*program_, std::move(globals));
  } catch (const jinja::Error& e) {
    return ToStatus(e);
  }
}

bool JinjaTemplate::IsRaisedError(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

}  // namespace kvserve
