#include "server/config/config.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace kvserve {
namespace {

std::string Error(const absl::StatusOr<ServeConfig>& c) {
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

TEST_CASE("A minimal config takes every default", "[server]") {
  auto c = ParseServeConfig("model:\n  path: dummy:tiny\n", "/cfg");
  REQUIRE(c.ok());
  REQUIRE(c->model.path == "dummy:tiny");
  REQUIRE(c->model.device == "cpu");
  REQUIRE(c->model.threads == 0);
  REQUIRE(c->model.dtype == "auto");
  REQUIRE(c->model.cuda_graphs);
  REQUIRE(c->model.attention_kernel == "fast");
  REQUIRE(c->model.tool_call_format == "auto");
  REQUIRE(c->model.chat_template.name() == "plain");
  REQUIRE(c->model.chat_template.tool_call_format().empty());
  REQUIRE(c->cache.kv_dtype == "fp32");
  REQUIRE(c->cache.memory_fraction == 0.0);  // not set: each backend's default
  REQUIRE(c->cache.block_size == 16);
  REQUIRE(c->cache.prefix_caching);
  REQUIRE(c->scheduler.max_num_seqs == 64);
  REQUIRE(c->scheduler.preemption_mode == "recompute");
  REQUIRE(c->server.host == "127.0.0.1");
  REQUIRE(c->server.http_port == 8000);
  REQUIRE(c->server.grpc_port == 50051);
  REQUIRE(c->server.shutdown_timeout == 30);
  REQUIRE(c->server.max_body_bytes == 8 << 20);
  REQUIRE(c->server.api_key.empty());
  REQUIRE_FALSE(c->server.metrics_auth);
  REQUIRE_FALSE(c->model.mmap);
  REQUIRE(c->logging.level == "info");
  REQUIRE(c->logging.format == "text");
}

TEST_CASE("Every section is read into the typed struct", "[server]") {
  const char* yaml = R"(
model:
  path: models/x.bin
  tokenizer: /abs/tok.model
  name: tiny
  device: cuda:1
  threads: 3
  dtype: BF16
  cuda_graphs: false
  attention_kernel: reference
  tool_call_format: hermes
  chat_template: chatml
cache:
  kv_dtype: int8
  block_size: 32
  num_blocks: 100
  memory_bytes: 512MiB
  memory_fraction: 0.5
  num_swap_blocks: 8
  int4_group_size: 32
  prefix_caching: false
  eviction_policy: streaming
  eviction_budget: 256
  sink_tokens: 2
  recent_tokens: 254
  eviction_history: 8
  evictor_model: evictor.txt
scheduler:
  max_num_seqs: 8
  max_num_batched_tokens: 256
  max_model_len: 400
  preemption_mode: swap
server:
  host: 0.0.0.0
  http_port: 9000
  grpc_port: 9001
  shutdown_timeout: 2.5s
  max_body_bytes: 64k
  max_queue: 10
  api_key: secret
  http_threads: 4
logging:
  level: debug
  format: json
)";
  auto c = ParseServeConfig(yaml, "/etc/kvserve");
  REQUIRE(c.ok());
  SECTION("relative paths resolve against the config's directory") {
    REQUIRE(c->model.path == "/etc/kvserve/models/x.bin");
    REQUIRE(c->model.tokenizer == "/abs/tok.model");
  }
  SECTION("values keep their types") {
    REQUIRE(c->model.name == "tiny");
    REQUIRE(c->model.device == "cuda:1");
    REQUIRE(c->model.threads == 3);
    REQUIRE(c->model.dtype == "bf16");
    REQUIRE_FALSE(c->model.cuda_graphs);
    REQUIRE(c->model.attention_kernel == "reference");
    REQUIRE(c->model.chat_template.name() == "chatml");
    REQUIRE(c->model.tool_call_format == "hermes");
    REQUIRE(c->model.chat_template.tool_call_format() == "hermes");
    REQUIRE(c->cache.kv_dtype == "int8");
    REQUIRE(c->cache.block_size == 32);
    REQUIRE(c->cache.num_blocks == 100);
    REQUIRE(c->cache.memory_bytes == 512LL << 20);
    REQUIRE(c->cache.memory_fraction == 0.5);
    REQUIRE(c->cache.num_swap_blocks == 8);
    REQUIRE(c->cache.int4_group_size == 32);
    REQUIRE_FALSE(c->cache.prefix_caching);
    REQUIRE(c->scheduler.max_num_seqs == 8);
    REQUIRE(c->scheduler.max_num_batched_tokens == 256);
    REQUIRE(c->scheduler.max_model_len == 400);
    REQUIRE(c->server.host == "0.0.0.0");
    REQUIRE(c->server.http_port == 9000);
    REQUIRE(c->server.grpc_port == 9001);
    REQUIRE(c->server.shutdown_timeout == 2.5);
    REQUIRE(c->server.max_body_bytes == 64000);  // k is SI, as in Kubernetes
    REQUIRE(c->server.max_queue == 10);
    REQUIRE(c->server.api_key == "secret");
    REQUIRE(c->server.http_threads == 4);
    REQUIRE(c->logging.level == "debug");
    REQUIRE(c->logging.format == "json");
  }
  SECTION("the engine config carries the scheduler keys and the queue limit") {
    EngineConfig e = c->ToEngineConfig();
    REQUIRE(e.max_num_seqs == 8);
    REQUIRE(e.max_num_batched_tokens == 256);
    REQUIRE(e.max_model_len == 400);
    REQUIRE(e.max_queue_size == 10);
    REQUIRE(e.preemption_mode == PreemptionMode::kSwap);
    REQUIRE_FALSE(e.prefix_caching);
    REQUIRE(e.eviction.policy == EvictionPolicyKind::kStreaming);
    REQUIRE(e.eviction.budget == 256);
    REQUIRE(e.eviction.sink_tokens == 2);
    REQUIRE(e.eviction.recent_tokens == 254);
    REQUIRE(e.eviction.history == 8);
    REQUIRE(e.evictor_model == "/etc/kvserve/evictor.txt");
    REQUIRE(e.fair_clients);  // fairness auto with an API key
  }
}

TEST_CASE("scheduler.fairness: auto is per-client exactly when API keys are configured",
          "[server]") {
  auto fair = [](const std::string& body) {
    absl::StatusOr<ServeConfig> c = ParseServeConfig("model:\n  path: dummy:tiny\n" + body, "");
    REQUIRE(c.ok());
    return c->ToEngineConfig().fair_clients;
  };
  REQUIRE_FALSE(fair(""));
  REQUIRE(fair("server:\n  api_key: k\n"));
  REQUIRE(fair("server:\n  api_key_file: keys.txt\n"));
  REQUIRE_FALSE(fair("scheduler:\n  fairness: fcfs\nserver:\n  api_key: k\n"));
  REQUIRE(fair("scheduler:\n  fairness: per_client\n"));
  REQUIRE(fair("scheduler:\n  fairness: auto\nserver:\n  api_key: k\n"));
  REQUIRE(
      Error(ParseServeConfig("model:\n  path: dummy:tiny\nscheduler:\n  fairness: fifo\n", "")) ==
      "scheduler.fairness: expected one of auto, per_client, fcfs, got 'fifo'");
}

TEST_CASE("Bad values stop with the key path and the reason", "[server]") {
  auto parse = [](const std::string& body) {
    return ParseServeConfig("model:\n  path: dummy:tiny\n" + body, "");
  };
  REQUIRE(Error(parse("cache:\n  block_size: abc\n")) ==
          "cache.block_size: expected a positive integer, got 'abc'");
  REQUIRE(Error(parse("cache:\n  block_size: 0\n")) ==
          "cache.block_size: expected a positive integer, got '0'");
  REQUIRE(Error(parse("cache:\n  block_size: 16.5\n")) ==
          "cache.block_size: expected a positive integer, got '16.5'");
  REQUIRE(Error(parse("cache:\n  kv_dtype: int3\n")) ==
          "cache.kv_dtype: expected one of fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4, int4_kc, "
          "int2_kc, or one per layer (e.g. int8,int4_kc*,int8: NAME*N for N layers, NAME* for the "
          "rest), "
          "got 'int3'");
  REQUIRE(Error(parse("cache:\n  kv_dtype: int8,int4_kc**,int8\n")).rfind("cache.kv_dtype: ", 0) ==
          0);
  {
    // One dtype per layer: parsed here, checked against the model's layers when it loads.
    absl::StatusOr<ServeConfig> c = parse("cache:\n  kv_dtype: int8,int4_kc*,int8\n");
    REQUIRE(c.ok());
    REQUIRE(c->cache.kv_dtype == "int8,int4_kc*,int8");
    REQUIRE(parse("cache:\n  kv_dtype: int4_kc\n").ok());
    REQUIRE(parse("cache:\n  kv_dtype: int2_kc\n").ok());
    c = parse("cache:\n  kv_dtype: int8,int2_kc*,int8\n");
    REQUIRE(c.ok());
    REQUIRE(c->cache.kv_dtype == "int8,int2_kc*,int8");
  }
  REQUIRE(Error(parse("cache:\n  kv_dtype: int2\n")).rfind("cache.kv_dtype: expected one of", 0) ==
          0);
  REQUIRE(Error(parse("cache:\n  prefix_caching: maybe\n")) ==
          "cache.prefix_caching: expected true or false, got 'maybe'");
  REQUIRE(Error(parse("cache:\n  memory_fraction: 1.5\n")) ==
          "cache.memory_fraction: expected a number in (0, 1], got '1.5'");
  REQUIRE(Error(parse("cache:\n  memory_bytes: 12 parsecs\n")) ==
          "cache.memory_bytes: '12 parsecs' has an unknown unit (e.g. 80GiB = 80 x 1024^3, 80GB = "
          "80 x 1000^3, or a plain byte count)");
  REQUIRE(Error(parse("server:\n  http_port: 70000\n")) ==
          "server.http_port: expected a port number in [0, 65535], got '70000'");
  REQUIRE(Error(parse("server:\n  shutdown_timeout: -1\n")) ==
          "server.shutdown_timeout: expected a duration in seconds >= 0 (e.g. 30, 2.5s, 500ms, "
          "1m), got '-1'");
  REQUIRE(Error(parse("scheduler:\n  preemption_mode: pray\n")) ==
          "scheduler.preemption_mode: expected one of recompute, swap, got 'pray'");
  REQUIRE(Error(parse("cache:\n  eviction_policy: lru\n")) ==
          "cache.eviction_policy: expected one of none, sliding_window, streaming, h2o, "
          "scissorhands, learned, got 'lru'");
  REQUIRE(Error(parse("cache:\n  eviction_history: 65\n")) ==
          "cache.eviction_history: expected an integer in [1, 64], got '65'");
  REQUIRE(Error(parse("logging:\n  format: xml\n")) ==
          "logging.format: expected one of text, json, got 'xml'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: dummy:tiny\n  tool_call_format: qwen\n", "")) ==
          "model.tool_call_format: expected one of auto, hermes, llama3_json, mistral, got 'qwen'");
  REQUIRE(Error(parse("cache:\n  block_size: [1, 2]\n")) ==
          "cache.block_size: expected a single value, got 'a list'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  device: tpu\n", "")) ==
          "model.device: expected cpu, cuda or cuda:N, got 'tpu'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  device: cuda:x\n", "")) ==
          "model.device: expected cpu, cuda or cuda:N, got 'cuda:x'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  device: cuda:-1\n", "")) ==
          "model.device: expected cpu, cuda or cuda:N, got 'cuda:-1'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  dtype: int8\n", "")) ==
          "model.dtype: expected one of auto, fp32, fp16, bf16, got 'int8'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  weight_dtype: int5\n", "")) ==
          "model.weight_dtype: expected auto, fp32, fp16, bf16, int8, int4, int4_asym or fp8_e4m3, "
          "got 'int5'");
  {
    // fp8_e4m3 is a value of the key; whether it runs is the runner's check.
    absl::StatusOr<ServeConfig> c =
        ParseServeConfig("model:\n  path: x\n  weight_dtype: FP8_E4M3\n", "");
    REQUIRE(c.ok());
    REQUIRE(c->model.weight_dtype == "fp8_e4m3");
  }
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  weight_dtype_head: q6\n", "")) ==
          "model.weight_dtype_head: expected auto, fp32, fp16, bf16, int8, int4, int4_asym or "
          "fp8_e4m3, got 'q6'");
  {
    absl::StatusOr<ServeConfig> c = ParseServeConfig(
        "model:\n  path: x\n  weight_dtype: INT4\n  weight_dtype_head: int8\n  "
        "weight_group_size: 128\n",
        "");
    REQUIRE(c.ok());
    REQUIRE(c->model.weight_dtype == "int4");
    REQUIRE(c->model.weight_dtype_head == "int8");
    REQUIRE(c->model.weight_group_size == 128);
  }
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  cuda_graphs: sometimes\n", "")) ==
          "model.cuda_graphs: expected true or false, got 'sometimes'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  attention_kernel: flash\n", "")) ==
          "model.attention_kernel: expected one of fast, reference, got 'flash'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: x\n  threads: -1\n", "")) ==
          "model.threads: expected an integer in [0, 4096] (0: what the cgroup allows), got '-1'");
}

TEST_CASE("cache.low_rank: a file path, refused with eviction and tiers", "[server]") {
  auto parse = [](const std::string& body) {
    return ParseServeConfig("model:\n  path: dummy:tiny\ncache:\n  low_rank: m.lowrank\n" + body,
                            "/etc/kvserve");
  };
  absl::StatusOr<ServeConfig> c = parse("");
  REQUIRE(c.ok());
  REQUIRE(c->cache.low_rank == "/etc/kvserve/m.lowrank");
  REQUIRE(Error(parse("  eviction_policy: streaming\n")) ==
          "cache.low_rank: KV eviction is refused with low-rank latents (cache.eviction_policy "
          "streaming)");
  REQUIRE(Error(parse("  host_tier_bytes: 1GiB\n")) ==
          "cache.low_rank: KV tiers (cache.host_tier_bytes, cache.disk_tier_path, "
          "cache.remote_tier_url) are refused with low-rank latents");
}

TEST_CASE("cache.cross_layer: a nested map, refused with eviction, tiers and low rank",
          "[server]") {
  auto parse = [](const std::string& body) {
    return ParseServeConfig(
        "model:\n  path: dummy:tiny\ncache:\n  cross_layer:\n    from_layer: 2\n"
        "    threshold: 0.2\n" +
            body,
        "/etc/kvserve");
  };
  absl::StatusOr<ServeConfig> c = parse("");
  REQUIRE(c.ok());
  REQUIRE(c->cache.cross_layer.from_layer == 2);
  REQUIRE(c->cache.cross_layer.threshold == 0.2);
  REQUIRE(c->cache.cross_layer.retain == KvCrossLayerSpec::kDefaultRetain);
  REQUIRE(!ParseServeConfig("model:\n  path: dummy:tiny\n", "")->cache.cross_layer.enabled());
  REQUIRE(Error(parse("    retain: 0\n")) ==
          "cache.cross_layer.retain: expected a fraction of a block's slots in (0, 1], got '0'");
  REQUIRE(Error(parse("    thresold: 1\n")).starts_with("cache.cross_layer.thresold: unknown key"));
  REQUIRE(Error(parse("  eviction_policy: h2o\n")) ==
          "cache.cross_layer: KV eviction is refused with cross-layer pages "
          "(cache.eviction_policy h2o)");
  REQUIRE(Error(parse("  disk_tier_path: kv.bin\n")) ==
          "cache.cross_layer: KV tiers (cache.host_tier_bytes, cache.disk_tier_path, "
          "cache.remote_tier_url) are refused with cross-layer pages");
  REQUIRE(Error(parse("  low_rank: m.lowrank\n")) ==
          "cache.cross_layer: not with cache.low_rank (its latents are not a layer's K/V)");
}

TEST_CASE("Every key has one line of --help", "[server]") {
  for (const std::string& key : ServeConfigKeys()) {
    INFO(key);
    REQUIRE_FALSE(ServeConfigKeyHelp(key).empty());
  }
  REQUIRE(ServeConfigKeyHelp("model.dtype") ==
          "weights and activations: auto (fp32 on cpu, bf16 on cuda), fp32, fp16 or bf16; the CPU "
          "backend computes in fp32 only");
  REQUIRE(ServeConfigKeyHelp("cache.nonsense").empty());
}

TEST_CASE("Unknown keys and sections are refused, naming what is known", "[server]") {
  auto c = ParseServeConfig("model:\n  path: x\ncache:\n  blocksize: 16\n", "");
  REQUIRE(Error(c).rfind("cache.blocksize: unknown key (cache has: kv_dtype, block_size,", 0) == 0);
  c = ParseServeConfig("model:\n  path: x\ncaches:\n  block_size: 16\n", "");
  REQUIRE(Error(c) ==
          "caches: unknown section (sections: model, cache, scheduler, server, limits, logging)");
  c = ParseServeConfig("- a\n- b\n", "");
  REQUIRE(Error(c) == "the config must be a map of sections (model, cache, ...)");
  c = ParseServeConfig("model: [\n", "");
  REQUIRE(Error(c).rfind("YAML syntax error", 0) == 0);
}

TEST_CASE("Eviction settings are checked as a whole, naming the key", "[server]") {
  REQUIRE(Error(ParseServeConfig("model: {path: x}\ncache: {eviction_policy: h2o}\n", "")) ==
          "cache.eviction_budget must be >= 2 for h2o, got 0");
  REQUIRE(Error(ParseServeConfig("model: {path: x}\ncache: {eviction_policy: streaming, "
                                 "eviction_budget: 64, sink_tokens: 4, recent_tokens: 64}\n",
                                 "")) ==
          "cache.recent_tokens (64) + cache.sink_tokens (4) must equal cache.eviction_budget (64) "
          "for streaming");
  REQUIRE(Error(ParseServeConfig(
              "model: {path: x}\ncache: {eviction_policy: learned, eviction_budget: 64}\n", "")) ==
          "cache.eviction_policy learned needs cache.evictor_model (kvserve train-evictor)");
  // sliding_window may take the model's own window.
  REQUIRE(
      ParseServeConfig("model: {path: x}\ncache: {eviction_policy: sliding_window}\n", "").ok());
}

TEST_CASE("Whole-config rules name the key to fix", "[server]") {
  REQUIRE(Error(ParseServeConfig("cache:\n  block_size: 16\n", "")) ==
          "model.path: required (a llama2.c checkpoint, an HF directory or dummy:<preset>)");
  REQUIRE(Error(ParseServeConfig("model: {path: x}\nserver: {http_port: 9000, grpc_port: 9000}\n",
                                 "")) ==
          "server.grpc_port: must differ from server.http_port (both 9000)");
  REQUIRE(
      Error(ParseServeConfig(
          "model: {path: x}\nscheduler: {max_num_seqs: 64, max_num_batched_tokens: 32}\n", "")) ==
      "scheduler.max_num_batched_tokens: must be >= scheduler.max_num_seqs (32 < 64)");
  REQUIRE(Error(ParseServeConfig("model: {path: x}\nscheduler: {preemption_mode: swap}\n", "")) ==
          "cache.num_swap_blocks: must be > 0 when scheduler.preemption_mode is swap");
  REQUIRE(ParseServeConfig("model: {path: x}\nserver: {http_port: 0, grpc_port: 0}\n", "").ok());
}

TEST_CASE("Every pairwise config rule accepts its boundary and refuses one past it", "[server]") {
  struct Rule {
    const char* what;
    std::string at_boundary;  // valid
    std::string past;         // refused with `error`
    std::string error;
  };
  const Rule rules[] = {
      {"max_num_batched_tokens >= max_num_seqs",
       "scheduler: {max_num_seqs: 64, max_num_batched_tokens: 64}\n",
       "scheduler: {max_num_seqs: 64, max_num_batched_tokens: 63}\n",
       "scheduler.max_num_batched_tokens: must be >= scheduler.max_num_seqs (63 < 64)"},
      {"grpc_port differs from http_port", "server: {http_port: 9000, grpc_port: 9001}\n",
       "server: {http_port: 9001, grpc_port: 9001}\n",
       "server.grpc_port: must differ from server.http_port (both 9001)"},
      {"swap needs a swap pool",
       "scheduler: {preemption_mode: swap}\ncache: {num_swap_blocks: 1}\n",
       "scheduler: {preemption_mode: swap}\ncache: {num_swap_blocks: 0}\n",
       "cache.num_swap_blocks: must be > 0 when scheduler.preemption_mode is swap"},
      {"streaming sink_tokens <= eviction_budget - 1",
       "cache: {eviction_policy: streaming, eviction_budget: 8, sink_tokens: 7}\n",
       "cache: {eviction_policy: streaming, eviction_budget: 8, sink_tokens: 8}\n",
       "cache.sink_tokens must be in [0, cache.eviction_budget - 1 = 7], got 8"},
      {"streaming recent_tokens + sink_tokens == eviction_budget",
       "cache: {eviction_policy: streaming, eviction_budget: 8, sink_tokens: 2, recent_tokens: "
       "6}\n",
       "cache: {eviction_policy: streaming, eviction_budget: 8, sink_tokens: 2, recent_tokens: "
       "7}\n",
       "cache.recent_tokens (7) + cache.sink_tokens (2) must equal cache.eviction_budget (8) for "
       "streaming"},
      {"h2o recent_tokens <= eviction_budget - 1",
       "cache: {eviction_policy: h2o, eviction_budget: 8, recent_tokens: 7}\n",
       "cache: {eviction_policy: h2o, eviction_budget: 8, recent_tokens: 8}\n",
       "cache.recent_tokens must be in [0, cache.eviction_budget - 1 = 7] for h2o (0: "
       "cache.eviction_budget / 2), got 8"},
      {"eviction_budget >= 2", "cache: {eviction_policy: h2o, eviction_budget: 2}\n",
       "cache: {eviction_policy: h2o, eviction_budget: 1}\n",
       "cache.eviction_budget must be >= 2 for h2o, got 1"},
  };
  for (const Rule& r : rules) {
    INFO(r.what);
    absl::StatusOr<ServeConfig> ok = ParseServeConfig("model: {path: x}\n" + r.at_boundary, "");
    INFO((ok.ok() ? std::string("ok") : std::string(ok.status().message())));
    REQUIRE(ok.ok());
    REQUIRE(Error(ParseServeConfig("model: {path: x}\n" + r.past, "")) == r.error);
  }
}

TEST_CASE("Overrides (--set) apply after the file and are checked the same way", "[server]") {
  const std::string yaml = "model:\n  path: m.bin\ncache:\n  block_size: 16\n";
  SECTION("a valid override wins") {
    auto c = ParseServeConfig(
        yaml, "/d", {"cache.block_size=32", "server.http_port=0", "model.tokenizer=t.model"});
    REQUIRE(c.ok());
    REQUIRE(c->cache.block_size == 32);
    REQUIRE(c->server.http_port == 0);
    // Command-line paths are the user's, relative to the current directory.
    REQUIRE(c->model.tokenizer == "t.model");
    REQUIRE(c->model.path == "/d/m.bin");
  }
  SECTION("a bad override names its key") {
    REQUIRE(Error(ParseServeConfig(yaml, "", {"cache.block_size=abc"})) ==
            "cache.block_size: expected a positive integer, got 'abc'");
    REQUIRE(
        Error(ParseServeConfig(yaml, "", {"cache.blok=1"})).rfind("cache.blok: unknown key", 0) ==
        0);
    REQUIRE(Error(ParseServeConfig(yaml, "", {"nonsense"})) ==
            "--set nonsense: expected key.path=value (e.g. cache.block_size=32)");
  }
}

TEST_CASE("Environment variables expand in values, with fallbacks", "[server]") {
  setenv("KVSERVE_TEST_MODEL_DIR", "/models/tiny", 1);
  unsetenv("KVSERVE_TEST_UNSET");
  auto c = ParseServeConfig(
      "model:\n  path: ${KVSERVE_TEST_MODEL_DIR}/m.bin\n"
      "  tokenizer: ${KVSERVE_TEST_UNSET:-${KVSERVE_TEST_MODEL_DIR}/fallback}/tok.model\n"
      "server:\n  http_port: ${KVSERVE_TEST_UNSET:-8123}\n",
      "/cfg");
  REQUIRE(c.ok());
  REQUIRE(c->model.path == "/models/tiny/m.bin");
  REQUIRE(c->model.tokenizer == "/models/tiny/fallback/tok.model");
  REQUIRE(c->server.http_port == 8123);
  REQUIRE(Error(ParseServeConfig("model:\n  path: ${KVSERVE_TEST_UNSET}/m.bin\n", "")) ==
          "model.path: environment variable KVSERVE_TEST_UNSET is not set (use "
          "${KVSERVE_TEST_UNSET:-fallback})");
}

TEST_CASE("A chat template is a built-in name or a map of role patterns", "[server]") {
  auto c = ParseServeConfig(
      "model:\n  path: x\n  chat_template:\n    user: \"[U] {content}\\n\"\n"
      "    default: \"<{role}> {content}\\n\"\n    generation_prompt: \"[A]\"\n",
      "");
  REQUIRE(c.ok());
  REQUIRE(c->model.chat_template.name() == "custom");
  std::vector<ChatMessage> m = {{"system", "be brief"}, {"user", "hi"}};
  REQUIRE(*c->model.chat_template.Render(m) == "<system> be brief\n[U] hi\n[A]");
  REQUIRE(
      Error(ParseServeConfig("model:\n  path: x\n  chat_template: jinja\n", "")) ==
      "model.chat_template: expected auto, a built-in template (plain, chatml, llama3) or a map of "
      "role patterns, got 'jinja'");
  REQUIRE(
      Error(ParseServeConfig("model:\n  path: x\n  chat_template:\n    user: \"{text}\"\n", "")) ==
      "model.chat_template.user: unknown placeholder {text} (known: {role}, {content})");
}

TEST_CASE("model.chat_template: auto takes the checkpoint's own template, else plain", "[server]") {
  const std::string dir = testing::MakeTempDir("config-chat-template");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"})";
  const std::vector<ChatMessage> m = {{"user", "hi"}};

  auto c = ParseServeConfig("model:\n  path: " + dir + "\n", "");
  REQUIRE(c.ok());
  REQUIRE(c->model.chat_template.name() == "checkpoint");
  REQUIRE(*c->model.chat_template.Render(m) == "<s><user>hi");
  // A single-file model: the tokenizer's directory.
  c = ParseServeConfig("model:\n  path: m.bin\n  tokenizer: " + dir + "/tokenizer.json\n", "");
  REQUIRE(c->model.chat_template.name() == "checkpoint");
  // An explicit built-in, in the file or with --set, overrides.
  c = ParseServeConfig("model:\n  path: " + dir + "\n  chat_template: chatml\n", "");
  REQUIRE(c->model.chat_template.name() == "chatml");
  c = ParseServeConfig("model:\n  path: " + dir + "\n", "", {"model.chat_template=plain"});
  REQUIRE(c->model.chat_template.name() == "plain");
  c = ParseServeConfig("model:\n  path: x\n  chat_template: chatml\n", "",
                       {"model.chat_template=auto"});
  REQUIRE(c->model.chat_template.name() == "plain");  // x has no template

  const std::string broken = testing::MakeTempDir("config-chat-template");
  std::ofstream(broken + "/tokenizer_config.json")
      << R"({"chat_template": "{% if %}x{% endif %}"})";
  REQUIRE(Error(ParseServeConfig("model:\n  path: " + broken + "\n", "")) ==
          "model.chat_template: " + broken +
              "/tokenizer_config.json: chat template line 1: expected an expression, got '%}' (set "
              "model.chat_template to plain, chatml, llama3 or a map of role patterns to serve "
              "without it)");
  REQUIRE(ParseServeConfig("model:\n  path: " + broken + "\n  chat_template: plain\n", "").ok());
}

TEST_CASE("The shipped configs parse", "[server]") {
  setenv("KVSERVE_MODEL_DIR", "/models/stories260k", 1);
  auto c = LoadServeConfig(std::string(KVSERVE_SOURCE_DIR) + "/configs/default.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->model.path == "/models/stories260k/stories260K.bin");
  REQUIRE(c->model.device == "cpu");
  REQUIRE(c->model.chat_template.name() == "plain");  // auto: llama2.c ships no template
  unsetenv("KVSERVE_MODEL_DIR");
  auto fallback = LoadServeConfig(std::string(KVSERVE_SOURCE_DIR) + "/configs/default.yaml");
  REQUIRE(fallback.ok());
  REQUIRE(fallback->model.path.ends_with("/shared/models/stories260k/stories260K.bin"));

  auto h200 = LoadServeConfig(std::string(KVSERVE_SOURCE_DIR) + "/configs/llama3-8b-h200.yaml");
  REQUIRE(h200.ok());
  REQUIRE(h200->model.device == "cuda");
  REQUIRE(h200->model.dtype == "bf16");
  REQUIRE(h200->model.cuda_graphs);
  REQUIRE(h200->cache.memory_fraction == 0.9);
  REQUIRE(h200->cache.kv_dtype == "int8");
  REQUIRE(h200->model.chat_template.name() == "llama3");

  REQUIRE(LoadServeConfig("/nonexistent/kvserve.yaml").status().message() ==
          "/nonexistent/kvserve.yaml: cannot read the config file");
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("The limits section sets the request cost budget", "[server]") {
  auto c = ParseServeConfig("model:\n  path: dummy:tiny\n", "/cfg");
  REQUIRE(c.ok());
  // Defaults: the derived limits stay 0 until the model's max_model_len is known.
  RequestLimits l = c->ToRequestLimits();
  REQUIRE(l.max_prompt_bytes == 0);
  REQUIRE(l.max_prompt_tokens == 0);
  REQUIRE(l.max_generated_tokens == 0);
  REQUIRE(l.max_stop_strings == 16);
  REQUIRE(l.max_stop_string_bytes == 256);
  REQUIRE(l.max_logprobs == 20);
  REQUIRE(l.max_samples == 64);
  REQUIRE(c->limits.max_concurrent_per_client == 0);
  REQUIRE(c->limits.max_unsent_outputs == 4096);
  const RequestLimits r = ResolveRequestLimits(l, 512);
  REQUIRE(r.max_prompt_tokens == 512);
  REQUIRE(r.max_prompt_bytes == 32 * 512);
  REQUIRE(r.max_generated_tokens == 64 * 512);

  c = ParseServeConfig(
      "model:\n  path: dummy:tiny\nlimits:\n  max_prompt_bytes: 1MiB\n  max_prompt_tokens: 100\n"
      "  max_generated_tokens: 1000\n  max_n: 4\n  max_stop_strings: 2\n  max_stop_bytes: 8\n"
      "  max_stop_token_ids: 3\n  max_logprobs: 5\n  max_concurrent_per_client: 7\n"
      "  max_unsent_outputs: 9\n",
      "/cfg");
  REQUIRE(c.ok());
  l = c->ToRequestLimits();
  REQUIRE(l.max_prompt_bytes == 1 << 20);
  REQUIRE(l.max_prompt_tokens == 100);
  REQUIRE(l.max_generated_tokens == 1000);
  REQUIRE(l.max_samples == 4);
  REQUIRE(l.max_stop_strings == 2);
  REQUIRE(l.max_stop_string_bytes == 8);
  REQUIRE(l.max_stop_token_ids == 3);
  REQUIRE(l.max_logprobs == 5);
  REQUIRE(c->limits.max_concurrent_per_client == 7);
  REQUIRE(c->limits.max_unsent_outputs == 9);
  // Set limits are kept as they are; the engine gets the same ones.
  REQUIRE(ResolveRequestLimits(l, 512).max_prompt_tokens == 100);
  REQUIRE(c->ToEngineConfig().request_limits.max_stop_strings == 2);
  REQUIRE(Error(ParseServeConfig("model:\n  path: dummy:tiny\nlimits:\n  max_n: 0\n", "/cfg")) ==
          "limits.max_n: expected an integer in [1, 4096], got '0'");
  REQUIRE(Error(ParseServeConfig("model:\n  path: dummy:tiny\nlimits:\n  max_prompt: 1\n", "/cfg"))
              .starts_with("limits.max_prompt: unknown key (limits has: max_prompt_bytes, "));
}

TEST_CASE("A config file over 1 MiB is refused before it is parsed", "[server]") {
  const std::string dir = testing::MakeTempDir("big_config");
  const std::string path = dir + "/big.yaml";
  {
    // The 25 MB YAML map of the report: parsing it took 9 s and 1 GB.
    std::ofstream out(path);
    out << "model:\n  path: dummy:tiny\nextra:\n";
    for (int i = 0; out.tellp() < (25 << 20); ++i) out << "  key" << i << ": value\n";
  }
  const auto start = absl::Now();
  absl::StatusOr<ServeConfig> c = LoadServeConfig(path);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  REQUIRE(Error(c) == path + ": the config file has " +
                          std::to_string(std::filesystem::file_size(path)) +
                          " bytes, more than the 1048576 (1 MiB) a config may have");
  INFO(seconds);
  // A parse would take seconds; refusing reads nothing. Compared with
  // parsing a file at the limit (1 MiB), it is the faster.
  {
    std::ofstream out(path, std::ios::trunc);
    out << "model:\n  path: dummy:tiny\nextra:\n";
    for (int i = 0; out.tellp() < (1 << 20) - 64; ++i) out << "  key" << i << ": value\n";
  }
  const auto start2 = absl::Now();
  // Under the limit it is parsed (and the unknown section named).
  REQUIRE(Error(LoadServeConfig(path)).find("extra: unknown section") != std::string::npos);
  REQUIRE(seconds < absl::ToDoubleSeconds(absl::Now() - start2));
}

}  // namespace
}  // namespace kvserve
