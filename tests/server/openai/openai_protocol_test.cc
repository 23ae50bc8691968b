#include "server/openai/openai_protocol.h"

#include <catch2/catch.hpp>

#include "tests/server/openai/api_fixture.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

using Fixture = testing::ApiFixture;

std::vector<int32_t> Bytes(const std::string& s, bool bos = true) {
  std::vector<int32_t> ids;
  if (bos) ids.push_back(1);
  for (unsigned char c : s) ids.push_back(3 + c);
  return ids;
}

ApiRequest Parse(ApiKind kind, const std::string& body) {
  Fixture f;
  ApiRequest r;
  std::optional<ApiError> err = ParseApiRequest(kind, body, f.ctx(), &r);
  INFO(body);
  REQUIRE_FALSE(err.has_value());
  return r;
}

ApiError ParseError(ApiKind kind, const std::string& body) {
  Fixture f;
  ApiRequest r;
  std::optional<ApiError> err = ParseApiRequest(kind, body, f.ctx(), &r);
  INFO(body);
  REQUIRE(err.has_value());
  return *err;
}

TEST_CASE("Completion requests carry every OpenAI and extension field", "[server]") {
  ApiRequest r = Parse(ApiKind::kCompletion, R"({
    "model": "tiny", "prompt": "hi", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
    "n": 2, "stop": ["x", "yz"], "seed": 7, "logprobs": 3, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "user": "u1", "stream": true,
    "stream_options": {"include_usage": true}, "top_k": 40, "min_p": 0.05,
    "repetition_penalty": 1.1, "ignore_eos": true, "stop_token_ids": [2, 7],
    "cache_salt": "tenant-a", "kv_policy": "none", "priority": -3, "unknown_field": {"a": 1}})");
  const GenerateRequest& g = r.request;
  REQUIRE(r.kind == ApiKind::kCompletion);
  REQUIRE(r.model == "tiny");
  REQUIRE(r.stream);
  REQUIRE(r.include_usage);
  REQUIRE(r.user == "u1");
  REQUIRE(g.prompt_token_ids == Bytes("hi"));
  REQUIRE(g.max_tokens == 5);
  REQUIRE(g.n == 2);
  REQUIRE(g.stop == std::vector<std::string>{"x", "yz"});
  REQUIRE(g.stop_token_ids == std::vector<int32_t>{2, 7});
  REQUIRE(g.logprobs == 3);
  REQUIRE(g.ignore_eos);
  REQUIRE(g.cache_salt == "tenant-a");
  REQUIRE(g.kv_policy.policy == "none");
  REQUIRE(g.priority == -3);
  REQUIRE(g.sampling.temperature == 0.5f);
  REQUIRE(g.sampling.top_p == 0.9f);
  REQUIRE(g.sampling.top_k == 40);
  REQUIRE(g.sampling.min_p == 0.05f);
  REQUIRE(g.sampling.repetition_penalty == 1.1f);
  REQUIRE(g.sampling.presence_penalty == 0.5f);
  REQUIRE(g.sampling.frequency_penalty == -0.5f);
  REQUIRE(g.sampling.seed == 7u);
}

TEST_CASE("Completion prompts: text, one-element arrays and token ids", "[server]") {
  SECTION("defaults: 16 tokens, temperature 1, no logprobs") {
    ApiRequest r = Parse(ApiKind::kCompletion, R"({"prompt": ""})");
    REQUIRE(r.request.prompt_token_ids == std::vector<int32_t>{1});  // BOS only
    REQUIRE(r.request.max_tokens == 16);
    REQUIRE(r.request.sampling.temperature == 1.0f);
    REQUIRE(r.request.logprobs == -1);
    REQUIRE(r.request.n == 1);
    REQUIRE(r.model == "tiny");
    REQUIRE_FALSE(r.stream);
  }
  SECTION("an array of one string") {
    REQUIRE(Parse(ApiKind::kCompletion, R"({"prompt": ["ab"]})").request.prompt_token_ids ==
            Bytes("ab"));
  }
  SECTION("token ids, flat or nested once, are used as given") {
    REQUIRE(Parse(ApiKind::kCompletion, R"({"prompt": [1, 100, 101]})").request.prompt_token_ids ==
            std::vector<int32_t>{1, 100, 101});
    ApiRequest r = Parse(ApiKind::kCompletion, R"({"prompt": [[1, 107, 108]], "echo": true})");
    REQUIRE(r.request.prompt_token_ids == Bytes("hi"));
    REQUIRE(r.echo);
    REQUIRE(r.echo_text == "hi");
  }
  SECTION("null fields count as absent") {
    ApiRequest r =
        Parse(ApiKind::kCompletion,
              R"({"prompt": "a", "max_tokens": null, "temperature": null, "stop": null})");
    REQUIRE(r.request.max_tokens == 16);
    REQUIRE(r.request.stop.empty());
  }
}

TEST_CASE("Chat requests render messages through the template", "[server]") {
  ApiRequest r = Parse(ApiKind::kChat, R"({"model": "tiny", "messages": [
      {"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "max_completion_tokens": 4, "max_tokens": 9, "logprobs": true, "top_logprobs": 2})");
  REQUIRE(r.kind == ApiKind::kChat);
  REQUIRE(r.request.prompt_token_ids == Bytes("system: s\nuser: a\nb\nassistant:"));
  REQUIRE(r.request.max_tokens == 4);  // max_completion_tokens wins
  REQUIRE(r.request.logprobs == 2);
  SECTION("add_generation_prompt: false leaves the assistant's turn closed") {
    ApiRequest d = Parse(
        ApiKind::kChat,
        R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})");
    REQUIRE(d.request.prompt_token_ids == Bytes("user: x\n"));
  }
  SECTION("without max_tokens a chat may use the rest of the context") {
    ApiRequest d = Parse(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
    REQUIRE(d.request.prompt_token_ids.size() == 19);  // BOS + "user: x\nassistant:"
    REQUIRE(d.request.max_tokens == 64 - 19);
    REQUIRE(d.request.logprobs == -1);
  }
}

TEST_CASE("Chat requests bring tools, tool calls and template variables to a checkpoint's template",
          "[server]") {
  // Renders what the template receives, as JSON.
  absl::StatusOr<std::optional<HfChatTemplate>> hf = HfChatTemplate::FromConfig(
      R"({"bos_token": "<s>", "chat_template": "{{ bos_token }}{{ messages|tojson }}{{ tools|tojson }}{{ add_generation_prompt }}{{ flavor }}"})",
      "", "test");
  REQUIRE(hf.ok());
  Fixture f;
  f.chat_template = ChatTemplate::FromCheckpoint(**hf);
  const std::string body = R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "f", "arguments": "{\"y\": 1, \"x\": 2}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"y": {}, "x": {}}}}],
    "tool_choice": "auto", "add_generation_prompt": false, "chat_template_kwargs": {"flavor": "!"},
    "max_tokens": 1})";
  ApiContext ctx = f.ctx();
  ctx.max_model_len = 4096;
  ApiRequest r;
  std::optional<ApiError> err = ParseApiRequest(ApiKind::kChat, body, ctx, &r);
  INFO((err ? err->message : ""));
  REQUIRE_FALSE(err.has_value());
  // Member order as sent; no BOS added by the tokenizer (the template wrote <s>).
  REQUIRE(
      r.request.prompt_token_ids ==
      Bytes(
          "<s>[{\"role\": \"user\", \"content\": \"a\\nb\"}, {\"role\": \"assistant\", "
          "\"content\": \"\", "
          "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
          "\"f\", "
          "\"arguments\": {\"y\": 1, \"x\": 2}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
          "\"content\": \"ok\"}][{\"type\": \"function\", \"function\": {\"name\": \"f\", "
          "\"parameters\": "
          "{\"y\": {}, \"x\": {}}}}]False!",
          /*bos=*/false));

  SECTION("wrong types name the field") {
    std::optional<ApiError> e = ParseApiRequest(
        ApiKind::kChat, R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", f.ctx(), &r);
    REQUIRE(e->param == "messages[0].tool_calls");
    REQUIRE(e->message == "'messages[0].tool_calls' must be an array of tool calls, got an object");
    e = ParseApiRequest(ApiKind::kChat, R"({"messages": [{"role": "user"}], "tools": "f"})",
                        f.ctx(), &r);
    REQUIRE(e->param == "tools");
    e = ParseApiRequest(ApiKind::kChat,
                        R"({"messages": [{"role": "user"}], "chat_template_kwargs": []})", f.ctx(),
                        &r);
    REQUIRE(e->param == "chat_template_kwargs");
  }
  SECTION("a template's refusal is a 400 naming messages") {
    f.chat_template = ChatTemplate::FromCheckpoint(**HfChatTemplate::FromConfig(
        R"({"chat_template": "{{ raise_exception('Only user turns, please') }}"})", "", "test"));
    std::optional<ApiError> e = ParseApiRequest(
        ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})", f.ctx(), &r);
    REQUIRE(e->http_status == 400);
    REQUIRE(e->param == "messages");
    REQUIRE(
        e->message ==
        "'messages' cannot be rendered with the model's chat template: Only user turns, please");
  }
}

TEST_CASE("Bad requests name the field, OpenAI style", "[server]") {
  struct Case {
    ApiKind kind;
    const char* body;
    const char* param;
    const char* message;
  };
  const ApiKind C = ApiKind::kCompletion, H = ApiKind::kChat;
  const Case cases[] = {
      {C, R"({"prompt": "a", "temperature": -1})", "temperature",
       "temperature must be >= 0, got -1"},
      {C, R"({"prompt": "a", "temperature": "hot"})", "temperature",
       "'temperature' must be a number, got a string"},
      {C, R"({"prompt": "a", "top_p": 0})", "top_p", "top_p must be in (0, 1], got 0"},
      {C, R"({"prompt": "a", "top_p": 1.5})", "top_p", "top_p must be in (0, 1], got 1.5"},
      {C, R"({"prompt": "a", "max_tokens": 0})", "max_tokens",
       "'max_tokens' must be in [1, 2^31), got 0"},
      {C, R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens",
       "'max_tokens' must be an integer, got a number"},
      {C, R"({"prompt": "a", "n": 0})", "n", "n must be in [1, 64], got 0"},
      {C, R"({"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13",
          "14","15","16","17"]})",
       "stop", "stop has 17 strings, at most 16 are allowed"},
      {C, R"({"prompt": "a", "stop": 5})", "stop",
       "'stop' must be a string or an array of strings, got an integer"},
      {C, R"({"prompt": "a", "stop": ["x", 1]})", "stop",
       "'stop' entries must be strings, got an integer"},
      {C, R"({"prompt": "a", "logprobs": 21})", "logprobs",
       "logprobs must be -1 (off) or in [0, 20], got 21"},
      {H, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
          "top_logprobs": 21})",
       "top_logprobs", "logprobs must be -1 (off) or in [0, 20], got 21"},
      {C, R"({"prompt": "a", "presence_penalty": 3})", "presence_penalty",
       "presence_penalty must be in [-2, 2], got 3"},
      {C, R"({"prompt": "a", "top_k": -2})", "top_k",
       "top_k must be -1, 0 (off) or positive, got -2"},
      {C, R"({"prompt": "a", "stream": "yes"})", "stream",
       "'stream' must be a boolean, got a string"},
      {C, R"({"prompt": "a", "stop_token_ids": [600]})", "stop_token_ids",
       "stop_token_ids[0] = 600 is outside the vocabulary [0, 512)"},
      {C, R"({"prompt": "a", "logit_bias": {"5": 1}})", "logit_bias",
       "'logit_bias' is not supported"},
      {C, R"({"max_tokens": 3})", "prompt", "'prompt' is required"},
      {C, R"({"prompt": 3})", "prompt",
       "'prompt' must be a string, an array of one string or an array of token ids, got an "
       "integer"},
      {C, R"({"prompt": []})", "prompt", "'prompt' must not be empty"},
      {C, R"({"prompt": [1, -4]})", "prompt",
       "prompt_token_ids[1] = -4 is outside the vocabulary [0, 512)"},
      {C, R"({"prompt": ["a", "b"]})", "prompt",
       "batched prompts are not supported: send one prompt per request"},
      {C, R"({"prompt": "a", "max_tokens": 63})", "max_tokens",
       "This model's maximum context length is 64 tokens, but 65 were requested (2 in the prompt, "
       "63 for the completion)"},
      {C, R"({"prompt": "0123456789012345678901234567890123456789012345678901234567890123"})",
       "prompt",
       "This model's maximum context length is 64 tokens, and the prompt has 65 tokens, leaving no "
       "room for the completion"},
      {H, R"({"messages": "hi"})", "messages",
       "'messages' must be an array of messages, got a string"},
      {H, R"({"messages": []})", "messages", "'messages' must not be empty"},
      {H, R"({"messages": [{"content": "x"}]})", "messages[0].role",
       "'messages[0].role' must be a non-empty string"},
      {H, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "'messages[0].content' must be a string or an array of content parts, got an integer"},
      {H, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
       "'top_logprobs' requires 'logprobs': true"},
      {H, R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1})",
       "max_completion_tokens", "'max_completion_tokens' must be in [1, 2^31), got -1"},
  };
  for (const Case& c : cases) {
    ApiError e = ParseError(c.kind, c.body);
    INFO(c.body);
    REQUIRE(e.http_status == 400);
    REQUIRE(e.param == c.param);
    REQUIRE(e.message == c.message);
    json body = json::parse(e.Body());
    REQUIRE(body["error"]["type"] == "invalid_request_error");
    REQUIRE(body["error"]["param"] == c.param);
    REQUIRE(body["error"]["message"] == c.message);
  }
  SECTION("context errors carry OpenAI's code") {
    REQUIRE(ParseError(C, R"({"prompt": "a", "max_tokens": 63})").code ==
            "context_length_exceeded");
  }
  SECTION("invalid JSON has no param") {
    ApiError e = ParseError(C, "{\"prompt\": ");
    REQUIRE(e.http_status == 400);
    REQUIRE(e.message.rfind("invalid JSON body: ", 0) == 0);
    REQUIRE(json::parse(e.Body())["error"]["param"].is_null());
    REQUIRE(ParseError(C, "[1, 2]").message == "the request body must be a JSON object");
  }
  SECTION("another model is 404 model_not_found") {
    ApiError e = ParseError(C, R"({"model": "gpt-4", "prompt": "a"})");
    REQUIRE(e.http_status == 404);
    REQUIRE(e.param == "model");
    REQUIRE(e.code == "model_not_found");
  }
}

TEST_CASE("kv_policy is a policy name or an object, and bad fields are named", "[server]") {
  KvPolicyOverride k = Parse(ApiKind::kCompletion, R"({"prompt": "a", "kv_policy": {
      "policy": "h2o", "budget": 128, "recent_tokens": 32}})")
                           .request.kv_policy;
  REQUIRE(k.policy == "h2o");
  REQUIRE(k.budget == 128);
  REQUIRE(k.sink_tokens == -1);
  REQUIRE(k.recent_tokens == 32);
  k = Parse(ApiKind::kChat,
            R"({"messages": [{"role": "user", "content": "a"}], "kv_policy": "streaming"})")
          .request.kv_policy;
  REQUIRE(k.policy == "streaming");
  REQUIRE(k.budget == 0);
  REQUIRE(Parse(ApiKind::kCompletion, R"({"prompt": "a", "kv_policy": {"sink_tokens": 0}})")
              .request.kv_policy.sink_tokens == 0);

  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": "a", "kv_policy": 5})", "kv_policy",
       "'kv_policy' must be an object or a policy name, got an integer"},
      {R"({"prompt": "a", "kv_policy": {"policy": 1}})", "policy",
       "'policy' must be a string, got an integer"},
      {R"({"prompt": "a", "kv_policy": {"budget": "big"}})", "kv_policy.budget",
       "'kv_policy.budget' must be an integer"},
      {R"({"prompt": "a", "kv_policy": {"budget": 1}})", "kv_policy.budget",
       "'kv_policy.budget' must be an integer >= 2, got 1"},
      {R"({"prompt": "a", "kv_policy": {"sink_tokens": -1}})", "kv_policy.sink_tokens",
       "'kv_policy.sink_tokens' must be an integer >= 0, got -1"},
      {R"({"prompt": "a", "kv_policy": {"window": 8}})", "kv_policy.window",
       "'kv_policy' has no field 'window' (policy, budget, sink_tokens, recent_tokens)"},
  };
  for (const Case& c : cases) {
    const ApiError e = ParseError(ApiKind::kCompletion, c.body);
    INFO(c.body);
    REQUIRE(e.http_status == 400);
    REQUIRE(e.param == c.param);
    REQUIRE(e.message == c.message);
  }
  // streaming and sliding_window may run past max_model_len (64 here); the
  // others may not.
  REQUIRE(
      Parse(ApiKind::kCompletion, R"({"prompt": "a", "max_tokens": 100, "kv_policy": "streaming"})")
          .request.max_tokens == 100);
  const ApiError bounded =
      ParseError(ApiKind::kCompletion, R"({"prompt": "a", "max_tokens": 100, "kv_policy": "h2o"})");
  REQUIRE(bounded.code == "context_length_exceeded");
  // The engine's own checks come back naming the kv_policy field.
  const ApiError e = ApiErrorFromStatus(
      FieldError("kv_policy.budget", "kv_policy.budget must be >= 2 for h2o, got 1"), "prompt");
  REQUIRE(e.http_status == 400);
  REQUIRE(e.param == "kv_policy.budget");
}

TEST_CASE("Engine statuses map to HTTP codes and params", "[server]") {
  // The field is the status' payload, not a guess from the message.
  ApiError e = ApiErrorFromStatus(FieldError("top_p", "top_p must be in (0, 1], got 2"), "prompt");
  REQUIRE(e.http_status == 400);
  REQUIRE(e.param == "top_p");
  REQUIRE(ApiErrorFromStatus(absl::InvalidArgumentError("top_p is wrong"), "prompt").param == "");
  e = ApiErrorFromStatus(FieldError("prompt_token_ids", "too long"), "messages");
  REQUIRE(e.param == "messages");
  e = ApiErrorFromStatus(absl::InvalidArgumentError("something odd"), "prompt");
  REQUIRE(e.param.empty());
  e = ApiErrorFromStatus(absl::ResourceExhaustedError("queue full (4096 waiting)"), "prompt");
  REQUIRE(e.http_status == 429);
  REQUIRE(e.code == "queue_full");
  REQUIRE(ApiErrorFromStatus(absl::UnavailableError("draining"), "prompt").http_status == 503);
  REQUIRE(ApiErrorFromStatus(absl::InternalError("boom"), "prompt").http_status == 500);
}

GenerateOutput Out(int index, std::string text, std::vector<int32_t> ids,
                   FinishReason finish = FinishReason::kNone, bool last = false) {
  GenerateOutput o;
  o.index = index;
  o.text = std::move(text);
  o.token_ids = std::move(ids);
  o.finish_reason = finish;
  o.request_finished = last;
  if (last) o.usage = Usage{3, 1, 4};
  return o;
}

TEST_CASE("Whole responses follow the OpenAI objects", "[server]") {
  Fixture f;
  SECTION("completion with logprobs") {
    ApiRequest r = Parse(ApiKind::kCompletion, R"({"prompt": "hi", "logprobs": 1})");
    ResponseAccumulator acc(r, f.tokenizer.get());
    GenerateOutput a = Out(0, "ab", {100, 101});
    a.logprobs = {{100, -0.5f, {{100, -0.5f}}}, {101, -1.0f, {{101, -1.0f}}}};
    GenerateOutput b = Out(0, "c", {102}, FinishReason::kLength, true);
    b.logprobs = {{102, -std::numeric_limits<float>::infinity(), {}}};
    acc.Add(a);
    acc.Add(b);
    json j = acc.ToJson("cmpl-1", 1700000000, "tiny");
    REQUIRE(j["id"] == "cmpl-1");
    REQUIRE(j["object"] == "text_completion");
    REQUIRE(j["created"] == 1700000000);
    REQUIRE(j["model"] == "tiny");
    REQUIRE(j["choices"].size() == 1);
    REQUIRE(j["choices"][0]["index"] == 0);
    REQUIRE(j["choices"][0]["text"] == "abc");
    REQUIRE(j["choices"][0]["finish_reason"] == "length");
    json lp = j["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"] == json::array({"a", "b", "c"}));
    REQUIRE(lp["token_logprobs"] == json::array({-0.5, -1.0, -9999.0}));
    REQUIRE(lp["top_logprobs"][0] == json{{"a", -0.5}});
    REQUIRE(lp["top_logprobs"][2].is_null());
    REQUIRE(lp["text_offset"] == json::array({0, 1, 2}));
    REQUIRE(j["usage"] == json{{"prompt_tokens", 3},
                               {"completion_tokens", 4},
                               {"total_tokens", 7},
                               {"prompt_tokens_details", {{"cached_tokens", 1}}}});
  }
  SECTION("chat with two samples") {
    ApiRequest r =
        Parse(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2})");
    ResponseAccumulator acc(r, f.tokenizer.get());
    acc.Add(Out(1, "B", {69}, FinishReason::kStop));
    acc.Add(Out(0, "A", {68}, FinishReason::kStop, true));
    json j = acc.ToJson("chatcmpl-1", 5, "tiny");
    REQUIRE(j["object"] == "chat.completion");
    REQUIRE(j["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "A"}});
    REQUIRE(j["choices"][1]["message"]["content"] == "B");
    REQUIRE(j["choices"][1]["finish_reason"] == "stop");
    REQUIRE(j["choices"][0]["logprobs"].is_null());
    REQUIRE(acc.error().empty());
  }
  SECTION("an error finish is reported") {
    ApiRequest r = Parse(ApiKind::kCompletion, R"({"prompt": "hi"})");
    ResponseAccumulator acc(r, f.tokenizer.get());
    GenerateOutput o = Out(0, "", {}, FinishReason::kError, true);
    o.error = "model failed";
    acc.Add(o);
    REQUIRE(acc.error() == "model failed");
  }
}

std::vector<json> Events(const std::string& sse, bool* done) {
  std::vector<json> out;
  *done = false;
  size_t pos = 0;
  while (pos < sse.size()) {
    size_t end = sse.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    std::string line = sse.substr(pos, end - pos);
    REQUIRE(line.rfind("data: ", 0) == 0);
    std::string data = line.substr(6);
    if (data == "[DONE]") {
      REQUIRE(end + 2 == sse.size());
      *done = true;
    } else {
      out.push_back(json::parse(data));
    }
    pos = end + 2;
  }
  return out;
}

TEST_CASE("Streams are SSE chunks ending with [DONE]", "[server]") {
  Fixture f;
  SECTION("completions: text deltas, finish reason on the last, usage chunk") {
    ApiRequest r =
        Parse(ApiKind::kCompletion,
              R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": true}})");
    StreamFormatter s(r, f.tokenizer.get(), "cmpl-9", 42, "tiny");
    std::string sse = s.Start();
    sse += s.Add(Out(0, "Once", {1}));
    sse += s.Add(Out(0, "", {2}));  // held back (partial UTF-8): nothing to send
    sse += s.Add(Out(0, " upon", {3}, FinishReason::kStop, true));
    sse += s.Finish();
    bool done;
    std::vector<json> ev = Events(sse, &done);
    REQUIRE(done);
    REQUIRE(ev.size() == 3);
    REQUIRE(ev[0]["object"] == "text_completion");
    REQUIRE(ev[0]["id"] == "cmpl-9");
    REQUIRE(ev[0]["choices"][0]["text"] == "Once");
    REQUIRE(ev[0]["choices"][0]["finish_reason"].is_null());
    REQUIRE(ev[0]["usage"].is_null());
    REQUIRE(ev[1]["choices"][0]["text"] == " upon");
    REQUIRE(ev[1]["choices"][0]["finish_reason"] == "stop");
    REQUIRE(ev[2]["choices"].empty());
    REQUIRE(ev[2]["usage"]["total_tokens"] == 7);
  }
  SECTION("chat: a role delta first, content deltas, then an empty delta with the reason") {
    ApiRequest r = Parse(ApiKind::kChat,
                         R"({"messages": [{"role": "user", "content": "x"}], "stream": true})");
    StreamFormatter s(r, f.tokenizer.get(), "chatcmpl-9", 42, "tiny");
    std::string sse =
        s.Start() + s.Add(Out(0, "Hi", {1}, FinishReason::kLength, true)) + s.Finish();
    bool done;
    std::vector<json> ev = Events(sse, &done);
    REQUIRE(done);
    REQUIRE(ev.size() == 3);
    REQUIRE(ev[0]["object"] == "chat.completion.chunk");
    REQUIRE(ev[0]["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
    REQUIRE(ev[1]["choices"][0]["delta"] == json{{"content", "Hi"}});
    REQUIRE(ev[1]["choices"][0]["finish_reason"].is_null());
    REQUIRE(ev[2]["choices"][0]["delta"] == json::object());
    REQUIRE(ev[2]["choices"][0]["finish_reason"] == "length");
    REQUIRE_FALSE(ev[2].contains("usage"));
  }
  SECTION("an engine error becomes an error event") {
    ApiRequest r = Parse(ApiKind::kCompletion, R"({"prompt": "hi", "stream": true})");
    StreamFormatter s(r, f.tokenizer.get(), "cmpl-9", 42, "tiny");
    GenerateOutput o = Out(0, "", {}, FinishReason::kError, true);
    o.error = "boom";
    bool done;
    std::vector<json> ev = Events(s.Add(o) + s.Finish(), &done);
    REQUIRE(ev.size() == 1);
    REQUIRE(ev[0]["error"]["message"] == "boom");
    REQUIRE(ev[0]["error"]["type"] == "server_error");
  }
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("The checkpoint's sampling defaults apply where a request sets nothing", "[server]") {
  Fixture f;
  ApiContext ctx = f.ctx();
  ctx.default_sampling.temperature = 0.6f;  // as generation_config.json recommends
  ctx.default_sampling.top_p = 0.9f;
  ApiRequest r;
  REQUIRE_FALSE(ParseApiRequest(ApiKind::kCompletion, R"({"prompt": "a"})", ctx, &r).has_value());
  REQUIRE(r.request.sampling.temperature == 0.6f);
  REQUIRE(r.request.sampling.top_p == 0.9f);
  REQUIRE(r.request.sampling.top_k == 0);
  ApiRequest s;
  REQUIRE_FALSE(
      ParseApiRequest(ApiKind::kCompletion, R"({"prompt": "a", "temperature": 0})", ctx, &s)
          .has_value());
  REQUIRE(s.request.sampling.temperature == 0.0f);
  REQUIRE(s.request.sampling.top_p == 0.9f);
}

// Counts Encode calls: the budget must refuse before tokenizing.
class CountingTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return inner_->vocab_size(); }
  int32_t bos_id() const override { return inner_->bos_id(); }
  int32_t eos_id() const override { return inner_->eos_id(); }
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override {
    ++encodes;
    return inner_->Encode(text, add_bos);
  }
  std::string TokenBytes(int32_t id, int32_t prev) const override {
    return inner_->TokenBytes(id, prev);
  }
  std::string IdToPiece(int32_t id) const override { return inner_->IdToPiece(id); }
  mutable int encodes = 0;

 private:
  std::unique_ptr<Tokenizer> inner_ = Tokenizer::ByteLevel(512);
};

TEST_CASE("The cost budget refuses before tokenizing, naming the field", "[server]") {
  CountingTokenizer tok;
  ChatTemplate chat_template;
  ApiContext ctx;
  ctx.tokenizer = &tok;
  ctx.chat_template = &chat_template;
  ctx.model_name = "tiny";
  ctx.max_model_len = 64;  // derived: 64 prompt tokens, 2048 prompt bytes, 4096 generated
  struct Case {
    ApiKind kind;
    json body;
    std::string param;
    std::string message;
  };
  const std::string big(3000, 'a');
  json many_stops = json::array();
  for (int i = 0; i < 100000; ++i) many_stops.push_back("s");
  const std::vector<Case> cases = {
      {ApiKind::kCompletion,
       {{"prompt", big}},
       "prompt",
       "prompt has 3000 bytes, at most 2048 are allowed (limits.max_prompt_bytes)"},
      {ApiKind::kChat,
       {{"messages",
         {{{"role", "user"}, {"content", big.substr(0, 1500)}},
          {{"role", "user"}, {"content", big.substr(0, 1500)}}}}},
       "messages",
       "messages has 3000 bytes, at most 2048 are allowed (limits.max_prompt_bytes)"},
      {ApiKind::kCompletion,
       {{"prompt", big}, {"stop", many_stops}},
       "stop",
       "stop has 100000 strings, at most 16 are allowed"},
      {ApiKind::kCompletion,
       {{"prompt", "a"}, {"n", 64}, {"max_tokens", 100}, {"kv_policy", "streaming"}},
       "max_tokens",
       "n x max_tokens = 64 x 100 = 6400 tokens, at most 4096 are allowed "
       "(limits.max_generated_tokens)"},
      {ApiKind::kCompletion,
       {{"prompt", "a"}, {"logprobs", 21}},
       "logprobs",
       "logprobs must be -1 (off) or in [0, 20], got 21"},
  };
  for (const Case& c : cases) {
    ApiRequest r;
    std::optional<ApiError> e = ParseApiRequest(c.kind, c.body.dump(), ctx, &r);
    INFO(c.message);
    REQUIRE(e.has_value());
    REQUIRE(e->http_status == 400);
    REQUIRE(e->param == c.param);
    REQUIRE(e->message == c.message);
  }
  REQUIRE(tok.encodes == 0);

  // Prompt tokens: counted once tokenized (text) or as sent (ids).
  ctx.limits.max_prompt_tokens = 10;
  ApiRequest r;
  std::optional<ApiError> e =
      ParseApiRequest(ApiKind::kCompletion, R"({"prompt": "hello world!"})", ctx, &r);
  REQUIRE(e.has_value());
  REQUIRE(e->param == "prompt");
  REQUIRE(e->message == "prompt has 13 tokens, at most 10 are allowed (limits.max_prompt_tokens)");
  REQUIRE(tok.encodes == 1);
  e = ParseApiRequest(ApiKind::kCompletion, R"({"prompt": [5,5,5,5,5,5,5,5,5,5,5]})", ctx, &r);
  REQUIRE(e.has_value());
  REQUIRE(e->message == "prompt has 11 tokens, at most 10 are allowed (limits.max_prompt_tokens)");
  // At the limit all is well.
  e = ParseApiRequest(ApiKind::kCompletion, R"({"prompt": "hello wor", "max_tokens": 4})", ctx, &r);
  REQUIRE_FALSE(e.has_value());
  REQUIRE(r.request.prompt_token_ids.size() == 10);
}

// Every field a request body may carry, at the top level and nested, holding
// a number no double can hold: a 400 naming the field, never an exception
// (an out_of_range escaping the parser once ended the daemon).
TEST_CASE("Numbers beyond a double in any field are a 400 naming the field", "[server]") {
  const char* fields[] = {"model",
                          "prompt",
                          "messages",
                          "max_tokens",
                          "max_completion_tokens",
                          "temperature",
                          "top_p",
                          "top_k",
                          "min_p",
                          "n",
                          "best_of",
                          "seed",
                          "stop",
                          "stop_token_ids",
                          "stream",
                          "stream_options",
                          "logprobs",
                          "top_logprobs",
                          "echo",
                          "suffix",
                          "user",
                          "presence_penalty",
                          "frequency_penalty",
                          "repetition_penalty",
                          "logit_bias",
                          "ignore_eos",
                          "priority",
                          "cache_salt",
                          "kv_policy",
                          "tools",
                          "tool_choice",
                          "chat_template_kwargs",
                          "add_generation_prompt",
                          "response_format",
                          "an_unknown_field"};
  const char* numbers[] = {"1e309", "-1e999", "1E+400", "123e456789"};
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    const std::string base = kind == ApiKind::kChat
                                 ? R"("messages": [{"role": "user", "content": "x"}])"
                                 : R"("prompt": "a")";
    for (const char* field : fields) {
      for (const char* number : numbers) {
        struct Shape {
          std::string value;
          std::string path;
        };
        const std::string f = field;
        const Shape shapes[] = {
            {number, f},
            {std::string("[1, ") + number + "]", f + "[1]"},
            {std::string(R"({"inner": [{"deeper": )") + number + "}]}", f + ".inner[0].deeper"},
        };
        for (const Shape& shape : shapes) {
          // The field after the base so it overrides nothing it needs.
          const std::string body = "{" + base + ", \"" + f + "\": " + shape.value + "}";
          ApiError e = ParseError(kind, body);
          INFO(body);
          REQUIRE(e.http_status == 400);
          REQUIRE(e.param == shape.path);
          REQUIRE(e.message ==
                  "'" + shape.path + "' is a number out of range (beyond a double's +-1.8e308)");
          REQUIRE(json::parse(e.Body())["error"]["param"] == shape.path);
        }
      }
    }
  }
  // Inside a message and inside a tool's schema.
  REQUIRE(ParseError(ApiKind::kChat,
                     R"({"messages": [{"role": "user", "content": "x", "weight": 1e309}]})")
              .param == "messages[0].weight");
  REQUIRE(ParseError(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"x": {"maximum": -1e999}}}}}]})")
              .param == "tools[0].function.parameters.properties.x.maximum");
}

}  // namespace
}  // namespace kvserve
