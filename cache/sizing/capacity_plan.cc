#include "cache/sizing/capacity_plan.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"
#include "cache/sizing/kv_layers.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status Positive(int64_t v, const char* field) {
  if (v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", v));
}

}  // namespace

std::vector<KvDtypeSpec> DefaultPlanDtypes(int block_size) {
  std::vector<KvDtypeSpec> out;
  for (KvDtype d : kCpuKvDtypes) {
    if (IsKcDtype(d) && block_size < kInt4KcMinBlockSize) continue;
    out.push_back(d);
  }
  return out;
}

absl::StatusOr<std::vector<KvFormatCapacity>> PlanCapacity(const CapacityPlanRequest& req) {
  KV_RETURN_IF_ERROR(Positive(req.num_layers, "num_layers"));
  KV_RETURN_IF_ERROR(Positive(req.num_kv_heads, "num_kv_heads"));
  KV_RETURN_IF_ERROR(Positive(req.head_dim, "head_dim"));
  KV_RETURN_IF_ERROR(Positive(req.context_tokens, "context"));
  KV_RETURN_IF_ERROR(Positive(req.block_size, "block_size"));
  if (req.memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory must be >= 0, got ", req.memory_bytes));
  }
  if (req.weight_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight bytes must be >= 0, got ", req.weight_bytes));
  }
  if (req.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 0, got ", req.batch));
  }
  if (req.max_seqs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_seqs must be >= 0, got ", req.max_seqs));
  }
  const int64_t budget = std::max<int64_t>(0, req.memory_bytes - req.weight_bytes);
  const std::vector<KvDtypeSpec> specs =
      req.dtypes.empty() ? DefaultPlanDtypes(req.block_size) : req.dtypes;
  // fp16 is the yardstick whether or not it is planned.
  KV_ASSIGN_OR_RETURN(KvFormat fp16, KvFormat::Create(KvDtype::kFp16, req.num_kv_heads,
                                                      req.head_dim, req.block_size));
  const int64_t fp16_bytes_per_token = fp16.block_bytes() * req.num_layers / req.block_size;
  const int64_t fp16_tokens = budget / (fp16.block_bytes() * req.num_layers) * req.block_size;
  std::vector<KvFormatCapacity> plan;
  for (const KvDtypeSpec& spec : specs) {
    KV_ASSIGN_OR_RETURN(KvLayers layers,
                        ResolveKvLayers(spec,
                                        {req.num_layers, req.num_kv_heads, req.head_dim,
                                         req.block_size, req.int4_group_size, KvElem::kFp16},
                                        "kv_dtype", req.layer_dims));
    if (!req.layer_dims.empty() && layers.has_tails()) continue;
    if (req.cross_layer.enabled()) {
      if (layers.has_tails()) continue;  // int4_kc, int2_kc
      KV_ASSIGN_OR_RETURN(
          layers, ResolveKvLayers(spec,
                                  {req.num_layers, req.num_kv_heads, req.head_dim, req.block_size,
                                   req.int4_group_size, KvElem::kFp16},
                                  "kv_dtype", req.layer_dims, req.cross_layer));
    }
    KvFormatCapacity c;
    c.spec = spec;
    c.dtype = layers.formats.front().dtype();
    c.bytes_per_token = layers.bytes_per_token();
    c.block_bytes = layers.bytes_per_block;
    c.num_tail_blocks = TailBlocksFor(layers, static_cast<int32_t>(req.max_seqs));
    c.tail_bytes = c.num_tail_blocks * layers.bytes_per_tail;
    c.kv_budget_bytes = budget;
    c.num_blocks = std::max<int64_t>(0, budget - c.tail_bytes) / c.block_bytes;
    c.num_tokens = c.num_blocks * req.block_size;
    c.blocks_per_seq = BlocksForTokens(req.context_tokens, req.block_size);
    c.max_seqs = c.num_blocks / c.blocks_per_seq;
    c.batch_bytes = req.batch * c.blocks_per_seq * c.block_bytes + c.tail_bytes;
    c.batch_fits = c.batch_bytes <= budget;
    c.tokens_vs_fp16 = static_cast<double>(fp16_bytes_per_token) / c.bytes_per_token;
    c.tokens_vs_fp16_in_budget =
        fp16_tokens > 0 ? static_cast<double>(c.num_tokens) / fp16_tokens : 0.0;
    plan.push_back(c);
  }
  return plan;
}

}  // namespace kvserve
