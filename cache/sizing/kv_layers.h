// KvLayers: a model's KV formats, one per layer, and what one block of them
// costs: the one place a per-layer kv_dtype list (kv_dtype_spec.h) becomes
// formats, bytes per block and per tail and the tail count, for the CPU and
// CUDA runners, the runner factory, `kvserve plan` (capacity_plan.h) and
// eval-kv. Bytes are as allocated (each layer's block padded as kv_layout.h
// lays it out), so what a plan or a report says is what a pool takes.
//
// Example (stories260K: 5 layers, 4 KV heads of 8, block 16, int4_kc with
// fp32 tails): 5 x 896 = 4,480 bytes per block, 280 bytes per token.
// Cross-layer from layer 2 with retain 0.125 in fp32: layers 0-2 and 4 take
// 4,096 bytes a block each and layer 3's shared page 832 (2 retained rows a
// head, fp16 ratios, the index), 17,216 bytes a block, 1,076 per token.
//
// Thread-safety: immutable value type; pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_cross_layer.h"
#include "cache/format/kv_dtype_spec.h"
#include "cache/format/kv_format.h"

namespace kvserve {

// The shape every layer's format shares.
struct KvLayerShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int int4_group_size = 64;
  // How int4_kc tails store rows: kFp32 on the CPU, kFp16 on CUDA.
  KvElem tail_elem = KvElem::kFp32;
};

// One layer's page shape where it is not the model's: low-rank latents
// (model/lowrank/low_rank_kv.h) store groups of kv heads at their rank.
struct KvLayerDims {
  int32_t num_heads = 0;
  int32_t head_dim = 0;
};

struct KvLayers {
  std::vector<KvFormat> formats;  // one per layer
  int64_t bytes_per_block = 0;    // one block id, every layer
  int64_t bytes_per_tail = 0;     // one tail id, the layers with tails (0: none)
  int32_t block_size = 0;

  bool has_tails() const { return bytes_per_tail > 0; }
  // Bytes one token costs over every layer, as allocated (bytes_per_block /
  // block_size, rounded up).
  int64_t bytes_per_token() const { return (bytes_per_block + block_size - 1) / block_size; }
};

// The formats of spec over shape. InvalidArgument from spec.Resolve (naming
// `what`) or from KvFormat::Create (naming the cache.* setting). layer_dims,
// when not empty, gives every layer's page shape instead of shape's
// num_kv_heads and head_dim. cross (cache.cross_layer, when enabled) makes
// its pairs' layers base and shared pages (KvFormat::ForCrossLayer; the
// shared pages' bytes are the pool's per-layer bytes like any other) with
// fp32 tails; not with layer_dims.
absl::StatusOr<KvLayers> ResolveKvLayers(const KvDtypeSpec& spec, const KvLayerShape& shape,
                                         std::string_view what = "cache.kv_dtype",
                                         std::span<const KvLayerDims> layer_dims = {},
                                         const KvCrossLayerSpec& cross = {});

// Whether a pool with tails still keeps a partial block's rows in the block
// for some layer (a layer without tails beside int4_kc ones, a cross-layer
// pair's plain layers), so copy-on-write of a partial block copies it
// (ModelRunner::partial_rows_in_blocks).
inline bool PartialRowsInBlocks(std::span<const KvFormat> formats) {
  bool tails = false, rows = false;
  for (const KvFormat& f : formats) (f.has_tails() ? tails : rows) = true;
  return tails && rows;
}

// Tail blocks a pool of layers keeps for max_seqs running sequences: two
// each (a tail freed while a pending copy still reads it is reused a step
// later), 0 when no layer keeps tails.
inline int32_t TailBlocksFor(const KvLayers& layers, int32_t max_seqs) {
  return layers.has_tails() ? 2 * (max_seqs > 1 ? max_seqs : 1) : 0;
}

}  // namespace kvserve
