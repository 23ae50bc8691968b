// [gpu] The int4_kc kernels on the device against the CPU's int4_kc kernels
// on a layout with fp16 tails (tests/kernels/kc_problem.h builds the state
// before a step with the CPU): SealKvBlocks writes exactly the CPU's block
// bytes, PagedAttentionKc equals cpu::PagedAttention within the fp32
// attention tolerance (unsplit and split into 16-key partitions),
// WriteKvTails writes exactly the CPU's tail bytes; and the launchers
// refuse layouts that are not int4_kc with fp16 tails. The same problems
// run in make test through the simulator (cuda_sim/int4_kc_sim_test.cc);
// here they run on the hardware, with larger shapes.
#include "kernels/cuda/kv/kv_write_kc.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cuda/attention/paged_attention_kc.h"
#include "kernels/plan/gpu_attention_plan.h"
#include "tests/kernels/cuda/device_buffer.h"
#include "tests/kernels/kc_problem.h"

namespace kvserve::cuda {
namespace {

using ::kvserve::testing::DeviceBuffer;
using ::kvserve::testing::RequireBadField;
using ::kvserve::testing::RequireOk;
using namespace ::kvserve::testing::kc;  // NOLINT: the shared problem

// One layer's pages and tails, and the step's batch, on the device.
struct DeviceState {
  DeviceBuffer pages, tails, query_start, context_len, block_table, tail_ids, k, v, q, out;
  DeviceState(const KcProblem& p)
      : pages(p.before.Blocks().size()),
        tails(p.before.Tails().size()),
        query_start(p.step.batch.query_start.size() * 4),
        context_len(p.step.batch.context_len.size() * 4),
        block_table(p.step.batch.block_table.size() * 4),
        tail_ids(p.step.batch.tail_ids.size() * 4),
        k(p.step.k.size() * 4),
        v(p.step.v.size() * 4),
        q(p.q.size() * 4),
        out(p.q.size() * 4) {
    pages.Upload(p.before.Blocks());
    tails.Upload(p.before.Tails());
    query_start.Upload(p.step.batch.query_start);
    context_len.Upload(p.step.batch.context_len);
    block_table.Upload(p.step.batch.block_table);
    tail_ids.Upload(p.step.batch.tail_ids);
    k.Upload(p.step.k);
    v.Upload(p.step.v);
    q.Upload(p.q);
  }
  BatchView Batch(const KcProblem& p) const {
    BatchView b = ViewOf(p.step.batch);  // counts; device pointers below
    b.token_ids = nullptr;
    b.positions = nullptr;
    b.slot_mapping = nullptr;
    b.logits_rows = nullptr;
    b.query_start = query_start.as<int32_t>();
    b.context_len = context_len.as<int32_t>();
    b.block_table = block_table.as<int32_t>();
    b.tail_ids = tail_ids.as<int32_t>();
    return b;
  }
  PagedKvView Kv(const KcProblem& p) const {
    PagedKvView kv = LayerView(p.before.pages, 0);
    kv.pages = pages.as();
    kv.tails = tails.as();
    return kv;
  }
};

void CheckOnDevice(const KcCase& c) {
  INFO(c.Name());
  const KcProblem p = BuildKcProblem(c);
  DeviceState d(p);
  KvKcWriteParams w;
  w.k = d.k.as();
  w.v = d.v.as();
  w.dtype = ActDtype::kFp32;
  w.batch = d.Batch(p);
  w.kv = d.Kv(p);
  RequireOk(SealKvBlocks(w, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  REQUIRE(DifferingBytes(d.pages.Download<uint8_t>(d.pages.bytes()), p.sealed.Blocks()) == 0);

  const int nh = c.num_kv_heads * c.group;
  const GpuAttentionShape shape{nh, c.num_kv_heads, c.head_dim, c.window};
  for (bool split : {false, true}) {
    INFO((split ? "split" : "unsplit"));
    GpuAttentionPlanOptions options;
    if (split) {
      options.fixed_partition_keys = 16;
    } else {
      options.split = false;
    }
    absl::StatusOr<GpuAttentionPlan> plan = PlanGpuAttention(ViewOf(p.step.batch), shape, options);
    REQUIRE(plan.ok());
    DeviceBuffer plan_dev(plan->words().size() * 4);
    plan_dev.Upload(plan->words());
    const int64_t ws = GpuAttentionWorkspaceBytes(shape, plan->launch().num_partials);
    DeviceBuffer workspace(static_cast<size_t>(ws));
    PagedAttentionKcParams a;
    a.attn.q = d.q.as();
    a.attn.out = d.out.as();
    a.attn.dtype = ActDtype::kFp32;
    a.attn.kv = d.Kv(p);
    a.attn.batch = d.Batch(p);
    a.attn.num_heads = nh;
    a.attn.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.attn.sliding_window = c.window;
    a.attn.plan = plan_dev.as<int32_t>();
    a.attn.launch = plan->launch();
    a.attn.workspace = ws > 0 ? workspace.as() : nullptr;
    a.attn.workspace_bytes = ws;
    a.new_k = d.k.as();
    a.new_v = d.v.as();
    RequireOk(PagedAttentionKc(a, nullptr));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const double worst = WorstError(d.out.Download<float>(p.q.size()), p.out, p.vmax);
    INFO("worst error / max|v| = " << worst);
    REQUIRE(worst <= kTol);
  }

  RequireOk(WriteKvTails(w, nullptr));
  REQUIRE_CUDA(cudaDeviceSynchronize());
  REQUIRE(DifferingBytes(d.tails.Download<uint8_t>(d.tails.bytes()), p.written.Tails()) == 0);
  REQUIRE(DifferingBytes(d.pages.Download<uint8_t>(d.pages.bytes()), p.written.Blocks()) == 0);
}

TEST_CASE("CUDA int4_kc and int2_kc seal, attention and tail write match the CPU kernels",
          "[gpu]") {
  uint32_t seed = 31;
  for (KvDtype dtype : {KvDtype::kInt4Kc, KvDtype::kInt2Kc})
    for (int hd : {64, 128, 256}) {
      for (int group : {1, 4, 3}) {
        for (int bs : {16, 32}) {
          KcCase c;
          c.dtype = dtype;
          c.head_dim = hd;
          c.group = group;
          c.block_size = bs;
          c.int4_group = hd == 256 ? 64 : 32;
          c.window = seed % 4 == 0 ? 21 : 0;
          c.ctx = {bs, 17, 2 * bs + 8, bs + 3, 300, 3 * bs, 1000};
          c.q_len = {1, 17, 5, 6, 1, 2 * bs + 3, 40};
          c.seed = seed++;
          CheckOnDevice(c);
        }
      }
    }
}

TEST_CASE("CUDA int4_kc launchers refuse other layouts, naming the field", "[gpu]") {
  KcCase c;
  c.ctx = {20};
  c.q_len = {4};
  const KcProblem p = BuildKcProblem(c);
  DeviceState d(p);
  KvKcWriteParams w;
  w.k = d.k.as();
  w.v = d.v.as();
  w.batch = d.Batch(p);
  w.kv = d.Kv(p);
  KvKcWriteParams plain = w;
  plain.kv.layout =
      KvFormat::Create(KvDtype::kInt4, c.num_kv_heads, c.head_dim, c.block_size, c.int4_group)
          ->layout();
  RequireBadField(SealKvBlocks(plain, nullptr), "kv.layout");
  RequireBadField(WriteKvTails(plain, nullptr), "kv.layout");
  KvKcWriteParams fp32_tails = w;
  fp32_tails.kv.layout = KvFormat::Create(KvDtype::kInt4Kc, c.num_kv_heads, c.head_dim,
                                          c.block_size, c.int4_group, KvElem::kFp32)
                             ->layout();
  RequireBadField(SealKvBlocks(fp32_tails, nullptr), "fp16 tails");
  KvKcWriteParams no_tails = w;
  no_tails.batch.tail_ids = nullptr;
  RequireBadField(WriteKvTails(no_tails, nullptr), "batch.tail_ids");
  PagedAttentionKcParams a;
  a.attn.kv = plain.kv;
  a.attn.num_heads = c.num_kv_heads;
  RequireBadField(PagedAttentionKc(a, nullptr), "kv.layout");
}

}  // namespace
}  // namespace kvserve::cuda
