// CUDA paged attention against cpu::PagedAttention on the same inputs: pages
// written by cpu::WriteKv on the host and copied to the device byte for
// byte, the same batch, the same q. Unused slots of every page, q's and
// out's row padding and the workspace are poisoned with 0xff bytes (NaN in
// every float encoding, and NaN scales for int8/int4), so a read outside a
// row's keys or a missing write shows up as NaN.
//
// Every case runs the reference kernel (model.attention_kernel: reference)
// and, where it takes the layout, the fast tensor-core kernel, whose own
// roundings (P and quantized K/V in fp16 or bf16) FastTolerance in
// tests/kernels/attention_problem.h adds to the bounds below.
//
// Tolerances, as max |gpu - cpu| / max|v| over a (sequence, kv head):
//  - Both kernels decode the same bytes to bitwise the same floats
//    (kv_decode.cuh mirrors DequantizeRow), so with fp32 q/out the only
//    difference is fp32 rounding in a different order: scores are sums of
//    head_dim <= 256 products and outputs weighted sums of up to 4097 keys,
//    whose rounding error is a few times 2^-24 * sqrt(terms) relative, about
//    1e-5 at worst here. kFp32Tol = 4e-5 keeps a margin, while one key
//    missed or added at context 4097 (weight ~1/4097) moves out by ~2e-4.
//  - q in fp16/bf16 is exact input to both sides (q is drawn from values
//    representable in both); out is rounded once to the storage type, a
//    relative error of at most the unit roundoff (2^-8 for bf16's 8-bit
//    significand, 2^-11 for fp16's 11) of |out| <= max|v|, on top.
// The fp32 sweep is the one that catches indexing errors; the bf16/fp16 runs
// check the conversions and strides.
#include "kernels/cuda/attention/paged_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/format/kv_format.h"
#include "kernels/paged_view.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::cuda::testing;  // NOLINT: the shared problem helpers

// Device memory owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) {
    REQUIRE(cudaMalloc(&ptr_, bytes_) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void Upload(const void* host, size_t bytes) {
    REQUIRE(bytes <= bytes_);
    REQUIRE(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  template <typename T>
  void Upload(const std::vector<T>& host) {
    Upload(host.data(), host.size() * sizeof(T));
  }
  void Poison() { REQUIRE(cudaMemset(ptr_, 0xff, bytes_) == cudaSuccess); }
  std::vector<uint8_t> Download(size_t bytes) const {
    std::vector<uint8_t> host(bytes);
    REQUIRE(cudaMemcpy(host.data(), ptr_, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

int NumSms() {
  int device = 0, sms = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  return sms;
}

// How the GPU run is set up besides the problem.
struct RunSetup {
  ActDtype act = ActDtype::kFp32;
  GpuAttentionPlanOptions options;
  int64_t q_pad = 0;    // extra (poisoned) elements per q row
  int64_t out_pad = 0;  // extra elements per out row, which must stay poisoned
  AttentionKernel kernel = AttentionKernel::kReference;
  int32_t persistent_sms = 0;  // PagedAttentionParams::num_sms (0: one CTA per item)
  std::string Name() const {
    return absl::StrCat(ActName(act), options.split ? "" : " nosplit", " fixed",
                        options.fixed_partition_keys, " sms", options.num_sms, " pad", q_pad, "/",
                        out_pad, kernel == AttentionKernel::kFast ? " fast" : " reference",
                        " persistent", persistent_sms);
  }
};

// Runs the CUDA kernel; returns out as floats [T][num_heads][head_dim] and
// checks that the padding of out rows is still poisoned.
std::vector<float> RunGpu(const Problem& p, int window, const RunSetup& setup) {
  const int hd = p.format.head_dim();
  const int64_t row = int64_t(p.num_heads) * hd;
  const int32_t t = p.batch.num_tokens();
  const ActDtype act = setup.act;
  const int64_t es = ActDtypeSize(act);

  DeviceBuffer pages(p.pages.total_bytes());
  pages.Upload(p.pages.layer(0), p.pages.total_bytes());
  DeviceBuffer query_start(p.batch.query_start.size() * 4),
      context_len(p.batch.context_len.size() * 4), block_table(p.batch.block_table.size() * 4);
  query_start.Upload(p.batch.query_start);
  context_len.Upload(p.batch.context_len);
  block_table.Upload(p.batch.block_table);
  const std::vector<uint8_t> q_bytes = ToAct(p.q, act, row, setup.q_pad);
  DeviceBuffer q(q_bytes.size());
  q.Upload(q_bytes);
  const size_t out_bytes = static_cast<size_t>(t * (row + setup.out_pad) * es);
  DeviceBuffer out(out_bytes);
  out.Poison();

  const GpuAttentionShape shape{p.num_heads, p.format.num_kv_heads(), hd, window};
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(p.batch), shape, setup.options);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  DeviceBuffer plan_dev(plan->bytes());
  plan_dev.Upload(plan->words());
  const int64_t ws_bytes = GpuAttentionWorkspaceBytes(shape, plan->header().num_partials);
  DeviceBuffer workspace(ws_bytes);
  workspace.Poison();

  PagedAttentionParams a;
  a.q = q.as();
  a.out = out.as();
  a.q_stride = row + setup.q_pad;
  a.out_stride = row + setup.out_pad;
  a.dtype = act;
  a.kv.pages = pages.as<uint8_t>();
  a.kv.num_blocks = p.pages.num_blocks();
  a.kv.layout = p.format.layout();
  a.batch = ViewOf(p.batch);
  a.batch.query_start = query_start.as<int32_t>();
  a.batch.context_len = context_len.as<int32_t>();
  a.batch.block_table = block_table.as<int32_t>();
  a.batch.token_ids = nullptr;
  a.batch.positions = nullptr;
  a.batch.slot_mapping = nullptr;
  a.batch.logits_rows = nullptr;
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.sliding_window = window;
  a.plan = plan_dev.as<int32_t>();
  a.launch = plan->launch();
  a.workspace = ws_bytes > 0 ? workspace.as() : nullptr;
  a.workspace_bytes = ws_bytes;
  a.kernel = setup.kernel;
  a.num_sms = setup.persistent_sms;
  const absl::Status status = PagedAttention(a, nullptr);
  INFO(status.ToString());
  REQUIRE(status.ok());
  const cudaError_t err = cudaDeviceSynchronize();
  INFO(cudaGetErrorString(err));
  REQUIRE(err == cudaSuccess);

  const std::vector<uint8_t> bytes = out.Download(out_bytes);
  std::vector<float> result(static_cast<size_t>(t * row));
  int bad_pad = 0;
  for (int64_t r = 0; r < t; ++r) {
    const uint8_t* src = bytes.data() + r * (row + setup.out_pad) * es;
    for (int64_t i = 0; i < row; ++i) result[r * row + i] = FromAct(src + i * es, act);
    for (int64_t i = row * es; i < (row + setup.out_pad) * es; ++i) bad_pad += src[i] != 0xff;
  }
  REQUIRE(bad_pad == 0);
  return result;
}

// Each setup runs the reference kernel and, where it takes the layout, the
// fast one (with its roundings' tolerance, FastTolerance).
void CheckCase(const AttnCase& c, const std::vector<RunSetup>& setups) {
  INFO(c.Name());
  const Problem p = Build(c);
  const std::vector<float> ref = RunCpu(p, c.window);
  PagedAttentionParams probe;
  probe.kv.layout = p.format.layout();
  const bool fast_takes = UsesFastAttention(probe);
  for (const RunSetup& base : setups) {
    for (AttentionKernel kernel : {AttentionKernel::kReference, AttentionKernel::kFast}) {
      if (kernel == AttentionKernel::kFast && !fast_takes) continue;
      RunSetup setup = base;
      setup.kernel = kernel;
      INFO(setup.Name());
      const std::vector<float> got = RunGpu(p, c.window, setup);
      const double err = WorstError(p, got, ref);
      const double tol = kernel == AttentionKernel::kFast
                             ? FastTolerance(c.dtype, setup.act, c.q_scale)
                             : Tolerance(setup.act);
      INFO("worst error / max|v| = " << err << ", tolerance " << tol);
      REQUIRE(err <= tol);
    }
  }
}

// Auto split on this device, a forced split into 64-key partitions (most
// rows merged), and no split; in fp32, plus bf16 for the forced split.
std::vector<RunSetup> StandardSetups() {
  RunSetup auto_split;
  auto_split.options.num_sms = NumSms();
  RunSetup fixed = auto_split;
  fixed.options.fixed_partition_keys = 64;
  RunSetup none = auto_split;
  none.options.split = false;
  RunSetup fixed_bf16 = fixed;
  fixed_bf16.act = ActDtype::kBf16;
  RunSetup persistent = fixed;  // a grid of the CTAs two SMs hold, walking every item
  persistent.persistent_sms = 2;
  return {auto_split, fixed, none, fixed_bf16, persistent};
}

TEST_CASE("CUDA paged attention matches the CPU kernel over every format and shape", "[gpu]") {
  // Each batch: a first decode row (context 1), a whole 17-token prompt, a
  // 5-row chunk after a 92-token prefix hit, a decode row at 1000 and a
  // 3-row chunk at 4097, sharing one shuffled pool.
  const std::vector<RunSetup> setups = StandardSetups();
  const int windows[] = {0, 0, 7, 1000};
  uint32_t seed = 1;
  for (KvDtype dtype : kAllKvDtypes) {
    for (int hd : {8, 64, 128}) {
      for (int bs : {1, 16, 32}) {
        for (int group : {1, 4, 8}) {
          AttnCase c;
          c.dtype = dtype;
          c.head_dim = hd;
          c.block_size = bs;
          c.group = group;
          c.int4_group = hd == 128 ? 32 : 64;  // 4 groups per row at 128, 1 below
          c.window = windows[seed % 4];
          c.ctx = {1, 17, 97, 1000, 4097};
          c.q_len = {1, 17, 5, 1, 3};
          c.seed = seed++;
          CheckCase(c, setups);
        }
      }
    }
  }
}

TEST_CASE("CUDA paged attention: sliding windows around every boundary", "[gpu]") {
  const std::vector<RunSetup> setups = StandardSetups();
  uint32_t seed = 100;
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kK8V4}) {
    for (int window : {1, 2, 16, 17, 64, 100, 4096, 5000}) {
      AttnCase c;
      c.dtype = dtype;
      c.head_dim = 64;
      c.block_size = 16;
      c.group = 4;
      c.window = window;
      c.ctx = {4097, 300, 33, 1};
      c.q_len = {2, 40, 33, 1};
      c.q_scale = 3.0f;
      c.seed = seed++;
      CheckCase(c, setups);
    }
  }
}

// Small enough for compute-sanitizer memcheck (gpu-bundle/run.sh runs the
// [sanitize] cases under it): every format, a split, a window, a mixed batch.
TEST_CASE("CUDA paged attention: a small mixed batch for memcheck", "[gpu][sanitize]") {
  const std::vector<RunSetup> setups = StandardSetups();
  uint32_t seed = 900;
  for (KvDtype dtype : kAllKvDtypes) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 64;
    c.block_size = 16;
    c.group = 4;
    c.window = dtype == KvDtype::kInt8 ? 20 : 0;
    c.ctx = {300, 33, 1};
    c.q_len = {1, 33, 1};
    c.seed = seed++;
    CheckCase(c, setups);
  }
}

TEST_CASE("CUDA paged attention: peaky softmax over long split contexts", "[gpu]") {
  // Scores spread over tens of units: partitions' maxima differ a lot, so a
  // wrong rescale or merge weight shows.
  std::vector<RunSetup> setups = StandardSetups();
  for (int keys : {1, 7, 256}) {
    RunSetup s = setups[0];
    s.options.fixed_partition_keys = keys;
    setups.push_back(s);
  }
  for (KvDtype dtype : {KvDtype::kFp32, KvDtype::kFp8E4m3, KvDtype::kInt4}) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 128;
    c.group = 8;
    c.ctx = {4097, 700, 300};
    c.q_len = {1, 3, 300};
    c.q_scale = 8.0f;
    c.seed = 7;
    CheckCase(c, setups);
  }
}

TEST_CASE("CUDA paged attention: 32768-token contexts, decode and a prefix-hit chunk", "[gpu]") {
  uint32_t seed = 900;
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kInt8, KvDtype::kInt4}) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 128;
    c.num_kv_heads = 2;
    c.group = 4;
    c.block_size = dtype == KvDtype::kInt8 ? 32 : 16;
    c.ctx = {32768, 32768};
    c.q_len = {1, 7};
    c.seed = seed++;
    CheckCase(c, StandardSetups());
  }
}

TEST_CASE("CUDA paged attention: the Llama-3-8B decode shape in bf16", "[gpu]") {
  // 32 query heads over 8 kv heads, head_dim 128, block 16, a decode batch.
  RunSetup s;
  s.act = ActDtype::kBf16;
  s.options.num_sms = NumSms();
  for (KvDtype dtype : kAllKvDtypes) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 128;
    c.num_kv_heads = 8;
    c.group = 4;
    c.ctx = {1000, 2000, 3000, 4096, 17, 1, 999, 64};
    c.q_len = {1, 1, 1, 1, 1, 1, 1, 1};
    c.seed = 11;
    RunSetup f32 = s;
    f32.act = ActDtype::kFp32;
    CheckCase(c, {s, f32});
  }
}

TEST_CASE("CUDA paged attention: GQA groups that are not powers of two, MQA, wide groups",
          "[gpu]") {
  const std::vector<RunSetup> setups = StandardSetups();
  struct {
    int kv, group;
  } shapes[] = {{2, 3}, {1, 6}, {1, 32}, {2, 17}, {3, 2}, {1, 1}};
  uint32_t seed = 300;
  for (const auto& sh : shapes) {
    for (KvDtype dtype : {KvDtype::kFp16, KvDtype::kInt4}) {
      AttnCase c;
      c.dtype = dtype;
      c.head_dim = 64;
      c.num_kv_heads = sh.kv;
      c.group = sh.group;
      c.ctx = {45, 97, 500};
      c.q_len = {4, 1, 23};
      c.seed = seed++;
      CheckCase(c, setups);
    }
  }
}

TEST_CASE("CUDA paged attention: head_dim 256, 6 and 2, int4 groups of 2", "[gpu]") {
  const std::vector<RunSetup> setups = StandardSetups();
  struct {
    int hd, int4_group;
  } dims[] = {{256, 64}, {256, 256}, {6, 2}, {2, 2}, {96, 32}};
  uint32_t seed = 400;
  for (const auto& d : dims) {
    for (KvDtype dtype : kAllKvDtypes) {
      AttnCase c;
      c.dtype = dtype;
      c.head_dim = d.hd;
      c.int4_group = d.int4_group;
      c.group = 2;
      c.block_size = 32;
      c.ctx = {300, 40, 1};
      c.q_len = {1, 40, 1};
      c.seed = seed++;
      CheckCase(c, setups);
    }
  }
}

TEST_CASE("CUDA paged attention: fp16 and bf16 activations with padded rows", "[gpu]") {
  std::vector<RunSetup> setups;
  for (ActDtype act : {ActDtype::kFp32, ActDtype::kFp16, ActDtype::kBf16}) {
    for (int64_t pad : {0, 1, 64}) {
      RunSetup s;
      s.act = act;
      s.options.num_sms = NumSms();
      s.options.fixed_partition_keys = pad == 1 ? 32 : 0;
      s.q_pad = pad;
      s.out_pad = pad + 3;
      setups.push_back(s);
    }
  }
  for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kK8V4}) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 64;
    c.group = 4;
    c.ctx = {200, 20, 1};
    c.q_len = {1, 20, 1};
    c.seed = 500;
    CheckCase(c, setups);
  }
}

TEST_CASE("CUDA paged attention: a batch without rows launches nothing", "[gpu]") {
  PagedAttentionParams a;
  a.kv.layout = KvFormat::Create(KvDtype::kInt8, 2, 64, 16)->layout();
  a.num_heads = 8;
  a.scale = 0.125f;
  REQUIRE(PagedAttention(a, nullptr).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("CUDA paged attention rejects bad params naming the field", "[gpu]") {
  DeviceBuffer buffer(1 << 16);
  PagedAttentionParams a;
  a.q = a.out = buffer.as();
  a.kv.pages = buffer.as<uint8_t>();
  a.kv.num_blocks = 1;
  a.kv.layout = KvFormat::Create(KvDtype::kInt4, 2, 64, 16, 32)->layout();
  a.batch.query_start = a.batch.context_len = a.batch.block_table = buffer.as<int32_t>();
  a.batch.max_blocks_per_seq = 1;
  a.num_heads = 8;
  a.scale = 0.125f;
  a.plan = buffer.as<int32_t>();
  a.launch = {1, 0, 0, 4};
  auto require_bad = [&](const std::string& field) {
    const absl::Status status = PagedAttention(a, nullptr);
    INFO(status.ToString());
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(status.message()).find(field) != std::string::npos);
  };
  SECTION("num_heads") {
    a.num_heads = 7;
    require_bad("num_heads");
  }
  SECTION("heads per CTA of another plan") {
    a.launch.heads_per_cta = 2;
    require_bad("heads_per_cta");
  }
  SECTION("q_stride") {
    a.q_stride = 100;
    require_bad("q_stride");
  }
  SECTION("a K/V pair no format has") {
    a.kv.layout.k = KvFormat::Create(KvDtype::kFp16, 2, 64, 16)->layout().k;
    a.kv.layout.v = KvFormat::Create(KvDtype::kBf16, 2, 64, 16)->layout().v;
    require_bad("elements");
  }
  SECTION("int4 group") {
    a.kv.layout.v.group_size = 3;
    require_bad("kv.layout.v");
  }
  SECTION("workspace too small for the partials") {
    a.launch = {2, 1, 2, 4};
    a.workspace = buffer.as();
    a.workspace_bytes = 100;
    require_bad("workspace_bytes");
  }
  SECTION("null plan") {
    a.plan = nullptr;
    require_bad("plan");
  }
  SECTION("head_dim") {
    a.kv.layout.head_dim = 258;
    require_bad("head_dim");
  }
}

}  // namespace
}  // namespace kvserve::cuda
