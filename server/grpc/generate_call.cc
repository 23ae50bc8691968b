#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/kvserve.grpc.pb.h"
#include "scheduler/request_validation.h"
#include "server/admission/auth.h"
#include "server/admission/client_limiter.h"
#include "server/admission/engine_gate.h"
#include "server/admission/request_budget.h"
#include "server/grpc/grpc_call.h"
#include "server/observability/logging.h"
#include "util/field_status.h"

namespace kvserve::grpc_call {
namespace {

namespace v1 = ::kvserve::v1;

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

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartGenerate(const CallEnv& env,
                                                          grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* request) {
  return new GenerateReactor(env, ctx, request);
}

}  // namespace kvserve::grpc_call
