#include "cache/sizing/kv_layers.h"

#include "absl/strings/str_cat.h"
#include "util/status_macros.h"

namespace kvserve {

absl::StatusOr<KvLayers> ResolveKvLayers(const KvDtypeSpec& spec, const KvLayerShape& shape,
                                         std::string_view what,
                                         std::span<const KvLayerDims> layer_dims,
                                         const KvCrossLayerSpec& cross) {
  KV_ASSIGN_OR_RETURN(std::vector<KvDtype> dtypes, spec.Resolve(shape.num_layers, what));
  KvLayers out;
  out.block_size = shape.block_size;
  out.formats.reserve(dtypes.size());
  if (!layer_dims.empty() && layer_dims.size() != dtypes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page shapes for ", layer_dims.size(),
                                                   " layers, the model has ", dtypes.size()));
  }
  const int num_layers = static_cast<int>(dtypes.size());
  if (cross.enabled()) {
    KV_RETURN_IF_ERROR(cross.Validate(num_layers));
    if (!layer_dims.empty()) {
      return absl::InvalidArgumentError(
          "cache.cross_layer: not with cache.low_rank (its latents are not a layer's K/V)");
    }
  }
  for (size_t l = 0; l < dtypes.size(); ++l) {
    const bool own = !layer_dims.empty();
    KV_ASSIGN_OR_RETURN(
        KvFormat f, KvFormat::Create(dtypes[l], own ? layer_dims[l].num_heads : shape.num_kv_heads,
                                     own ? layer_dims[l].head_dim : shape.head_dim,
                                     shape.block_size, shape.int4_group_size, shape.tail_elem));
    const KvCrossRole role = cross.RoleOf(static_cast<int>(l), num_layers);
    if (role != KvCrossRole::kNone) {
      KV_ASSIGN_OR_RETURN(f, KvFormat::ForCrossLayer(f, role, cross.RetainSlots(shape.block_size)));
    }
    out.bytes_per_block += f.block_bytes();
    out.bytes_per_tail += f.tail_block_bytes();
    out.formats.push_back(f);
  }
  return out;
}

}  // namespace kvserve
