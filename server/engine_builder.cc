#include "server/engine_builder.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/kv_format.h"
#include "cache/memory_budget.h"
#include "cache/status_macros.h"
#include "model/cpu_model_runner.h"
#include "model/cpu_threads.h"
#include "model/model_loader.h"
#include "spdlog/spdlog.h"

namespace kvserve {
namespace {

absl::Status WithKey(const char* key, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(key, ": ", std::string(s.message())));
}

}  // namespace

absl::StatusOr<BuiltEngine> BuildEngine(
    const ServeConfig& config, std::function<void(const RequestMetrics&)> on_request_finished) {
  if (config.model.device == "cuda") {
#ifdef KVSERVE_HAVE_CUDA
    return absl::UnimplementedError(
        "model.device: cuda: this build has CUDA kernels but no CUDA model runner yet; use "
        "model.device: cpu");
#else
    return absl::UnimplementedError(
        "model.device: cuda: kvserve was built without CUDA (configure with -DKVSERVE_CUDA=ON "
        "where nvcc is installed); use model.device: cpu");
#endif
  }

  absl::StatusOr<LoadedModel> loaded = LoadModel(config.model.path, config.model.tokenizer);
  if (!loaded.ok()) return WithKey("model.path", loaded.status());
  const ModelConfig mc = loaded->weights.config;

  absl::StatusOr<KvDtype> dtype = ParseKvDtype(config.cache.kv_dtype);
  if (!dtype.ok()) return WithKey("cache.kv_dtype", dtype.status());
  absl::StatusOr<KvFormat> format = KvFormat::Create(
      *dtype, mc.num_kv_heads, mc.head_dim, config.cache.block_size, config.cache.int4_group_size);
  if (!format.ok()) return WithKey("cache", format.status());

  const int32_t max_model_len = config.scheduler.max_model_len > 0 ? config.scheduler.max_model_len
                                                                   : mc.max_position_embeddings;
  const int64_t bytes_per_block = BytesPerBlock(mc.num_layers, format->block_bytes());
  const int32_t seq_blocks = BlocksForTokens(max_model_len, config.cache.block_size);
  int32_t num_blocks = config.cache.num_blocks;
  if (num_blocks == 0 && config.cache.memory_bytes > 0) {
    KV_ASSIGN_OR_RETURN(num_blocks, PoolBlocksFromBudget(0, config.cache.memory_bytes,
                                                         mc.num_layers, format->block_bytes()));
  } else if (num_blocks == 0) {
    const int64_t wanted = int64_t{config.scheduler.max_num_seqs} * seq_blocks;
    const int64_t affordable = std::max<int64_t>(kDefaultCpuKvBudget / bytes_per_block, seq_blocks);
    num_blocks = static_cast<int32_t>(std::min(wanted, affordable));
  }

  CpuRunnerOptions opt;
  opt.kv_dtype = *dtype;
  opt.block_size = config.cache.block_size;
  opt.num_blocks = num_blocks;
  opt.num_swap_blocks = config.cache.num_swap_blocks;
  opt.int4_group_size = config.cache.int4_group_size;
  opt.num_threads = config.model.threads > 0 ? config.model.threads : DefaultCpuThreads();
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner =
      CpuModelRunner::Create(std::move(loaded->weights), opt);
  if (!runner.ok()) return WithKey("cache", runner.status());

  EngineConfig ec = config.ToEngineConfig();
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
  info.kv_dtype = std::string(KvDtypeName(*dtype));
  info.block_size = config.cache.block_size;
  info.num_blocks = num_blocks;
  info.num_swap_blocks = config.cache.num_swap_blocks;
  info.max_model_len = max_model_len;
  info.prefix_caching = config.cache.prefix_caching;
  spdlog::info(
      "model {} ({} layers, {} heads, {} kv heads, vocab {}), max_model_len {}, {} CPU threads; "
      "KV cache {} x {} blocks of {} tokens ({:.1f} MiB), {} swap blocks",
      info.name, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.vocab_size, max_model_len,
      opt.num_threads, info.kv_dtype, num_blocks, info.block_size,
      static_cast<double>(bytes_per_block) * num_blocks / (1 << 20), info.num_swap_blocks);
  return out;
}

}  // namespace kvserve
