// The OpenAI HTTP client of client.h (cpp-httplib).
#include <httplib.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/client.h"
#include "bench/loadgen/server_metrics.h"

namespace kvserve::bench {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxErrorBody = 300;

int64_t IntOr(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

class HttpClient final : public Client {
 public:
  HttpClient(const ClientOptions& options, bool keep_alive)
      : options_(options), keep_alive_(keep_alive) {
    if (!SplitHttpUrl(options_.url, &host_, &port_, &base_path_)) host_.clear();
    if (base_path_.ends_with("/v1")) base_path_.resize(base_path_.size() - 3);
    path_ = base_path_ + (options_.api == Api::kChat ? "/v1/chat/completions" : "/v1/completions");
    if (keep_alive_) client_ = NewConnection();
  }

  RequestResult Send(const BenchRequest& request) override {
    RequestResult res;
    if (host_.empty()) {
      res.error = absl::StrCat("bad --url '", options_.url, "' (expected http://host:port)");
      return res;
    }
    std::unique_ptr<httplib::Client> fresh;
    httplib::Client* client = client_.get();
    if (!keep_alive_) {
      fresh = NewConnection();
      client = fresh.get();
    }

    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.body = HttpRequestBody(options_, request);
    req.headers.emplace("Content-Type", "application/json");
    req.headers.emplace("Accept", options_.stream ? "text/event-stream" : "application/json");
    if (!options_.api_key.empty()) {
      req.headers.emplace("Authorization", "Bearer " + options_.api_key);
    }
    int status = 0;
    std::string raw;  // a non-streamed or failed response's body
    SseParser sse;
    bool done = false;
    double last = 0;
    std::string chunk_error;
    auto take = [&](const ChunkInfo& c, double now) {
      if (!c.error.empty() && chunk_error.empty()) chunk_error = c.error;
      if (!c.text.empty()) {
        res.text += c.text;
        if (res.ttft_s < 0) {
          res.ttft_s = now - res.start_s;
        } else {
          res.itl_s.push_back(now - last);
        }
        last = now;
        ++res.chunks;
      }
      if (c.has_usage) {
        res.usage_reported = true;
        res.prompt_tokens = c.prompt_tokens;
        res.output_tokens = c.completion_tokens;
        res.cached_tokens = c.cached_tokens;
      }
    };
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      const double now = SteadySeconds();
      if (status != 200 || !options_.stream) {
        raw.append(data, n);
        return true;
      }
      for (const std::string& payload : sse.Feed(std::string_view(data, n))) {
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) {
          if (chunk_error.empty())
            chunk_error = "a stream chunk is not JSON: " + payload.substr(0, 80);
          continue;
        }
        take(ParseChunk(options_.api, j), now);
      }
      return true;
    };

    httplib::Response response;
    httplib::Error err = httplib::Error::Success;
    res.start_s = SteadySeconds();
    const bool sent = client->send(req, response, err);
    const double end = SteadySeconds();
    res.e2e_s = end - res.start_s;
    if (!sent) {
      res.error =
          absl::StrCat("connection to ", host_, ":", port_, " failed: ", httplib::to_string(err));
      // A kept-alive connection that broke is replaced for the next request.
      if (keep_alive_) client_ = NewConnection();
      return res;
    }
    if (status != 200) {
      res.error = absl::StrCat("HTTP ", status, ": ", raw.substr(0, kMaxErrorBody));
      return res;
    }
    if (!options_.stream) {
      json j = json::parse(raw, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        res.error = "the response is not JSON: " + raw.substr(0, kMaxErrorBody);
        return res;
      }
      take(ParseChunk(options_.api, j), end);
      if (!chunk_error.empty()) {
        res.error = chunk_error;
        return res;
      }
      res.ttft_s = res.e2e_s;
      res.ok = true;
      return res;
    }
    if (!chunk_error.empty()) {
      res.error = chunk_error;
    } else if (!done && res.chunks == 0) {
      res.error = "the stream ended without output or [DONE]";
    } else {
      res.ok = true;
      if (!res.usage_reported) res.output_tokens = res.chunks;
    }
    return res;
  }

 private:
  std::unique_ptr<httplib::Client> NewConnection() const {
    auto c = std::make_unique<httplib::Client>(host_, port_);
    c->set_keep_alive(keep_alive_);
    // The request goes out as two writes (headers, body): without
    // TCP_NODELAY the body would wait for the server's delayed ACK.
    c->set_tcp_nodelay(true);
    c->set_connection_timeout(10, 0);
    c->set_write_timeout(30, 0);
    c->set_read_timeout(options_.timeout_s, 0);
    return c;
  }

  const ClientOptions options_;
  const bool keep_alive_;
  std::string host_;
  int port_ = 0;
  std::string base_path_;
  std::string path_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace

const char* ApiName(Api api) {
  switch (api) {
    case Api::kCompletions:
      return "completions";
    case Api::kChat:
      return "chat";
    case Api::kGrpc:
      return "grpc";
  }
  return "?";
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string HttpRequestBody(const ClientOptions& options, const BenchRequest& request) {
  json b = json::object();
  if (!options.model.empty()) b["model"] = options.model;
  if (options.api == Api::kChat) {
    b["messages"] = json::array({{{"role", "user"}, {"content", request.prompt}}});
  } else if (options.send_token_ids && !request.prompt_ids.empty()) {
    b["prompt"] = request.prompt_ids;
  } else {
    b["prompt"] = request.prompt;
  }
  b["max_tokens"] = request.max_tokens;
  b["temperature"] = options.temperature;
  if (options.ignore_eos) b["ignore_eos"] = true;
  b["stream"] = options.stream;
  if (options.stream) b["stream_options"] = {{"include_usage", true}};
  if (options.extra_body.is_object()) {
    for (const auto& [key, value] : options.extra_body.items()) b[key] = value;
  }
  return b.dump(-1, ' ', false, json::error_handler_t::replace);
}

ChunkInfo ParseChunk(Api api, const json& chunk) {
  ChunkInfo c;
  if (!chunk.is_object()) {
    c.error = "a chunk is not a JSON object";
    return c;
  }
  if (auto e = chunk.find("error"); e != chunk.end() && !e->is_null()) {
    c.error = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                  ? (*e)["message"].get<std::string>()
                  : e->dump();
    return c;
  }
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array()) {
    for (const json& choice : *choices) {
      if (!choice.is_object()) continue;
      const json* text = nullptr;
      if (api == Api::kChat) {
        for (const char* key : {"delta", "message"}) {
          if (auto m = choice.find(key); m != choice.end() && m->is_object()) {
            if (auto t = m->find("content"); t != m->end()) text = &*t;
          }
        }
      } else if (auto t = choice.find("text"); t != choice.end()) {
        text = &*t;
      }
      if (text != nullptr && text->is_string()) c.text += text->get<std::string>();
    }
  }
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) {
    c.has_usage = true;
    c.prompt_tokens = IntOr(*u, "prompt_tokens", -1);
    c.completion_tokens = IntOr(*u, "completion_tokens", -1);
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      c.cached_tokens = IntOr(*d, "cached_tokens", -1);
    }
  }
  return c;
}

std::vector<std::string> SseParser::Feed(std::string_view bytes) {
  for (char ch : bytes) {
    if (ch != '\r') buffer_.push_back(ch);
  }
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t end; (end = buffer_.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    std::string data;
    bool has_data = false;
    std::string_view event(buffer_.data() + pos, end - pos);
    while (!event.empty()) {
      const size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
      if (!line.starts_with("data:")) continue;
      line.remove_prefix(5);
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (has_data) data.push_back('\n');
      data.append(line);
      has_data = true;
    }
    if (has_data) out.push_back(std::move(data));
  }
  buffer_.erase(0, pos);
  return out;
}

std::unique_ptr<Client> MakeClient(const ClientOptions& options, bool keep_alive) {
  if (options.api == Api::kGrpc) return MakeGrpcClient(options, keep_alive);
  return std::make_unique<HttpClient>(options, keep_alive);
}

}  // namespace kvserve::bench
