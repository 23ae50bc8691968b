#include "server/config/config_help.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/eviction/eviction_params.h"
#include "cache/format/kv_format.h"
#include "server/config/config.h"

namespace kvserve {

std::vector<std::string> EvictionPolicyNames() {
  std::vector<std::string> names;
  for (EvictionPolicyKind k : kAllEvictionPolicies) names.emplace_back(EvictionPolicyName(k));
  return names;
}

std::string OneOf(const std::vector<std::string>& names) {
  if (names.size() < 2) return absl::StrJoin(names, "");
  return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "), " or ", names.back());
}

std::vector<std::string> KvDtypeNames() {
  std::vector<std::string> names;
  for (KvDtype d : kCpuKvDtypes) names.emplace_back(KvDtypeName(d));
  return names;
}

std::string ServeConfigKeyHelp(const std::string& key) {
  static const std::map<std::string, std::string>* help = new std::map<std::string, std::string>{
      {"model.path",
       "llama2.c checkpoint, HF directory (config.json + *.safetensors) or dummy:<preset>"},
      {"model.tokenizer",
       "tokenizer.json or SentencePiece .model; empty: the HF directory's own, or the .model "
       "beside a llama2.c checkpoint"},
      {"model.name", "the served model name (OpenAI `model`); empty: from the model"},
      {"model.device", "cpu, cuda (device 0) or cuda:N"},
      {"model.threads",
       "CPU forward-pass threads, also quantizing model.weight_dtype at load; 0: what the cgroup "
       "CPU quota and the affinity mask allow"},
      {"model.dtype",
       "weights and activations: auto (fp32 on cpu, bf16 on cuda), fp32, fp16 or bf16; the CPU "
       "backend computes in fp32 only"},
      {"model.weight_dtype",
       "linear layers: auto (as model.dtype), fp32, int8 (per channel), int4 (per group, "
       "model.weight_group_size; llama.cpp's q4_0) or int4_asym (int4 with a per-group offset: "
       "q4_1, 0.5 bits a weight more at group 32, less error), quantized at load on the CPU; "
       "fp8_e4m3 (per channel, fp8 GEMMs; CUDA with bf16 / fp16 activations; an fp8 checkpoint "
       "loads as shipped)"},
      {"model.weight_dtype_head",
       "the output head: auto (fp32 for vocabularies under 32768 tokens, else int8 when "
       "model.weight_dtype quantizes, fp8_e4m3 for fp8_e4m3), fp32, int8, int4, int4_asym or "
       "fp8_e4m3"},
      {"model.weight_group_size", "int4 / int4_asym inputs per scale: 32 (default) or 128"},
      {"model.mmap",
       "mmap the weight files instead of reading them into memory (false): faster start, shared "
       "page cache, but a file truncated while served kills the daemon (SIGBUS) and one "
       "rewritten in place changes the served weights"},
      {"model.cuda_graphs", "CUDA: replay decode steps from graphs captured per batch size (true)"},
      {"model.attention_kernel",
       "CUDA: fast (tensor cores; fp16/bf16/fp8/int8/int4/k8v4 pages at head_dim 64, 128 or 256, "
       "else the reference kernel) or reference (the simple kernel, to compare or fall back)"},
      {"model.tool_call_format",
       "auto (the chat template's markers, else every format is tried), hermes (<tool_call> "
       "tags), llama3_json or mistral ([TOOL_CALLS]): how tool calls are parsed and framed"},
      {"model.chat_template",
       "auto (the checkpoint's own template, else plain), plain, chatml, llama3, or a map of "
       "role patterns"},
      {"cache.kv_dtype", absl::StrCat("KV page format: ", OneOf(KvDtypeNames()),
                                      ", or one per layer (int8,int4_kc*,int8)")},
      {"cache.block_size", "tokens per KV block (16)"},
      {"cache.num_blocks",
       "KV blocks in the pool; 0: from memory_bytes / memory_fraction / default"},
      {"cache.memory_bytes", "KV pool budget in bytes (e.g. 40GiB); 0: not set"},
      {"cache.memory_fraction",
       "KV pool share of the memory left after the weights (CUDA: and the measured activation "
       "peak), in (0, 1]; unset: 0.9 on cuda, the CPU default budget on cpu"},
      {"cache.num_swap_blocks", "blocks of the host swap pool (pinned memory on cuda)"},
      {"cache.int4_group_size", "channels per int4 scale group"},
      {"cache.prefix_caching", "reuse cached prompt prefixes (true)"},
      {"cache.eviction_policy",
       absl::StrCat("KV eviction: ", OneOf(EvictionPolicyNames()), " (none)")},
      {"cache.eviction_budget",
       "KV entries a sequence keeps when evicting; 0: the model's sliding_window"},
      {"cache.sink_tokens", "streaming: first tokens always kept (4)"},
      {"cache.recent_tokens",
       "recent tokens always kept; 0: budget - sink_tokens (streaming), budget / 2 (others)"},
      {"cache.eviction_history", "scissorhands: steps of attention history, 1..64 (16)"},
      {"cache.evictor_model", "learned: the predictor `kvserve train-evictor` wrote"},
      {"cache.low_rank",
       "low-rank KV latents: the file `kvserve calibrate-kv` wrote (CPU only; no eviction, no "
       "tiers, no int4_kc; docs/kv-low-rank.md)"},
      {"cache.cross_layer.from_layer",
       "cross-layer KV sharing: first merged layer, pairs (L, L+1), (L+2, L+3), ... (CPU only; no "
       "eviction, no tiers, no int4_kc/int2_kc, no cache.low_rank; docs/kv-cross-layer.md); -1: "
       "off"},
      {"cache.cross_layer.threshold",
       "cross-layer: angle / pi above which a token stays unmerged, in [0, 1] (0.1)"},
      {"cache.cross_layer.retain",
       "cross-layer: fraction of a block's slots that can hold unmerged tokens, in (0, 1] "
       "(0.125)"},
      {"cache.host_tier_bytes",
       "host-memory tier for prefix blocks leaving the device pool (e.g. 8GiB; pinned on "
       "CUDA); 0: none"},
      {"cache.disk_tier_path", "disk tier: one preallocated file, kept across restarts"},
      {"cache.disk_tier_bytes", "disk tier size (e.g. 100GiB)"},
      {"cache.remote_tier_url", "shared tier: redis://host:port/db (Redis or Valkey)"},
      {"cache.tier_load_timeout_ms",
       "a disk or remote KV load the request waits for longer than this is abandoned and the "
       "prompt recomputed (1000)"},
      {"scheduler.max_num_seqs", "most sequences in one step"},
      {"scheduler.max_num_batched_tokens", "most tokens in one step"},
      {"scheduler.max_model_len", "longest sequence (prompt + output); 0: the model's"},
      {"scheduler.preemption_mode", "recompute or swap (needs cache.num_swap_blocks)"},
      {"scheduler.fairness",
       "per_client (clients take turns), fcfs, or auto (per_client with API keys)"},
      {"server.host", "address the HTTP and gRPC servers listen on"},
      {"server.http_port", "OpenAI-compatible HTTP port; 0: any free port"},
      {"server.grpc_port", "gRPC port; 0: any free port"},
      {"server.shutdown_timeout", "seconds in-flight requests get to finish on SIGTERM"},
      {"server.max_body_bytes", "largest HTTP request body"},
      {"server.max_queue", "waiting requests beyond this get 429 / RESOURCE_EXHAUSTED"},
      {"server.api_key", "require Authorization: Bearer <key>; empty: no auth"},
      {"server.http_threads",
       "HTTP io threads, and as many prompt workers parsing and tokenizing the requests of "
       "both front ends (4); connections and streams take no thread of their own"},
      {"server.reuse_port", "SO_REUSEPORT: share the ports with other kvserve processes (false)"},
      {"server.http_header_timeout_s",
       "seconds: a request head must arrive within this of its first byte (of the accept on a "
       "new connection), else 408 and close (10)"},
      {"server.http_body_timeout_s",
       "seconds: a request body must arrive within this after its head, else 408 and close (30)"},
      {"server.http_idle_timeout_s",
       "seconds: a kept-alive connection with no new request is closed after this (60)"},
      {"server.http_write_timeout_s",
       "seconds: a response write that makes no progress this long closes the connection (30)"},
      {"server.max_connections",
       "integer: open HTTP connections; one more is answered 503 and closed (4096)"},
      {"server.http_stream_buffer_bytes",
       "bytes: unsent SSE output per stream; a client that stops reading past this has its "
       "request cancelled and the connection closed (1MiB)"},
      {"server.api_key_file",
       "path: more API keys, one a line ('#' comments); any configured key is accepted"},
      {"server.metrics_auth",
       "with API keys, /metrics needs one too (Bearer, as /v1/); Prometheus then scrapes with a "
       "key (false: /metrics is open, its counters are every tenant's)"},
      {"server.tls.cert_file",
       "path: PEM certificate chain; with server.tls.key_file the HTTP port speaks HTTPS only"},
      {"server.tls.key_file", "path: PEM private key of server.tls.cert_file"},
      {"limits.max_prompt_bytes",
       "bytes of a text prompt (chat: as rendered), refused before tokenizing; 0: 32 x "
       "max_prompt_tokens"},
      {"limits.max_prompt_tokens", "tokens of a prompt; 0: max_model_len"},
      {"limits.max_generated_tokens",
       "n x max_tokens, the tokens one request may ask for; 0: 64 x max_model_len"},
      {"limits.max_n", "samples per request (n); the engine also holds it to max_num_seqs (64)"},
      {"limits.max_stop_strings", "stop strings per request (16)"},
      {"limits.max_stop_bytes", "bytes of each stop string (256)"},
      {"limits.max_stop_token_ids", "stop_token_ids per request (256)"},
      {"limits.max_logprobs", "logprobs alternatives per token (20)"},
      {"limits.max_concurrent_per_client",
       "generation calls open at once per API key (or peer address without auth); over it: 429 / "
       "RESOURCE_EXHAUSTED; 0: unlimited"},
      {"limits.max_unsent_outputs",
       "outputs a stream holds for a client that stopped reading before the request is "
       "cancelled (4096)"},
      {"logging.level", "trace, debug, info, warn, error, critical or off"},
      {"logging.format", "text or json"},
  };
  auto it = help->find(key);
  return it == help->end() ? "" : it->second;
}

}  // namespace kvserve
