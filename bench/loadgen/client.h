// Clients that send one benchmark request and time its response: the
// OpenAI HTTP API (/v1/completions or /v1/chat/completions, streamed as
// server-sent events or not) and kvserve's gRPC Generate stream.
//
// Timing (steady clock, seconds): the clock starts just before the request
// is written. TTFT is the arrival of the first chunk that carries output
// (text or token ids; chat's role-only first chunk does not count), ITL the
// gaps between such chunks, E2E the end of the response. Without streaming
// the first token arrives with the last, so TTFT = E2E. Output tokens are
// the server's usage.completion_tokens when it reports them (the OpenAI
// stream_options.include_usage), else the number of output chunks (one
// token per chunk on vLLM and llama.cpp; kvserve may put several tokens of
// one poll into a chunk, but it always reports usage).
//
// A kept-alive client holds one connection (HTTP keep-alive, or one gRPC
// channel) for all its requests; otherwise every request opens a fresh
// connection and closes it ("Connection: close"; a new gRPC channel with a
// private subchannel pool).
//
// Thread-safety: one Client per thread; MakeClient may be called from any.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench/loadgen/workload.h"

namespace kvserve::bench {

enum class Api { kCompletions, kChat, kGrpc };

// "completions", "chat", "grpc".
const char* ApiName(Api api);

struct ClientOptions {
  Api api = Api::kCompletions;
  std::string url = "http://127.0.0.1:8000";  // HTTP base, without /v1
  std::string grpc_target;                    // host:port (kGrpc and the probe)
  std::string model;
  std::string api_key;  // "" = no Authorization header
  bool stream = true;
  bool ignore_eos = true;       // generate exactly max_tokens
  bool send_token_ids = false;  // send BenchRequest::prompt_ids instead of the text
  double temperature = 0;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into each HTTP body
  int timeout_s = 600;
};

struct RequestResult {
  bool ok = false;
  std::string error;   // when !ok: status and the start of the body
  double start_s = 0;  // steady clock
  double ttft_s = -1;  // -1: no output arrived
  double e2e_s = 0;
  std::vector<double> itl_s;  // gaps between output chunks
  int64_t chunks = 0;         // output-bearing chunks
  int64_t output_tokens = 0;
  int64_t prompt_tokens = -1;  // from usage; -1 when not reported
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1: not reported
  bool usage_reported = false;
  int64_t expected_input_tokens = 0;  // the workload's count (set by the load runner)
  int64_t request_index = -1;         // the workload's request (set by the load runner)
  std::string text;                   // the output text, all chunks joined
};

class Client {
 public:
  virtual ~Client() = default;
  virtual RequestResult Send(const BenchRequest& request) = 0;
};

std::unique_ptr<Client> MakeClient(const ClientOptions& options, bool keep_alive);

// Seconds on the steady clock.
double SteadySeconds();

// --- HTTP pieces, exposed for tests ----------------------------------------

// The JSON body of an OpenAI request for `request`.
std::string HttpRequestBody(const ClientOptions& options, const BenchRequest& request);

// What one streamed chunk (or a whole non-streamed response) says.
struct ChunkInfo {
  std::string text;  // completions: choices[0].text; chat: delta.content / message.content
  bool has_usage = false;
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;
  std::string error;  // an {"error": ...} object's message
};
ChunkInfo ParseChunk(Api api, const nlohmann::json& chunk);

// Incremental server-sent-events parser: feed bytes as they arrive, get the
// "data:" payloads of every completed event ("[DONE]" included).
class SseParser {
 public:
  std::vector<std::string> Feed(std::string_view bytes);

 private:
  std::string buffer_;
};

// gRPC client (grpc_client.cc).
std::unique_ptr<Client> MakeGrpcClient(const ClientOptions& options, bool keep_alive);

}  // namespace kvserve::bench
