#include "cache/tier/host_arena.h"

#include <algorithm>
#include <utility>

namespace kvserve {

HostArena::HostArena(std::span<uint8_t> arena, int64_t capacity_bytes, int64_t value_bytes)
    : value_bytes_(value_bytes) {
  int64_t bytes = capacity_bytes;
  if (arena.empty()) {
    // Default-initialised: pages are committed as slots are first written.
    owned_.reset(new uint8_t[static_cast<size_t>(std::max<int64_t>(capacity_bytes, 1))]);
    base_ = owned_.get();
  } else {
    base_ = arena.data();
    bytes = std::min<int64_t>(bytes, static_cast<int64_t>(arena.size()));
  }
  const int64_t slots = value_bytes > 0 ? bytes / value_bytes : 0;
  pins_.reserve(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    pins_.push_back(std::make_shared<int32_t>(static_cast<int32_t>(s)));
  }
  for (int64_t s = slots; s-- > 0;) free_.push_back(static_cast<int32_t>(s));
}

bool HostArena::Holds(const void* p, int64_t n) const {
  const auto* b = static_cast<const uint8_t*>(p);
  return b >= base_ && n >= 0 && b + n <= base_ + int64_t{num_slots()} * value_bytes_;
}

int32_t HostArena::Reserve(std::vector<HostTier::Entry>* evicted) {
  for (;;) {
    // A free slot no load still reads.
    for (size_t i = free_.size(); i-- > 0;) {
      const int32_t s = free_[i];
      if (!Usable(s)) continue;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return s;
    }
    if (lru_.empty()) return -1;
    // Push out the least recently used entry (its bytes for the tier below).
    const Entry victim = lru_.front();
    lru_.pop_front();
    index_.erase(victim.hash);
    if (evicted != nullptr) {
      const auto* p = reinterpret_cast<const char*>(slot(victim.slot));
      evicted->push_back(
          {victim.hash, std::make_shared<const std::string>(p, static_cast<size_t>(value_bytes_))});
    }
    free_.push_back(victim.slot);
  }
}

void HostArena::Commit(int32_t s, BlockHash hash) {
  Erase(hash);
  lru_.push_back({hash, s});
  index_[hash] = std::prev(lru_.end());
}

void HostArena::Release(int32_t s) { free_.push_back(s); }

HostArena::Pinned HostArena::Get(BlockHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return {};
  lru_.splice(lru_.end(), lru_, it->second);
  const int32_t s = it->second->slot;
  return {pins_[s], std::string_view(reinterpret_cast<const char*>(slot(s)),
                                     static_cast<size_t>(value_bytes_))};
}

void HostArena::Erase(BlockHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  free_.push_back(it->second->slot);
  lru_.erase(it->second);
  index_.erase(it);
}

std::vector<BlockHash> HostArena::LruOrder() const {
  std::vector<BlockHash> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) out.push_back(e.hash);
  return out;
}

}  // namespace kvserve
