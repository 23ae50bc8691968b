#include "cache/tier/host_tier.h"

#include <utility>

namespace kvserve {

bool HostTier::Put(BlockHash hash, std::shared_ptr<const std::string> value,
                   std::vector<Entry>* evicted) {
  const int64_t bytes = static_cast<int64_t>(value->size());
  if (bytes > capacity_) return false;
  Erase(hash);
  while (used_ + bytes > capacity_) {
    Entry& victim = lru_.front();
    used_ -= static_cast<int64_t>(victim.value->size());
    index_.erase(victim.hash);
    if (evicted != nullptr) evicted->push_back(std::move(victim));
    lru_.pop_front();
  }
  lru_.push_back({hash, std::move(value)});
  index_[hash] = std::prev(lru_.end());
  used_ += bytes;
  return true;
}

std::shared_ptr<const std::string> HostTier::Get(BlockHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second);
  return it->second->value;
}

void HostTier::Erase(BlockHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  used_ -= static_cast<int64_t>(it->second->value->size());
  lru_.erase(it->second);
  index_.erase(it);
}

std::vector<BlockHash> HostTier::LruOrder() const {
  std::vector<BlockHash> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) out.push_back(e.hash);
  return out;
}

}  // namespace kvserve
