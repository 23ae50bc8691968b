#include "cache/sizing/kv_layers.h"

#include "util/status_macros.h"

namespace kvserve {

absl::StatusOr<KvLayers> ResolveKvLayers(const KvDtypeSpec& spec, const KvLayerShape& shape,
                                         std::string_view what) {
  KV_ASSIGN_OR_RETURN(std::vector<KvDtype> dtypes, spec.Resolve(shape.num_layers, what));
  KvLayers out;
  out.block_size = shape.block_size;
  out.formats.reserve(dtypes.size());
  for (KvDtype dtype : dtypes) {
    KV_ASSIGN_OR_RETURN(
        KvFormat f, KvFormat::Create(dtype, shape.num_kv_heads, shape.head_dim, shape.block_size,
                                     shape.int4_group_size, shape.tail_elem));
    out.bytes_per_block += f.block_bytes();
    out.bytes_per_tail += f.tail_block_bytes();
    out.formats.push_back(f);
  }
  return out;
}

}  // namespace kvserve
