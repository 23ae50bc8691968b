// SeqId: a sequence's id in the KV cache manager (KvCacheManager, and the
// scheduler's Sequence that names its cache), apart so a header that only
// names sequences need not include the cache manager.
#pragma once

#include <cstdint>

namespace kvserve {

using SeqId = int64_t;

}  // namespace kvserve
