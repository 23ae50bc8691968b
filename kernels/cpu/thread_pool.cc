#include "kernels/cpu/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_CPU_RELAX() _mm_pause()
#else
#define KV_CPU_RELAX() ((void)0)
#endif

namespace kvserve::cpu {
namespace {

// How long an idle worker polls before it sleeps: longer than the gap
// between two phases of a forward pass, short enough not to burn a core
// while the engine waits for requests.
constexpr auto kSpinFor = std::chrono::microseconds(200);

constexpr uint64_t kField = (1u << 20) - 1;
uint64_t JobId(uint64_t s) { return s >> 40; }
uint64_t NumChunks(uint64_t s) { return (s >> 20) & kField; }
uint64_t NextChunk(uint64_t s) { return s & kField; }

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunErased(int chunks, ChunkFn fn, void* ctx) {
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  const uint64_t id = (JobId(state_.load(std::memory_order_relaxed)) + 1) & ((1u << 24) - 1);
  fn_.store(fn, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t job = (id << 40) | (static_cast<uint64_t>(chunks) << 20);
  state_.store(job, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_.notify_all();
  Drain(job);
  // Only chunks a worker has already claimed can be outstanding here.
  for (int spins = 0; done_.load(std::memory_order_acquire) != chunks; ++spins) {
    if (spins < 4096) {
      KV_CPU_RELAX();
    } else {
      std::this_thread::yield();  // the worker lost its core mid-chunk
    }
  }
}

void ThreadPool::Drain(uint64_t job) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (JobId(s) != JobId(job) || NextChunk(s) >= NumChunks(s)) return;
    if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed),
                                          static_cast<int>(NextChunk(s)));
      done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::WorkerLoop() {
  // Start from the initial value, not the current one: a worker that starts
  // late still helps with a job published before it ran.
  uint32_t seen = 0;
  for (;;) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
    for (int i = 0; wake_.load(std::memory_order_acquire) == seen; ++i) {
      KV_CPU_RELAX();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(seen, std::memory_order_seq_cst);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
    }
    seen = wake_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_seq_cst)) return;
    Drain(state_.load(std::memory_order_acquire));
  }
}

}  // namespace kvserve::cpu
