#include "server/http_service.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/engine_config.h"
#include "server/logging.h"
#include "server/openai_protocol.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

// How long a streaming handler waits for engine output before checking the
// client is still there.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(250);

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(DumpJson(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.Body(), "application/json");
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

// Per-request state of a streaming response, shared by httplib's content
// provider (called repeatedly on the connection's thread) and its releaser.
struct SseCall {
  ServingState* state;
  std::shared_ptr<RequestStream> stream;
  StreamFormatter formatter;
  std::string request_id;
  absl::Time start;
  bool started = false;
  bool finished = false;
  bool client_gone = false;
};

}  // namespace

HttpService::HttpService(ServingState* state, Options options)
    : state_(state),
      options_(std::move(options)),
      created_(UnixNow()),
      server_(std::make_unique<httplib::Server>()) {
  Register();
}

HttpService::~HttpService() { Stop(); }

void HttpService::Register() {
  httplib::Server& s = *server_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  // httplib listens with a backlog of 5, too few for a burst of clients
  // connecting at once; keep the listening socket to widen it after bind.
  // Not httplib's defaults, which set SO_REUSEPORT: a second daemon on the
  // same port would then start without a word and split the traffic.
  s.set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (options_.reuse_port) ::setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  s.set_read_timeout(30, 0);
  s.set_write_timeout(10, 0);
  // Without TCP_NODELAY a response written in two pieces (headers, then
  // body) on a kept-alive connection waits for the client's delayed ACK:
  // about 40 ms per request (Nagle). Linux copies the option from the
  // listening socket to every accepted one.
  s.set_tcp_nodelay(true);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 &&
        !state_->Authorized(req.get_header_value("Authorization"))) {
      ApiError e;
      e.http_status = 401;
      e.message = "Incorrect or missing API key: send 'Authorization: Bearer <key>'";
      e.code = "invalid_api_key";
      SendError(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Whatever httplib answers on its own (unknown path, oversized body,
  // malformed request) still gets an OpenAI-style JSON body.
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.is_chunked_content_provider_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        ApiError e;
        e.http_status = res.status;
        switch (res.status) {
          case 404:
            e.type = "not_found_error";
            e.message = absl::StrCat("no route for ", req.method, " ", req.path);
            break;
          case 413:
            e.message = absl::StrCat("the request body is larger than server.max_body_bytes (",
                                     options_.max_body_bytes, " bytes)");
            e.code = "payload_too_large";
            break;
          default:
            e.message = absl::StrCat("HTTP ", res.status);
            break;
        }
        SendError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));

  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    state_->metrics().CountHttpResponse(res.status);
    spdlog::debug("http {} {} -> {}", req.method, req.path, res.status);
  });

  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(/*chat=*/false, req, res);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(/*chat=*/true, req, res);
  });
  s.Get("/v1/models",
        [this](const httplib::Request&, httplib::Response& res) { HandleModels(res); });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  s.Get("/metrics",
        [this](const httplib::Request&, httplib::Response& res) { HandleMetrics(res); });
}

absl::Status HttpService::Start() {
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
  } else if (!server_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("server.http_port: cannot listen on ", options_.host,
                                               ":", options_.port, " (in use, or a bad host?)"));
  }
  port_ = port;
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpService::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

void HttpService::HandleHealth(httplib::Response& res) {
  switch (state_->phase()) {
    case ServingState::Phase::kReady:
      SendJson(res, 200, {{"status", "ready"}});
      break;
    case ServingState::Phase::kLoading:
      SendJson(res, 503, {{"status", "loading"}});
      break;
    case ServingState::Phase::kDraining:
      SendJson(res, 503, {{"status", "draining"}});
      break;
  }
}

void HttpService::HandleMetrics(httplib::Response& res) {
  Engine* engine = state_->engine();
  std::string text =
      engine != nullptr ? state_->metrics().Scrape(engine->GetStats()) : state_->metrics().Scrape();
  res.status = 200;
  res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
}

void HttpService::HandleModels(httplib::Response& res) {
  if (state_->engine() == nullptr) return SendError(res, Unavailable(state_->phase()));
  const ServedModelInfo& info = state_->info();
  SendJson(res, 200,
           {{"object", "list"},
            {"data", json::array({{{"id", info.name},
                                   {"object", "model"},
                                   {"created", created_},
                                   {"owned_by", "kvserve"},
                                   {"max_model_len", info.max_model_len}}})}});
}

void HttpService::HandleGenerate(bool chat, const httplib::Request& req, httplib::Response& res) {
  const ApiKind kind = chat ? ApiKind::kChat : ApiKind::kCompletion;
  Engine* engine = state_->engine();
  if (!state_->ready() || engine == nullptr) return SendError(res, Unavailable(state_->phase()));

  ApiContext ctx;
  ctx.tokenizer = &engine->tokenizer();
  ctx.chat_template = &state_->chat_template();
  ctx.model_name = state_->info().name;
  ctx.max_model_len = state_->info().max_model_len;
  ctx.default_sampling = engine->model_config().DefaultSampling();
  ctx.default_kv_policy = std::string(EvictionPolicyName(engine->config().eviction.policy));
  ApiRequest api;
  if (std::optional<ApiError> e = ParseApiRequest(kind, req.body, ctx, &api)) {
    spdlog::info("http {} rejected: {} (param {})", req.path, e->message, e->param);
    return SendError(res, *e);
  }

  std::string request_id = req.get_header_value("X-Request-Id");
  if (!IsAcceptableRequestId(request_id)) request_id = NewRequestId();
  api.request.request_id = request_id;
  const std::string response_id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id);
  const int64_t created = UnixNow();
  res.set_header("X-Request-Id", request_id);

  absl::StatusOr<std::shared_ptr<RequestStream>> submitted = engine->Submit(api.request);
  if (!submitted.ok()) {
    LogRequest(spdlog::level::info, request_id, "refused by the engine: {}",
               std::string(submitted.status().message()));
    return SendError(res, ApiErrorFromStatus(submitted.status(), chat ? "messages" : "prompt"));
  }
  std::shared_ptr<RequestStream> stream = *std::move(submitted);
  LogRequest(spdlog::level::info, request_id, "{} prompt_tokens={} max_tokens={} n={} stream={}",
             req.path, api.request.prompt_token_ids.size(), api.request.max_tokens, api.request.n,
             api.stream);
  state_->CallStarted();

  if (!api.stream) {
    ResponseAccumulator acc(api, &engine->tokenizer());
    GenerateOutput out;
    while (stream->Next(&out) == RequestStream::Pop::kOutput) acc.Add(out);
    state_->CallFinished();
    if (!acc.error().empty()) {
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.message = acc.error();
      LogRequest(spdlog::level::err, request_id, "generation failed: {}", acc.error());
      return SendError(res, e);
    }
    LogRequest(spdlog::level::debug, request_id, "done");
    return SendJson(res, 200, acc.ToJson(response_id, created, api.model));
  }

  auto call = std::make_shared<SseCall>(SseCall{
      state_, stream, StreamFormatter(api, &engine->tokenizer(), response_id, created, api.model),
      request_id, absl::Now()});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [call](size_t, httplib::DataSink& sink) {
        if (call->finished) {
          sink.done();
          return true;
        }
        std::string events;
        if (!call->started) {
          call->started = true;
          events = call->formatter.Start();
        }
        GenerateOutput out;
        RequestStream::Pop pop = call->stream->Next(&out, kStreamPoll);
        while (pop == RequestStream::Pop::kOutput) {
          events += call->formatter.Add(out);
          pop = call->stream->TryNext(&out);  // send everything already there at once
        }
        if (pop == RequestStream::Pop::kEnd) events += call->formatter.Finish();
        const bool gone =
            events.empty() ? !sink.is_writable() : !sink.write(events.data(), events.size());
        if (gone) {
          call->client_gone = true;
          call->stream->Cancel();
          return false;
        }
        if (pop == RequestStream::Pop::kEnd) {
          call->finished = true;
          sink.done();
        }
        return true;
      },
      [call](bool) {
        // Whatever ended the response (done, write failure, server stop), a
        // request still running has nobody left to read it.
        if (!call->finished) call->stream->Cancel();
        LogRequest(spdlog::level::info, call->request_id, "stream {} after {:.3f}s",
                   call->finished ? "done" : "cancelled (client gone)",
                   absl::ToDoubleSeconds(absl::Now() - call->start));
        call->state->CallFinished();
      });
}

}  // namespace kvserve
