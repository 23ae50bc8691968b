// ThreadPool: persistent workers for fork-join phases of the CPU forward
// pass. A phase is split into chunks (row ranges); the caller and the
// workers claim chunks from one atomic counter until none are left, and Run
// returns when every claimed chunk is done.
//
// Claiming (rather than a fixed chunk per thread) matters on a shared
// machine: a worker that the OS has not scheduled yet simply claims nothing,
// and the caller does its share, so a phase never waits a whole time slice
// for a sleeping thread; it only waits for chunks a worker has started.
//
// Workers spin briefly between phases (a forward pass runs phases
// back-to-back, microseconds apart), then sleep on a futex (std::atomic
// wait) and use no CPU while the engine is idle.
//
// Thread-safety: Run must be called from one thread at a time (the engine
// thread). The function runs concurrently on different chunk indices.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvserve::cpu {

class ThreadPool {
 public:
  // num_threads counts the caller; 1 means "run everything inline".
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(chunk) once for every chunk in [0, chunks), on the caller and
  // the workers, and returns when all are done. Chunks may run in any order.
  template <typename Fn>
  void Run(int chunks, Fn&& fn) {
    if (chunks <= 1 || workers_.empty()) {
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    RunErased(chunks, &Trampoline<Fn>, &fn);
  }

  static constexpr int kMaxChunks = (1 << 20) - 1;

 private:
  using ChunkFn = void (*)(void* ctx, int chunk);
  template <typename Fn>
  static void Trampoline(void* ctx, int chunk) {
    (*static_cast<Fn*>(ctx))(chunk);
  }
  void RunErased(int chunks, ChunkFn fn, void* ctx);
  // Claims and runs chunks of the job published as `job_state`; returns when
  // none are left (or the job is no longer the current one).
  void Drain(uint64_t job_state);
  void WorkerLoop();

  std::vector<std::thread> workers_;
  // The current job, packed so that one compare-exchange both checks that a
  // chunk belongs to the job a thread woke up for and claims it:
  //   bits 40..63 job id, 20..39 chunk count, 0..19 next chunk.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> done_{0};          // chunks of the current job finished
  std::atomic<ChunkFn> fn_{nullptr};  // valid while the job has unfinished chunks
  std::atomic<void*> ctx_{nullptr};
  // Bumped per job; idle workers wait on it.
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Splits [0, n) into `parts` contiguous ranges; returns range `part`.
inline void SplitRange(int64_t n, int parts, int part, int64_t* begin, int64_t* end) {
  *begin = n * part / parts;
  *end = n * (part + 1) / parts;
}

}  // namespace kvserve::cpu
