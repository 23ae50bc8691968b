// server/config/: the serve config: the typed ServeConfig, its YAML and
// --set parser and its checks (config.h, this header), and the keys' help
// texts and the value lists the parser and `kvserve serve --help` share,
// taken from the cache's own tables (config_help.h).
//
// ServeConfig: everything `kvserve serve` reads from its YAML file and
// `--set key=value` overrides, as a typed struct with defaults.
//
// Six sections: model, cache, scheduler, server, limits, logging. Every key is
// known: an unknown key, a value of the wrong type or out of range stops
// start-up with the key path and the reason, e.g.
//   "cache.block_size: expected a positive integer, got 'abc'".
//
// String values may use ${VAR} and ${VAR:-fallback} (environment). Relative
// paths in the file (model.path, model.tokenizer) resolve against the file's
// directory; those given with --set against the current directory.
//
// model.chat_template: auto (the default) is resolved at parse time: the
// chat template the model directory ships (tokenizer_config.json or
// chat_template.jinja, see model/chat/hf_chat_template.h), else "plain".
//
// Thread-safety: plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_cross_layer.h"
#include "model/chat/chat_template.h"
#include "scheduler/engine_config.h"
#include "scheduler/request_validation.h"

namespace kvserve {

struct ServeConfig {
  struct Model {
    std::string path;            // checkpoint file, HF directory or "dummy:<preset>"; required
    std::string tokenizer;       // "" = found beside the model
    std::string name;            // the served name (OpenAI `model`); "" = from the model
    std::string device = "cpu";  // cpu | cuda | cuda:N
    int32_t threads = 0;  // CPU forward pass and quantizing at load; 0 = what the cgroup allows
    std::string dtype = "auto";  // auto | fp32 | fp16 | bf16 (auto: fp32 cpu, bf16 cuda)
    // Linear layers (CPU: int8 / int4 quantized at load; model/model_config.h).
    std::string weight_dtype = "auto";
    std::string weight_dtype_head = "auto";
    int32_t weight_group_size = 32;
    bool cuda_graphs = true;                // CUDA: replay decode steps from captured graphs
    std::string attention_kernel = "fast";  // CUDA: fast | reference
    bool mmap = false;  // mmap the weight files instead of reading them (risks: README)
    // auto (the checkpoint's own template, else plain), a built-in name or a
    // map of role patterns.
    ChatTemplate chat_template = ChatTemplate::Auto();
    // auto (the chat template's markers, else every format is tried), hermes,
    // llama3_json or mistral: how tool calls are parsed and constrained.
    std::string tool_call_format = "auto";
  } model;
  struct Cache {
    std::string kv_dtype = "fp32";  // one dtype or one per layer (cache/format/kv_dtype_spec.h)
    int32_t block_size = 16;
    int32_t num_blocks = 0;    // 0: from memory_bytes / memory_fraction / a default
    int64_t memory_bytes = 0;  // KV budget in bytes (accepts KiB/MiB/GiB suffixes)
    // Of the memory left after the weights (and, on CUDA, the activation
    // peak); 0: not set (CUDA then uses 0.9, the CPU its default budget).
    double memory_fraction = 0.0;
    int32_t num_swap_blocks = 0;
    int32_t int4_group_size = 64;
    bool prefix_caching = true;
    // KV eviction defaults (requests may override with kv_policy).
    std::string eviction_policy = "none";
    int32_t eviction_budget = 0;    // entries per sequence; 0: the model's sliding window
    int32_t sink_tokens = 4;        // streaming
    int32_t recent_tokens = 0;      // 0: derived (streaming: budget - sinks; others: budget / 2)
    int32_t eviction_history = 16;  // scissorhands
    std::string evictor_model;      // policy learned: the file `kvserve train-evictor` wrote
    // Low-rank KV latents: the file `kvserve calibrate-kv` wrote (CPU only;
    // docs/kv-low-rank.md); "": off.
    std::string low_rank;
    // Cross-layer KV sharing (cache/format/kv_cross_layer.h, CPU only;
    // docs/kv-cross-layer.md): cache.cross_layer.{from_layer, threshold,
    // retain}; from_layer -1: off.
    KvCrossLayerSpec cross_layer;
    // Tiers below the device pool (cache/tier/, docs/kv-tiers.md); 0 / "": off.
    int64_t host_tier_bytes = 0;
    std::string disk_tier_path;
    int64_t disk_tier_bytes = 0;
    std::string remote_tier_url;  // redis://host:port/db
    int32_t tier_load_timeout_ms = 1000;
  } cache;
  struct Scheduler {
    int32_t max_num_seqs = 64;
    int32_t max_num_batched_tokens = 512;
    int32_t max_model_len = 0;                  // 0: the model's
    std::string preemption_mode = "recompute";  // recompute | swap
    // per_client: clients (API keys, else peer hosts) take turns; fcfs:
    // arrival order; auto: per_client when API keys are configured.
    std::string fairness = "auto";
  } scheduler;
  struct Server {
    std::string host = "127.0.0.1";
    int32_t http_port = 8000;          // 0: any free port
    int32_t grpc_port = 50051;         // 0: any free port
    double shutdown_timeout = 30;      // seconds to finish in-flight work on SIGTERM
    int64_t max_body_bytes = 8 << 20;  // larger HTTP bodies get 413
    int32_t max_queue = 4096;          // waiting requests beyond this get 429
    std::string api_key;               // "" = no auth; else "Authorization: Bearer <key>"
    int32_t http_threads = 4;          // HTTP io threads (and as many prompt workers, both APIs)
    bool reuse_port = false;           // SO_REUSEPORT: share the ports with other processes
    // HTTP connection limits and TLS (server/http/http_server.h).
    double http_header_timeout_s = 10;           // a request head must arrive within this (408)
    double http_body_timeout_s = 30;             // a body within this after its head (408)
    double http_idle_timeout_s = 60;             // a kept-alive connection without a request closes
    double http_write_timeout_s = 30;            // a response write without progress closes
    int32_t max_connections = 4096;              // open HTTP connections; beyond: 503 and close
    int64_t http_stream_buffer_bytes = 1 << 20;  // unsent SSE bytes; beyond: request cancelled
    std::string api_key_file;                    // more API keys, one a line
    bool metrics_auth = false;                   // /metrics needs a key too (with keys)
    struct Tls {
      std::string cert_file;  // PEM certificate chain; with key_file: HTTPS
      std::string key_file;   // PEM private key
    } tls;
  } server;
  // The request cost budget (scheduler/request_validation.h), the same over
  // HTTP and gRPC, and the per-client concurrency limit
  // (server/admission/client_limiter.h). 0 for a derived limit means "from the served
  // model" as noted.
  struct Limits {
    int64_t max_prompt_bytes = 0;  // text prompt bytes before tokenizing; 0: 32 x max_prompt_tokens
    int64_t max_prompt_tokens = 0;     // 0: max_model_len
    int64_t max_generated_tokens = 0;  // n x max_tokens; 0: 64 x max_model_len
    int32_t max_n = kDefaultRequestLimits.max_samples;
    int32_t max_stop_strings = kDefaultRequestLimits.max_stop_strings;
    int32_t max_stop_bytes = kDefaultRequestLimits.max_stop_string_bytes;  // each stop string
    int32_t max_stop_token_ids = kDefaultRequestLimits.max_stop_token_ids;
    int32_t max_logprobs = kDefaultRequestLimits.max_logprobs;
    int32_t max_concurrent_per_client = 0;  // generation calls per API key / peer; 0: unlimited
    // Outputs a stream may hold for a client that does not read before the
    // request is cancelled.
    int32_t max_unsent_outputs = 4096;
  } limits;
  struct Logging {
    std::string level = "info";   // trace | debug | info | warn | error | critical | off
    std::string format = "text";  // text | json
  } logging;

  EngineConfig ToEngineConfig() const;
  // The limits section as the validator takes it (derived limits still 0:
  // see ResolveRequestLimits).
  RequestLimits ToRequestLimits() const;
};

// Parses YAML text. base_dir anchors relative paths ("" = leave them as is).
// overrides are "key.path=value" strings applied after the file.
absl::StatusOr<ServeConfig> ParseServeConfig(const std::string& yaml_text,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& overrides = {});
// Config files larger than this are refused before parsing.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{1} << 20;

// Reads and parses a config file; errors name the file too. A file over
// kMaxConfigFileBytes is refused unread.
absl::StatusOr<ServeConfig> LoadServeConfig(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

// Every key a config may hold, for --help ("cache.block_size", ...).
std::vector<std::string> ServeConfigKeys();
// One line of --help for a key ("" for an unknown key).
std::string ServeConfigKeyHelp(const std::string& key);

}  // namespace kvserve
