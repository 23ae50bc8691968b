#include "kernels/plan/gpu_attention_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status Bad(const char* field, const char* rule, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat("PlanGpuAttention: ", field, " must be ", rule, ", got ", value));
}

absl::Status CheckShape(const GpuAttentionShape& s) {
  if (s.num_kv_heads <= 0) return Bad("num_kv_heads", "> 0", s.num_kv_heads);
  if (s.num_heads <= 0 || s.num_heads % s.num_kv_heads != 0) {
    return Bad("num_heads", "a positive multiple of num_kv_heads", s.num_heads);
  }
  if (s.head_dim <= 0 || s.head_dim % 2 != 0 || s.head_dim > kGpuAttentionMaxHeadDim) {
    return Bad("head_dim", "even and in [2, 256]", s.head_dim);
  }
  if (s.sliding_window < 0) return Bad("sliding_window", ">= 0", s.sliding_window);
  return absl::OkStatus();
}

absl::Status CheckOptions(const GpuAttentionPlanOptions& o) {
  if (o.num_sms <= 0) return Bad("num_sms", "> 0", o.num_sms);
  if (o.ctas_per_sm <= 0) return Bad("ctas_per_sm", "> 0", o.ctas_per_sm);
  if (o.partition_granule <= 0) return Bad("partition_granule", "> 0", o.partition_granule);
  if (o.fixed_partition_keys < 0) {
    return Bad("fixed_partition_keys", ">= 0", o.fixed_partition_keys);
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(const BatchView& b) {
  if (b.num_seqs < 0) return Bad("batch.num_seqs", ">= 0", b.num_seqs);
  if (b.num_tokens < 0) return Bad("batch.num_tokens", ">= 0", b.num_tokens);
  if (b.num_seqs == 0) {
    return b.num_tokens == 0 ? absl::OkStatus()
                             : Bad("batch.num_tokens", "0 without sequences", b.num_tokens);
  }
  if (b.query_start[0] != 0) return Bad("batch.query_start[0]", "0", b.query_start[0]);
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    if (b.QueryLen(s) < 0) return Bad("batch.query_start", "non-decreasing", b.query_start[s + 1]);
    if (b.context_len[s] < b.QueryLen(s)) {
      return Bad("batch.context_len", ">= the sequence's query rows", b.context_len[s]);
    }
  }
  if (b.query_start[b.num_seqs] != b.num_tokens) {
    return Bad("batch.query_start[num_seqs]", "num_tokens", b.query_start[b.num_seqs]);
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Partitions of [kb, ke) cut at the multiples of c.
int64_t Parts(int32_t kb, int32_t ke, int64_t c) { return CeilDiv(ke, c) - kb / c; }

int32_t RowsPerTile(int32_t heads_per_cta) {
  return std::max<int32_t>(1, kGpuAttentionMaxQueryVectors / heads_per_cta);
}

}  // namespace

int32_t GpuAttentionHeadsPerCta(int32_t num_heads, int32_t num_kv_heads) {
  if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return 0;
  const int32_t group = num_heads / num_kv_heads;
  for (int32_t h = std::min(group, kGpuAttentionMaxQueryVectors); h > 1; --h) {
    if (group % h == 0) return h;
  }
  return 1;
}

absl::StatusOr<GpuAttentionPlan> PlanGpuAttention(const BatchView& batch,
                                                  const GpuAttentionShape& shape,
                                                  const GpuAttentionPlanOptions& options) {
  KV_RETURN_IF_ERROR(CheckShape(shape));
  KV_RETURN_IF_ERROR(CheckOptions(options));
  KV_RETURN_IF_ERROR(CheckBatch(batch));
  const int32_t hpc = GpuAttentionHeadsPerCta(shape.num_heads, shape.num_kv_heads);
  const int32_t rows_per_tile = RowsPerTile(hpc);
  const int64_t grid_y = shape.num_heads / hpc;

  // Tiles: consecutive rows of one sequence, with the union of their keys.
  std::vector<GpuAttentionWorkItem> tiles;
  int32_t max_key_end = 0;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    for (int32_t r = batch.query_start[s]; r < batch.query_start[s + 1]; r += rows_per_tile) {
      GpuAttentionWorkItem t;
      t.seq = s;
      t.row_begin = r;
      t.num_rows = std::min(rows_per_tile, batch.query_start[s + 1] - r);
      t.key_begin = KeyBegin(batch.CacheIndex(s, r), shape.sliding_window);
      t.key_end = batch.CacheIndex(s, r + t.num_rows - 1) + 1;
      max_key_end = std::max(max_key_end, t.key_end);
      tiles.push_back(t);
    }
  }

  // Split size: 0 means no split.
  int64_t c = 0;
  if (options.fixed_partition_keys > 0) {
    c = options.fixed_partition_keys;
  } else if (options.split && !tiles.empty()) {
    const int64_t target = static_cast<int64_t>(options.num_sms) * options.ctas_per_sm;
    if (static_cast<int64_t>(tiles.size()) * grid_y < target) {
      const int64_t g = options.partition_granule;
      // At m_hi every tile is one partition (every key_end <= m_hi * g), so a
      // fitting size exists; take the smallest. The count is not monotone in
      // c (cuts are absolute), hence the scan.
      const int64_t m_hi = std::max<int64_t>(1, CeilDiv(max_key_end, g));
      for (int64_t m = 1; m <= m_hi; ++m) {
        int64_t ctas = 0;
        for (const GpuAttentionWorkItem& t : tiles) ctas += Parts(t.key_begin, t.key_end, m * g);
        if (ctas * grid_y <= target) {
          c = m < m_hi ? m * g : 0;
          break;
        }
      }
    }
  }

  GpuAttentionPlan plan;
  int32_t partials = 0;
  for (const GpuAttentionWorkItem& t : tiles) {
    const int64_t parts = c > 0 ? Parts(t.key_begin, t.key_end, c) : 1;
    if (parts <= 1) {
      plan.items_.push_back(t);
      continue;
    }
    const int64_t first_cut = t.key_begin / c;
    for (int64_t p = 0; p < parts; ++p) {
      GpuAttentionWorkItem item = t;
      item.key_begin = static_cast<int32_t>(std::max<int64_t>(t.key_begin, (first_cut + p) * c));
      item.key_end = static_cast<int32_t>(std::min<int64_t>(t.key_end, (first_cut + p + 1) * c));
      item.partial = partials + static_cast<int32_t>(p) * t.num_rows;
      plan.items_.push_back(item);
    }
    for (int32_t i = 0; i < t.num_rows; ++i) {
      plan.merges_.push_back(
          {t.row_begin + i, partials + i, static_cast<int32_t>(parts), t.num_rows});
    }
    partials += static_cast<int32_t>(parts) * t.num_rows;
  }
  // Heaviest items first, so the longest CTAs do not form the tail.
  std::stable_sort(plan.items_.begin(), plan.items_.end(),
                   [](const GpuAttentionWorkItem& a, const GpuAttentionWorkItem& b) {
                     return int64_t(a.key_end - a.key_begin) * a.num_rows >
                            int64_t(b.key_end - b.key_begin) * b.num_rows;
                   });

  GpuAttentionPlanHeader& h = plan.header_;
  h.num_items = static_cast<int32_t>(plan.items_.size());
  h.num_merges = static_cast<int32_t>(plan.merges_.size());
  h.num_partials = partials;
  h.heads_per_cta = hpc;
  h.rows_per_tile = rows_per_tile;
  h.partition_keys = static_cast<int32_t>(plan.merges_.empty() ? 0 : c);
  h.items_offset = sizeof(GpuAttentionPlanHeader) / 4;
  h.merges_offset =
      h.items_offset + h.num_items * static_cast<int32_t>(sizeof(GpuAttentionWorkItem) / 4);
  auto append = [&plan](const void* p, size_t bytes) {
    const int32_t* w = static_cast<const int32_t*>(p);
    plan.words_.insert(plan.words_.end(), w, w + bytes / 4);
  };
  append(&h, sizeof(h));
  for (const GpuAttentionWorkItem& it : plan.items_) append(&it, sizeof(it));
  for (const GpuAttentionMergeItem& m : plan.merges_) append(&m, sizeof(m));
  return plan;
}

int64_t GpuAttentionSlotFloats(const GpuAttentionShape& shape) {
  return static_cast<int64_t>(shape.num_heads) * (2 + shape.head_dim);
}

int64_t GpuAttentionWorkspaceBytes(const GpuAttentionShape& shape, int64_t num_partials) {
  return std::max<int64_t>(0, num_partials) * GpuAttentionSlotFloats(shape) * 4;
}

GpuAttentionPlanBounds GpuAttentionBounds(const GpuAttentionShape& shape,
                                          const GpuAttentionPlanOptions& options,
                                          int64_t max_tokens, int64_t max_context) {
  GpuAttentionPlanBounds b;
  const int32_t hpc = GpuAttentionHeadsPerCta(shape.num_heads, shape.num_kv_heads);
  if (hpc == 0 || max_tokens <= 0) return b;
  const int64_t grid_y = shape.num_heads / hpc;
  const int64_t rows_per_tile = RowsPerTile(hpc);
  b.max_merges = max_tokens;
  if (options.fixed_partition_keys > 0) {
    // Keys lie in [0, max_context), so a tile has at most this many partitions.
    const int64_t parts = std::max<int64_t>(1, CeilDiv(max_context, options.fixed_partition_keys));
    b.max_items = max_tokens * parts;
    b.max_partials = parts > 1 ? max_tokens * parts : 0;
  } else if (options.split) {
    // A split plan keeps its CTAs within the target; an unsplit one has at
    // most one item per row.
    const int64_t split_items =
        static_cast<int64_t>(options.num_sms) * options.ctas_per_sm / grid_y;
    b.max_items = std::max(max_tokens, split_items);
    b.max_partials = split_items * rows_per_tile;
  } else {
    b.max_items = max_tokens;
  }
  b.max_words = 8 + 8 * b.max_items + 4 * b.max_merges;
  b.workspace_bytes = GpuAttentionWorkspaceBytes(shape, b.max_partials);
  return b;
}

}  // namespace kvserve
