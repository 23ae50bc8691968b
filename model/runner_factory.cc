#include "model/runner_factory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache/sizing/kv_layers.h"
#include "cache/sizing/kv_pool_plan.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/cpu/cpu_threads.h"
#include "model/loader/quantize_weights.h"
#include "model/lowrank/low_rank_kv.h"
#include "util/status_macros.h"
#ifdef KVSERVE_HAVE_CUDA
#include "model/cuda/cuda_model_runner.h"
#endif

namespace kvserve {
namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
int64_t HostMemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

// The weight_dtype keys, checked whatever the device: int8 / int4 only on
// the CPU, fp8_e4m3 only on CUDA and with bf16 / fp16 activations; with
// weights, what they already are (a checkpoint shipped in fp8, weights an
// earlier runner quantized) counts where the keys ask for nothing.
absl::Status CheckWeightQuant(const RunnerOptions& options, const DeviceSpec& device,
                              const LlamaWeights* weights) {
  KV_ASSIGN_OR_RETURN(
      WeightQuantSpec quant,
      ParseWeightQuant(options.weight_dtype, options.weight_dtype_head, options.weight_group_size));
  const bool shipped_fp8 = weights != nullptr && weights->weight_quant.fp8();
  if (device.kind == DeviceSpec::Kind::kCpu) {
    if (quant.fp8() || shipped_fp8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.weight_dtype: ", shipped_fp8 && !quant.fp8() ? "the checkpoint's " : "",
          "fp8_e4m3 weights run on CUDA only (model.device: cuda); the CPU runner takes fp32, "
          "int8, int4 or int4_asym"));
    }
    return absl::OkStatus();
  }
  if (weights != nullptr && weights->weight_quant.any() && !quant.any()) {
    quant = weights->weight_quant;
  }
  if (!quant.any()) return absl::OkStatus();
  if (quant.fp8()) {
    KV_ASSIGN_OR_RETURN(WeightDtype act, ResolveWeightDtype(options.dtype, device));
    if (act == WeightDtype::kFp32) {
      return absl::InvalidArgumentError(
          "model.weight_dtype: fp8_e4m3 weights need bf16 or fp16 activations (model.dtype: bf16, "
          "fp16 or auto); cuBLASLt's fp8 GEMMs take no fp32 activations");
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.weight_dtype: ", quant.ToString(),
                   " weights run on the CPU only (model.device: cpu); ", options.device,
                   " takes fp32, fp16 or bf16 weights (model.dtype) or fp8_e4m3"));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(LlamaWeights weights,
                                                             const RunnerOptions& o) {
  KV_ASSIGN_OR_RETURN(WeightDtype dtype, ResolveWeightDtype(o.dtype, DeviceSpec{}));
  if (dtype != WeightDtype::kFp32) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dtype: ", std::string(WeightDtypeName(dtype)),
                     ": the CPU backend computes in fp32; use model.dtype: fp32 or auto"));
  }
  if (weights.dummy_seed.has_value()) {
    return absl::InvalidArgumentError(
        "model.path: the CPU backend needs the dummy weights materialized on the host");
  }
  const ModelConfig& mc = weights.config;
  KV_RETURN_IF_ERROR(mc.Validate());
  KV_RETURN_IF_ERROR(CheckWeightQuant(o, DeviceSpec{}, &weights));
  std::shared_ptr<const LowRankKv> low_rank;
  if (!o.low_rank.empty()) {
    // Before quantizing: the fingerprint hashes the fp32 K/V projections.
    absl::StatusOr<LowRankKv> lr = LoadLowRankKvFor(o.low_rank, weights);
    if (!lr.ok()) {
      return absl::Status(lr.status().code(),
                          absl::StrCat("cache.low_rank: ", std::string(lr.status().message())));
    }
    low_rank = std::make_shared<const LowRankKv>(*std::move(lr));
  }
  KV_ASSIGN_OR_RETURN(WeightQuantSpec quant,
                      ParseWeightQuant(o.weight_dtype, o.weight_dtype_head, o.weight_group_size));
  // The quantizer's threads as the forward pass's (model.threads; 0: what
  // the cgroup quota and the affinity mask allow).
  KV_RETURN_IF_ERROR(
      QuantizeWeights(quant, &weights, o.num_threads > 0 ? o.num_threads : DefaultCpuThreads()));
  // int4_kc layers also keep full-precision tails (TailBlocksFor), taken off
  // the budget first.
  KvLayerShape shape{mc.num_layers, mc.num_kv_heads,   mc.head_dim,
                     o.block_size,  o.int4_group_size, KvElem::kFp32};
  const std::vector<KvLayerDims> dims =
      low_rank ? LowRankLayerDims(*low_rank) : std::vector<KvLayerDims>{};
  KV_ASSIGN_OR_RETURN(KvLayers layers,
                      ResolveKvLayers(o.kv_dtype, shape, "cache.kv_dtype", dims, o.cross_layer));
  const int32_t num_tails = TailBlocksFor(layers, o.max_num_seqs);
  KvPoolRequest pool;
  pool.num_blocks = o.num_blocks;
  pool.memory_bytes = o.memory_bytes;
  pool.memory_fraction = o.memory_fraction;
  pool.default_bytes = kDefaultCpuKvBudget;
  if (o.memory_fraction > 0) pool.available_bytes = HostMemAvailable();
  pool.weight_bytes = ForwardWeightBytes(weights);
  pool.bytes_per_block = layers.bytes_per_block;
  pool.fixed_bytes = layers.bytes_per_tail * num_tails;
  pool.block_size = o.block_size;
  pool.max_model_len = o.max_model_len > 0 ? o.max_model_len : mc.max_position_embeddings;
  pool.max_num_seqs = o.max_num_seqs;
  KV_ASSIGN_OR_RETURN(KvPoolPlan plan, PlanKvPool(pool));

  CpuRunnerOptions ro;
  ro.kv_dtype = o.kv_dtype;
  ro.block_size = o.block_size;
  ro.num_blocks = plan.num_blocks;
  ro.num_swap_blocks = o.num_swap_blocks;
  ro.int4_group_size = o.int4_group_size;
  ro.num_threads = o.num_threads;
  ro.pool_sized_from = plan.sized_from;
  ro.num_tail_blocks = num_tails;
  ro.low_rank = std::move(low_rank);
  ro.cross_layer = o.cross_layer;
  absl::StatusOr<std::unique_ptr<CpuModelRunner>> runner =
      CpuModelRunner::Create(std::move(weights), ro);
  if (!runner.ok()) {
    return absl::Status(runner.status().code(),
                        absl::StrCat("cache: ", std::string(runner.status().message())));
  }
  return std::unique_ptr<ModelRunner>(*std::move(runner));
}

}  // namespace

absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text) {
  const std::string t(absl::StripAsciiWhitespace(std::string(text)));
  DeviceSpec d;
  if (t == "cpu") return d;
  d.kind = DeviceSpec::Kind::kCuda;
  if (t == "cuda") return d;
  int ordinal = -1;
  if (t.starts_with("cuda:") && absl::SimpleAtoi(t.substr(5), &ordinal) && ordinal >= 0 &&
      t.find_first_not_of("0123456789", 5) == std::string::npos) {
    d.ordinal = ordinal;
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.device: expected cpu, cuda or cuda:N, got '", std::string(text), "'"));
}

std::string_view WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kFp32:
      return "fp32";
    case WeightDtype::kFp16:
      return "fp16";
    case WeightDtype::kBf16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<WeightDtype> ResolveWeightDtype(std::string_view text, const DeviceSpec& device) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(std::string(text)));
  if (t == "auto" || t.empty()) {
    return device.kind == DeviceSpec::Kind::kCuda ? WeightDtype::kBf16 : WeightDtype::kFp32;
  }
  if (t == "fp32" || t == "float32") return WeightDtype::kFp32;
  if (t == "fp16" || t == "float16") return WeightDtype::kFp16;
  if (t == "bf16" || t == "bfloat16") return WeightDtype::kBf16;
  return absl::InvalidArgumentError(absl::StrCat(
      "model.dtype: expected auto, fp32, fp16 or bf16, got '", std::string(text), "'"));
}

bool RunnerDefersDummyWeights(const RunnerOptions& options) {
#ifdef KVSERVE_HAVE_CUDA
  absl::StatusOr<DeviceSpec> d = ParseDevice(options.device);
  return d.ok() && d->kind == DeviceSpec::Kind::kCuda;
#else
  return false;
#endif
}

absl::Status CheckRunnerDevice(const RunnerOptions& options) {
  KV_ASSIGN_OR_RETURN(DeviceSpec device, ParseDevice(options.device));
  KV_RETURN_IF_ERROR(CheckWeightQuant(options, device, nullptr));
  if (device.kind == DeviceSpec::Kind::kCpu) return absl::OkStatus();
  if (!options.low_rank.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.low_rank: low-rank KV latents run on the CPU runner only "
                     "(model.device: cpu); ",
                     options.device, " takes a cache without cache.low_rank"));
  }
  if (options.cross_layer.enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.cross_layer: cross-layer KV sharing runs on the CPU runner only "
                     "(model.device: cpu); ",
                     options.device, " takes a cache without cache.cross_layer"));
  }
#ifdef KVSERVE_HAVE_CUDA
  return CudaModelRunner::CheckDevice(options, device);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "model.device: ", options.device,
      ": kvserve was built without CUDA (configure with -DKVSERVE_CUDA=ON where nvcc is "
      "installed); use model.device: cpu"));
#endif
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(LlamaWeights weights,
                                                               const RunnerOptions& options) {
  KV_ASSIGN_OR_RETURN(DeviceSpec device, ParseDevice(options.device));
  if (device.kind == DeviceSpec::Kind::kCpu) return CreateCpuRunner(std::move(weights), options);
  KV_RETURN_IF_ERROR(CheckWeightQuant(options, device, &weights));
  KV_RETURN_IF_ERROR(CheckRunnerDevice(options));  // refuses cache.low_rank, cross_layer first
#ifdef KVSERVE_HAVE_CUDA
  KV_ASSIGN_OR_RETURN(WeightDtype dtype, ResolveWeightDtype(options.dtype, device));
  KV_ASSIGN_OR_RETURN(
      WeightQuantSpec quant,
      ParseWeightQuant(options.weight_dtype, options.weight_dtype_head, options.weight_group_size));
  if (quant.fp8() && weights.dummy_seed.has_value() && weights.tok_embeddings.data == nullptr) {
    // A dummy model's shapes: generated and quantized on the device.
    if (weights.weight_quant.any() &&
        !(weights.weight_quant == quant.Resolve(weights.config.vocab_size))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model.weight_dtype: the weights are already ", weights.weight_quant.ToString()));
    }
    weights.weight_quant = quant.Resolve(weights.config.vocab_size);
  } else if (quant.fp8()) {
    KV_RETURN_IF_ERROR(QuantizeWeights(
        quant, &weights, options.num_threads > 0 ? options.num_threads : DefaultCpuThreads()));
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                      CudaModelRunner::Create(std::move(weights), options, device, dtype));
  return std::unique_ptr<ModelRunner>(std::move(runner));
#else
  return absl::InternalError("unreachable: CheckRunnerDevice refuses CUDA in this build");
#endif
}

}  // namespace kvserve
