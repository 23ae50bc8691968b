#include "server/engine_builder.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/cpu/cpu_threads.h"
#include "model/loader/dummy_model.h"
#include "model/loader/model_loader.h"
#include "model/runner_factory.h"
#include "spdlog/spdlog.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status WithKey(const char* key, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(key, ": ", std::string(s.message())));
}

absl::StatusOr<RunnerOptions> RunnerOptionsFor(const ServeConfig& config) {
  RunnerOptions ro;
  ro.device = config.model.device;
  ro.dtype = config.model.dtype;
  ro.weight_dtype = config.model.weight_dtype;
  ro.weight_dtype_head = config.model.weight_dtype_head;
  ro.weight_group_size = config.model.weight_group_size;
  ro.cuda_graphs = config.model.cuda_graphs;
  ro.attention_kernel = config.model.attention_kernel;
  // One dtype, or one per layer (cache/format/kv_dtype_spec.h); errors name cache.kv_dtype.
  absl::StatusOr<KvDtypeSpec> kv_dtype = KvDtypeSpec::Parse(config.cache.kv_dtype);
  if (!kv_dtype.ok()) return kv_dtype.status();
  ro.kv_dtype = *kv_dtype;
  ro.block_size = config.cache.block_size;
  ro.num_blocks = config.cache.num_blocks;
  ro.memory_bytes = config.cache.memory_bytes;
  ro.memory_fraction = config.cache.memory_fraction;
  ro.num_swap_blocks = config.cache.num_swap_blocks;
  ro.int4_group_size = config.cache.int4_group_size;
  ro.low_rank = config.cache.low_rank;
  ro.cross_layer = config.cache.cross_layer;
  ro.num_threads = config.model.threads > 0 ? config.model.threads : DefaultCpuThreads();
  ro.max_num_seqs = config.scheduler.max_num_seqs;
  ro.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
  ro.max_model_len = config.scheduler.max_model_len;
  return ro;
}

}  // namespace

absl::Status CheckBeforeLoad(const ServeConfig& config) {
  KV_ASSIGN_OR_RETURN(RunnerOptions ro, RunnerOptionsFor(config));
  KV_RETURN_IF_ERROR(CheckRunnerDevice(ro));
  const std::string& path = config.model.path;
  if (path.rfind(kDummyPrefix, 0) == 0) {
    return DummyPresetConfig(path).status().ok()
               ? absl::OkStatus()
               : WithKey("model.path", DummyPresetConfig(path).status());
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("model.path: ", path, " does not exist"));
  }
  if (!config.cache.low_rank.empty() && !std::filesystem::exists(config.cache.low_rank, ec)) {
    return absl::NotFoundError(
        absl::StrCat("cache.low_rank: ", config.cache.low_rank, " does not exist"));
  }
  if (!config.model.tokenizer.empty() && !std::filesystem::exists(config.model.tokenizer, ec)) {
    return absl::NotFoundError(
        absl::StrCat("model.tokenizer: ", config.model.tokenizer, " does not exist"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BuiltEngine> BuildEngine(
    const ServeConfig& config, std::function<void(const RequestMetrics&)> on_request_finished) {
  KV_ASSIGN_OR_RETURN(RunnerOptions ro, RunnerOptionsFor(config));
  // Fail on the device before reading gigabytes of weights.
  if (absl::Status device = CheckRunnerDevice(ro); !device.ok()) return device;

  absl::StatusOr<LoadedModel> loaded =
      LoadModel(config.model.path, config.model.tokenizer, RunnerDefersDummyWeights(ro),
                config.model.mmap ? FileAccess::kMmap : FileAccess::kRead);
  if (!loaded.ok()) return WithKey("model.path", loaded.status());
  const ModelConfig mc = loaded->weights.config;
  const std::string fingerprint = loaded->weights.fingerprint;
  const int32_t max_model_len = config.scheduler.max_model_len > 0 ? config.scheduler.max_model_len
                                                                   : mc.max_position_embeddings;

  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(std::move(loaded->weights), ro);
  if (!runner.ok()) return runner.status();
  const RunnerMemoryInfo memory = (*runner)->memory_info();

  EngineConfig ec = config.ToEngineConfig();
  // Dummy weights have no file: their preset (and fixed seed) names them.
  ec.weights_fingerprint = fingerprint.empty() ? config.model.path : fingerprint;
  ec.on_request_finished = std::move(on_request_finished);
  std::shared_ptr<const Tokenizer> tokenizer(std::move(loaded->tokenizer));
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(ec, *std::move(runner), std::move(tokenizer));
  if (!engine.ok()) return engine.status();

  BuiltEngine out;
  out.engine = *std::move(engine);
  ServedModelInfo& info = out.info;
  info.name = !config.model.name.empty() ? config.model.name
              : !mc.name.empty()         ? mc.name
                                         : std::filesystem::path(config.model.path).stem().string();
  info.device = config.model.device;
  info.kv_dtype = config.cache.kv_dtype;
  info.block_size = config.cache.block_size;
  info.num_blocks = memory.num_blocks;
  info.num_swap_blocks = memory.num_swap_blocks;
  info.max_model_len = max_model_len;
  info.prefix_caching = config.cache.prefix_caching;
  info.memory = memory;
  info.weights_fingerprint = fingerprint;
  spdlog::info("weights fingerprint {} ({} of {})", fingerprint.empty() ? "none" : fingerprint,
               config.model.mmap ? "mmapped" : "read into memory", config.model.path);
  spdlog::info(
      "model {} ({} layers, {} heads, {} kv heads, vocab {}) on {} in {} ({:.1f} MiB of "
      "weights, {:.1f} MiB of activations), max_model_len {}; KV cache {} x {} blocks of {} "
      "tokens, {:.1f} KiB per block, {:.1f} MiB, {} tokens (sized from {}), {} swap blocks",
      info.name, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.vocab_size, memory.device,
      memory.weight_dtype, static_cast<double>(memory.weight_bytes) / (1 << 20),
      static_cast<double>(memory.activation_bytes) / (1 << 20), max_model_len, info.kv_dtype,
      memory.num_blocks, info.block_size, static_cast<double>(memory.kv_bytes_per_block) / 1024,
      static_cast<double>(memory.kv_pool_bytes) / (1 << 20), memory.kv_pool_tokens,
      memory.pool_sized_from, memory.num_swap_blocks);
  if (memory.device == "cpu") {
    spdlog::info("CPU forward pass on {} threads (model.threads: {})", ro.num_threads,
                 config.model.threads > 0 ? "as set" : "0, what the cgroup and affinity allow");
  }
  if (memory.quantized_weights > 0) {
    spdlog::info(
        "weights quantized to {} at load in {:.2f} s on {} threads ({} weights, {:.1f} ns "
        "a weight)",
        memory.weight_dtype, memory.quantize_seconds, memory.quantize_threads,
        memory.quantized_weights,
        memory.quantize_seconds * 1e9 / static_cast<double>(memory.quantized_weights));
  }
  return out;
}

}  // namespace kvserve
