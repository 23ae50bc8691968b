// KvPageLayout: the byte layout of one block of the paged KV cache, for one
// layer, as a plain value that host and device code share. KvFormat (in
// kv_format.h) builds and validates it; kernels (CPU and CUDA) receive it by
// value and compute offsets with the helpers below, so both backends read and
// write the same bytes.
//
// Block layout (one layer; a block id names the same slot in every layer):
//   [K data][K meta][V data][V meta]        each region 16-byte aligned
//   K/V data: [num_kv_heads][block_size][row_bytes]
//   K/V meta: [num_kv_heads][block_size][meta_bytes]   (per token), except
//             kInt4Channel: [num_kv_heads][meta_bytes] (per block)
// row_bytes = head_dim * bits / 8 (int2_kc: 2-bit codes, see below). meta_bytes:
//   fp32/fp16/bf16: 0
//   fp8_e4m3, int8: 4  (one fp32 scale; value = q * scale)
//   int4: (head_dim / group_size) * 4  (fp16 scale, fp16 zero per group,
//         stored as [scale, zero] pairs, group 0 first;
//         value = q * scale + zero, q in [0, 15], two values per byte,
//         channel 2i in the low nibble, 2i+1 in the high nibble)
//   int4_channel (K of int4_kc): 8 + 2 * head_dim bytes per head per BLOCK,
//         see "int4_kc" below.
//   int2_kc's parts are int4_channel and int4 with part.bits = 2: codes in
//         [0, 3], four per byte (channel 4i + k in bits 2k, 2k + 1 of byte
//         i), L = 3 levels where int4 has 15 (value = q * scale + zero, scale
//         = (max - min) / 3); meta as int4's.
// How values are quantized into this layout: kernels/cpu/kv/kv_quant.h (the CUDA
// kernels follow it bit for bit). block_bytes is rounded up to 64 bytes so
// every block starts on a cache line.
//
// int4_kc (KIVI-style: K per channel over a full block, V per token):
//   * K data: int4 codes exactly as int4 ([head][slot][head_dim / 2], channel
//     2i low nibble), but the scales are per channel of the whole block. The
//     meta of head h (at BlockMetaOffset(k, h)) is
//        float lo; float unit; uint8 {cmin_d, cmax_d} for d = 0 .. head_dim-1
//     and channel d of every row of the block decodes as (IEEE fp32, round
//     to nearest even, every operation rounded separately):
//        scale_d = float(cmax_d - cmin_d) * unit
//        zero_d  = fmaf(float(L * cmin_d), unit, lo)
//        value   = fmaf(float(q), scale_d, zero_d)
//     with L = 15 (KvCodeLevels(4)), i.e. each channel's [min, max] is stored
//     as two 8-bit codes on the head's range [lo, lo + 255 * L * unit] (255
//     steps of L units), so a channel's L + 1 levels cover its own range
//     while its meta costs 2 bytes.
//   * int2_kc is int4_kc with bits = 2 in both parts: L = 3 (K codes q in
//     [0, 3], four per byte), V 2-bit per token; same meta, tails and
//     contract.
//     The encoder (kernels/cpu/kv/kv_quant.h, QuantizeBlockKChannel) needs all
//     block_size rows at once, so a block is quantized only when full.
//   * V: int4 per token, as the int4 format (group_size channels per group).
//   * Tails: a sequence's last, partial block is not in its block yet: its
//     rows live in full precision in a tail block (KvTailLayout below; fp32
//     on the CPU, fp16 on the GPU) from a small tail pool (tail ids are
//     0 .. num_tails-1 and, like block ids, name the same slot in every
//     layer). BatchInput::tail_ids names each sequence's tail. The kernels'
//     contract for a step (b = a sequence, first = its first new cache
//     index, ctx = context_len[b], bs = block_size; see
//     kernels/cpu/attention/paged_attention.h):
//       - before the step the tail holds rows [first - first % bs, first) at
//         slots i % bs; blocks below first / bs are quantized;
//       - flush (before attention): every block k the step completes,
//         first / bs <= k < ctx / bs, is quantized in one go into
//         block_table[b][k] from its rows (the tail's for i < first, this
//         step's K/V for the others). A block is never requantized;
//       - attention: a row at cache index i reads every key of an earlier
//         block (j / bs < i / bs) from its quantized block and the keys of
//         its own block (j / bs == i / bs) in full precision: from the tail
//         for j < first, from this step's K/V for j >= first. So what a row
//         sees depends on its index only, never on how the sequence was cut
//         into steps (prefill chunks, decode, recompute after preemption);
//       - after attention: this step's rows of the final partial block
//         (ctx / bs * bs <= i < ctx, none when ctx % bs == 0) are written to
//         the tail at slot i % bs.
//     With fp16 tails, a step's own new rows are rounded to fp16 wherever
//     they are read (attention, and the flush's input), so they match what
//     the tail holds for them in later steps.
//     block_size must be at least 16 for int4_kc (KvFormat refuses less):
//     per-channel ranges need enough tokens to amortise their meta.
//
// Cross-layer sharing (cache.cross_layer, MiniCache-style; the merge and its
// attention: kernels/cpu/attention/cross_layer_attention.h). Layers pair up
// from a first layer L: (L, L+1), (L+2, L+3), ...; the lower layer of a pair
// is the base (role kBase), the upper the shared layer (kShared). Both keep
// a sequence's partial last block in fp32 tails (as int4_kc does), and a
// block is merged when it fills:
//   * base page: an ordinary page of the layer's format (kernels that read
//     plain pages read it); token t of head h holds m_l * e for a merged
//     token (e the SLERP midpoint, t = 0.5, of the two layers' unit
//     directions, m_l = |x_l|), x_l itself for an unmerged one; K (after
//     RoPE, as stored) and V separately;
//   * shared page:
//       [K retention data][K retention meta][V retention data][V retention meta]
//       [ratios][index]                               each region 16-byte aligned
//     retention data/meta: as a plain page's K/V but [num_kv_heads]
//       [retain_slots][row_bytes] (x_{l+1} of the unmerged tokens, in the
//       layer's format; RetainedRowOffset / RetainedMetaOffset);
//     ratios: fp16 [block_size][num_kv_heads][2]: m_{l+1} / m_l of K, then
//       of V (a merged token's K of layer l+1 is ratio_k * its base key);
//     index: uint8 [block_size]: kCrossMerged (0xFF) or the token's
//       retention slot.
//   One decision per token for every head, K and V (so one index byte).
//
// Tail block layout (one layer, when tail.block_bytes > 0):
//   [K rows][V rows]   each [num_kv_heads][block_size][tail.row_bytes],
//   16-byte aligned; tail.row_bytes = head_dim * 4 (fp32) or * 2 (fp16).
//
// This header has no dependencies beyond <cstdint> so that nvcc device code
// can include it. Thread-safety: plain values.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KV_HOST_DEVICE __host__ __device__
#else
#define KV_HOST_DEVICE
#endif

namespace kvserve {

// What one half (K or V) of a block stores. kInt4Channel is int4_kc's K:
// int4 codes per token, scales per channel per block.
enum class KvElem : uint8_t { kFp32, kFp16, kBf16, kFp8E4m3, kInt8, kInt4, kInt4Channel };

// int4_kc: codes of a channel's range on the head's range (0 .. 255), in
// steps of KvCodeLevels(bits) units (kInt4ChannelLevels for 4 bits).
inline constexpr int kInt4ChannelCodes = 255;
inline constexpr int kInt4ChannelLevels = 15;

// The top code of a `bits`-bit integer part (15 for int4, 3 for int2_kc's).
KV_HOST_DEVICE constexpr int KvCodeLevels(int bits) { return (1 << bits) - 1; }
// Bytes before the per-channel codes in a head's int4_kc K meta (lo, unit).
inline constexpr int kInt4ChannelHeader = 8;

struct KvPartLayout {
  KvElem elem = KvElem::kFp32;
  int32_t row_bytes = 0;    // bytes of one token's head_dim values
  int32_t meta_bytes = 0;   // scale/zero bytes of one token for one head
                            // (kInt4Channel: of the whole block for one head)
  int32_t group_size = 0;   // int4 channels per scale group; head_dim otherwise
  int32_t bits = 4;         // code bits of kInt4 / kInt4Channel parts: 4, or 2 (int2_kc)
  int64_t data_offset = 0;  // from the block start
  int64_t meta_offset = 0;  // from the block start
};

// Where a layer's tails keep a partial block in full precision (int4_kc).
struct KvTailLayout {
  KvElem elem = KvElem::kFp32;  // kFp32 (CPU) or kFp16 (CUDA)
  int32_t row_bytes = 0;        // one token's head_dim values
  int64_t k_offset = 0;         // from the tail block start
  int64_t v_offset = 0;
  int64_t block_bytes = 0;  // one tail block of one layer; 0: no tails
};

// A layer's part in cross-layer sharing (see above).
enum class KvCrossRole : uint8_t { kNone, kBase, kShared };
// A merged token's index byte in a shared page.
inline constexpr uint8_t kCrossMerged = 0xFF;

struct KvCrossLayout {
  KvCrossRole role = KvCrossRole::kNone;
  int32_t retain_slots = 0;  // kShared: retention rows per head (< 255)
  int64_t ratio_offset = 0;  // kShared: fp16 [block_size][num_kv_heads][2]
  int64_t index_offset = 0;  // kShared: uint8 [block_size]
};

struct KvPageLayout {
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int64_t block_bytes = 0;  // one block of one layer, padded to 64
  KvPartLayout k;
  KvPartLayout v;
  KvTailLayout tail;
  KvCrossLayout cross;

  // Retention row r of a head in a shared page (cross.role == kShared).
  KV_HOST_DEVICE int64_t RetainedRowOffset(const KvPartLayout& part, int head, int r) const {
    return part.data_offset +
           (static_cast<int64_t>(head) * cross.retain_slots + r) * part.row_bytes;
  }
  KV_HOST_DEVICE int64_t RetainedMetaOffset(const KvPartLayout& part, int head, int r) const {
    return part.meta_offset +
           (static_cast<int64_t>(head) * cross.retain_slots + r) * part.meta_bytes;
  }
  // The fp16 K ratio of (slot, head) in a shared page; its V ratio follows.
  KV_HOST_DEVICE int64_t RatioOffset(int slot, int head) const {
    return cross.ratio_offset + (static_cast<int64_t>(slot) * num_kv_heads + head) * 4;
  }

  // Whether a sequence's partial last block lives in a tail (int4_kc).
  KV_HOST_DEVICE bool has_tails() const { return tail.block_bytes > 0; }

  // Byte offset, inside a block, of the row of (head, slot) in a part.
  KV_HOST_DEVICE int64_t RowOffset(const KvPartLayout& part, int head, int slot) const {
    return part.data_offset + (static_cast<int64_t>(head) * block_size + slot) * part.row_bytes;
  }
  // Per-token meta of (head, slot); not for kInt4Channel parts.
  KV_HOST_DEVICE int64_t MetaOffset(const KvPartLayout& part, int head, int slot) const {
    return part.meta_offset + (static_cast<int64_t>(head) * block_size + slot) * part.meta_bytes;
  }
  // Per-block meta of a head (kInt4Channel parts).
  KV_HOST_DEVICE int64_t BlockMetaOffset(const KvPartLayout& part, int head) const {
    return part.meta_offset + static_cast<int64_t>(head) * part.meta_bytes;
  }
  // Byte offset, inside a tail block, of the K (v = false) or V row of
  // (head, slot).
  KV_HOST_DEVICE int64_t TailRowOffset(bool v, int head, int slot) const {
    return (v ? tail.v_offset : tail.k_offset) +
           (static_cast<int64_t>(head) * block_size + slot) * tail.row_bytes;
  }
};

}  // namespace kvserve
