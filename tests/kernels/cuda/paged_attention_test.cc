// CUDA paged attention against cpu::PagedAttention on the same inputs: pages
// written by cpu::WriteKv on the host and copied to the device byte for
// byte, the same batch, the same q. Unused slots of every page, q's and
// out's row padding and the workspace are poisoned with 0xff bytes (NaN in
// every float encoding, and NaN scales for int8/int4), so a read outside a
// row's keys or a missing write shows up as NaN.
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
//    representable in both); out is rounded once to the storage type: at
//    most half an ulp of |out| <= max|v|: 2^-9 (bf16) or 2^-11 (fp16) on top.
// The fp32 sweep is the one that catches indexing errors; the bf16/fp16 runs
// check the conversions and strides.
#include "kernels/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_format.h"
#include "cache/kv_pages.h"
#include "kernels/attention_plan.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/gpu_attention_plan.h"
#include "kernels/paged_view.h"

namespace kvserve::cuda {
namespace {

constexpr double kFp32Tol = 4e-5;

double Tolerance(ActDtype act) {
  switch (act) {
    case ActDtype::kBf16: return kFp32Tol + std::ldexp(1.0, -9);
    case ActDtype::kFp16: return kFp32Tol + std::ldexp(1.0, -11);
    default: return kFp32Tol;
  }
}

const char* ActName(ActDtype a) {
  return a == ActDtype::kFp32 ? "fp32" : a == ActDtype::kFp16 ? "fp16" : "bf16";
}

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

// One attention problem: sequences of context ctx[s] whose last q_len[s]
// cache entries are this step's rows (q_len 1: decode; q_len == ctx: a whole
// prompt; in between: a chunk after a prefix-cache hit).
struct AttnCase {
  KvDtype dtype = KvDtype::kFp32;
  int block_size = 16;
  int head_dim = 64;
  int num_kv_heads = 2;
  int group = 1;
  int window = 0;
  int int4_group = 64;
  std::vector<int> ctx;
  std::vector<int> q_len;
  float q_scale = 1.0f;  // > 1 makes the softmax peaky
  uint32_t seed = 1;

  std::string Name() const {
    std::string s = absl::StrCat(std::string(KvDtypeName(dtype)), " bs", block_size, " hd",
                                 head_dim, " kv", num_kv_heads, " g", group, " w", window,
                                 " int4g", int4_group, " qs", q_scale, " seqs");
    for (size_t i = 0; i < ctx.size(); ++i) absl::StrAppend(&s, " ", ctx[i], "/", q_len[i]);
    return s;
  }
};

struct Problem {
  KvFormat format;
  HostKvPages pages;
  BatchInput batch;
  std::vector<float> q;  // [T][num_heads][head_dim], exact in bf16 and fp16
  int num_heads = 0;
  std::vector<double> vmax;  // [num_seqs][num_kv_heads]: max |v| over the context
};

// A float exactly representable in bf16 and in fp16 (normal range).
float ExactInHalfTypes(float x) {
  const float b = cpu::Bf16ToFloat(cpu::FloatToBf16(x));
  return std::fabs(b) < 1e-3f ? 0.0f : std::clamp(b, -60000.0f, 60000.0f);
}

Problem Build(const AttnCase& c) {
  absl::StatusOr<KvFormat> f =
      KvFormat::Create(c.dtype, c.num_kv_heads, c.head_dim, c.block_size, c.int4_group);
  REQUIRE(f.ok());
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int nb_seq = static_cast<int>(c.ctx.size());
  int total_blocks = 3;  // spares that no table names
  int max_blocks = 1;
  for (int len : c.ctx) {
    const int n = (len + c.block_size - 1) / c.block_size;
    total_blocks += n;
    max_blocks = std::max(max_blocks, n + 1);
  }
  Problem p{*f, HostKvPages(*f, 1, total_blocks), {}, {}, c.num_kv_heads * c.group, {}};
  std::memset(p.pages.layer(0), 0xff, p.pages.total_bytes());
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  BatchInput& b = p.batch;
  b.Clear();
  b.max_blocks_per_seq = max_blocks;
  b.block_table.assign(static_cast<size_t>(nb_seq) * max_blocks, -1);
  std::vector<int64_t> slots;
  int next = 0;
  for (int s = 0; s < nb_seq; ++s) {
    REQUIRE(c.q_len[s] <= c.ctx[s]);
    const int n = (c.ctx[s] + c.block_size - 1) / c.block_size;
    for (int i = 0; i < n; ++i) b.block_table[s * max_blocks + i] = ids[next++];
    for (int i = 0; i < c.ctx[s]; ++i) {
      slots.push_back(int64_t(b.block_table[s * max_blocks + i / c.block_size]) * c.block_size +
                      i % c.block_size);
    }
    b.context_len.push_back(c.ctx[s]);
    b.query_start.push_back(b.query_start.back() + c.q_len[s]);
    for (int r = 0; r < c.q_len[s]; ++r) {
      b.token_ids.push_back(0);
      b.positions.push_back(c.ctx[s] - c.q_len[s] + r);
      b.slot_mapping.push_back(slots[slots.size() - c.q_len[s] + r]);
    }
  }
  const size_t kv_elems = slots.size() * c.num_kv_heads * c.head_dim;
  std::vector<float> k(kv_elems), v(kv_elems);
  for (float& x : k) x = normal(rng);
  for (size_t i = 0; i < v.size(); ++i) v[i] = normal(rng) + (i % 3 == 0 ? 1.5f : 0.0f);
  cpu::KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.slot_mapping = slots.data();
  w.num_tokens = static_cast<int32_t>(slots.size());
  w.kv = LayerView(p.pages, 0);
  cpu::WriteKv(w);

  p.q.resize(static_cast<size_t>(b.num_tokens()) * p.num_heads * c.head_dim);
  for (float& x : p.q) x = ExactInHalfTypes(c.q_scale * normal(rng));

  // max |v| per (sequence, kv head), from the pages as decoded.
  const KvFormat& fmt = p.format;
  std::vector<float> row(c.head_dim);
  for (int s = 0; s < nb_seq; ++s) {
    for (int h = 0; h < c.num_kv_heads; ++h) {
      double m = 0.0;
      for (int i = 0; i < c.ctx[s]; ++i) {
        const uint8_t* block =
            p.pages.layer(0) + int64_t(b.BlockRow(s)[i / c.block_size]) * fmt.block_bytes();
        cpu::DequantizeRow(fmt.v(), c.head_dim,
                           block + fmt.RowOffset(fmt.v(), h, i % c.block_size),
                           block + fmt.MetaOffset(fmt.v(), h, i % c.block_size), row.data());
        for (float x : row) m = std::max(m, double(std::fabs(x)));
      }
      p.vmax.push_back(m);
    }
  }
  return p;
}

// cpu::PagedAttention over all rows, on several threads (it is reentrant on
// disjoint row ranges).
std::vector<float> RunCpu(const Problem& p, int window) {
  std::vector<float> out(p.q.size(), -777.0f);
  cpu::PagedAttentionParams a;
  a.q = p.q.data();
  a.out = out.data();
  a.kv = LayerView(p.pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.format.head_dim()));
  a.sliding_window = window;
  const int parts = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  const std::vector<int32_t> bounds = SplitRowsByAttentionCost(a.batch, window, parts, 64);
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i] < bounds[i + 1]) {
      threads.emplace_back([&a, &bounds, i] { cpu::PagedAttention(a, bounds[i], bounds[i + 1]); });
    }
  }
  for (std::thread& th : threads) th.join();
  return out;
}

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
  std::string Name() const {
    return absl::StrCat(ActName(act), options.split ? "" : " nosplit", " fixed",
                        options.fixed_partition_keys, " sms", options.num_sms, " pad", q_pad, "/",
                        out_pad);
  }
};

std::vector<uint8_t> ToAct(const std::vector<float>& x, ActDtype act, int64_t row, int64_t pad) {
  const int64_t es = ActDtypeSize(act), rows = static_cast<int64_t>(x.size()) / row;
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * (row + pad) * es), 0xff);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < row; ++i) {
      const float f = x[r * row + i];
      uint8_t* dst = bytes.data() + (r * (row + pad) + i) * es;
      if (act == ActDtype::kFp32) {
        std::memcpy(dst, &f, 4);
      } else {
        const uint16_t h = act == ActDtype::kBf16 ? cpu::FloatToBf16(f) : cpu::FloatToFp16(f);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  return bytes;
}

float FromAct(const uint8_t* src, ActDtype act) {
  if (act == ActDtype::kFp32) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, src, 2);
  return act == ActDtype::kBf16 ? cpu::Bf16ToFloat(h) : cpu::Fp16ToFloat(h);
}

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
  DeviceBuffer query_start(p.batch.query_start.size() * 4), context_len(p.batch.context_len.size() * 4),
      block_table(p.batch.block_table.size() * 4);
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

// max over elements of |gpu - cpu| / vmax(sequence, kv head); NaN -> inf.
double WorstError(const Problem& p, const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const int hd = p.format.head_dim(), nh = p.num_heads, group = nh / p.format.num_kv_heads();
  const BatchView v = ViewOf(p.batch);
  double worst = 0.0;
  int reported = 0;
  for (int32_t r = 0; r < v.num_tokens; ++r) {
    const int32_t s = v.SeqOfRow(r);
    for (int h = 0; h < nh; ++h) {
      const double vmax = std::max(p.vmax[s * p.format.num_kv_heads() + h / group], 1e-30);
      for (int d = 0; d < hd; ++d) {
        const size_t i = (size_t(r) * nh + h) * hd + d;
        double e = std::fabs(double(gpu[i]) - double(cpu[i])) / vmax;
        if (std::isnan(e)) e = INFINITY;
        if (e > worst && reported < 3 && e > kFp32Tol) {
          UNSCOPED_INFO("row " << r << " (seq " << s << ") head " << h << " ch " << d << ": gpu "
                               << gpu[i] << " cpu " << cpu[i] << " vmax " << vmax);
          ++reported;
        }
        worst = std::max(worst, e);
      }
    }
  }
  return worst;
}

void CheckCase(const AttnCase& c, const std::vector<RunSetup>& setups) {
  INFO(c.Name());
  const Problem p = Build(c);
  const std::vector<float> ref = RunCpu(p, c.window);
  for (const RunSetup& setup : setups) {
    INFO(setup.Name());
    const std::vector<float> got = RunGpu(p, c.window, setup);
    const double err = WorstError(p, got, ref);
    INFO("worst error / max|v| = " << err << ", tolerance " << Tolerance(setup.act));
    REQUIRE(err <= Tolerance(setup.act));
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
  return {auto_split, fixed, none, fixed_bf16};
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
