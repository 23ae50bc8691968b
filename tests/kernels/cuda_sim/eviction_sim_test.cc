// KV eviction's device code run on the CPU by cuda_sim.h: the CUDA
// attention kernels with sink queries and per-key mass output
// (paged_attention_kernel.cuh: AttentionKernel, MergeKernel, MassKernel,
// GatherMassKernel) against cpu::PagedAttention with the same sink_q /
// num_sinks / key_mass, and the slot-move kernel (move_slots_kernel.cuh)
// against the CPU runner's MoveSlots byte copy, over every per-token
// format. Outputs within the tolerances of paged_attention_sim_test.cc,
// masses within 2e-5 absolute (a key's mass sums at most num_heads weights,
// each computed from the same scores as the CPU's up to fp32 summation
// order), the gathered statistics and the moved bytes exactly; and RoPE at
// positions past its table (rope_kernel.cuh with host-computed rows) bit for
// bit as cpu::ApplyRope with the CPU's angles.
// clang-format off
#include "tests/kernels/cuda_sim/cuda_sim.h"  // first: the shims the kernel source needs
#include "kernels/cuda/attention/paged_attention_kernel.cuh"
#include "kernels/cuda/kv/move_slots_kernel.cuh"
#include "kernels/cuda/layers/rope_kernel.cuh"
// clang-format on

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/block_copy.h"
#include "cache/format/kv_pages.h"
#include "kernels/cpu/kv/move_slots.h"
#include "kernels/cpu/layers/ops.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/attention_problem.h"

namespace kvserve::cuda {
namespace {

using namespace ::kvserve::cuda::testing;  // NOLINT: the shared problem helpers
using attention_detail::KernelArgs;

constexpr size_t kSmemBytes =
    (attention_detail::SmemFloats(kGpuAttentionMaxHeadDim) / 4 + 1) * sizeof(float4);

// The eviction inputs of a problem: sinks per sequence, a sink query per
// row, which sequences record mass.
struct Eviction {
  std::vector<int32_t> num_sinks;     // [B]
  std::vector<float> sink_q;          // like p.q
  std::vector<int64_t> mass_offset;   // [T]
  std::vector<int64_t> stats_offset;  // [B], layer 0
  int64_t total_keys = 0, total_stats = 0;
};

Eviction MakeEviction(const Problem& p, int window, std::vector<int32_t> sinks,
                      std::vector<bool> record, uint32_t seed) {
  Eviction e;
  const BatchView v = ViewOf(p.batch);
  e.num_sinks = std::move(sinks);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  e.sink_q.resize(p.q.size());
  for (float& x : e.sink_q) x = ExactInHalfTypes(normal(rng));
  e.mass_offset.assign(v.num_tokens, -1);
  e.stats_offset.assign(v.num_seqs, -1);
  for (int32_t b = 0; b < v.num_seqs; ++b) {
    if (!record[b]) continue;
    for (int32_t r = p.batch.query_start[b]; r < p.batch.query_start[b + 1]; ++r) {
      e.mass_offset[r] = e.total_keys;
      e.total_keys += NumKeys(v.CacheIndex(b, r), window);
    }
    e.stats_offset[b] = e.total_stats;
    e.total_stats += p.batch.context_len[b];
  }
  return e;
}

struct Result {
  std::vector<float> out, mass;
};

Result RunCpuEviction(const Problem& p, int window, const Eviction& e) {
  Result res;
  res.out.assign(p.q.size(), -777.0f);
  res.mass.assign(e.total_keys, -777.0f);
  cpu::PagedAttentionParams a;
  a.q = p.q.data();
  a.out = res.out.data();
  a.kv = LayerView(p.pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.format.head_dim()));
  a.sliding_window = window;
  a.sink_q = e.sink_q.data();
  a.num_sinks = e.num_sinks.data();
  a.key_mass = res.mass.data();
  a.key_mass_offset = e.mass_offset.data();
  cpu::PagedAttention(a, 0, p.batch.num_tokens());
  return res;
}

Result RunSimEviction(const Problem& p, int window, const Eviction& e, ActDtype act,
                      const GpuAttentionPlanOptions& options) {
  const int hd = p.format.head_dim();
  const int64_t row = int64_t(p.num_heads) * hd, pad = 3;
  const int32_t t = p.batch.num_tokens();
  const int64_t es = ActDtypeSize(act);
  const std::vector<uint8_t> q = ToAct(p.q, act, row, pad);
  const std::vector<uint8_t> sq = ToAct(e.sink_q, act, row, pad);
  std::vector<uint8_t> out(static_cast<size_t>(t * (row + pad) * es), 0xff);
  std::vector<float> stats(static_cast<size_t>(t) * p.num_heads * 2, NAN);
  Result res;
  res.mass.assign(e.total_keys, NAN);

  const GpuAttentionShape shape{p.num_heads, p.format.num_kv_heads(), hd, window};
  absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(p.batch), shape, options);
  REQUIRE(plan.ok());
  std::vector<float> workspace(  // poisoned: every bit set (NaN); may be empty
      static_cast<size_t>(GpuAttentionWorkspaceBytes(shape, plan->header().num_partials) / 4),
      __uint_as_float(0xffffffffu));

  KernelArgs a{};
  a.q = q.data();
  a.out = out.data();
  a.q_stride = row + pad;
  a.out_stride = row + pad;
  a.dtype = act;
  a.kv = LayerView(p.pages, 0);
  a.batch = ViewOf(p.batch);
  a.num_heads = p.num_heads;
  a.group = p.num_heads / p.format.num_kv_heads();
  a.heads_per_cta = plan->header().heads_per_cta;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.sliding_window = window;
  a.plan = plan->words().data();
  a.workspace = workspace.data();
  a.slot_floats = GpuAttentionSlotFloats(shape);
  a.sink_q = sq.data();
  a.num_sinks = e.num_sinks.data();
  a.softmax_stats = stats.data();
  a.key_mass = res.mass.data();
  a.key_mass_offset = e.mass_offset.data();

  const dim3 grid(plan->header().num_items, p.num_heads / a.heads_per_cta);
  const attention_detail::KernelFn kernel =
      attention_detail::AttentionKernelFor(p.format.k().elem, p.format.v().elem);
  REQUIRE(kernel != nullptr);
  std::vector<float4> smem(kSmemBytes / sizeof(float4));  // the kernel's dynamic shared memory
  cuda_sim::Launch(kernel, grid, attention_detail::kThreads, smem.data(), kSmemBytes, a);
  if (plan->header().num_merges > 0) {
    cuda_sim::Launch(attention_detail::MergeKernel,
                     attention_skeleton::MergeGrid(plan->header().num_merges, a.num_heads),
                     attention_detail::kThreads, nullptr, 0, a);
  }
  const attention_detail::KernelFn mass = attention_detail::MassKernelFor(p.format.k().elem);
  REQUIRE(mass != nullptr);
  cuda_sim::Launch(mass, dim3(t), attention_detail::kThreads, nullptr, 0, a);

  res.out.resize(static_cast<size_t>(t * row));
  for (int64_t r = 0; r < t; ++r) {
    const uint8_t* src = out.data() + r * (row + pad) * es;
    for (int64_t i = 0; i < row; ++i) res.out[r * row + i] = FromAct(src + i * es, act);
    for (int64_t i = row * es; i < (row + pad) * es; ++i) REQUIRE(src[i] == 0xff);
  }
  return res;
}

// The CPU runner's gather (model/cpu/cpu_forward.cc GatherAttentionStats), one layer.
std::vector<float> CpuGather(const Problem& p, int window, const Eviction& e,
                             const std::vector<float>& mass) {
  std::vector<float> out(e.total_stats, 0.0f);
  const BatchView v = ViewOf(p.batch);
  for (int32_t b = 0; b < v.num_seqs; ++b) {
    if (e.stats_offset[b] < 0) continue;
    float* o = out.data() + e.stats_offset[b];
    for (int32_t r = p.batch.query_start[b]; r < p.batch.query_start[b + 1]; ++r) {
      const int32_t idx = v.CacheIndex(b, r), lo = KeyBegin(idx, window);
      for (int32_t j = lo; j <= idx; ++j) o[j] += mass[e.mass_offset[r] + (j - lo)];
    }
  }
  return out;
}

std::vector<float> SimGather(const Problem& p, int window, const Eviction& e,
                             const std::vector<float>& mass) {
  std::vector<float> out(e.total_stats, NAN);
  attention_detail::GatherArgs g{ViewOf(p.batch),       window,
                                 mass.data(),           e.mass_offset.data(),
                                 e.stats_offset.data(), out.data()};
  cuda_sim::Launch(attention_detail::GatherMassKernel, dim3(p.batch.num_seqs()),
                   attention_detail::kThreads, nullptr, 0, g);
  return out;
}

void CheckEviction(const AttnCase& c, std::vector<int32_t> sinks, std::vector<bool> record) {
  INFO(c.Name());
  const Problem p = Build(c);
  const Eviction e = MakeEviction(p, c.window, std::move(sinks), std::move(record), c.seed + 99);
  const Result ref = RunCpuEviction(p, c.window, e);
  // The sinks change the output: a run without them differs somewhere.
  REQUIRE(WorstError(p, RunCpu(p, c.window), ref.out) > 1e-3);
  GpuAttentionPlanOptions none, split;
  none.split = false;
  split.fixed_partition_keys = 16;
  for (ActDtype act : {ActDtype::kFp32, ActDtype::kBf16}) {
    for (const GpuAttentionPlanOptions& o : {none, split}) {
      INFO(ActName(act) << (o.split ? " split" : " nosplit"));
      const Result sim = RunSimEviction(p, c.window, e, act, o);
      const double err = WorstError(p, sim.out, ref.out);
      INFO("worst error / max|v| = " << err);
      REQUIRE(err <= Tolerance(act));
      REQUIRE(sim.mass.size() == ref.mass.size());
      double worst_mass = 0.0;
      for (size_t i = 0; i < ref.mass.size(); ++i) {
        const double d = std::fabs(double(sim.mass[i]) - ref.mass[i]);
        worst_mass = std::isnan(d) ? INFINITY : std::max(worst_mass, d);
      }
      INFO("worst mass error " << worst_mass);
      REQUIRE(worst_mass <= 2e-5);
      // The gather adds in the CPU's order: equal masses, equal statistics.
      REQUIRE(SimGather(p, c.window, e, sim.mass) == CpuGather(p, c.window, e, sim.mass));
    }
  }
}

TEST_CASE("simulated CUDA attention with sinks and key mass matches the CPU kernel",
          "[kernels][cuda_sim][eviction]") {
  // A decode row, a 17-token prompt, a 5-row chunk and a long decode row;
  // sinks on three of them (one below, one across a block boundary), mass
  // recorded for three.
  uint32_t seed = 300;
  for (KvDtype dtype : kAllKvDtypes) {
    AttnCase c;
    c.dtype = dtype;
    c.head_dim = 16;
    c.group = seed % 2 == 0 ? 2 : 1;
    c.block_size = seed % 3 == 0 ? 1 : 4;
    c.int4_group = 8;
    c.window = seed % 3 == 1 ? 9 : 0;
    c.ctx = {3, 17, 40, 70};
    c.q_len = {1, 17, 5, 1};
    c.q_scale = 2.0f;
    c.seed = seed++;
    CheckEviction(c, {2, 0, 4, 6}, {true, true, false, true});
  }
}

TEST_CASE("simulated CUDA attention with sinks: scores far past the fp32 range of exp",
          "[kernels][cuda_sim][eviction]") {
  // As above with queries scaled by 100 (scores of hundreds; the mass
  // kernel exponentiates against the head's final maximum).
  AttnCase c;
  c.dtype = KvDtype::kFp16;
  c.head_dim = 16;
  c.group = 2;
  c.block_size = 4;
  c.ctx = {3, 17, 40};
  c.q_len = {1, 17, 1};
  c.q_scale = 100.0f;
  c.seed = 350;
  CheckEviction(c, {2, 0, 6}, {true, true, true});
}

TEST_CASE("simulated CUDA attention: eviction outputs off leave the kernel as before",
          "[kernels][cuda_sim][eviction]") {
  // num_sinks all 0 and no recorded row: exactly the output without them.
  AttnCase c;
  c.dtype = KvDtype::kInt8;
  c.head_dim = 16;
  c.group = 2;
  c.ctx = {20, 9};
  c.q_len = {1, 9};
  c.seed = 7;
  const Problem p = Build(c);
  Eviction e = MakeEviction(p, 0, {0, 0}, {false, false}, 8);
  GpuAttentionPlanOptions o;
  o.fixed_partition_keys = 16;
  const Result with = RunSimEviction(p, 0, e, ActDtype::kFp32, o);
  e.sink_q.assign(e.sink_q.size(), NAN);  // never read
  REQUIRE(RunSimEviction(p, 0, e, ActDtype::kFp32, o).out == with.out);
  REQUIRE(WorstError(p, with.out, RunCpu(p, 0)) <= Tolerance(ActDtype::kFp32));
}

TEST_CASE("simulated CUDA slot moves copy exactly the CPU runner's bytes, every format",
          "[kernels][cuda_sim][eviction]") {
  std::mt19937 rng(11);
  for (KvDtype dtype : kAllKvDtypes) {
    for (int hd : {6, 16}) {
      INFO(KvDtypeName(dtype) << " hd " << hd);
      absl::StatusOr<KvFormat> f = KvFormat::Create(dtype, 2, hd, 4, hd == 6 ? 2 : 8);
      REQUIRE(f.ok());
      const int layers = 3, blocks = 5;
      HostKvPages cpu(*f, layers, blocks), sim(*f, layers, blocks);
      for (int64_t i = 0; i < cpu.total_bytes(); ++i) cpu.layer(0)[i] = static_cast<uint8_t>(rng());
      std::memcpy(sim.layer(0), cpu.layer(0), cpu.total_bytes());
      const std::vector<uint8_t> before(cpu.layer(0), cpu.layer(0) + cpu.total_bytes());
      // Independent moves: within a block, across blocks, to the last slot;
      // one outside the pool (skipped by the kernel, not given to the CPU).
      const std::vector<SlotMove> moves = {{5, 1}, {19, 2}, {0, 12}, {9, 19 - 1}};
      cpu::MoveSlots(cpu, moves);
      std::vector<int64_t> list;
      for (const SlotMove& m : moves) list.insert(list.end(), {m.src, m.dst});
      list.insert(list.end(), {3, int64_t{blocks} * 4});
      MoveSlotsParams mp;
      mp.pool = sim.layer(0);
      mp.num_layers = layers;
      mp.num_blocks = blocks;
      mp.layout = f->layout();
      mp.moves = list.data();
      mp.num_moves = static_cast<int32_t>(list.size() / 2);
      cuda_sim::Launch(move_slots_detail::MoveSlotsKernel,
                       dim3(static_cast<unsigned>(mp.num_moves), layers),
                       move_slots_detail::kThreads, nullptr, 0, mp);
      const std::vector<uint8_t> got(sim.layer(0), sim.layer(0) + sim.total_bytes());
      const std::vector<uint8_t> want(cpu.layer(0), cpu.layer(0) + cpu.total_bytes());
      REQUIRE(got == want);
      REQUIRE(got != before);  // the moves changed something
    }
  }
}

TEST_CASE("simulated RoPE past the table takes the host rows, bit for bit as the CPU",
          "[kernels][cuda_sim][eviction]") {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    const int max_positions = 50, head_dim = 16, half = head_dim / 2, nq = 2, nkv = 1, tokens = 3;
    const cpu::RopeTable table(max_positions, head_dim, 10000.0f);
    // The CPU's RopeAt past the table computes as the table does: a table
    // long enough to hold the positions gives its very numbers.
    const cpu::RopeTable big(2000, head_dim, 10000.0f);
    const int64_t stride = (nq + 2 * nkv) * head_dim;
    std::vector<float> qkv(tokens * stride);
    for (float& x : qkv) x = normal(rng);
    const std::vector<int32_t> positions = {7, 50, 1999};
    std::vector<float> want = qkv;
    std::vector<float> row_cos(tokens * half, NAN), row_sin(tokens * half, NAN);
    for (int t = 0; t < tokens; ++t) {
      float* row = want.data() + t * stride;
      const bool inter = style == RopeStyle::kInterleaved;
      cpu::ApplyRope(row, nq, head_dim, big.cos(positions[t]), big.sin(positions[t]), inter);
      cpu::ApplyRope(row + nq * head_dim, nkv, head_dim, big.cos(positions[t]),
                     big.sin(positions[t]), inter);
      if (positions[t] >= max_positions) {
        std::memcpy(row_cos.data() + t * half, big.cos(positions[t]), half * 4);
        std::memcpy(row_sin.data() + t * half, big.sin(positions[t]), half * 4);
      }
    }
    RopeParams p;
    p.q = qkv.data();
    p.k = qkv.data() + nq * head_dim;
    p.q_stride = p.k_stride = stride;
    p.positions = positions.data();
    p.cos = table.cos(0);
    p.sin = table.sin(0);
    p.max_positions = max_positions;
    p.num_tokens = tokens;
    p.num_q_heads = nq;
    p.num_kv_heads = nkv;
    p.head_dim = head_dim;
    p.style = style;
    std::vector<float> without = qkv;
    p.row_cos = row_cos.data();
    p.row_sin = row_sin.data();
    cuda_sim::Launch(rope_detail::RopeKernel<float>, dim3(tokens), rope_detail::kThreads, nullptr,
                     0, p);
    REQUIRE(std::memcmp(qkv.data(), want.data(), qkv.size() * 4) == 0);
    // Without the rows, a position past the table is NaN (as before).
    p.q = without.data();
    p.k = without.data() + nq * head_dim;
    p.row_cos = p.row_sin = nullptr;
    cuda_sim::Launch(rope_detail::RopeKernel<float>, dim3(tokens), rope_detail::kThreads, nullptr,
                     0, p);
    REQUIRE(std::memcmp(without.data(), want.data(), stride * 4) == 0);
    REQUIRE(std::isnan(without[stride]));
  }
}

}  // namespace
}  // namespace kvserve::cuda
