#include "kernels/cpu/kv/move_slots.h"

#include <cstring>

namespace kvserve::cpu {

void MoveSlots(HostKvPages& pages, std::span<const SlotMove> moves) {
  const int bs = pages.format().block_size();
  for (const SlotMove& m : moves) {
    const int32_t sb = static_cast<int32_t>(m.src / bs), so = static_cast<int32_t>(m.src % bs);
    const int32_t db = static_cast<int32_t>(m.dst / bs), dof = static_cast<int32_t>(m.dst % bs);
    for (int l = 0; l < pages.num_layers(); ++l) {
      const KvPageLayout& lay = pages.format(l).layout();
      const uint8_t* src = pages.block(l, sb);
      uint8_t* dst = pages.block(l, db);
      for (int h = 0; h < lay.num_kv_heads; ++h) {
        for (const KvPartLayout* part : {&lay.k, &lay.v}) {
          std::memcpy(dst + lay.RowOffset(*part, h, dof), src + lay.RowOffset(*part, h, so),
                      part->row_bytes);
          std::memcpy(dst + lay.MetaOffset(*part, h, dof), src + lay.MetaOffset(*part, h, so),
                      part->meta_bytes);
        }
      }
    }
  }
}

}  // namespace kvserve::cpu
