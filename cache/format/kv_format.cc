#include "cache/format/kv_format.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cache/sizing/block_count.h"

namespace kvserve {
namespace {

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// bits: the code bits of kInt4 / kInt4Channel parts (4, or 2 for int2_kc).
KvPartLayout PartFor(KvElem elem, int head_dim, int group_size, int bits) {
  KvPartLayout p;
  p.elem = elem;
  p.group_size = head_dim;
  p.bits = bits;
  switch (elem) {
    case KvElem::kFp32:
      p.row_bytes = head_dim * 4;
      break;
    case KvElem::kFp16:
    case KvElem::kBf16:
      p.row_bytes = head_dim * 2;
      break;
    case KvElem::kFp8E4m3:
    case KvElem::kInt8:
      p.row_bytes = head_dim;
      p.meta_bytes = 4;
      break;
    case KvElem::kInt4:
      p.row_bytes = head_dim * bits / 8;
      p.group_size = group_size;
      p.meta_bytes = (head_dim / group_size) * 4;
      break;
    case KvElem::kInt4Channel:
      p.row_bytes = head_dim * bits / 8;
      p.meta_bytes = kInt4ChannelHeader + 2 * head_dim;  // per head per block
      break;
  }
  return p;
}

}  // namespace

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp32:
      return "fp32";
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
    case KvDtype::kInt8:
      return "int8";
    case KvDtype::kInt4:
      return "int4";
    case KvDtype::kK8V4:
      return "k8v4";
    case KvDtype::kInt4Kc:
      return "int4_kc";
    case KvDtype::kInt2Kc:
      return "int2_kc";
  }
  return "?";
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  std::string n = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (n == "fp32" || n == "float32") return KvDtype::kFp32;
  if (n == "fp16" || n == "float16" || n == "half") return KvDtype::kFp16;
  if (n == "bf16" || n == "bfloat16") return KvDtype::kBf16;
  if (n == "fp8_e4m3" || n == "fp8" || n == "fp8e4m3") return KvDtype::kFp8E4m3;
  if (n == "int8") return KvDtype::kInt8;
  if (n == "int4") return KvDtype::kInt4;
  if (n == "k8v4") return KvDtype::kK8V4;
  if (n == "int4_kc") return KvDtype::kInt4Kc;
  if (n == "int2_kc") return KvDtype::kInt2Kc;
  return absl::InvalidArgumentError(absl::StrCat(
      "kv_dtype: unknown KV cache dtype '", std::string(name),
      "' (expected fp32, fp16, bf16, fp8_e4m3, int8, int4, k8v4, int4_kc or int2_kc)"));
}

absl::StatusOr<KvFormat> KvFormat::Create(KvDtype dtype, int num_kv_heads, int head_dim,
                                          int block_size, int int4_group_size, KvElem tail_elem) {
  if (num_kv_heads <= 0) return absl::InvalidArgumentError("num_kv_heads must be > 0");
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim must be positive and even, got ", head_dim));
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.block_size must be > 0, got ", block_size));
  }
  const bool kc = IsKcDtype(dtype);
  const int bits = kc ? KcDtypeBits(dtype) : 4;
  if (kc && block_size < kInt4KcMinBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.block_size must be at least ", kInt4KcMinBlockSize, " for kv_dtype ",
                     std::string(KvDtypeName(dtype)),
                     " (K ranges are per channel over a block), got ", block_size));
  }
  if (kc && tail_elem != KvElem::kFp32 && tail_elem != KvElem::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(KvDtypeName(dtype)), " tails hold fp32 or fp16 rows"));
  }
  if (bits == 2 && head_dim % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim must be a multiple of 4 for kv_dtype int2_kc (four codes a byte), got ",
        head_dim));
  }
  int group = std::min(int4_group_size, head_dim);
  const int group_multiple = bits == 2 ? 4 : 2;
  if (group <= 0 || group % group_multiple != 0 || head_dim % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.int4_group_size ", int4_group_size, " must be ",
                     bits == 2 ? "a multiple of 4" : "even", " and divide head_dim ", head_dim));
  }
  KvElem ke = KvElem::kFp32, ve = KvElem::kFp32;
  switch (dtype) {
    case KvDtype::kFp32:
      ke = ve = KvElem::kFp32;
      break;
    case KvDtype::kFp16:
      ke = ve = KvElem::kFp16;
      break;
    case KvDtype::kBf16:
      ke = ve = KvElem::kBf16;
      break;
    case KvDtype::kFp8E4m3:
      ke = ve = KvElem::kFp8E4m3;
      break;
    case KvDtype::kInt8:
      ke = ve = KvElem::kInt8;
      break;
    case KvDtype::kInt4:
      ke = ve = KvElem::kInt4;
      break;
    case KvDtype::kK8V4:
      ke = KvElem::kInt8;
      ve = KvElem::kInt4;
      break;
    case KvDtype::kInt4Kc:
    case KvDtype::kInt2Kc:
      ke = KvElem::kInt4Channel;
      ve = KvElem::kInt4;
      break;
  }
  KvFormat f;
  KvPageLayout& l = f.layout_;
  f.dtype_ = dtype;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.block_size = block_size;
  l.k = PartFor(ke, head_dim, group, bits);
  l.v = PartFor(ve, head_dim, group, bits);
  const int64_t rows = static_cast<int64_t>(num_kv_heads) * block_size;
  int64_t off = 0;
  for (KvPartLayout* p : {&l.k, &l.v}) {
    const int64_t meta_rows = p->elem == KvElem::kInt4Channel ? num_kv_heads : rows;
    p->data_offset = off;
    off = AlignUp(off + rows * p->row_bytes, 16);
    p->meta_offset = off;
    off = AlignUp(off + meta_rows * p->meta_bytes, 16);
  }
  l.block_bytes = AlignUp(off, 64);
  if (kc) {
    KvTailLayout& t = l.tail;
    t.elem = tail_elem;
    t.row_bytes = head_dim * (tail_elem == KvElem::kFp32 ? 4 : 2);
    t.k_offset = 0;
    t.v_offset = AlignUp(rows * t.row_bytes, 16);
    t.block_bytes = AlignUp(t.v_offset + rows * t.row_bytes, 64);
  }
  return f;
}

absl::StatusOr<KvFormat> KvFormat::ForCrossLayer(const KvFormat& plain, KvCrossRole role,
                                                 int retain_slots) {
  const KvPageLayout& p = plain.layout_;
  if (IsKcDtype(plain.dtype_) || p.has_tails()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.cross_layer: kv_dtype ", std::string(KvDtypeName(plain.dtype_)),
                     " keeps per-block K ranges and tails; cross-layer pages take a per-token "
                     "kv_dtype"));
  }
  if (role == KvCrossRole::kNone) return plain;
  const int max_slots = std::min(p.block_size, 254);
  if (retain_slots < 1 || retain_slots > max_slots) {
    return absl::InvalidArgumentError(absl::StrCat("cache.cross_layer.retain: ", retain_slots,
                                                   " retained slots a block, expected 1 .. ",
                                                   max_slots));
  }
  KvFormat f = plain;
  KvPageLayout& l = f.layout_;
  l.cross.role = role;
  const int64_t rows = static_cast<int64_t>(p.num_kv_heads) * p.block_size;
  if (role == KvCrossRole::kShared) {
    l.cross.retain_slots = retain_slots;
    const int64_t kept = static_cast<int64_t>(p.num_kv_heads) * retain_slots;
    int64_t off = 0;
    for (KvPartLayout* part : {&l.k, &l.v}) {
      part->data_offset = off;
      off = AlignUp(off + kept * part->row_bytes, 16);
      part->meta_offset = off;
      off = AlignUp(off + kept * part->meta_bytes, 16);
    }
    l.cross.ratio_offset = off;
    off = AlignUp(off + rows * 4, 16);
    l.cross.index_offset = off;
    l.block_bytes = AlignUp(off + p.block_size, 64);
  }
  KvTailLayout& t = l.tail;
  t.elem = KvElem::kFp32;
  t.row_bytes = p.head_dim * 4;
  t.k_offset = 0;
  t.v_offset = AlignUp(rows * t.row_bytes, 16);
  t.block_bytes = AlignUp(t.v_offset + rows * t.row_bytes, 64);
  return f;
}

int64_t KvFormat::bytes_per_token_per_layer() const {
  const KvPageLayout& l = layout_;
  if (l.cross.role == KvCrossRole::kShared) {
    const int64_t block = static_cast<int64_t>(l.num_kv_heads) *
                              (l.cross.retain_slots * int64_t{l.k.row_bytes + l.k.meta_bytes +
                                                              l.v.row_bytes + l.v.meta_bytes} +
                               int64_t{l.block_size} * 4) +
                          l.block_size;
    return BlocksForTokens(block, l.block_size);
  }
  if (l.k.elem == KvElem::kInt4Channel) {
    const int64_t block =
        static_cast<int64_t>(l.num_kv_heads) *
        (l.block_size * (l.k.row_bytes + l.v.row_bytes + l.v.meta_bytes) + l.k.meta_bytes);
    return BlocksForTokens(block, l.block_size);
  }
  return static_cast<int64_t>(l.num_kv_heads) *
         (l.k.row_bytes + l.k.meta_bytes + l.v.row_bytes + l.v.meta_bytes);
}

}  // namespace kvserve
