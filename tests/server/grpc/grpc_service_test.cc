#include "server/grpc/grpc_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "proto/kvserve.grpc.pb.h"
#include "server/admission/client_limiter.h"
#include "spdlog/spdlog.h"
#include "tests/grpc_health.h"
#include "tests/server/fake_engine.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;

struct GrpcFixture {
  explicit GrpcFixture(bool ready = true, std::string api_key = "",
                       GrpcService::Options options = {},
                       std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : state(&metrics, ChatTemplate(), std::move(api_key)), service(&state, std::move(options)) {
    spdlog::set_level(spdlog::level::warn);
    REQUIRE(service.Start("127.0.0.1", 0).ok());
    channel = grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(service.port()),
        credentials != nullptr ? credentials : grpc::InsecureChannelCredentials());
    stub = v1::Generation::NewStub(channel);
    if (ready) MakeReady();
  }
  ~GrpcFixture() { service.Shutdown(absl::Now()); }
  void MakeReady() {
    ServedModelInfo info;
    info.name = "fake";
    info.max_model_len = 256;
    info.kv_dtype = "fp32";
    info.block_size = 16;
    state.SetReady(&engine, info);
    service.SetServing(true);
  }
  // 1 SERVING, 2 NOT_SERVING, -1 on error.
  int Health(const std::string& name) { return testing::GrpcHealthCheck(channel, name); }

  ServerMetrics metrics;
  ServingState state;
  testing::FakeEngine engine;
  GrpcService service;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
};

// The kvserve-field trailer of a finished call ("" when absent).
std::string FieldTrailer(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find("kvserve-field");
  return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
}

// A generation that runs until it is cancelled: the fake engine streams
// endless tokens a millisecond apart. The first one has been read.
struct EndlessStream {
  explicit EndlessStream(GrpcFixture& f) {
    f.engine.reply_length = 1 << 30;
    f.engine.token_interval = absl::Milliseconds(1);
    v1::GenerateRequest req;
    req.set_max_tokens(10000);
    reader = f.stub->Generate(&ctx, req);
    REQUIRE(reader->Read(&first));
  }
  // Reads what is left and returns the call's status.
  grpc::Status Finish() {
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  }

  grpc::ClientContext ctx;  // outlives the reader
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  v1::GenerateResponse first;
};

// field: when given, the kvserve-field trailer ("" when absent).
std::vector<v1::GenerateResponse> Generate(GrpcFixture& f, const v1::GenerateRequest& req,
                                           grpc::Status* status, std::string* field = nullptr) {
  grpc::ClientContext ctx;
  auto reader = f.stub->Generate(&ctx, req);
  std::vector<v1::GenerateResponse> out;
  v1::GenerateResponse r;
  while (reader->Read(&r)) out.push_back(r);
  *status = reader->Finish();
  if (field != nullptr) *field = FieldTrailer(ctx);
  return out;
}

TEST_CASE("gRPC Generate streams the text and ends with usage", "[server]") {
  GrpcFixture f;
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(5);
  req.mutable_sampling()->set_temperature(0);
  req.set_request_id("g-1");
  req.set_logprobs(1);
  grpc::Status st;
  auto responses = Generate(f, req, &st);
  REQUIRE(st.ok());
  std::string text;
  for (const auto& r : responses) {
    REQUIRE(r.request_id() == "g-1");
    text += r.text();
    REQUIRE(r.logprobs_size() == 1);
  }
  REQUIRE(text == "abcde");
  REQUIRE(responses.back().request_finished());
  REQUIRE(responses.back().finish_reason() == v1::FINISH_REASON_LENGTH);
  REQUIRE(responses.back().usage().completion_tokens() == 5);
  GenerateRequest seen = f.engine.last_request();
  // Tokenized by the front end (within the budget), so the engine gets ids.
  REQUIRE(seen.prompt_token_ids == std::vector<int32_t>{1, 3 + 'h', 3 + 'i'});
  REQUIRE(seen.prompt.empty());
  REQUIRE(seen.add_bos);
  REQUIRE(seen.sampling.temperature == 0.0f);
  REQUIRE(seen.max_tokens == 5);
  REQUIRE(seen.logprobs == 1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC kv_policy reaches the engine, unset fields left to its defaults", "[server]") {
  GrpcFixture f;
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(3);
  grpc::Status st;
  Generate(f, req, &st);
  REQUIRE(st.ok());
  REQUIRE(f.engine.last_request().kv_policy.empty());
  v1::KvPolicy* k = req.mutable_kv_policy();
  k->set_policy("streaming");
  k->set_budget(256);
  k->set_sink_tokens(0);  // set, though zero
  Generate(f, req, &st);
  REQUIRE(st.ok());
  KvPolicyOverride seen = f.engine.last_request().kv_policy;
  REQUIRE(seen.policy == "streaming");
  REQUIRE(seen.budget == 256);
  REQUIRE(seen.sink_tokens == 0);
  REQUIRE(seen.recent_tokens == -1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

// Every field of the proto's GenerateRequest (and of its SamplingParams and
// KvPolicy) set to a value that is not its default, and what the engine's
// request must hold for it. A field added to the proto without an entry here
// fails the test, so none is dropped in the conversion unnoticed.
TEST_CASE("gRPC converts every GenerateRequest field into the engine's request", "[server]") {
  using Check = std::function<void(const GenerateRequest&)>;
  v1::GenerateRequest req;
  std::map<std::string, Check> checks;
  auto add = [&checks](const std::string& name, Check c) {
    REQUIRE(checks.emplace(name, std::move(c)).second);
  };
  req.set_request_id("map-1");
  add("kvserve.v1.GenerateRequest.request_id",
      [](const GenerateRequest& g) { REQUIRE(g.request_id == "map-1"); });
  req.set_prompt("hi");
  req.set_add_bos(false);
  add("kvserve.v1.GenerateRequest.prompt", [](const GenerateRequest& g) {
    REQUIRE(g.prompt_token_ids == std::vector<int32_t>{3 + 'h', 3 + 'i'});  // no BOS
  });
  add("kvserve.v1.GenerateRequest.add_bos",
      [](const GenerateRequest& g) { REQUIRE_FALSE(g.add_bos); });
  // prompt_token_ids win over the text: checked in a second call below.
  add("kvserve.v1.GenerateRequest.prompt_token_ids", nullptr);
  v1::SamplingParams* sp = req.mutable_sampling();
  add("kvserve.v1.GenerateRequest.sampling", nullptr);  // its fields below
  sp->set_temperature(0.5f);
  add("kvserve.v1.SamplingParams.temperature",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.temperature == 0.5f); });
  sp->set_top_k(7);
  add("kvserve.v1.SamplingParams.top_k",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.top_k == 7); });
  sp->set_top_p(0.75f);
  add("kvserve.v1.SamplingParams.top_p",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.top_p == 0.75f); });
  sp->set_min_p(0.125f);
  add("kvserve.v1.SamplingParams.min_p",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.min_p == 0.125f); });
  sp->set_repetition_penalty(1.25f);
  add("kvserve.v1.SamplingParams.repetition_penalty",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.repetition_penalty == 1.25f); });
  sp->set_presence_penalty(0.5f);
  add("kvserve.v1.SamplingParams.presence_penalty",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.presence_penalty == 0.5f); });
  sp->set_frequency_penalty(-0.25f);
  add("kvserve.v1.SamplingParams.frequency_penalty",
      [](const GenerateRequest& g) { REQUIRE(g.sampling.frequency_penalty == -0.25f); });
  sp->set_seed(42);
  add("kvserve.v1.SamplingParams.seed", [](const GenerateRequest& g) {
    REQUIRE(g.sampling.seed.has_value());
    REQUIRE(*g.sampling.seed == 42);
  });
  req.set_max_tokens(5);
  add("kvserve.v1.GenerateRequest.max_tokens",
      [](const GenerateRequest& g) { REQUIRE(g.max_tokens == 5); });
  req.set_n(2);
  add("kvserve.v1.GenerateRequest.n", [](const GenerateRequest& g) { REQUIRE(g.n == 2); });
  req.add_stop("zz");
  add("kvserve.v1.GenerateRequest.stop",
      [](const GenerateRequest& g) { REQUIRE(g.stop == std::vector<std::string>{"zz"}); });
  req.add_stop_token_ids(9);
  add("kvserve.v1.GenerateRequest.stop_token_ids",
      [](const GenerateRequest& g) { REQUIRE(g.stop_token_ids == std::vector<int32_t>{9}); });
  req.set_ignore_eos(true);
  add("kvserve.v1.GenerateRequest.ignore_eos",
      [](const GenerateRequest& g) { REQUIRE(g.ignore_eos); });
  req.set_logprobs(2);
  add("kvserve.v1.GenerateRequest.logprobs",
      [](const GenerateRequest& g) { REQUIRE(g.logprobs == 2); });
  req.set_cache_salt("salt");
  add("kvserve.v1.GenerateRequest.cache_salt",
      [](const GenerateRequest& g) { REQUIRE(g.cache_salt == "salt"); });  // no keys: as sent
  req.set_priority(3);
  add("kvserve.v1.GenerateRequest.priority",
      [](const GenerateRequest& g) { REQUIRE(g.priority == 3); });
  req.mutable_constraint()->set_regex("[a-z]+");
  add("kvserve.v1.GenerateRequest.constraint", [](const GenerateRequest& g) {
    REQUIRE(g.constraint.kind == GrammarSpec::Kind::kRegex);
    REQUIRE(g.constraint.text == "[a-z]+");
  });  // each kind: the Constraint test below
  v1::KvPolicy* kv = req.mutable_kv_policy();
  add("kvserve.v1.GenerateRequest.kv_policy", nullptr);  // its fields below
  kv->set_policy("h2o");
  add("kvserve.v1.KvPolicy.policy",
      [](const GenerateRequest& g) { REQUIRE(g.kv_policy.policy == "h2o"); });
  kv->set_budget(64);
  add("kvserve.v1.KvPolicy.budget",
      [](const GenerateRequest& g) { REQUIRE(g.kv_policy.budget == 64); });
  kv->set_sink_tokens(2);
  add("kvserve.v1.KvPolicy.sink_tokens",
      [](const GenerateRequest& g) { REQUIRE(g.kv_policy.sink_tokens == 2); });
  kv->set_recent_tokens(16);
  add("kvserve.v1.KvPolicy.recent_tokens",
      [](const GenerateRequest& g) { REQUIRE(g.kv_policy.recent_tokens == 16); });

  // Constraint's fields: one kind at a time, in the Constraint test below.
  for (const char* name : {"kvserve.v1.Constraint.json_schema", "kvserve.v1.Constraint.json_object",
                           "kvserve.v1.Constraint.regex", "kvserve.v1.Constraint.choice",
                           "kvserve.v1.Constraint.grammar", "kvserve.v1.ChoiceList.choices"}) {
    add(name, nullptr);
  }

  // The table covers the proto, field for field.
  std::set<std::string> fields;
  for (const google::protobuf::Descriptor* d :
       {v1::GenerateRequest::descriptor(), v1::SamplingParams::descriptor(),
        v1::KvPolicy::descriptor(), v1::Constraint::descriptor(), v1::ChoiceList::descriptor()}) {
    for (int i = 0; i < d->field_count(); ++i) fields.insert(d->field(i)->full_name());
  }
  std::set<std::string> covered;
  for (const auto& [name, check] : checks) covered.insert(name);
  REQUIRE(covered == fields);

  GrpcFixture f;
  grpc::Status st;
  Generate(f, req, &st);
  INFO(st.error_message());
  REQUIRE(st.ok());
  const GenerateRequest seen = f.engine.last_request();
  for (const auto& [name, check] : checks) {
    INFO(name);
    if (check) check(seen);
  }
  req.add_prompt_token_ids(1);
  req.add_prompt_token_ids(40);
  Generate(f, req, &st);
  REQUIRE(st.ok());
  REQUIRE(f.engine.last_request().prompt_token_ids == std::vector<int32_t>{1, 40});
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC Constraint reaches the engine as the request's grammar spec", "[server]") {
  GrpcFixture f;
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(3);
  grpc::Status st;
  Generate(f, req, &st);
  REQUIRE(st.ok());
  REQUIRE(f.engine.last_request().constraint.empty());
  req.mutable_constraint()->set_json_schema(R"({"type":"integer"})");
  Generate(f, req, &st);
  REQUIRE(st.ok());
  GrammarSpec seen = f.engine.last_request().constraint;
  CHECK(seen.kind == GrammarSpec::Kind::kJsonSchema);
  CHECK(seen.text == R"({"type":"integer"})");
  CHECK(seen.field == "constraint.json_schema");
  req.mutable_constraint()->mutable_choice()->add_choices("yes");
  req.mutable_constraint()->mutable_choice()->add_choices("no");
  Generate(f, req, &st);
  REQUIRE(st.ok());
  seen = f.engine.last_request().constraint;
  CHECK(seen.kind == GrammarSpec::Kind::kChoice);
  CHECK(seen.choices == std::vector<std::string>{"yes", "no"});
  req.mutable_constraint()->set_regex("[a-z]+");
  Generate(f, req, &st);
  REQUIRE(st.ok());
  CHECK(f.engine.last_request().constraint.kind == GrammarSpec::Kind::kRegex);
  req.mutable_constraint()->set_json_object(true);
  Generate(f, req, &st);
  REQUIRE(st.ok());
  CHECK(f.engine.last_request().constraint.kind == GrammarSpec::Kind::kJsonObject);
  req.mutable_constraint()->set_grammar(R"(root ::= "a"+)");
  Generate(f, req, &st);
  REQUIRE(st.ok());
  seen = f.engine.last_request().constraint;
  CHECK(seen.kind == GrammarSpec::Kind::kGbnf);
  CHECK(seen.text == R"(root ::= "a"+)");
  CHECK(seen.field == "constraint.grammar");
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC errors carry the status code and name the field", "[server]") {
  GrpcFixture f;
  grpc::Status st;
  v1::GenerateRequest req;
  req.mutable_sampling()->set_temperature(-1);
  std::string field;
  Generate(f, req, &st, &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "temperature must be >= 0, got -1");
  REQUIRE(field == "temperature");  // the same field HTTP names in "param"

  req.Clear();
  req.add_prompt_token_ids(9999);
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "prompt_token_ids[0] = 9999 is outside the vocabulary [0, 512)");

  // 100,000 stop strings are refused by count, naming the field.
  req.Clear();
  for (int i = 0; i < 100000; ++i) req.add_stop("x");
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "stop has 100000 strings, at most 16 are allowed");

  req.Clear();
  f.engine.queue_full = true;
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  f.engine.queue_full = false;

  f.state.StartDraining();
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("gRPC health reflects loading and readiness", "[server]") {
  GrpcFixture f(/*ready=*/false);
  REQUIRE(f.Health("") == 2);
  REQUIRE(f.Health("kvserve.v1.Generation") == 2);
  grpc::Status st;
  Generate(f, v1::GenerateRequest(), &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  f.MakeReady();
  REQUIRE(f.Health("") == 1);
  REQUIRE(f.Health("kvserve.v1.Generation") == 1);
  f.service.SetServing(false);
  REQUIRE(f.Health("") == 2);
}

TEST_CASE("gRPC unary calls: Tokenize, GetModelInfo, GetStats", "[server]") {
  GrpcFixture f;
  grpc::ClientContext c1;
  v1::TokenizeRequest tr;
  tr.set_text("ab");
  v1::TokenizeResponse tresp;
  REQUIRE(f.stub->Tokenize(&c1, tr, &tresp).ok());
  REQUIRE(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()) ==
          std::vector<int32_t>{1, 3 + 'a', 3 + 'b'});
  REQUIRE(tresp.pieces(1) == "a");

  grpc::ClientContext c2;
  v1::ModelInfo info;
  REQUIRE(f.stub->GetModelInfo(&c2, v1::GetModelInfoRequest(), &info).ok());
  REQUIRE(info.name() == "fake");
  REQUIRE(info.vocab_size() == 512);
  REQUIRE(info.max_model_len() == 256);
  REQUIRE(info.kv_dtype() == "fp32");
  REQUIRE(info.block_size() == 16);

  grpc::ClientContext c3;
  v1::Stats stats;
  REQUIRE(f.stub->GetStats(&c3, v1::GetStatsRequest(), &stats).ok());
  REQUIRE(stats.num_running() == 0);
}

TEST_CASE("gRPC checks the bearer key when one is configured", "[server]") {
  GrpcFixture f(/*ready=*/true, "k");
  grpc::Status st;
  Generate(f, v1::GenerateRequest(), &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer k");
  v1::GenerateRequest req;
  req.set_max_tokens(2);
  auto reader = f.stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  std::string text;
  while (reader->Read(&r)) text += r.text();
  REQUIRE(reader->Finish().ok());
  REQUIRE(text == "ab");
}

TEST_CASE("A gRPC client cancelling mid-stream cancels the request", "[server]") {
  GrpcFixture f;
  EndlessStream stream(f);
  REQUIRE(stream.first.text() == "a");
  stream.ctx.TryCancel();
  REQUIRE(stream.Finish().error_code() == grpc::StatusCode::CANCELLED);
  REQUIRE(f.engine.WaitForCancelled(1) == 1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

// Sends `bytes` as the request of `method` and returns the call's status
// (the field trailer in *field).
grpc::Status RawCall(GrpcFixture& f, const std::string& method, const std::string& bytes,
                     std::string* field = nullptr) {
  grpc::GenericStub stub(f.channel);
  grpc::ClientContext ctx;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    absl::MutexLock lock(&mu);
    status = std::move(s);
    done = true;
  });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  if (field != nullptr) *field = FieldTrailer(ctx);
  return status;
}

TEST_CASE("gRPC malformed messages are INVALID_ARGUMENT saying why", "[server]") {
  GrpcFixture f;
  std::string field;
  // GenerateRequest.prompt (field 2, length-delimited) holding 0xff 0xfe.
  grpc::Status st =
      RawCall(f, "/kvserve.v1.Generation/Generate", std::string("\x12\x02\xff\xfe", 4), &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() ==
          "GenerateRequest.prompt is not valid UTF-8 (string fields must be)");
  REQUIRE(field == "prompt");
  // A stop string (field 8) and the kv_policy's policy (field 15 -> 1).
  st = RawCall(f, "/kvserve.v1.Generation/Generate", std::string("\x42\x01\xc3", 3), &field);
  REQUIRE(st.error_message() == "GenerateRequest.stop is not valid UTF-8 (string fields must be)");
  REQUIRE(field == "stop");
  st =
      RawCall(f, "/kvserve.v1.Generation/Generate", std::string("\x7a\x03\x0a\x01\x80", 5), &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() ==
          "GenerateRequest.kv_policy.policy is not valid UTF-8 (string fields must be)");
  REQUIRE(field == "kv_policy.policy");
  // Truncated: a 5-byte prompt with one byte sent.
  st = RawCall(f, "/kvserve.v1.Generation/Generate",
               std::string("\x12\x05"
                           "a",
                           3),
               &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() ==
          "the GenerateRequest message cannot be parsed (3 bytes, truncated or not a protobuf "
          "message)");
  REQUIRE(field.empty());
  st = RawCall(f, "/kvserve.v1.Generation/Tokenize", std::string("\x0a\x01\xff", 3), &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "TokenizeRequest.text is not valid UTF-8 (string fields must be)");
  REQUIRE(field == "text");
  st = RawCall(f, "/kvserve.v1.Generation/GetStats", std::string("\x0a\x05", 2));
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing reached the engine, and a good call still works.
  REQUIRE(f.engine.last_request().request_id.empty());
  v1::GenerateRequest req;
  req.set_max_tokens(3);
  Generate(f, req, &st);
  REQUIRE(st.ok());
}

TEST_CASE("gRPC holds every request to the cost budget before the engine sees it", "[server]") {
  GrpcService::Options options;
  options.limits.max_prompt_tokens = 8;  // fake max_model_len: 256
  options.limits.max_prompt_bytes = 64;
  GrpcFixture f(true, "", options);
  struct Case {
    std::function<void(v1::GenerateRequest*)> set;
    std::string field;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest* r) { r->set_prompt(std::string(5 << 20, 'a')); }, "prompt",
       "prompt has 5242880 bytes, at most 64 are allowed (limits.max_prompt_bytes)"},
      {[](v1::GenerateRequest* r) { r->set_prompt("abcdefgh"); }, "prompt",
       "prompt has 9 tokens, at most 8 are allowed (limits.max_prompt_tokens)"},
      {[](v1::GenerateRequest* r) {
         for (int i = 0; i < 9; ++i) r->add_prompt_token_ids(5);
       },
       "prompt_token_ids",
       "prompt_token_ids has 9 tokens, at most 8 are allowed (limits.max_prompt_tokens)"},
      {[](v1::GenerateRequest* r) {
         r->set_n(64);
         r->set_max_tokens(257);
       },
       "max_tokens",
       "n x max_tokens = 64 x 257 = 16448 tokens, at most 16384 are allowed "
       "(limits.max_generated_tokens)"},
      {[](v1::GenerateRequest* r) { r->set_logprobs(21); }, "logprobs",
       "logprobs must be -1 (off) or in [0, 20], got 21"},
      {[](v1::GenerateRequest* r) { r->add_stop(std::string(257, 'x')); }, "stop",
       "stop[0] has 257 bytes, at most 256 are allowed"},
      {[](v1::GenerateRequest* r) {
         for (int i = 0; i < 100000; ++i) r->add_stop("x");
       },
       "stop", "stop has 100000 strings, at most 16 are allowed"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req;
    c.set(&req);
    grpc::Status st;
    std::string field;
    Generate(f, req, &st, &field);
    INFO(c.message);
    REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(st.error_message() == c.message);
    REQUIRE(field == c.field);
  }
  REQUIRE(f.engine.last_request().request_id.empty());  // none was submitted
  // Tokenize is bounded the same way.
  grpc::ClientContext ctx;
  v1::TokenizeRequest tr;
  tr.set_text(std::string(65, 'a'));
  v1::TokenizeResponse tresp;
  grpc::Status st = f.stub->Tokenize(&ctx, tr, &tresp);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() ==
          "text has 65 bytes, at most 64 are allowed (limits.max_prompt_bytes)");
  grpc::ClientContext ctx2;
  tr.set_text("abcdefgh");
  st = f.stub->Tokenize(&ctx2, tr, &tresp);
  REQUIRE(st.error_message() ==
          "text has 9 tokens, at most 8 are allowed (limits.max_prompt_tokens)");
  // Within the budget all is well.
  v1::GenerateRequest ok;
  ok.set_prompt("abcdefg");
  ok.set_max_tokens(2);
  Generate(f, ok, &st);
  REQUIRE(st.ok());
  REQUIRE(f.engine.last_request().prompt_token_ids.size() == 8);
}

TEST_CASE("gRPC limits concurrent calls per client", "[server]") {
  GrpcService::Options options;
  options.max_concurrent_per_client = 1;
  GrpcFixture f(true, "", options);
  EndlessStream stream(f);  // one call open
  v1::GenerateRequest small;
  small.set_max_tokens(2);
  grpc::Status st;
  Generate(f, small, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(st.error_message() ==
          "this client already has 1 generation calls open, the most "
          "limits.max_concurrent_per_client allows");
  grpc::ClientContext tctx;
  v1::TokenizeRequest tr;
  v1::TokenizeResponse tresp;
  REQUIRE(f.stub->Tokenize(&tctx, tr, &tresp).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  stream.ctx.TryCancel();
  stream.Finish();
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
  // The slot is back once the call is done.
  for (int i = 0; i < 100; ++i) {
    Generate(f, small, &st);
    if (st.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));  // OnDone may trail the client's status
  }
  REQUIRE(st.ok());
}

TEST_CASE("A gRPC stream whose client stops reading is cancelled once its buffer fills",
          "[server]") {
  GrpcService::Options options;
  options.max_unsent_outputs = 64;
  GrpcFixture f(true, "", options);
  f.engine.reply_length = 1 << 30;
  // A client that announces a small window and never reads.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(f.service.port()),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_max_tokens(16000);
  req.set_logprobs(20);
  auto reader = stub->Generate(&ctx, req);
  // The engine is told to stop well before 16,000 tokens, and the call
  // stops counting as in flight, though the client has read nothing.
  REQUIRE(f.engine.WaitForCancelled(1, absl::Seconds(30)) == 1);
  REQUIRE(f.engine.WaitForIdle() == 0);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
  // Reading now: what was sent, then the reason.
  v1::GenerateResponse r;
  int read = 0;
  while (reader->Read(&r)) ++read;
  REQUIRE(read < 16000);
  const grpc::Status st = reader->Finish();
  REQUIRE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(st.error_message() ==
          "the client read too slowly: more than 64 outputs waited to be sent "
          "(limits.max_unsent_outputs); the request was cancelled");
}

TEST_CASE("gRPC accepts the bearer scheme in any case", "[server]") {
  GrpcFixture f(/*ready=*/true, "k");
  for (const char* auth : {"Bearer k", "bearer k", "BEARER k", "Bearer  k"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", auth);
    grpc::ClientContext* c = &ctx;
    v1::GetStatsRequest req;
    v1::Stats out;
    INFO(auth);
    REQUIRE(f.stub->GetStats(c, req, &out).ok());
  }
  for (const char* auth : {"Bearer kk", "Bearer ", "Basic k", "k", "Bearerk"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", auth);
    v1::GetStatsRequest req;
    v1::Stats out;
    INFO(auth);
    REQUIRE(f.stub->GetStats(&ctx, req, &out).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST_CASE("gRPC serves TLS from a certificate and key file", "[server]") {
  const std::string dir = testing::MakeTempDir("grpc_tls");
  std::string out;
  const int rc = testing::RunShell(
      "cd " + testing::ShellQuote(dir) +
          " && openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem -days 1 "
          "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>&1",
      &out);
  if (rc != 0) {
    WARN("openssl could not make a certificate, skipping: " << out);
    return;
  }
  GrpcService::Options options;
  options.tls_cert_file = dir + "/cert.pem";
  options.tls_key_file = dir + "/key.pem";
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = testing::ReadFileOrDie(dir + "/cert.pem");
  GrpcFixture f(true, "", options, grpc::SslCredentials(ssl));
  v1::GenerateRequest req;
  req.set_max_tokens(3);
  grpc::Status st;
  auto responses = Generate(f, req, &st);
  REQUIRE(st.ok());
  REQUIRE(responses.back().request_finished());
  // A plaintext client gets nowhere.
  auto plain = v1::Generation::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(f.service.port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::Stats stats;
  REQUIRE(plain->GetStats(&ctx, v1::GetStatsRequest(), &stats).error_code() ==
          grpc::StatusCode::UNAVAILABLE);
  // Half a pair is a start-up error naming both keys.
  ServerMetrics metrics;
  ServingState state(&metrics, ChatTemplate(), "");
  GrpcService::Options half;
  half.tls_cert_file = options.tls_cert_file;
  GrpcService s(&state, half);
  const absl::Status started = s.Start("127.0.0.1", 0);
  REQUIRE(started.message() ==
          "server.tls.cert_file and server.tls.key_file: set both for TLS, or neither");
}

TEST_CASE("gRPC after StopServing: every call UNAVAILABLE on a port still open", "[server]") {
  GrpcFixture f;
  EndlessStream stream(f);  // still open when the drain ends
  f.state.StartDraining();
  // It is cancelled at the deadline, and then nothing uses the engine.
  const absl::Time start = absl::Now();
  REQUIRE(f.service.StopServing(absl::Now() + absl::Milliseconds(200)));
  REQUIRE(absl::Now() - start >= absl::Milliseconds(200));
  REQUIRE(stream.Finish().error_code() == grpc::StatusCode::CANCELLED);
  REQUIRE(f.engine.WaitForCancelled(1) == 1);
  // A new client connects and gets an answer (not a refused connection),
  // for every method, without the engine.
  auto fresh = v1::Generation::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(f.service.port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  v1::Stats stats;
  grpc::Status st = fresh->GetStats(&c1, v1::GetStatsRequest(), &stats);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(st.error_message() == "the server is shutting down");
  grpc::ClientContext c2;
  v1::TokenizeResponse tresp;
  st = fresh->Tokenize(&c2, v1::TokenizeRequest(), &tresp);
  REQUIRE(st.error_message() == "the server is shutting down");
  Generate(f, v1::GenerateRequest(), &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(st.error_message() == "the server is shutting down");
  REQUIRE(f.Health("") == 2);
  // With no call open it returns at once.
  REQUIRE(f.service.StopServing(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC counts calls in a limiter it may share with HTTP", "[server]") {
  GrpcService::Options options;
  options.limiter = std::make_shared<ClientLimiter>(1);
  auto limiter = options.limiter;
  GrpcFixture f(true, "", options);
  // An HTTP call of this host holds its one slot.
  absl::StatusOr<ClientLimiter::Token> http_call = limiter->Acquire("ipv4:127.0.0.1");
  REQUIRE(http_call.ok());
  v1::GenerateRequest req;
  req.set_max_tokens(2);
  grpc::Status st;
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  http_call->Release();
  Generate(f, req, &st);
  REQUIRE(st.ok());
}

}  // namespace
}  // namespace kvserve
