// Fuzzes the OpenAI request parser (server/openai/openai_protocol.h): bodies of
// /v1/completions and /v1/chat/completions, tokenized with the stories260K
// SentencePiece tokenizer and rendered with a pattern template or a Jinja
// checkpoint template.
//
// Input: the first byte picks the API (bit 0) and the chat template (bits
// 1-2); the rest is the body. A parse that succeeds must hand the engine a
// request it can take: prompt ids in the vocabulary, within max_model_len.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fuzz_util.h"
#include "model/chat/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "server/openai/openai_protocol.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

constexpr char kJinjaConfig[] = R"({"bos_token": "<s>", "eos_token": "</s>", "chat_template":
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] | trim }}<</SYS>>{% elif m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% else %}[{{ m['role'] | upper }}] {{ m['content'] }}{% endif %}{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"})";

struct State {
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplate templates[4];
};

State* Init() {
  auto* s = new State();
  auto tok = Tokenizer::LoadSentencePiece(testing::Stories260kTokenizer());
  FUZZ_CHECK(tok.ok());
  s->tokenizer = *std::move(tok);
  s->templates[0] = ChatTemplate();
  s->templates[1] = *ChatTemplate::Builtin("chatml");
  s->templates[2] = *ChatTemplate::Builtin("llama3");
  auto hf = HfChatTemplate::FromConfig(kJinjaConfig, "", "fuzz");
  FUZZ_CHECK(hf.ok() && hf->has_value());
  s->templates[3] = ChatTemplate::FromCheckpoint(**std::move(hf));
  return s;
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  static State* state = Init();
  if (size == 0) return 0;
  const ApiKind kind = (data[0] & 1) ? ApiKind::kChat : ApiKind::kCompletion;
  ApiContext ctx;
  ctx.tokenizer = state->tokenizer.get();
  ctx.chat_template = &state->templates[(data[0] >> 1) & 3];
  ctx.model_name = "stories260K";
  ctx.max_model_len = 512;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  ApiRequest req;
  std::optional<ApiError> err = ParseApiRequest(kind, body, ctx, &req);
  if (err.has_value()) {
    FUZZ_CHECK(err->http_status >= 400 && err->http_status < 500);
    FUZZ_CHECK(!err->message.empty());
    (void)err->Body();
    return 0;
  }
  const GenerateRequest& g = req.request;
  FUZZ_CHECK(!g.prompt_token_ids.empty());
  const bool unbounded =
      g.kv_policy.policy == "streaming" || g.kv_policy.policy == "sliding_window";
  FUZZ_CHECK(g.max_tokens >= 1);
  FUZZ_CHECK(unbounded ||
             static_cast<int64_t>(g.prompt_token_ids.size()) + g.max_tokens <= ctx.max_model_len);
  for (int32_t id : g.prompt_token_ids) {
    FUZZ_CHECK(id >= 0 && id < ctx.tokenizer->vocab_size());
  }
  FUZZ_CHECK(g.n >= 1);
  return 0;
}
