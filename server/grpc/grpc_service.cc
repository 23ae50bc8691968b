#include "server/grpc/grpc_service.h"

#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/kvserve.grpc.pb.h"
#include "scheduler/request_validation.h"
#include "server/auth.h"
#include "server/client_limiter.h"
#include "server/config.h"
#include "server/engine_gate.h"
#include "server/grpc/reflection_v1.h"
#include "server/grpc/stats_proto.h"
#include "server/logging.h"
#include "server/request_budget.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;

// The trailing metadata key that names the request field an
// INVALID_ARGUMENT is about (what HTTP puts in the error's "param").
constexpr char kFieldTrailer[] = "kvserve-field";

// ctx (when given) gets the kvserve-field trailer of a FieldError.
grpc::Status ToGrpc(const absl::Status& s, grpc::CallbackServerContext* ctx = nullptr) {
  if (const std::string field = ErrorField(s); ctx != nullptr && !field.empty()) {
    ctx->AddTrailingMetadata(kFieldTrailer, field);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string_view Metadata(const grpc::CallbackServerContext& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string_view()
                        : std::string_view(it->second.data(), it->second.size());
}

// Refuses calls the daemon cannot take: no model yet, draining, wrong key.
grpc::Status Admit(const ServingState& state, const grpc::CallbackServerContext& ctx,
                   bool needs_ready) {
  if (!state.Authorized(Metadata(ctx, "authorization"))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong 'authorization: Bearer <key>' metadata");
  }
  if (state.engine() == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading");
  }
  if (needs_ready && !state.ready()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }
  return grpc::Status::OK;
}

// The request field a protobuf full field name is ("kvserve.v1.KvPolicy.policy"
// -> "kv_policy.policy", "kvserve.v1.GenerateRequest.prompt" -> "prompt").
std::string RequestFieldName(std::string_view full_name) {
  const size_t dot = full_name.rfind('.');
  if (dot == std::string_view::npos) return std::string(full_name);
  std::string field(full_name.substr(dot + 1));
  if (absl::EndsWith(absl::string_view(full_name.data(), dot), "KvPolicy")) {
    return "kv_policy." + field;
  }
  return field;
}

// Parses a raw request. A malformed one is an InvalidArgument saying why,
// naming the field for invalid UTF-8 (libprotobuf's complaint is captured,
// not printed).
template <typename Message>
absl::Status ParseRequest(const grpc::ByteBuffer& raw, Message* msg) {
  // A call whose HEADERS end the stream carries no message at all (an empty
  // message is a valid, zero-length buffer): not a default request.
  if (!raw.Valid()) {
    return absl::InvalidArgumentError(absl::StrCat("no ", Message::descriptor()->name(),
                                                   " message: the call ended before sending one"));
  }
  grpc::ByteBuffer copy(raw);  // the reader needs a mutable buffer; slices are shared
  grpc::ProtoBufferReader reader(&copy);
  ProtobufLogCapture capture;
  if (msg->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  const std::string type = Message::descriptor()->name();
  const std::string& why = capture.text();
  if (absl::StrContains(why, "invalid UTF-8")) {
    // "String field 'kvserve.v1.GenerateRequest.prompt' contains invalid UTF-8 ..."
    const size_t open = why.find('\'');
    const size_t close = open == std::string::npos ? open : why.find('\'', open + 1);
    if (close != std::string::npos) {
      const std::string full = why.substr(open + 1, close - open - 1);
      const std::string field = RequestFieldName(full);
      return FieldError(
          field, absl::StrCat(type, ".", field, " is not valid UTF-8 (string fields must be)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the ", type, " message has a string field that is not valid UTF-8"));
  }
  return absl::InvalidArgumentError(absl::StrCat("the ", type, " message cannot be parsed (",
                                                 raw.Length(),
                                                 " bytes, truncated or not a protobuf message)"));
}

template <typename Message>
grpc::Status Serialize(const Message& msg, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  out->Clear();  // the writer fills an empty buffer only
  return grpc::SerializationTraits<Message>::Serialize(msg, out, &own_buffer);
}

// Applies the proto's defaults, then the one request validator
// (scheduler/request_validation.h) that HTTP and the engine use too. Every
// check here is cheap; the prompt's bytes are among them, its tokens wait
// for tokenizing.
absl::Status FromProto(const v1::GenerateRequest& p, const RequestLimits& limits,
                       const SamplingParams& defaults, GenerateRequest* g) {
  g->sampling = defaults;
  if (!p.request_id().empty() && !IsAcceptableRequestId(p.request_id())) {
    return FieldError("request_id", "request_id: use 1-128 characters of [A-Za-z0-9._:-]");
  }
  // Counted before anything is copied: 100,000 stop strings or a 5 MB
  // prompt are refused, not copied.
  if (absl::Status s = CheckStopCount(p.stop_size(), limits); !s.ok()) return s;
  if (p.prompt_token_ids().empty()) {
    if (absl::Status s = CheckPromptBytes(p.prompt().size(), limits); !s.ok()) return s;
  }
  g->request_id = p.request_id().empty() ? NewRequestId() : p.request_id();
  if (p.prompt_token_ids().empty()) g->prompt = p.prompt();
  g->prompt_token_ids.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  g->add_bos = p.has_add_bos() ? p.add_bos() : true;
  const v1::SamplingParams& s = p.sampling();
  if (s.has_temperature()) g->sampling.temperature = s.temperature();
  if (s.has_top_k()) g->sampling.top_k = s.top_k();
  if (s.has_top_p()) g->sampling.top_p = s.top_p();
  if (s.has_min_p()) g->sampling.min_p = s.min_p();
  if (s.has_repetition_penalty()) g->sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) g->sampling.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) g->sampling.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) g->sampling.seed = s.seed();
  g->max_tokens = p.has_max_tokens() ? p.max_tokens() : 16;
  g->n = p.has_n() ? p.n() : 1;
  g->stop.assign(p.stop().begin(), p.stop().end());
  g->stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  g->ignore_eos = p.ignore_eos();
  g->logprobs = p.has_logprobs() ? p.logprobs() : -1;
  if (p.has_logprobs() && p.logprobs() < 0) {
    return FieldError("logprobs", absl::StrCat("logprobs must be >= 0, got ", p.logprobs()));
  }
  g->cache_salt = p.cache_salt();
  g->priority = p.priority();
  if (p.has_kv_policy()) {
    const v1::KvPolicy& k = p.kv_policy();
    g->kv_policy.policy = k.policy();
    g->kv_policy.budget = k.budget();
    if (k.has_sink_tokens()) g->kv_policy.sink_tokens = k.sink_tokens();
    if (k.has_recent_tokens()) g->kv_policy.recent_tokens = k.recent_tokens();
  }
  if (p.has_constraint()) {
    const v1::Constraint& c = p.constraint();
    GrammarSpec& spec = g->constraint;
    switch (c.kind_case()) {
      case v1::Constraint::kJsonSchema:
        spec.kind = GrammarSpec::Kind::kJsonSchema;
        spec.text = c.json_schema();
        spec.field = "constraint.json_schema";
        break;
      case v1::Constraint::kJsonObject:
        if (c.json_object()) spec.kind = GrammarSpec::Kind::kJsonObject;
        spec.field = "constraint.json_object";
        break;
      case v1::Constraint::kRegex:
        spec.kind = GrammarSpec::Kind::kRegex;
        spec.text = c.regex();
        spec.field = "constraint.regex";
        break;
      case v1::Constraint::kChoice:
        spec.kind = GrammarSpec::Kind::kChoice;
        spec.choices.assign(c.choice().choices().begin(), c.choice().choices().end());
        spec.field = "constraint.choice.choices";
        break;
      case v1::Constraint::kGrammar:
        spec.kind = GrammarSpec::Kind::kGbnf;
        spec.text = c.grammar();
        spec.field = "constraint.grammar";
        break;
      case v1::Constraint::KIND_NOT_SET:
        break;
    }
  }
  return ValidateRequestParams(*g, limits);
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const GenerateOutput& out, const std::string& request_id, const Tokenizer& tok,
             v1::GenerateResponse* r) {
  r->Clear();
  r->set_request_id(request_id);
  r->set_index(out.index);
  r->set_text(out.text);
  r->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  for (const TokenLogprob& lp : out.logprobs) {
    v1::TokenLogprob* p = r->add_logprobs();
    p->set_token_id(lp.token_id);
    p->set_logprob(lp.logprob);
    p->set_token(tok.IdToPiece(lp.token_id));
    for (const auto& [id, value] : lp.top) {
      v1::TopLogprob* t = p->add_top();
      t->set_token_id(id);
      t->set_logprob(value);
      t->set_token(tok.IdToPiece(id));
    }
  }
  r->set_finish_reason(ToProto(out.finish_reason));
  r->set_error(out.error);
  r->set_request_finished(out.request_finished);
  if (out.request_finished) {
    v1::Usage* u = r->mutable_usage();
    u->set_prompt_tokens(out.usage.prompt_tokens);
    u->set_cached_prompt_tokens(out.usage.cached_prompt_tokens);
    u->set_completion_tokens(out.usage.completion_tokens);
    u->set_total_tokens(out.usage.prompt_tokens + out.usage.completion_tokens);
  }
}

class GenerateReactor;

// Lets the engine's notify, the prompt worker and the gate reach a Generate
// reactor only while it exists (OnDone clears it, waiting for a pump in
// progress). The gate cancels the call through it at its deadline.
struct ReactorLink final : EngineGate::Cancellable {
  absl::Mutex mu;
  GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  void Cancel() override;
};

// What every call shares: the daemon's state, the budget, the per-client
// limiter, the prompt workers and the engine gate.
struct CallEnv {
  ServingState* state = nullptr;
  const GrpcService::Options* options = nullptr;
  ClientLimiter* limiter = nullptr;
  PromptWorkers* workers = nullptr;
  EngineGate* gate = nullptr;

  // Admit, holding a lease on the engine when admitted.
  grpc::Status Admit(const grpc::CallbackServerContext& ctx, bool needs_ready,
                     EngineGate::Lease* lease) const {
    *lease = gate->Enter();
    if (!lease->held()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    }
    grpc::Status st = kvserve::Admit(*state, ctx, needs_ready);
    if (!st.ok()) lease->Release();
    return st;
  }

  // The budget for the served model (valid once an engine is published).
  RequestLimits Limits() const {
    RequestLimits l = ResolveRequestLimits(options->limits, state->info().max_model_len);
    l.vocab_size = state->engine()->tokenizer().vocab_size();
    return l;
  }
  // With keys, the key the call presented (Admit checked it); else "".
  std::string_view ApiKeyOf(const grpc::CallbackServerContext& ctx) const {
    if (state->api_keys()->empty()) return {};
    return BearerToken(Metadata(ctx, "authorization")).value_or(std::string_view());
  }
  std::string ClientOf(const grpc::CallbackServerContext& ctx) const {
    return ClientKey(ApiKeyOf(ctx), ctx.peer());
  }
};

// One Generate call. Deletes itself in OnDone.
//
// Begin (gRPC thread): admission, parsing, the client's slot and every
// cheap check. Submit (a prompt worker for text prompts, else inline):
// tokenizing within the budget and engine->Submit. Then outputs flow through
// Pump, bounded by options.max_unsent_outputs.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(const CallEnv& env, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw)
      : env_(env), ctx_(ctx), link_(std::make_shared<ReactorLink>()) {
    link_->reactor = this;
    env_.gate->Track(link_);
    GenerateRequest g;
    if (grpc::Status st = Begin(*raw, &g); !st.ok()) {
      FinishNow(st);
      return;
    }
    if (g.prompt_token_ids.empty()) {
      // Tokenizing may take a while: not on a thread other calls need.
      env_.workers->Run([this, g = std::move(g)]() mutable {
        try {
          Submit(std::move(g));
        } catch (const std::exception& e) {
          // A bug, not the client's: the call ends, the daemon serves on.
          spdlog::error("grpc Generate: internal error: {}", e.what());
          FinishNow(grpc::Status(grpc::StatusCode::INTERNAL, "internal error"));
        }
      });
    } else {
      Submit(std::move(g));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client is gone; stop generating for it.
      std::shared_ptr<RequestStream> stream;
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        stream = stream_;
        if (finished_) {
          if (stream != nullptr) stream->Cancel();
          return;
        }
        finished_ = true;
      }
      if (stream != nullptr) stream->Cancel();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream to the client broke"));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    Pump();
  }

  void OnCancel() override {
    std::shared_ptr<RequestStream> stream;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      stream = stream_;
    }
    if (stream != nullptr) {
      stream->Cancel();
      LogRequest(spdlog::level::info, request_id_, "grpc call cancelled by the client");
    }
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    bool counted = false;
    {
      absl::MutexLock lock(&mu_);
      counted = std::exchange(counted_, false);
    }
    if (counted) {
      LogRequest(spdlog::level::info, request_id_, "grpc Generate done after {:.3f}s",
                 absl::ToDoubleSeconds(absl::Now() - start_));
      env_.state->CallFinished();
    }
    delete this;
  }

  // The gate's deadline passed (link mu held).
  void CancelCall() { ctx_->TryCancel(); }

 private:
  grpc::Status Begin(const grpc::ByteBuffer& raw, GenerateRequest* g) {
    grpc::Status st = env_.Admit(*ctx_, /*needs_ready=*/true, &lease_);
    if (!st.ok()) return st;
    v1::GenerateRequest p;
    if (absl::Status parsed = ParseRequest(raw, &p); !parsed.ok()) {
      // The id is not validated yet: logged capped, like any client string.
      LogRequest(spdlog::level::info, p.request_id().empty() ? "-" : LogText(p.request_id()),
                 "grpc Generate refused: {}", LogText(std::string(parsed.message())));
      return ToGrpc(parsed, ctx_);
    }
    absl::StatusOr<ClientLimiter::Token> slot = env_.limiter->Acquire(env_.ClientOf(*ctx_));
    if (!slot.ok()) return ToGrpc(slot.status(), ctx_);
    slot_ = *std::move(slot);
    Engine* engine = env_.state->engine();
    tokenizer_ = &engine->tokenizer();
    limits_ = env_.Limits();
    if (absl::Status v = FromProto(p, limits_, engine->model_config().DefaultSampling(), g);
        !v.ok()) {
      return ToGrpc(v, ctx_);
    }
    g->cache_salt = TenantCacheSalt(env_.ApiKeyOf(*ctx_), g->cache_salt);
    g->client = env_.ClientOf(*ctx_);
    request_id_ = g->request_id;
    return grpc::Status::OK;
  }

  // Tokenizes a text prompt within the budget and hands the request to the
  // engine; then streams. Touches no member after finishing the call.
  void Submit(GenerateRequest g) {
    bool cancelled = ctx_->IsCancelled();  // a reset stream costs the engine nothing
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled || cancelled_;
    }
    if (cancelled) {
      FinishNow(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
      return;
    }
    if (g.prompt_token_ids.empty()) {
      absl::StatusOr<std::vector<int32_t>> ids =
          TokenizeWithinBudget(*tokenizer_, g.prompt, g.add_bos, limits_);
      if (!ids.ok()) {
        LogRequest(spdlog::level::info, request_id_, "grpc Generate refused: {}",
                   std::string(ids.status().message()));
        FinishNow(ToGrpc(ids.status(), ctx_));
        return;
      }
      g.prompt_token_ids = *std::move(ids);
      g.prompt.clear();
    }
    const int32_t max_tokens = g.max_tokens;
    absl::StatusOr<std::shared_ptr<RequestStream>> s = env_.state->engine()->Submit(std::move(g));
    if (!s.ok()) {
      LogRequest(spdlog::level::info, request_id_, "grpc Generate refused: {}",
                 std::string(s.status().message()));
      FinishNow(ToGrpc(s.status(), ctx_));
      return;
    }
    LogRequest(spdlog::level::info, request_id_, "grpc Generate max_tokens={}", max_tokens);
    start_ = absl::Now();
    env_.state->CallStarted();
    std::shared_ptr<RequestStream> stream = *std::move(s);
    {
      absl::MutexLock lock(&mu_);
      counted_ = true;
      stream_ = stream;
      if (cancelled_) stream->Cancel();
    }
    // The engine may push before this returns: Pump is safe at any time.
    std::shared_ptr<ReactorLink> link = link_;
    stream->SetNotify([link] {
      absl::MutexLock lock(&link->mu);
      if (link->reactor != nullptr) link->reactor->Pump();
    });
    absl::MutexLock lock(&link->mu);
    if (link->reactor != nullptr) link->reactor->Pump();
  }

  // Finishes a call that never reached the engine.
  void FinishNow(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    Finish(status);
  }

  // Moves ready outputs into the unsent buffer, writes the next one when no
  // write is in flight, and finishes at the end of the stream or when the
  // client has let the buffer overflow.
  void Pump() {
    bool write = false;
    bool finish = false;
    bool overflow = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || stream_ == nullptr) return;
      GenerateOutput out;
      while (!ended_) {
        const RequestStream::Pop pop = stream_->TryNext(&out);
        if (pop == RequestStream::Pop::kTimeout) break;
        if (pop == RequestStream::Pop::kEnd) {
          ended_ = true;
          break;
        }
        if (out.finish_reason == FinishReason::kError && error_.empty()) {
          error_ = out.error.empty() ? "generation failed" : out.error;
        }
        unsent_.push_back(std::move(out));
      }
      peak_unsent_ = std::max(peak_unsent_, unsent_.size());
      if (static_cast<int64_t>(unsent_.size()) > env_.options->max_unsent_outputs) {
        // The client stopped reading: stop generating for it.
        stream_->Cancel();
        unsent_.clear();
        finished_ = true;
        finish = true;
        overflow = true;
        status = grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("the client read too slowly: more than ", env_.options->max_unsent_outputs,
                         " outputs waited to be sent (limits.max_unsent_outputs); the request "
                         "was cancelled"));
      } else if (!writing_ && !unsent_.empty()) {
        ToProto(unsent_.front(), request_id_, *tokenizer_, &response_);
        unsent_.pop_front();
        if (grpc::Status st = Serialize(response_, &buffer_); !st.ok()) {
          stream_->Cancel();
          finished_ = true;
          finish = true;
          status = st;
        } else {
          writing_ = true;
          write = true;
        }
      } else if (!writing_ && ended_) {
        finished_ = true;
        finish = true;
        status =
            error_.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, error_);
      }
    }
    if (overflow) {
      // The engine frees the blocks at its next step; the call no longer
      // costs a slot even while its last write waits for the client.
      LogRequest(spdlog::level::warn, request_id_, "{}", status.error_message());
      slot_.Release();
      lease_.Release();  // nothing below touches the engine
      bool counted = false;
      {
        absl::MutexLock lock(&mu_);
        counted = std::exchange(counted_, false);
      }
      if (counted) env_.state->CallFinished();
    }
    // buffer_ is not touched again until OnWriteDone clears writing_.
    if (write) StartWrite(&buffer_);
    if (finish) Finish(status);
  }

  const CallEnv env_;
  grpc::CallbackServerContext* const ctx_;
  const std::shared_ptr<ReactorLink> link_;
  EngineGate::Lease lease_;  // released when the call no longer touches the engine
  const Tokenizer* tokenizer_ = nullptr;
  RequestLimits limits_;
  ClientLimiter::Token slot_;
  std::string request_id_ = "-";
  absl::Time start_;
  absl::Mutex mu_;
  std::shared_ptr<RequestStream> stream_ ABSL_GUARDED_BY(mu_);
  std::deque<GenerateOutput> unsent_ ABSL_GUARDED_BY(mu_);
  size_t peak_unsent_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool counted_ ABSL_GUARDED_BY(mu_) = false;  // CallStarted, not yet CallFinished
  std::string error_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse response_;
  grpc::ByteBuffer buffer_;
};

void ReactorLink::Cancel() {
  absl::MutexLock lock(&mu);
  if (reactor != nullptr) reactor->CancelCall();
}

using RawGenerationService =
    v1::Generation::WithRawCallbackMethod_Generate<v1::Generation::WithRawCallbackMethod_Tokenize<
        v1::Generation::WithRawCallbackMethod_GetModelInfo<
            v1::Generation::WithRawCallbackMethod_GetStats<v1::Generation::Service>>>>;

}  // namespace

class GrpcService::Impl final : public RawGenerationService {
 public:
  Impl(ServingState* state, const Options* options)
      : limiter_(options->limiter != nullptr
                     ? options->limiter
                     : std::make_shared<ClientLimiter>(options->max_concurrent_per_client)),
        workers_(std::max(1, options->prompt_threads)) {
    env_.state = state;
    env_.options = options;
    env_.limiter = limiter_.get();
    env_.workers = &workers_;
    env_.gate = &state->gate();
  }

  void StopWorkers() { workers_.Stop(); }
  bool CloseGate(absl::Time deadline) { return env_.gate->Close(deadline); }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override {
    return new GenerateReactor(env_, ctx, request);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    auto request = std::make_shared<v1::TokenizeRequest>();
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, request.get()); !parsed.ok()) {
        st = ToGrpc(parsed, ctx);
      }
    }
    RequestLimits limits;
    if (st.ok()) {
      limits = env_.Limits();
      // The byte budget before any work, on this thread.
      if (absl::Status b = CheckPromptBytes(request->text().size(), limits, "text"); !b.ok()) {
        st = ToGrpc(b, ctx);
      }
    }
    absl::StatusOr<ClientLimiter::Token> slot;
    if (st.ok()) {
      slot = limiter_->Acquire(env_.ClientOf(*ctx));
      if (!slot.ok()) st = ToGrpc(slot.status(), ctx);
    }
    if (!st.ok()) {
      reactor->Finish(st);
      return reactor;
    }
    auto held = std::make_shared<ClientLimiter::Token>(*std::move(slot));
    auto leased = std::make_shared<EngineGate::Lease>(std::move(lease));
    ServingState* state = env_.state;
    workers_.Run([state, ctx, reactor, request, response, limits, held, leased] {
      const Tokenizer& tok = state->engine()->tokenizer();
      absl::StatusOr<std::vector<int32_t>> ids = TokenizeWithinBudget(
          tok, request->text(), request->has_add_bos() ? request->add_bos() : true, limits, "text");
      grpc::Status result;
      if (!ids.ok()) {
        result = ToGrpc(ids.status(), ctx);
      } else {
        v1::TokenizeResponse out;
        for (int32_t id : *ids) {
          out.add_token_ids(id);
          out.add_pieces(tok.IdToPiece(id));
        }
        result = Serialize(out, response);
      }
      held->Release();
      leased->Release();
      reactor->Finish(result);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* raw,
                                         grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    v1::GetModelInfoRequest request;
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, &request); !parsed.ok()) st = ToGrpc(parsed);
    }
    if (st.ok()) {
      const ModelConfig& m = env_.state->engine()->model_config();
      const ServedModelInfo& s = env_.state->info();
      v1::ModelInfo info;
      info.set_name(s.name);
      info.set_architecture(m.architecture);
      info.set_vocab_size(m.vocab_size);
      info.set_max_model_len(s.max_model_len);
      info.set_num_layers(m.num_layers);
      info.set_num_heads(m.num_heads);
      info.set_num_kv_heads(m.num_kv_heads);
      info.set_head_dim(m.head_dim);
      info.set_hidden_size(m.dim);
      info.set_bos_id(m.bos_id);
      info.set_eos_id(m.eos_id);
      info.set_device(s.device);
      info.set_kv_dtype(s.kv_dtype);
      info.set_block_size(s.block_size);
      info.set_num_blocks(s.num_blocks);
      info.set_num_swap_blocks(s.num_swap_blocks);
      info.set_prefix_caching(s.prefix_caching);
      st = Serialize(info, response);
    }
    reactor->Finish(st);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    v1::GetStatsRequest request;
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, &request); !parsed.ok()) st = ToGrpc(parsed);
    }
    if (st.ok()) {
      v1::Stats out;
      ToProto(env_.state->engine()->GetStats(), &out);
      st = Serialize(out, response);
    }
    reactor->Finish(st);
    return reactor;
  }

 private:
  const std::shared_ptr<ClientLimiter> limiter_;
  PromptWorkers workers_;
  CallEnv env_;
};

GrpcService::Options GrpcService::OptionsFromConfig(const ServeConfig& config) {
  Options o;
  o.limits = config.ToRequestLimits();
  o.max_concurrent_per_client = config.limits.max_concurrent_per_client;
  o.max_unsent_outputs = config.limits.max_unsent_outputs;
  o.tls_cert_file = config.server.tls.cert_file;
  o.tls_key_file = config.server.tls.key_file;
  // A stalled or idle connection lasts as long as on the HTTP port.
  o.handshake_timeout = absl::Seconds(config.server.http_header_timeout_s);
  o.idle_timeout = absl::Seconds(config.server.http_idle_timeout_s);
  return o;
}

GrpcService::GrpcService(ServingState* state, Options options)
    : state_(state),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>(state, &options_)) {}

GrpcService::~GrpcService() {
  Shutdown(absl::Now());
  impl_->StopWorkers();
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The API key, checked on a call's metadata before gRPC reads its message
// (so an unauthenticated 64 MiB message is refused, not received). Health and
// reflection stay open, as before; Admit checks again (a path the processor
// did not see is not let through).
grpc::Status CheckMetadataKey(const ServingState& state, std::string_view path,
                              std::string_view authorization) {
  if (path.rfind("/kvserve.v1.Generation/", 0) != 0) return grpc::Status::OK;
  if (state.Authorized(authorization)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong 'authorization: Bearer <key>' metadata");
}

// For TLS (grpc::SslServerCredentials takes a C++ processor).
class KeyProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit KeyProcessor(const ServingState* state) : state_(state) {}
  bool IsBlocking() const override { return false; }  // a constant-time compare
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    std::string_view path, authorization;
    for (const auto& [key, value] : md) {
      if (key == ":path") path = std::string_view(value.data(), value.size());
      if (key == "authorization") authorization = std::string_view(value.data(), value.size());
    }
    return CheckMetadataKey(*state_, path, authorization);
  }

 private:
  const ServingState* const state_;
};

// Plaintext with the same processor: grpc::InsecureServerCredentials()
// refuses a processor in 1.51, the core's insecure credentials take one.
class InsecureKeyCredentials final : public grpc::ServerCredentials {
 public:
  explicit InsecureKeyCredentials(const ServingState* state)
      : creds_(grpc_insecure_server_credentials_create()) {
    grpc_server_credentials_set_auth_metadata_processor(
        creds_, {&Process, nullptr, const_cast<ServingState*>(state)});
  }
  ~InsecureKeyCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    std::abort();  // this one has its processor
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  static void Process(void* arg, grpc_auth_context*, const grpc_metadata* md, size_t n,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    std::string_view path, authorization;
    for (size_t i = 0; i < n; ++i) {
      const std::string_view key(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
                                 GRPC_SLICE_LENGTH(md[i].key));
      const std::string_view value(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                                   GRPC_SLICE_LENGTH(md[i].value));
      if (key == ":path") path = value;
      if (key == "authorization") authorization = value;
    }
    const grpc::Status st =
        CheckMetadataKey(*static_cast<const ServingState*>(arg), path, authorization);
    done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(st.error_code()),
         st.ok() ? nullptr : st.error_message().c_str());
  }

  grpc_server_credentials* const creds_;
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const GrpcService::Options& o,
                                                                     const ServingState* state) {
  if (o.tls_cert_file.empty() && o.tls_key_file.empty()) {
    return std::make_shared<InsecureKeyCredentials>(state);
  }
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "server.tls.cert_file and server.tls.key_file: set both for TLS, or neither");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> key = ReadPem(o.tls_key_file, "server.tls.key_file");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> cert = ReadPem(o.tls_cert_file, "server.tls.cert_file");
  if (!cert.ok()) return cert.status();
  pair.private_key = *std::move(key);
  pair.cert_chain = *std::move(cert);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  creds->SetAuthMetadataProcessor(std::make_shared<KeyProcessor>(state));
  return creds;
}

}  // namespace

namespace {

// Set by gRPC's "Failed accept4: ..." line: 1.51's listener has stopped
// (any accept error but EAGAIN/ECONNABORTED/EINTR ends its accept loop).
std::atomic<bool> g_accept_failed{false};

// gRPC core's own lines (a failed TLS handshake, ...) through spdlog too.
void OnGrpcLog(gpr_log_func_args* args) {
  if (absl::StartsWith(args->message, "Failed accept4")) g_accept_failed.store(true);
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::warn
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  spdlog::log(level, "grpc ({}:{}): {}", args->file, args->line, args->message);
}

}  // namespace

absl::Status GrpcService::Start(const std::string& host, int port, bool reuse_port) {
  RouteProtobufLogs();
  gpr_set_log_function(&OnGrpcLog);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  address_host_ = host;
  reuse_port_ = reuse_port;
  port_ = port;
  {
    absl::MutexLock lock(&server_mu_);
    if (absl::Status s = BuildServerLocked(); !s.ok()) return s;
    serving_ = state_->ready();
    SetServingLocked(serving_);
  }
  if (options_.watchdog_interval > absl::ZeroDuration()) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }
  return absl::OkStatus();
}

absl::Status GrpcService::BuildServerLocked() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      Credentials(options_, state_);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  int selected = 0;
  // IPv6 literals need brackets in a gRPC target.
  const std::string address = address_host_.find(':') != std::string::npos
                                  ? absl::StrCat("[", address_host_, "]:", port_)
                                  : absl::StrCat(address_host_, ":", port_);
  auto ms = [](absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); };
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port_ ? 1 : 0);
  // Rapid reset and stream floods: at most this many open streams per
  // connection. gRPC 1.51 has no option that closes a connection resetting
  // streams faster than it completes them (the upstream fix for
  // CVE-2023-44487 came in 1.56.3+); README: terminate HTTP/2 in front.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  // A connection that never sends its SETTINGS closes after this (1.51's
  // default is 120 s); one without calls after idle_timeout. 1.51 has no
  // connection cap (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS came later):
  // these timeouts and the resource quota are what bound them.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, ms(options_.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(options_.idle_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options_.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(options_.keepalive_timeout));
  grpc::ResourceQuota quota("kvserve-grpc");
  quota.Resize(static_cast<size_t>(options_.memory_quota_bytes));
  quota.SetMaxThreads(64);  // sync handlers only (health, reflection)
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(address, *credentials, &selected);
  builder.RegisterService(impl_.get());
  // Reflection v1 beside gRPC's own v1alpha (registered by the plugin above).
  reflection_v1_ = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
      v1::Generation::service_full_name(), "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
  builder.RegisterService(reflection_v1_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || selected == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("server.grpc_port: cannot listen on ", address, " (in use, or a bad host?)"));
  }
  port_ = selected;
  return absl::OkStatus();
}

bool GrpcService::Probe() const {
  if (!options_.tls_cert_file.empty()) return true;  // TLS: the accept-failure line only
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  const std::string host = address_host_ == "0.0.0.0" ? "127.0.0.1"
                           : address_host_ == "::"    ? "::1"
                                                      : address_host_;
  const std::string target = host.find(':') != std::string::npos
                                 ? absl::StrCat("[", host, "]:", port_)
                                 : absl::StrCat(host, ":", port_);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.probe_timeout));
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer request(&empty, 1), response;
  const grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod("/grpc.health.v1.Health/Check",
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  // NOT_SERVING (drain, loading) still proves the port accepts.
  return st.ok();
}

void GrpcService::WatchdogLoop() {
  int failures = 0;
  bool accepting = true;
  for (;;) {
    {
      absl::MutexLock lock(&server_mu_);
      if (server_mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.watchdog_interval)) {
        return;
      }
    }
    const bool accept_failed = g_accept_failed.exchange(false);
    failures = accept_failed ? options_.probe_failures : (Probe() ? 0 : failures + 1);
    if (failures < options_.probe_failures) {
      if (!accepting) {
        accepting = true;
        state_->SetGrpcAccepting(true);
        absl::MutexLock lock(&server_mu_);
        SetServingLocked(serving_);
        spdlog::info("grpc port {} accepts again", port_);
      }
      continue;
    }
    if (accepting) {
      accepting = false;
      state_->SetGrpcAccepting(false);
      spdlog::warn("grpc port {} stopped accepting ({}); restarting the gRPC server", port_,
                   accept_failed ? "accept failed" : "health probes failed");
    }
    // The old listener must close first: a second socket on the port would
    // take a share of the connections and never accept them.
    absl::MutexLock lock(&server_mu_);
    if (stopping_) return;
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      server_->Wait();
      server_.reset();
    }
    if (absl::Status s = BuildServerLocked(); !s.ok()) {
      spdlog::warn("grpc restart failed (retrying): {}", std::string(s.message()));
      continue;
    }
    restarts_.fetch_add(1);
    SetServingLocked(serving_);
    failures = options_.probe_failures - 1;  // the next probe decides
  }
}

void GrpcService::SetServing(bool serving) {
  absl::MutexLock lock(&server_mu_);
  serving_ = serving;
  SetServingLocked(serving);
}

void GrpcService::SetServingLocked(bool serving) {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    // Not serving while the port could not accept, whatever the phase.
    const bool ok = serving && state_->grpc_accepting();
    health->SetServingStatus(ok);
    health->SetServingStatus(v1::Generation::service_full_name(), ok);
  }
}

bool GrpcService::StopServing(absl::Time deadline) {
  SetServing(false);
  return impl_->CloseGate(deadline);
}

void GrpcService::Shutdown(absl::Time deadline) {
  {
    absl::MutexLock lock(&server_mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr) return;
  SetServingLocked(false);
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  server_.reset();
}

}  // namespace kvserve
