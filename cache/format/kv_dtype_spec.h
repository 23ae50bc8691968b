// KvDtypeSpec: the KV cache dtype of every layer, as cache.kv_dtype and the
// --kv-dtype flags (serve, generate, eval-kv, plan) name it. Per-layer
// precision lets the layers that suffer most from quantization (often the
// first and the last) keep more bits while the rest use int4_kc.
//
// Syntax: a comma-separated list of entries, each a dtype name (kv_format.h)
// with an optional repeat:
//   NAME      one layer
//   NAME*N    N layers (N >= 1)
//   NAME*     every layer the other entries leave (zero or more); at most
//             one entry may say this
// A single name means every layer. Entries apply in layer order.
//   "int4_kc"                every layer int4_kc
//   "int8,int4_kc*,int8"     first and last layer int8, the others int4_kc
//   "fp16*2,int8*3"          exactly 5 layers
// Resolve() checks the list against the model's layer count.
//
// Thread-safety: immutable value type.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/format/kv_format.h"

namespace kvserve {

class KvDtypeSpec {
 public:
  // Every layer fp32.
  KvDtypeSpec() : KvDtypeSpec(KvDtype::kFp32) {}
  // Every layer `dtype` (implicit: a dtype is a spec).
  KvDtypeSpec(KvDtype dtype) : entries_{{dtype, kFill}} {}  // NOLINT

  // InvalidArgument naming `what` (e.g. "cache.kv_dtype") for an unknown
  // name, a bad repeat or two '*' entries.
  static absl::StatusOr<KvDtypeSpec> Parse(std::string_view text,
                                           std::string_view what = "cache.kv_dtype");

  // One dtype per layer. InvalidArgument naming `what` when the list names
  // more layers than num_layers, or (without a '*' entry) fewer.
  absl::StatusOr<std::vector<KvDtype>> Resolve(int num_layers,
                                               std::string_view what = "cache.kv_dtype") const;

  // The canonical text: "int4_kc", "int8,int4_kc*,int8", "fp16*2,int8*3";
  // Parse(ToString()) gives an equal spec.
  std::string ToString() const;

  // Whether every layer has one dtype (a single '*' entry), and which.
  bool is_uniform() const { return entries_.size() == 1 && entries_[0].count == kFill; }
  KvDtype first_dtype() const { return entries_.front().dtype; }
  // Whether any layer uses `dtype`.
  bool Uses(KvDtype dtype) const;

  friend bool operator==(const KvDtypeSpec& a, const KvDtypeSpec& b) {
    return a.ToString() == b.ToString();
  }

 private:
  static constexpr int kFill = -1;
  struct Entry {
    KvDtype dtype;
    int count;  // layers, or kFill
  };
  std::vector<Entry> entries_;
};

}  // namespace kvserve
