// The CUDA runtime stand-in: every cuda* call kvserve makes (kernels/cuda,
// model/cuda, bench/gpu), on the CPU. See cuda_stub.h for the model; the
// choices that follow the real API are commented where they are made.
// clang-format off
#include "tests/cuda_stub/cuda_stub_launch.h"
// clang-format on

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tests/cuda_stub/cuda_stub.h"

using Op = std::function<void()>;

struct CUstream_st {
  bool blocking = true;
  std::deque<Op> queue;
  uint64_t enqueued = 0, executed = 0;
  bool capturing = false, invalidated = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;
  std::vector<Op> captured;
};
struct CUevent_st {
  unsigned flags = 0;
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;
  bool recorded = false, in_capture = false;
};
struct CUgraph_st {
  std::vector<Op> nodes;
};
struct CUgraphExec_st {
  std::vector<Op> nodes;
};

namespace cuda_stub {
namespace {

constexpr size_t kGuard = 4096;
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr int kOptinSmem = 232448;  // H200: sharedMemPerBlockOptin

enum class Kind { kDevice, kPinned };
struct Alloc {
  char* map = nullptr;
  size_t map_bytes = 0;  // includes the guard page
  char* ptr = nullptr;
  size_t bytes = 0;
  Kind kind = Kind::kDevice;
};

struct Runtime {
  std::recursive_mutex mu;
  std::map<uintptr_t, Alloc> allocs;  // by ptr
  CUstream_st legacy;                 // the NULL stream
  std::vector<CUstream_st*> streams;
  std::unordered_map<const void*, int> max_dynamic_smem;
  size_t total = size_t{4} << 30;
  int64_t device_bytes = 0;
  int fail_malloc_after = -1;
  cudaError_t fail_mem_info = cudaSuccess;
  Counters counters;
  int open_depth = 0;
};

Runtime& R() {
  static Runtime* r = new Runtime;
  return *r;
}
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t Err(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }

void Protect(const Alloc& a, int prot) {
  if (mprotect(a.map, a.map_bytes - kGuard, prot) != 0) {
    std::perror("cuda_stub: mprotect");
    std::abort();
  }
}

// Device memory is readable only between Open and Close (nested).
void Open() {
  Runtime& r = R();
  if (r.open_depth++ > 0) return;
  for (auto& [_, a] : r.allocs) {
    if (a.kind == Kind::kDevice) Protect(a, PROT_READ | PROT_WRITE);
  }
}
void Close() {
  Runtime& r = R();
  if (--r.open_depth > 0) return;
  for (auto& [_, a] : r.allocs) {
    if (a.kind == Kind::kDevice) Protect(a, PROT_NONE);
  }
}

// The allocation holding [p, p + n), or null.
const Alloc* Find(const void* p, size_t n = 1) {
  Runtime& r = R();
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = r.allocs.upper_bound(u);
  if (it == r.allocs.begin()) return nullptr;
  --it;
  const Alloc& a = it->second;
  if (u < it->first || u - it->first >= a.bytes) return nullptr;
  if (n > a.bytes - (u - it->first)) return nullptr;
  return &a;
}
bool InsideAny(const void* p) {
  Runtime& r = R();
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  auto it = r.allocs.upper_bound(u);
  if (it == r.allocs.begin()) return false;
  --it;
  return u - it->first < it->second.bytes;
}

CUstream_st* S(cudaStream_t s) {
  // cudaStreamLegacy and cudaStreamPerThread are the NULL stream here.
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &R().legacy;
  return s;
}

// Runs `s`'s queued operations up to sequence number `upto`. The legacy
// stream and blocking streams order against each other, so draining one
// drains the others first.
void DrainOne(CUstream_st* s, uint64_t upto) {
  Open();
  while (s->executed < upto && !s->queue.empty()) {
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    op();
    ++s->executed;
  }
  Close();
}
void Drain(CUstream_st* s, uint64_t upto) {
  Runtime& r = R();
  if (s->blocking) {
    if (s != &r.legacy) DrainOne(&r.legacy, r.legacy.enqueued);
    for (CUstream_st* o : r.streams) {
      if (o != s && o->blocking && s == &r.legacy) DrainOne(o, o->enqueued);
    }
  }
  DrainOne(s, upto);
}
void DrainAll() {
  Runtime& r = R();
  DrainOne(&r.legacy, r.legacy.enqueued);
  for (CUstream_st* o : r.streams) DrainOne(o, o->enqueued);
}

// Calls the real API refuses while this thread (ThreadLocal mode) or any
// thread (Global mode) captures: cudaErrorStreamCaptureUnsupported, and the
// capture is invalidated (its cudaStreamEndCapture fails).
cudaError_t RefuseDuringCapture() {
  Runtime& r = R();
  bool refused = false;
  for (CUstream_st* s : r.streams) {
    if (!s->capturing) continue;
    const bool applies =
        s->mode == cudaStreamCaptureModeGlobal || (s->mode == cudaStreamCaptureModeThreadLocal &&
                                                   s->capture_thread == std::this_thread::get_id());
    if (applies) {
      s->invalidated = true;
      refused = true;
    }
  }
  return refused ? Err(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t Enqueue(cudaStream_t stream, Op op) {
  CUstream_st* s = S(stream);
  if (s->capturing) {
    if (s->invalidated) return Err(cudaErrorStreamCaptureInvalidated);
    s->captured.push_back(std::move(op));
    return cudaSuccess;
  }
  s->queue.push_back(std::move(op));
  ++s->enqueued;
  return cudaSuccess;
}

char* MapAlloc(size_t bytes, Kind kind) {
  const size_t body = RoundUp(std::max<size_t>(bytes, 1), 256);
  const size_t map_bytes = RoundUp(body, Page()) + kGuard;
  void* m = mmap(nullptr, map_bytes, kind == Kind::kDevice ? PROT_NONE : PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* map = static_cast<char*>(m);
  mprotect(map + map_bytes - kGuard, kGuard, PROT_NONE);
  // The allocation ends at the guard page, so a read past it faults.
  Alloc a{map, map_bytes, map + map_bytes - kGuard - body, bytes, kind};
  if (R().open_depth > 0 && kind == Kind::kDevice) Protect(a, PROT_READ | PROT_WRITE);
  R().allocs[reinterpret_cast<uintptr_t>(a.ptr)] = a;
  return a.ptr;
}

cudaError_t FreeAlloc(void* p, Kind kind) {
  Runtime& r = R();
  auto it = r.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.allocs.end() || it->second.kind != kind) return Err(cudaErrorInvalidValue);
  munmap(it->second.map, it->second.map_bytes);
  if (kind == Kind::kDevice) {
    r.device_bytes -= static_cast<int64_t>(it->second.bytes);
    --r.counters.live_device_allocations;
  } else {
    --r.counters.live_host_allocations;
  }
  r.allocs.erase(it);
  return cudaSuccess;
}

void DoCopy(void* dst, const void* src, size_t n) {
  Open();
  std::memmove(dst, src, n);
  Close();
}

// Checks a copy's pointers against its kind: a device side must lie in one
// allocation (device or pinned host); a host side must not be device memory.
cudaError_t CheckCopy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  auto device_ok = [&](const void* p) {
    const Alloc* a = Find(p, n);
    return a != nullptr;
  };
  auto host_ok = [&](const void* p) {
    const Alloc* a = Find(p, 1);
    return a == nullptr ? !InsideAny(p) : (a->kind == Kind::kPinned && Find(p, n) != nullptr);
  };
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return host_ok(src) && device_ok(dst) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return device_ok(src) && host_ok(dst) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return device_ok(src) && device_ok(dst) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost:
      return cudaSuccess;
    case cudaMemcpyDefault:
      return (Find(src, 1) == nullptr || device_ok(src)) &&
                     (Find(dst, 1) == nullptr || device_ok(dst))
                 ? cudaSuccess
                 : cudaErrorInvalidValue;
  }
  return cudaErrorInvalidMemcpyDirection;
}
bool Pageable(const void* p) { return Find(p) == nullptr; }

}  // namespace

void SetDeviceMemoryBytes(size_t total) {
  std::lock_guard lock(R().mu);
  R().total = total;
}
void FailMallocAfter(int n) {
  std::lock_guard lock(R().mu);
  R().fail_malloc_after = n;
}
void FailNextMemGetInfo(cudaError_t error) {
  std::lock_guard lock(R().mu);
  R().fail_mem_info = error;
}
Counters GetCounters() {
  std::lock_guard lock(R().mu);
  Counters c = R().counters;
  c.live_device_bytes = R().device_bytes;
  return c;
}
int64_t PendingOps(cudaStream_t stream) {
  std::lock_guard lock(R().mu);
  return static_cast<int64_t>(S(stream)->queue.size());
}

cudaError_t EnqueueOp(cudaStream_t stream, std::function<void()> op) {
  std::lock_guard lock(R().mu);
  return Enqueue(stream, std::move(op));
}
bool IsDeviceRange(const void* p, size_t bytes) {
  std::lock_guard lock(R().mu);
  return Find(p, bytes) != nullptr;
}

cudaError_t EnqueueLaunch(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem,
                          cudaStream_t stream, std::function<void()> cta) {
  std::lock_guard lock(R().mu);
  Runtime& r = R();
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  // H200 limits (cudaDeviceProp below); the real launch fails with these codes.
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    return Err(cudaErrorInvalidConfiguration);
  }
  if (dynamic_smem > kDefaultSmem) {
    auto it = r.max_dynamic_smem.find(kernel);
    const size_t allowed = it == r.max_dynamic_smem.end() ? kDefaultSmem : size_t(it->second);
    if (dynamic_smem > allowed) return Err(cudaErrorInvalidValue);
  }
  if (block.y != 1 || block.z != 1) {
    cuda_sim::Fail("cuda_stub: only 1-D blocks are simulated");
  }
  auto run = [grid, block, dynamic_smem, cta = std::move(cta)] {
    // Dynamic shared memory, poisoned with NaN bytes before each CTA.
    std::vector<float4> smem((dynamic_smem + 15) / 16 + 1);
    cuda_sim::g_grid_dim = grid;
    cuda_sim::g_block_dim = dim3(block.x, 1, 1);
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          std::memset(smem.data(), 0xff, smem.size() * sizeof(float4));
          cuda_sim::g_dynamic_shared = dynamic_smem > 0 ? smem.data() : nullptr;
          cuda_sim::RunBlock({x, y, z}, static_cast<int>(block.x), cta);
        }
      }
    }
    cuda_sim::g_dynamic_shared = nullptr;
    std::lock_guard lock(R().mu);
    ++R().counters.kernels_run;
  };
  return Enqueue(stream, std::move(run));
}

}  // namespace cuda_stub

using namespace cuda_stub;  // NOLINT: the C API below is the stand-in's body

#define LOCK std::lock_guard lock_(R().mu)

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return t_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define KV_NAME(x) \
  case x:          \
    return #x;
    KV_NAME(cudaSuccess)
    KV_NAME(cudaErrorInvalidValue)
    KV_NAME(cudaErrorMemoryAllocation)
    KV_NAME(cudaErrorInvalidConfiguration)
    KV_NAME(cudaErrorInvalidDevice)
    KV_NAME(cudaErrorInvalidMemcpyDirection)
    KV_NAME(cudaErrorInvalidPitchValue)
    KV_NAME(cudaErrorInvalidResourceHandle)
    KV_NAME(cudaErrorNotReady)
    KV_NAME(cudaErrorNoDevice)
    KV_NAME(cudaErrorInsufficientDriver)
    KV_NAME(cudaErrorStreamCaptureUnsupported)
    KV_NAME(cudaErrorStreamCaptureInvalidated)
    KV_NAME(cudaErrorStreamCaptureImplicit)
    KV_NAME(cudaErrorCapturedEvent)
    KV_NAME(cudaErrorIllegalState)
    KV_NAME(cudaErrorNotSupported)
#undef KV_NAME
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Err(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Err(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "NVIDIA H200 (kvserve CPU stand-in)");
  prop->totalGlobalMem = size_t{143771} << 20;  // as nvidia-smi reports an H200
  prop->sharedMemPerBlock = kDefaultSmem;
  prop->sharedMemPerBlockOptin = kOptinSmem;
  prop->sharedMemPerMultiprocessor = 233472;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->memoryBusWidth = 6144;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->asyncEngineCount = 3;
  prop->pageableMemoryAccess = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return Err(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      return cudaSuccess;
    case cudaDevAttrL2CacheSize:
      *value = p.l2CacheSize;
      return cudaSuccess;
    default:
      // Not one kvserve asks for: fail visibly rather than invent a value.
      return Err(cudaErrorInvalidValue);
  }
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  LOCK;
  Runtime& r = R();
  if (r.fail_mem_info != cudaSuccess) {
    const cudaError_t e = r.fail_mem_info;
    r.fail_mem_info = cudaSuccess;
    return Err(e);
  }
  *total = r.total;
  *free = r.total > size_t(r.device_bytes) ? r.total - size_t(r.device_bytes) : 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  LOCK;
  Runtime& r = R();
  *p = nullptr;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (r.fail_malloc_after >= 0 && r.fail_malloc_after-- == 0) {
    return Err(cudaErrorMemoryAllocation);
  }
  if (bytes == 0) return cudaSuccess;  // as the real API: success, null pointer
  if (r.device_bytes + static_cast<int64_t>(bytes) > static_cast<int64_t>(r.total)) {
    return Err(cudaErrorMemoryAllocation);
  }
  char* m = MapAlloc(bytes, Kind::kDevice);
  if (m == nullptr) return Err(cudaErrorMemoryAllocation);
  r.device_bytes += static_cast<int64_t>(bytes);
  ++r.counters.live_device_allocations;
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  LOCK;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (p == nullptr) return cudaSuccess;
  // cudaFree synchronises the device first.
  DrainAll();
  return FreeAlloc(p, Kind::kDevice);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  LOCK;
  *p = nullptr;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  char* m = MapAlloc(bytes, Kind::kPinned);
  if (m == nullptr) return Err(cudaErrorMemoryAllocation);
  ++R().counters.live_host_allocations;
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}
cudaError_t cudaFreeHost(void* p) {
  LOCK;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (p == nullptr) return cudaSuccess;
  DrainAll();
  return FreeAlloc(p, Kind::kPinned);
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  LOCK;
  // With unified addressing (every 64-bit device since CUDA 4) pinned host
  // memory is mapped at the same address, whatever cudaHostAlloc's flags.
  const Alloc* a = Find(host);
  if (flags != 0 || a == nullptr || a->kind != Kind::kPinned) return Err(cudaErrorInvalidValue);
  *device = host;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  LOCK;
  if (n == 0) return cudaSuccess;
  if (cudaError_t e = CheckCopy(dst, src, n, kind); e != cudaSuccess) return Err(e);
  CUstream_st* s = S(stream);
  const bool pageable_src = Pageable(src), pageable_dst = Pageable(dst);
  if (pageable_src || pageable_dst) ++R().counters.pageable_copies;
  if (s->capturing && (pageable_src || pageable_dst)) {
    // Copies with pageable memory cannot be captured.
    s->invalidated = true;
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  if (pageable_dst) {
    // To pageable memory: returns once the copy is done (stream order kept).
    if (cudaError_t e = Enqueue(stream, [=] { std::memmove(dst, src, n); }); e != cudaSuccess) {
      return e;
    }
    Drain(s, s->enqueued);
    return cudaSuccess;
  }
  if (pageable_src) {
    // From pageable memory: staged at the call, so the caller may reuse it.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + n);
    return Enqueue(stream, [=] { std::memmove(dst, staged->data(), n); });
  }
  // Pinned or device on both sides: read and written when the copy runs.
  return Enqueue(stream, [=] { std::memmove(dst, src, n); });
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  LOCK;
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return Err(cudaErrorInvalidPitchValue);
  // Device memory on its side(s), pinned or pageable host memory on the
  // host side (the KV pools, the swap pool, tier payloads): a span that
  // starts in an allocation must end in it, and the direction must match
  // the kinds (host: pinned, or outside every allocation).
  const size_t dst_span = dpitch * (height - 1) + width, src_span = spitch * (height - 1) + width;
  const Alloc* d = Find(dst, dst_span);
  const Alloc* s = Find(src, src_span);
  if ((d == nullptr && InsideAny(dst)) || (s == nullptr && InsideAny(src))) {
    return Err(cudaErrorInvalidValue);
  }
  const bool d_host = d == nullptr || d->kind == Kind::kPinned;
  const bool s_host = s == nullptr || s->kind == Kind::kPinned;
  const bool direction_ok = kind == cudaMemcpyDefault          ? (d != nullptr || s != nullptr)
                            : kind == cudaMemcpyDeviceToDevice ? !d_host && !s_host
                            : kind == cudaMemcpyDeviceToHost   ? d_host && !s_host
                            : kind == cudaMemcpyHostToDevice   ? !d_host && s_host
                                                               : false;
  if (!direction_ok) return Err(cudaErrorInvalidMemcpyDirection);
  CUstream_st* st = S(stream);
  if (d == nullptr || s == nullptr) ++R().counters.pageable_copies;
  if (st->capturing && (d == nullptr || s == nullptr)) {
    st->invalidated = true;  // copies with pageable memory cannot be captured
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  if (s == nullptr) {
    // From pageable memory: staged at the call (as cudaMemcpyAsync).
    auto staged = std::make_shared<std::vector<char>>(height * width);
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(staged->data() + r * width, static_cast<const char*>(src) + r * spitch, width);
    }
    return Enqueue(stream, [=] {
      for (size_t r = 0; r < height; ++r) {
        std::memmove(static_cast<char*>(dst) + r * dpitch, staged->data() + r * width, width);
      }
    });
  }
  const cudaError_t e = Enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
    }
  });
  // To pageable memory: returns once the copy is done (stream order kept).
  if (e == cudaSuccess && d == nullptr) Drain(st, st->enqueued);
  return e;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  LOCK;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  if (cudaError_t e = CheckCopy(dst, src, n, kind); e != cudaSuccess) return Err(e);
  // On the legacy stream: after all work of blocking streams, not of
  // cudaStreamNonBlocking ones.
  Drain(&R().legacy, R().legacy.enqueued);
  DoCopy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  LOCK;
  if (n == 0) return cudaSuccess;
  if (Find(p, n) == nullptr) return Err(cudaErrorInvalidValue);
  return Enqueue(stream, [=] { std::memset(p, value, n); });
}
cudaError_t cudaMemset(void* p, int value, size_t n) {
  LOCK;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  if (Find(p, n) == nullptr) return Err(cudaErrorInvalidValue);
  Drain(&R().legacy, R().legacy.enqueued);
  Open();
  std::memset(p, value, n);
  Close();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  LOCK;
  auto* s = new CUstream_st;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  R().streams.push_back(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  LOCK;
  Runtime& r = R();
  auto it = std::find(r.streams.begin(), r.streams.end(), stream);
  if (it == r.streams.end()) return Err(cudaErrorInvalidResourceHandle);
  if (stream->capturing) return Err(cudaErrorIllegalState);
  Drain(stream, stream->enqueued);  // pending work still completes
  r.streams.erase(it);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  LOCK;
  CUstream_st* s = S(stream);
  if (s->capturing) {
    s->invalidated = true;
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  Drain(s, s->enqueued);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  LOCK;
  CUstream_st* s = S(stream);
  if (s->capturing) {
    s->invalidated = true;
    return Err(cudaErrorStreamCaptureUnsupported);
  }
  return s->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize() {
  LOCK;
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  DrainAll();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = new CUevent_st{flags};
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  LOCK;
  CUstream_st* s = S(stream);
  if (s->capturing) {
    if (s->invalidated) return Err(cudaErrorStreamCaptureInvalidated);
    event->in_capture = true;
    return cudaSuccess;
  }
  event->in_capture = false;
  event->stream = s;
  event->seq = s->enqueued;
  event->recorded = true;
  return cudaSuccess;
}
// The work `stream` enqueues after this waits for the event's recorded
// work: an operation that, when the stream reaches it, runs the event's
// stream up to the record (an event never recorded: no wait, as the real
// API).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  LOCK;
  if (flags != 0 && flags != cudaEventWaitDefault) return Err(cudaErrorInvalidValue);
  if (event->in_capture || S(stream)->capturing) return Err(cudaErrorStreamCaptureUnsupported);
  if (!event->recorded) return cudaSuccess;
  CUstream_st* from = event->stream;
  const uint64_t seq = event->seq;
  if (from == S(stream)) return cudaSuccess;  // already in order
  return Enqueue(stream, [from, seq] { Drain(from, seq); });
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  LOCK;
  if (event->in_capture) return Err(cudaErrorCapturedEvent);
  if (cudaError_t e = RefuseDuringCapture(); e != cudaSuccess) return e;
  if (!event->recorded) return cudaSuccess;  // as the real API
  Drain(event->stream, event->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  LOCK;
  if (event->in_capture) return Err(cudaErrorCapturedEvent);
  if (!event->recorded) return cudaSuccess;
  return event->stream->executed >= event->seq ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  LOCK;
  if ((start->flags & cudaEventDisableTiming) || (end->flags & cudaEventDisableTiming)) {
    return Err(cudaErrorInvalidResourceHandle);
  }
  if (!start->recorded || !end->recorded) return Err(cudaErrorInvalidResourceHandle);
  if (start->stream->executed < start->seq || end->stream->executed < end->seq) {
    return Err(cudaErrorNotReady);
  }
  // No timing on the CPU: a microsecond per operation between the events.
  *ms = 1e-3f * static_cast<float>(end->seq - std::min(end->seq, start->seq));
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  LOCK;
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return Err(cudaErrorInvalidValue);
  // The opt-in maximum less the kernel's static shared memory, which the
  // stand-in does not know: the bound is the opt-in maximum itself.
  if (value < 0 || value > kOptinSmem) return Err(cudaErrorInvalidValue);
  R().max_dynamic_smem[func] = value;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  LOCK;
  CUstream_st* s = S(stream);
  if (s == &R().legacy) return Err(cudaErrorStreamCaptureUnsupported);
  if (s->capturing) return Err(cudaErrorIllegalState);
  s->capturing = true;
  s->invalidated = false;
  s->mode = mode;
  s->capture_thread = std::this_thread::get_id();
  s->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  LOCK;
  CUstream_st* s = S(stream);
  *graph = nullptr;
  if (!s->capturing) return Err(cudaErrorIllegalState);
  s->capturing = false;
  std::vector<Op> nodes = std::move(s->captured);
  s->captured.clear();
  if (s->invalidated) {
    s->invalidated = false;
    return Err(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(nodes)};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  LOCK;
  CUstream_st* s = S(stream);
  *status = !s->capturing    ? cudaStreamCaptureStatusNone
            : s->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {  // NOLINT: the API's type
  if (graph == nullptr) return Err(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  LOCK;
  if (exec == nullptr) return Err(cudaErrorInvalidValue);
  for (const Op& op : exec->nodes) {
    if (cudaError_t e = Enqueue(stream, op); e != cudaSuccess) return e;
  }
  ++R().counters.graphs_launched;
  return cudaSuccess;
}

}  // extern "C"
