// The CUDA stand-in's own checks: each SECTION plants one defect that a real
// GPU would show as a wrong answer, a fault or an error, and asserts that the
// stand-in shows it too (faults run in a forked child). Then the cuBLASLt
// stand-in against a naive GEMM.
// clang-format off
#include "tests/cuda_stub/cuda_stub_launch.h"  // first: the simulator's device API
// clang-format on

#include "tests/cuda_stub/cuda_stub.h"

#include <cublasLt.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/layers/gemm.h"

namespace {

using kvserve::cuda::LaunchKernel;

struct Child {
  bool signaled = false;
  int signal = 0;
  int exit_code = 0;
  std::string err;
};
// Runs fn in a forked child; what killed it and what it wrote to stderr.
Child RunInChild(const std::function<void()>& fn) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 2);
    freopen("/dev/null", "w", stdout);  // Catch's report of the child's fault
    close(pipe_fds[0]);
    fn();
    _exit(0);
  }
  close(pipe_fds[1]);
  Child c;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof(buf))) > 0;) c.err.append(buf, size_t(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  c.signaled = WIFSIGNALED(status);
  c.signal = c.signaled ? WTERMSIG(status) : 0;
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return c;
}

// Thread t writes shared[t] and reads shared[t + 1]; `sync` puts the
// barrier between that the racy version lacks.
__global__ void NeighbourKernel(float* out, bool sync) {
  float* s = static_cast<float*>(cuda_sim::g_dynamic_shared);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  if (sync) __syncthreads();
  out[t] = t + 1 < static_cast<int>(blockDim.x) ? s[t + 1] : -1.0f;
}
// The same race the other way: thread t reads shared[t - 1], which a lower
// thread writes (in thread order the writer has always run first).
__global__ void LowerNeighbourKernel(float* out) {
  float* s = static_cast<float*>(cuda_sim::g_dynamic_shared);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  out[t] = t > 0 ? s[t - 1] : -1.0f;
}
__global__ void CopyKernel(const float* in, float* out, int n) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < n) out[t] = in[t + 1];  // one past for t == n - 1
}
__global__ void Vec4Kernel(const float* in, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(in);
  if (threadIdx.x == 0) out[0] = v.x + v.y + v.z + v.w;
}
struct FillParams {
  float* out;  // [32]
  float value;
};
__global__ void FillKernel(const FillParams p) { p.out[threadIdx.x] = p.value; }
__global__ void SmemKernel(float* out) {
  if (threadIdx.x == 0) out[0] = 1.0f;
}

}  // namespace

// A kernel's static __shared__ array (cuda_sim_more.h): CTA 0 writes it,
// CTA 1 only reads it. In the kernels' *_detail namespace convention, which
// is what the per-CTA poisoning covers.
namespace kvserve::cuda::stub_check_detail {
__global__ void StaleSharedKernel(float* out) {
  __shared__ float v[32];
  if (blockIdx.x == 0) v[threadIdx.x] = 1.0f;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = v[threadIdx.x];
}
}  // namespace kvserve::cuda::stub_check_detail

namespace {

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}
std::vector<float> Download(const float* d, size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

}  // namespace

TEST_CASE("CUDA stand-in catches planted defects", "[cuda_stub][fiber_order]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  float* out = DeviceAlloc<float>(64);

  const cuda_sim::OrderState order = cuda_sim::Order();  // CUDA_SIM_ORDER's, restored below
  SECTION("a race with a lower thread's write is caught in reverse and random fiber order") {
    auto poisoned = [&](void (*kernel)(float*)) {
      REQUIRE(LaunchKernel(kernel, 1, 64, 64 * 4, stream, out) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      const std::vector<float> got = Download(out, 64);
      int n = 0;
      for (int t = 1; t < 64; ++t) n += std::isnan(got[t]);
      return n;
    };
    cuda_sim::SetFiberOrder(cuda_sim::FiberOrder::kForward);
    CHECK(poisoned(LowerNeighbourKernel) == 0);  // unseen in thread order
    cuda_sim::SetFiberOrder(cuda_sim::FiberOrder::kReverse);
    CHECK(poisoned(LowerNeighbourKernel) == 63);
    cuda_sim::SetFiberOrder(cuda_sim::FiberOrder::kRandom, 7);
    CHECK(poisoned(LowerNeighbourKernel) > 16);  // about half the pairs
    cuda_sim::Order() = order;
  }
  SECTION("static __shared__ memory is poisoned before every CTA") {
    REQUIRE(LaunchKernel(kvserve::cuda::stub_check_detail::StaleSharedKernel, 2, 32, 0, stream,
                         out) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const std::vector<float> got = Download(out, 64);
    for (int t = 0; t < 32; ++t) CHECK(got[t] == 1.0f);
    for (int t = 32; t < 64; ++t) CHECK(std::isnan(got[t]));  // not CTA 0's 1.0f
  }
  SECTION("a shared-memory read before the barrier reads poison") {
    cuda_sim::SetFiberOrder(cuda_sim::FiberOrder::kForward);  // reverse order hides this one
    REQUIRE(LaunchKernel(NeighbourKernel, 1, 64, 64 * 4, stream, out, false) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const std::vector<float> racy = Download(out, 64);
    for (int t = 0; t < 63; ++t) CHECK(std::isnan(racy[t]));
    REQUIRE(LaunchKernel(NeighbourKernel, 1, 64, 64 * 4, stream, out, true) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const std::vector<float> fixed = Download(out, 64);
    for (int t = 0; t < 63; ++t) CHECK(fixed[t] == static_cast<float>(t + 1));
    cuda_sim::Order() = order;
  }
  SECTION("a read past a cudaMalloc allocation faults") {
    float* in = DeviceAlloc<float>(64);  // 256 bytes: ends at the guard page
    const Child c = RunInChild([&] {
      LaunchKernel(CopyKernel, 1, 64, 0, stream, static_cast<const float*>(in), out, 64);
      cudaStreamSynchronize(stream);
    });
    CHECK(c.signaled);
    CHECK(c.signal == SIGSEGV);
    const Child ok = RunInChild([&] {
      LaunchKernel(CopyKernel, 1, 64, 0, stream, static_cast<const float*>(in), out, 63);
      cudaStreamSynchronize(stream);
    });
    CHECK_FALSE(ok.signaled);
    CHECK(ok.exit_code == 0);
    cudaFree(in);
  }
  SECTION("host code reading device memory faults") {
    const Child c = RunInChild([&] { std::printf("%f\n", static_cast<double>(out[0])); });
    CHECK(c.signal == SIGSEGV);
  }
  SECTION("a misaligned 16-byte load is reported") {
    float* in = DeviceAlloc<float>(64);
    const Child c = RunInChild([&] {
      LaunchKernel(Vec4Kernel, 1, 32, 0, stream, static_cast<const float*>(in + 1), out);
      cudaStreamSynchronize(stream);
    });
    CHECK(c.exit_code != 0);
    CHECK(c.err.find("misaligned address") != std::string::npos);
    const Child ok = RunInChild([&] {
      LaunchKernel(Vec4Kernel, 1, 32, 0, stream, static_cast<const float*>(in + 4), out);
      cudaStreamSynchronize(stream);
    });
    CHECK(ok.exit_code == 0);
    cudaFree(in);
  }
  SECTION("a host read without the stream synchronisation sees stale data") {
    float* pinned = nullptr;
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 32 * 4, cudaHostAllocMapped) ==
            cudaSuccess);
    for (int i = 0; i < 32; ++i) pinned[i] = -7.0f;
    REQUIRE(LaunchKernel(FillKernel, 1, 32, 0, stream, FillParams{out, 3.0f}) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(pinned, out, 32 * 4, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    CHECK(pinned[0] == -7.0f);  // the missing cudaStreamSynchronize
    CHECK(cuda_stub::PendingOps(stream) == 2);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(pinned[31] == 3.0f);
    // A synchronous cudaMemcpy does not wait for a cudaStreamNonBlocking stream.
    REQUIRE(LaunchKernel(FillKernel, 1, 32, 0, stream, FillParams{out, 5.0f}) == cudaSuccess);
    float host = 0;
    REQUIRE(cudaMemcpy(&host, out, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(host == 3.0f);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  }
  SECTION("a graph replays the pointer captured, not the one set after capture") {
    float* other = DeviceAlloc<float>(32);
    REQUIRE(cudaMemset(other, 0, 32 * 4) == cudaSuccess);
    REQUIRE(cudaMemset(out, 0, 32 * 4) == cudaSuccess);
    FillParams p{out, 9.0f};
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    REQUIRE(LaunchKernel(FillKernel, 1, 32, 0, stream, p) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    CHECK(cuda_stub::PendingOps(stream) == 0);  // captured, not run
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    p.out = other;  // the defect: the graph still holds `out`
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(Download(out, 32)[31] == 9.0f);
    CHECK(Download(other, 32)[0] == 0.0f);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(other);
  }
  SECTION("dynamic shared memory over 48 KiB needs the attribute, up to the opt-in maximum") {
    CHECK(LaunchKernel(SmemKernel, 1, 32, 64 << 10, stream, out) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFuncSetAttribute(SmemKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               232448 + 1) == cudaErrorInvalidValue);
    cudaGetLastError();
    REQUIRE(cudaFuncSetAttribute(SmemKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 << 10) == cudaSuccess);
    CHECK(LaunchKernel(SmemKernel, 1, 32, 64 << 10, stream, out) == cudaSuccess);
    CHECK(LaunchKernel(SmemKernel, 1, 32, (64 << 10) + 4, stream, out) == cudaErrorInvalidValue);
    cudaGetLastError();
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  }
  SECTION("launches over the H200's limits fail with cudaErrorInvalidConfiguration") {
    CHECK(LaunchKernel(SmemKernel, 1, 1056, 0, stream, out) == cudaErrorInvalidConfiguration);
    CHECK(LaunchKernel(SmemKernel, dim3(1, 65536), 32, 0, stream, out) ==
          cudaErrorInvalidConfiguration);
    CHECK(LaunchKernel(SmemKernel, 0, 32, 0, stream, out) == cudaErrorInvalidConfiguration);
    cudaGetLastError();
    cudaDeviceProp prop;
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(prop.major == 9);
    CHECK(prop.multiProcessorCount == 132);
    CHECK(prop.sharedMemPerBlockOptin == 232448);
  }
  SECTION("cudaMalloc during capture fails and invalidates the capture") {
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 256) == cudaErrorStreamCaptureUnsupported);
    CHECK(p == nullptr);
    CHECK(cudaStreamSynchronize(stream) == cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
    CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaGetLastError();
    std::vector<float> pageable(4);
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaMemcpyAsync(out, pageable.data(), 16, cudaMemcpyHostToDevice, stream) ==
          cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
  }
  SECTION("injected cudaMalloc and cudaMemGetInfo failures") {
    cuda_stub::FailMallocAfter(1);
    void* a = nullptr;
    void* b = nullptr;
    CHECK(cudaMalloc(&a, 256) == cudaSuccess);
    CHECK(cudaMalloc(&b, 256) == cudaErrorMemoryAllocation);
    CHECK(b == nullptr);
    CHECK(cudaMalloc(&b, 256) == cudaSuccess);
    cuda_stub::FailMallocAfter(-1);
    cudaFree(a);
    cudaFree(b);
    cuda_stub::FailNextMemGetInfo(cudaErrorInvalidValue);
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total) == cudaErrorInvalidValue);
    CHECK(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
    CHECK(total == (size_t{4} << 30));
    CHECK(total - free_bytes == static_cast<size_t>(cuda_stub::GetCounters().live_device_bytes));
    cudaGetLastError();
  }
  cudaFree(out);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

namespace {

// y[r][o] = sum_i w[o][i] x[r][i] (+ bias[o]) (+ y[r][o]), in fp32, k in order.
// k summed in chunks of `depth`, as the stand-in's algorithm for
// Gemm::kPlanRows = 64 rows does (cublaslt.cc), whatever `rows` is.
std::vector<float> NaiveLinear(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>* bias, const std::vector<float>* y0,
                               int rows, int in, int out, int depth = 16) {
  std::vector<float> y(size_t(rows) * out);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      float acc = 0;
      for (int q = 0; q < in; q += depth) {
        float chunk = 0;
        for (int i = q; i < std::min(in, q + depth); ++i) {
          chunk += w[size_t(o) * in + i] * x[size_t(r) * in + i];
        }
        acc += chunk;
      }
      if (y0 != nullptr) acc += (*y0)[size_t(r) * out + o];
      if (bias != nullptr) acc += (*bias)[o];
      y[size_t(r) * out + o] = acc;
    }
  }
  return y;
}

float* Upload(const std::vector<float>& h) {
  float* d = DeviceAlloc<float>(h.size());
  REQUIRE(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}

}  // namespace

TEST_CASE("CUDA stand-in: a stream that waits on an event sees the other stream's work",
          "[cuda_stub][fiber_order]") {
  // The runner's swap path: the compute stream writes, the copy stream
  // waits on an event of it and copies to pinned memory with
  // cudaMemcpy2DAsync; the host syncs only the copy stream.
  cudaStream_t compute = nullptr, copy = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t ready = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
  uint8_t* dev = DeviceAlloc<uint8_t>(4 * 64);
  uint8_t* host = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&host), 2 * 32, cudaHostAllocMapped) ==
          cudaSuccess);
  std::memset(host, 0, 2 * 32);
  REQUIRE(cudaMemsetAsync(dev, 7, 4 * 64, compute) == cudaSuccess);
  REQUIRE(cudaEventRecord(ready, compute) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(copy, ready, 0) == cudaSuccess);
  // Two rows of 32 bytes, 64 apart on the device, 32 apart in the host copy.
  REQUIRE(cudaMemcpy2DAsync(host, 32, dev, 64, 32, 2, cudaMemcpyDeviceToHost, copy) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
  REQUIRE(std::all_of(host, host + 64, [](uint8_t b) { return b == 7; }));
  // The direction is checked against the allocations.
  REQUIRE(cudaMemcpy2DAsync(host, 32, dev, 64, 32, 2, cudaMemcpyHostToDevice, copy) ==
          cudaErrorInvalidMemcpyDirection);
  cudaGetLastError();
  REQUIRE(cudaFreeHost(host) == cudaSuccess);
  REQUIRE(cudaFree(dev) == cudaSuccess);
  REQUIRE(cudaEventDestroy(ready) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(copy) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
}

TEST_CASE("cuBLASLt stand-in: Gemm::Linear against a naive GEMM", "[cuda_stub][fiber_order]") {
  using kvserve::cuda::ActDtype;
  // stories260K's w_down: in = 172, not a multiple of 8.
  const int rows = 3, in = 172, out = 64;
  std::vector<float> x(size_t(rows) * in), w(size_t(out) * in), bias(out), y0(size_t(rows) * out);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * float(i));
  for (int i = 0; i < out; ++i) bias[size_t(i)] = 0.5f * float(i);
  for (size_t i = 0; i < y0.size(); ++i) y0[i] = float(i % 7);
  float *dx = Upload(x), *dw = Upload(w), *db = Upload(bias), *dy = Upload(y0);
  auto gemm = kvserve::cuda::Gemm::Create(ActDtype::kFp32);
  REQUIRE(gemm.ok());
  kvserve::cuda::GemmParams p;
  p.rows = rows;
  p.in = in;
  p.out = out;
  p.x = dx;
  p.w = dw;
  p.y = dy;
  p.y_dtype = ActDtype::kFp32;

  SECTION("plain, then bias and the residual add") {
    REQUIRE((*gemm)->Linear(p, nullptr).ok());
    CHECK(Download(dy, y0.size()) == NaiveLinear(x, w, nullptr, nullptr, rows, in, out));
    REQUIRE(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    p.bias = db;
    p.accumulate = true;
    REQUIRE((*gemm)->Linear(p, nullptr).ok());
    CHECK(Download(dy, y0.size()) == NaiveLinear(x, w, &bias, &y0, rows, in, out));
  }
  SECTION("one algorithm for every row count: a row's y is the same bits in any batch") {
    // Asked per row count, the heuristic would sum k another way for 1
    // row (split-K 2, chunks of 4) than for 7 (chunks of 8): the stand-in
    // models the hazard, and Gemm asks once, at kPlanRows rows.
    std::vector<std::vector<float>> row0;
    for (int n : {1, 3, 7, 1}) {
      std::vector<float> xn(size_t(n) * in);
      for (size_t i = 0; i < xn.size(); ++i) xn[i] = x[i % x.size()];
      float* dxn = Upload(xn);
      float* dyn = DeviceAlloc<float>(size_t(n) * out);
      p.rows = n;
      p.x = dxn;
      p.y = dyn;
      REQUIRE((*gemm)->Linear(p, nullptr).ok());
      const std::vector<float> y = Download(dyn, size_t(n) * out);
      row0.emplace_back(y.begin(), y.begin() + out);
      cudaFree(dxn);
      cudaFree(dyn);
    }
    for (size_t i = 1; i < row0.size(); ++i) {
      INFO("call " << i);
      REQUIRE(std::memcmp(row0[i].data(), row0[0].data(), size_t(out) * 4) == 0);
    }
    REQUIRE((*gemm)->num_plans() == 1);
    REQUIRE((*gemm)->invariance_fallbacks() == 0);
    // The hazard itself: the heuristic's algorithms for 1 and for 64 rows
    // give other bits for the same row.
    cublasLtHandle_t h;
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t t = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    cublasLtMatrixLayout_t a, b1, c1, b64, c64;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, in, out, in);
    cublasLtMatrixLayoutCreate(&b1, CUDA_R_32F, in, 1, in);
    cublasLtMatrixLayoutCreate(&c1, CUDA_R_32F, out, 1, out);
    cublasLtMatrixLayoutCreate(&b64, CUDA_R_32F, in, 64, in);
    cublasLtMatrixLayoutCreate(&c64, CUDA_R_32F, out, 64, out);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t r1{}, r64{};
    int found = 0;
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, op, a, b1, c1, c1, pref, 1, &r1, &found) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, op, a, b64, c64, c64, pref, 1, &r64, &found) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    cublasLtMatmulHeuristicResult_t checked{};
    REQUIRE(cublasLtMatmulAlgoCheck(h, op, a, b1, c1, c1, &r64.algo, &checked) ==
            CUBLAS_STATUS_SUCCESS);
    const float one = 1, zero = 0;
    REQUIRE(cublasLtMatmul(h, op, &one, dw, a, dx, b1, &zero, dy, c1, dy, c1, &r1.algo, nullptr, 0,
                           nullptr) == CUBLAS_STATUS_SUCCESS);
    const std::vector<float> by_one = Download(dy, size_t(out));
    REQUIRE(cublasLtMatmul(h, op, &one, dw, a, dx, b1, &zero, dy, c1, dy, c1, &r64.algo, nullptr, 0,
                           nullptr) == CUBLAS_STATUS_SUCCESS);
    const std::vector<float> by_64 = Download(dy, size_t(out));
    REQUIRE(std::memcmp(by_64.data(), row0[0].data(), size_t(out) * 4) == 0);
    REQUIRE(std::memcmp(by_one.data(), by_64.data(), size_t(out) * 4) != 0);
    for (auto l : {a, b1, c1, b64, c64}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  SECTION("the heuristic's candidates are timed once per process and shape, never in a capture") {
    // Shapes no other case uses: the picks are the process's.
    p.out = 40;
    REQUIRE((*gemm)->Linear(p, nullptr).ok());
    REQUIRE((*gemm)->tuned_plans() == 1);  // the stand-in offers two candidates
    REQUIRE((*gemm)->memo_hits() == 0);
    const std::vector<float> first = Download(dy, size_t(rows) * 40);
    CHECK(first == NaiveLinear(x, w, nullptr, nullptr, rows, in, 40));
    auto other = kvserve::cuda::Gemm::Create(ActDtype::kFp32);
    REQUIRE(other.ok());
    REQUIRE((*other)->Linear(p, nullptr).ok());
    REQUIRE((*other)->tuned_plans() == 0);
    REQUIRE((*other)->memo_hits() == 1);
    REQUIRE(Download(dy, size_t(rows) * 40) == first);
    // A plan first made while its stream captures takes the heuristic's
    // first candidate: timing would synchronize a capturing stream.
    p.out = 24;
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE((*gemm)->Linear(p, stream).ok());
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE((*gemm)->tuned_plans() == 1);
    REQUIRE((*gemm)->num_plans() == 2);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(Download(dy, size_t(rows) * 24) == NaiveLinear(x, w, nullptr, nullptr, rows, in, 24));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  SECTION("the heuristic is asked with the bias pointer, and holds the call to its alignment") {
    cublasLtHandle_t h;
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 8, 8, 8);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 8, 2, 8);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 8, 2, 8);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);  // no bias pointer yet
    const void* aligned = db;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &aligned,
                                   sizeof(aligned));
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &found) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    const float one = 1, zero = 0;
    const void* odd = db + 1;  // 4-byte aligned: below the heuristic's 16
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &odd, sizeof(odd));
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dy, c, dy, c, &r.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &aligned,
                                   sizeof(aligned));
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dy, c, dy, c, &r.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_SUCCESS);
    cudaStreamSynchronize(nullptr);
    for (auto l : {a, b, c}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    // Through Gemm: a bias 4 bytes off its allocation gets its own plan.
    p.bias = db;
    REQUIRE((*gemm)->Linear(p, nullptr).ok());
    p.bias = db + 1;  // bias[1 ..], then one float past: keep `out` in bounds
    p.out = out - 1;
    p.ldy = out;
    REQUIRE((*gemm)->Linear(p, nullptr).ok());
    REQUIRE((*gemm)->num_plans() == 2);
  }
  SECTION("bf16 over in = 172 (344-byte rows: 8-byte aligned)") {
    auto g16 = kvserve::cuda::Gemm::Create(ActDtype::kBf16);
    REQUIRE(g16.ok());
    std::vector<uint16_t> xb(x.size()), wb(w.size());
    auto to_bf16 = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    };
    auto from_bf16 = [](uint16_t b) {
      const uint32_t u = uint32_t{b} << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    std::vector<float> xr(x.size()), wr(w.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = from_bf16(xb[i] = to_bf16(x[i]));
    for (size_t i = 0; i < w.size(); ++i) wr[i] = from_bf16(wb[i] = to_bf16(w[i]));
    void *dxb = nullptr, *dwb = nullptr;
    REQUIRE(cudaMalloc(&dxb, xb.size() * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&dwb, wb.size() * 2) == cudaSuccess);
    cudaMemcpy(dxb, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dwb, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice);
    p.x = dxb;
    p.w = dwb;
    p.y = dy;
    p.y_dtype = ActDtype::kFp32;  // the LM head's form: fp32 out of bf16
    REQUIRE((*g16)->Linear(p, nullptr).ok());
    CHECK(Download(dy, y0.size()) == NaiveLinear(xr, wr, nullptr, nullptr, rows, in, out));
    cudaFree(dxb);
    cudaFree(dwb);
    g16->reset();
  }
  SECTION("a pointer less aligned than the heuristic was told is refused") {
    REQUIRE((*gemm)->Linear(p, nullptr).ok());  // plans with 256-byte alignment
    cublasLtHandle_t h;
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 8, 8, 8);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 8, 2, 8);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 8, 2, 8);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &found) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    const float one = 1, zero = 0;
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx + 1, b, &zero, dy, c, dy, c, &r.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dy, c, dy, c, &r.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_SUCCESS);
    // A type pair outside the table, and an alignment below the element.
    cublasLtMatrixLayout_t half_b;
    cublasLtMatrixLayoutCreate(&half_b, CUDA_R_16F, 8, 2, 8);
    CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, a, half_b, c, c, pref, 1, &r, &found) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    const uint32_t two = 2;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &two,
                                         sizeof(two));
    CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 1, &r, &found) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(found == 0);
    cudaStreamSynchronize(nullptr);
    for (auto l : {a, b, c, half_b}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
  gemm->reset();
  for (float* d : {dx, dw, db, dy}) cudaFree(d);
}
