#include "server/http/http_service.h"

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "scheduler/engine_config.h"
#include "server/observability/logging.h"
#include "server/openai/json_body.h"
#include "server/openai/openai_protocol.h"
#include "server/openai/tokenize.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = DumpJson(body);
  return r;
}

HttpResponse ErrorResponse(const ApiError& e) {
  HttpResponse r;
  r.status = e.http_status;
  r.body = e.Body();
  return r;
}

ApiError Unavailable(ServingState::Phase phase) {
  ApiError e;
  e.http_status = 503;
  e.type = "service_unavailable";
  if (phase == ServingState::Phase::kLoading) {
    e.message = "the model is still loading";
    e.code = "loading";
  } else {
    e.message = "the server is shutting down";
    e.code = "draining";
  }
  return e;
}

}  // namespace

// One generation request from submission to its last byte. Owned by its
// exchange (and, briefly, by whatever runs it); the stream's notification
// holds it weakly. Destroyed before it finished — client gone, not
// reading, server stopping — it cancels the request, which frees its blocks
// at the engine's next step.
struct HttpService::GenerateCall : std::enable_shared_from_this<GenerateCall> {
  GenerateCall(ServingState* state, std::shared_ptr<HttpExchange> exchange,
               std::shared_ptr<RequestStream> stream, std::string request_id, bool sse)
      : state(state),
        exchange(std::move(exchange)),
        stream(std::move(stream)),
        request_id(std::move(request_id)),
        sse(sse),
        start(absl::Now()) {}

  ~GenerateCall() {
    stream->SetNotify(nullptr);
    if (!finished) {
      stream->Cancel();
      LogRequest(spdlog::level::info, request_id,
                 "{} cancelled after {:.3f}s (client gone, not reading, or server stopping)",
                 sse ? "stream" : "request", absl::ToDoubleSeconds(absl::Now() - start));
      state->CallFinished();
    }
  }

  // Engine thread: schedule one Drain on the exchange's strand.
  void Notify() {
    if (drain_posted.exchange(true)) return;
    exchange->Post([self = shared_from_this()] { self->Drain(); });
  }

  // On the strand: everything the stream holds goes to the client.
  void Drain() {
    drain_posted.store(false);
    if (finished) return;
    GenerateOutput out;
    RequestStream::Pop pop;
    if (!sse) {
      while ((pop = stream->TryNext(&out)) == RequestStream::Pop::kOutput) accumulator->Add(out);
      if (pop != RequestStream::Pop::kEnd) return;
      Finish();
      if (!accumulator->error().empty()) {
        ApiError e;
        e.http_status = 500;
        e.type = "server_error";
        e.message = accumulator->error();
        LogRequest(spdlog::level::err, request_id, "generation failed: {}", accumulator->error());
        HttpResponse r = ErrorResponse(e);
        r.headers.emplace_back("X-Request-Id", request_id);
        return exchange->Respond(std::move(r));
      }
      LogRequest(spdlog::level::debug, request_id, "done");
      HttpResponse r = JsonResponse(200, accumulator->ToJson(response_id, created, model));
      r.headers.emplace_back("X-Request-Id", request_id);
      return exchange->Respond(std::move(r));
    }
    std::string events;
    if (!started) {
      started = true;
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers = {{"Cache-Control", "no-cache"}, {"X-Request-Id", request_id}};
      exchange->StartStream(std::move(head));
      events = formatter->Start();
    }
    // Written output by output (they coalesce into one socket write): a
    // client that stopped reading is found out within one output.
    while ((pop = stream->TryNext(&out)) == RequestStream::Pop::kOutput) {
      events += formatter->Add(out);
      exchange->Write(events);
      events.clear();
      if (exchange->ended()) return;  // the client stopped reading: cancelled when released
    }
    if (pop == RequestStream::Pop::kEnd) events += formatter->Finish();
    exchange->Write(events);
    if (exchange->ended()) return;
    if (pop == RequestStream::Pop::kEnd) {
      Finish();
      LogRequest(spdlog::level::info, request_id, "stream done after {:.3f}s",
                 absl::ToDoubleSeconds(absl::Now() - start));
      exchange->EndStream();
    }
  }

  // Counted out of the in-flight calls before the last byte is queued, so a
  // client that has its answer sees the call finished.
  void Finish() {
    finished = true;
    state->CallFinished();
  }

  ServingState* const state;
  const std::shared_ptr<HttpExchange> exchange;
  const std::shared_ptr<RequestStream> stream;
  const std::string request_id;
  const bool sse;
  const absl::Time start;
  std::string response_id;
  std::string model;
  int64_t created = 0;
  std::optional<ResponseAccumulator> accumulator;  // !sse
  std::optional<StreamFormatter> formatter;        // sse
  bool started = false;
  bool finished = false;
  std::atomic<bool> drain_posted{false};
  ClientLimiter::Token
      client_slot;  // the client's concurrency slot (limits.max_concurrent_per_client)
};

HttpService::HttpService(ServingState* state, Options options)
    : state_(state),
      options_(std::move(options)),
      created_(UnixNow()),
      keys_(options_.api_keys != nullptr ? options_.api_keys : state->api_keys()) {
  HttpServer::Options o;
  o.host = options_.host;
  o.port = options_.port;
  o.reuse_port = options_.reuse_port;
  o.io_threads = options_.threads;
  o.header_timeout = options_.header_timeout;
  o.body_timeout = options_.body_timeout;
  o.idle_timeout = options_.idle_timeout;
  o.write_timeout = options_.write_timeout;
  o.max_connections = options_.max_connections;
  o.max_body_bytes = options_.max_body_bytes;
  o.max_unsent_bytes = options_.stream_buffer_bytes;
  o.tls_cert_file = options_.tls_cert_file;
  o.tls_key_file = options_.tls_key_file;
  server_ = std::make_unique<HttpServer>(
      o, [this](const HttpRequest& head) { return Authorize(head); },
      [this](std::shared_ptr<HttpExchange> ex) { Handle(std::move(ex)); },
      [this](int status) { state_->metrics().CountHttpResponse(status); });
}

HttpService::~HttpService() { Stop(); }

absl::Status HttpService::Start() {
  workers_ = std::make_unique<PromptClient>(options_.prompt_workers, options_.threads);
  if (absl::Status s = server_->Start(); !s.ok()) return s;
  port_ = server_->port();
  return absl::OkStatus();
}

void HttpService::Stop() {
  server_->Stop();
  // Work already queued still runs (a request the server no longer
  // answers ends at its first reply); the pool may be gRPC's too.
  if (workers_ != nullptr) workers_->Drain();
}

std::optional<HttpResponse> HttpService::Authorize(const HttpRequest& head) const {
  const bool guarded = absl::StartsWith(head.path, "/v1/") || head.path == "/tokenize" ||
                       head.path == "/detokenize" ||
                       (options_.metrics_auth && head.path == "/metrics");
  if (!guarded || keys_->Authorize(head.Header("Authorization"))) {
    return std::nullopt;
  }
  ApiError e;
  e.http_status = 401;
  e.message = "Incorrect or missing API key: send 'Authorization: Bearer <key>'";
  e.code = "invalid_api_key";
  HttpResponse r = ErrorResponse(e);
  r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

void HttpService::Handle(std::shared_ptr<HttpExchange> ex) {
  const HttpRequest& req = ex->request();
  if (req.method == "GET") {
    if (req.path == "/health") return ex->Respond(Health());
    if (req.path == "/metrics") return ex->Respond(Metrics());
    if (req.path == "/v1/models") return ex->Respond(Models());
  } else if (req.method == "POST") {
    if (req.path == "/v1/completions") return HandleGenerate(/*chat=*/false, std::move(ex));
    if (req.path == "/v1/chat/completions") return HandleGenerate(/*chat=*/true, std::move(ex));
    if (req.path == "/tokenize") return HandleTokenize(/*detokenize=*/false, std::move(ex));
    if (req.path == "/detokenize") return HandleTokenize(/*detokenize=*/true, std::move(ex));
  }
  // A route asked with another method is 405 with the methods it takes.
  const char* allow = nullptr;
  if (req.path == "/health" || req.path == "/metrics" || req.path == "/v1/models") allow = "GET";
  if (req.path == "/v1/completions" || req.path == "/v1/chat/completions" ||
      req.path == "/tokenize" || req.path == "/detokenize") {
    allow = "POST";
  }
  ApiError e;
  e.http_status = allow != nullptr ? 405 : 404;
  e.type = allow != nullptr ? "invalid_request_error" : "not_found_error";
  const std::string method = CapClientText(req.method, kLogTextBytes);
  const std::string path = CapClientText(req.path, kLogTextBytes);
  e.message = allow != nullptr ? absl::StrCat(method, " is not allowed on ", path, ": use ", allow)
                               : absl::StrCat("no route for ", method, " ", path);
  HttpResponse r = ErrorResponse(e);
  if (allow != nullptr) r.headers.emplace_back("Allow", allow);
  ex->Respond(std::move(r));
}

HttpResponse HttpService::Health() const {
  switch (state_->phase()) {
    case ServingState::Phase::kReady:
      if (!state_->grpc_accepting()) {
        return JsonResponse(503, {{"status", "grpc_not_accepting"},
                                  {"weights_fingerprint", state_->info().weights_fingerprint}});
      }
      return JsonResponse(
          200, {{"status", "ready"}, {"weights_fingerprint", state_->info().weights_fingerprint}});
    case ServingState::Phase::kLoading:
      return JsonResponse(503, {{"status", "loading"}});
    case ServingState::Phase::kDraining:
      break;
  }
  return JsonResponse(503, {{"status", "draining"}});
}

HttpResponse HttpService::Metrics() const {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  state_->metrics().SetHttpOpenConnections(server_->connections());
  const EngineGate::Lease lease = state_->gate().Enter();
  Engine* engine = lease.held() ? state_->engine() : nullptr;
  r.body =
      engine != nullptr ? state_->metrics().Scrape(engine->GetStats()) : state_->metrics().Scrape();
  return r;
}

HttpResponse HttpService::Models() const {
  if (state_->engine() == nullptr) return ErrorResponse(Unavailable(state_->phase()));
  const ServedModelInfo& info = state_->info();
  return JsonResponse(200, {{"object", "list"},
                            {"data", json::array({{{"id", info.name},
                                                   {"object", "model"},
                                                   {"created", created_},
                                                   {"owned_by", "kvserve"},
                                                   {"max_model_len", info.max_model_len}}})}});
}

void HttpService::HandleTokenize(bool detokenize, std::shared_ptr<HttpExchange> ex) {
  // Tokenizing is work: off the io threads, as generation requests are.
  workers_->Run([this, detokenize, ex = std::move(ex)] {
    HttpResponse r;
    try {
      const EngineGate::Lease lease = state_->gate().Enter();
      Engine* engine = lease.held() ? state_->engine() : nullptr;
      if (!state_->ready() || engine == nullptr) {
        r = ErrorResponse(Unavailable(state_->phase()));
      } else {
        ApiContext ctx;
        ctx.tokenizer = &engine->tokenizer();
        ctx.chat_template = &state_->chat_template();
        ctx.model_name = state_->info().name;
        ctx.max_model_len = state_->info().max_model_len;
        ctx.limits = options_.limits;
        json body;
        std::optional<ApiError> e = detokenize ? Detokenize(ex->request().body, ctx, &body)
                                               : Tokenize(ex->request().body, ctx, &body);
        r = e ? ErrorResponse(*e) : JsonResponse(200, body);
      }
    } catch (const std::exception& e) {
      spdlog::error("http {}: internal error: {}", LogText(ex->request().path), e.what());
      ApiError err;
      err.http_status = 500;
      err.type = "server_error";
      err.message = "internal error while handling the request";
      r = ErrorResponse(err);
    }
    ex->Post([ex, r = std::move(r)]() mutable { ex->Respond(std::move(r)); });
  });
}

void HttpService::HandleGenerate(bool chat, std::shared_ptr<HttpExchange> ex) {
  // Parsing tokenizes the prompt: off the io threads. No exception leaves
  // the worker (it would end the process): one that gets here is a bug,
  // answered with a 500 and logged, and the daemon goes on serving.
  workers_->Run([this, chat, ex = std::move(ex)] {
    try {
      GenerateOnWorker(chat, ex);
    } catch (const std::exception& e) {
      spdlog::error("http {}: internal error: {}", LogText(ex->request().path), e.what());
      ApiError err;
      err.http_status = 500;
      err.type = "server_error";
      err.message = "internal error while handling the request";
      ex->Post([ex, r = ErrorResponse(err)]() mutable { ex->Respond(std::move(r)); });
    }
  });
}

void HttpService::GenerateOnWorker(bool chat, const std::shared_ptr<HttpExchange>& ex) {
  {
    auto reply = [&ex](HttpResponse r) {
      ex->Post([ex, r = std::move(r)]() mutable { ex->Respond(std::move(r)); });
    };
    const HttpRequest& req = ex->request();
    const ApiKind kind = chat ? ApiKind::kChat : ApiKind::kCompletion;
    const EngineGate::Lease lease = state_->gate().Enter();
    Engine* engine = lease.held() ? state_->engine() : nullptr;
    if (!state_->ready() || engine == nullptr) {
      return reply(ErrorResponse(Unavailable(state_->phase())));
    }

    ApiContext ctx;
    ctx.tokenizer = &engine->tokenizer();
    ctx.chat_template = &state_->chat_template();
    ctx.model_name = state_->info().name;
    ctx.max_model_len = state_->info().max_model_len;
    ctx.default_sampling = engine->model_config().DefaultSampling();
    ctx.default_kv_policy = std::string(EvictionPolicyName(engine->config().eviction.policy));
    ctx.limits = options_.limits;
    // With keys, the key the request presented (Authorize checked it).
    std::string_view key;
    if (!keys_->empty())
      key = BearerToken(req.Header("Authorization")).value_or(std::string_view());
    ClientLimiter::Token slot;
    if (options_.limiter != nullptr) {
      absl::StatusOr<ClientLimiter::Token> t = options_.limiter->Acquire(ClientKey(key, req.peer));
      if (!t.ok()) {
        spdlog::info("http {} refused: {}", LogText(req.path), std::string(t.status().message()));
        return reply(ErrorResponse(ApiErrorFromStatus(t.status(), "")));
      }
      slot = *std::move(t);
    }
    ApiRequest api;
    if (std::optional<ApiError> e = ParseApiRequest(kind, req.body, ctx, &api)) {
      spdlog::info("http {} rejected: {} (param {})", LogText(req.path), LogText(e->message),
                   LogText(e->param));
      return reply(ErrorResponse(*e));
    }
    api.request.cache_salt = TenantCacheSalt(key, api.request.cache_salt);
    api.request.client = ClientKey(key, req.peer);

    std::string request_id(req.Header("X-Request-Id"));
    if (!IsAcceptableRequestId(request_id)) request_id = NewRequestId();
    api.request.request_id = request_id;
    absl::StatusOr<std::shared_ptr<RequestStream>> submitted = engine->Submit(api.request);
    if (!submitted.ok()) {
      LogRequest(spdlog::level::info, request_id, "refused by the engine: {}",
                 std::string(submitted.status().message()));
      HttpResponse r =
          ErrorResponse(ApiErrorFromStatus(submitted.status(), chat ? "messages" : "prompt"));
      r.headers.emplace_back("X-Request-Id", request_id);
      return reply(std::move(r));
    }
    LogRequest(spdlog::level::info, request_id, "{} prompt_tokens={} max_tokens={} n={} stream={}",
               req.path, api.request.prompt_token_ids.size(), api.request.max_tokens, api.request.n,
               api.stream);
    state_->CallStarted();
    auto call =
        std::make_shared<GenerateCall>(state_, ex, *std::move(submitted), request_id, api.stream);
    call->client_slot = std::move(slot);
    call->response_id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
    call->created = UnixNow();
    call->model = api.model;
    if (api.stream) {
      call->formatter.emplace(api, &engine->tokenizer(), call->response_id, call->created,
                              api.model);
    } else {
      call->accumulator.emplace(api, &engine->tokenizer());
    }
    call->stream->SetNotify([weak = std::weak_ptr<GenerateCall>(call)] {
      if (std::shared_ptr<GenerateCall> c = weak.lock()) c->Notify();
    });
    // If the exchange has already ended, the call is released unrun: cancelled.
    ex->Post([call]() mutable {
      call->exchange->Attach(call);
      call->Drain();
    });
  }
}

}  // namespace kvserve
