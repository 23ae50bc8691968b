// Micro-benchmark of the CPU paged attention kernels: the time per iteration
// is the cost of one decode token's attention in one layer (or its K/V
// write), per KV format, context length, model shape and instruction-set
// path; prefill512 is a whole 512-token prompt's attention in one layer.
//
// Shapes: stories260K (head_dim 8, 8 query heads, 4 kv heads) and a
// Llama-3-8B-like layer (head_dim 128, 32 query heads, 8 kv heads); block
// size 16; the sequence's blocks are scattered through the pool.
//
//   build/bench/micro_attention_bench --benchmark_filter=avx2
//   build/bench/micro_attention_bench --benchmark_out=attn.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache/format/kv_format.h"
#include "cache/format/kv_pages.h"
#include "kernels/batch_input.h"
#include "kernels/cpu/attention/paged_attention.h"
#include "kernels/cpu/cpu_features.h"

namespace kvserve::cpu {
namespace {

struct Shape {
  const char* name;
  int head_dim;
  int num_heads;
  int num_kv_heads;
};

constexpr Shape kShapes[] = {{"hd8_h8_kv4", 8, 8, 4}, {"hd128_h32_kv8", 128, 32, 8}};
constexpr int kBlockSize = 16;

struct Setup {
  KvFormat format;
  HostKvPages pages;
  BatchInput batch;
  std::vector<float> q, out, k_new, v_new;
};

// One sequence of ctx cached tokens whose last q_len are this step's rows.
Setup MakeSetup(KvDtype dtype, const Shape& s, int ctx, int q_len = 1) {
  KvFormat f = *KvFormat::Create(dtype, s.num_kv_heads, s.head_dim, kBlockSize);
  const int blocks = (ctx + kBlockSize - 1) / kBlockSize;
  const int pool_blocks = blocks * 4;  // the sequence's blocks are a scattered quarter
  Setup st{f, HostKvPages(f, 1, pool_blocks), {}, {}, {}, {}, {}};
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(blocks);

  BatchInput& b = st.batch;
  b.Clear();
  b.max_blocks_per_seq = blocks;
  b.block_table = ids;
  b.context_len = {ctx};
  b.query_start = {0, q_len};
  b.token_ids.assign(q_len, 0);
  for (int i = ctx - q_len; i < ctx; ++i) b.positions.push_back(i);
  std::vector<int64_t> slots(ctx);
  for (int i = 0; i < ctx; ++i)
    slots[i] = int64_t(ids[i / kBlockSize]) * kBlockSize + i % kBlockSize;
  b.slot_mapping.assign(slots.end() - q_len, slots.end());
  const size_t kv = size_t(ctx) * s.num_kv_heads * s.head_dim;
  std::vector<float> k(kv), v(kv);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.slot_mapping = slots.data();
  w.num_tokens = ctx;
  w.kv = LayerView(st.pages, 0);
  WriteKv(w);
  st.q.resize(size_t(q_len) * s.num_heads * s.head_dim);
  for (float& x : st.q) x = normal(rng);
  st.out.resize(st.q.size());
  st.k_new.assign(k.end() - s.num_kv_heads * s.head_dim, k.end());
  st.v_new.assign(v.end() - s.num_kv_heads * s.head_dim, v.end());
  return st;
}

// q_len 1: one decode token; q_len == ctx: a whole prompt's prefill.
void BM_Attention(benchmark::State& state, KvDtype dtype, Shape shape, int ctx, int q_len,
                  CpuIsa isa) {
  Setup st = MakeSetup(dtype, shape, ctx, q_len);
  PagedAttentionParams a;
  a.q = st.q.data();
  a.out = st.out.data();
  a.kv = LayerView(st.pages, 0);
  a.batch = ViewOf(st.batch);
  a.num_heads = shape.num_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  a.isa = isa;
  for (auto _ : state) {
    PagedAttention(a, 0, q_len);
    benchmark::DoNotOptimize(st.out.data());
    benchmark::ClobberMemory();
  }
}

void BM_DecodeWrite(benchmark::State& state, KvDtype dtype, Shape shape, CpuIsa isa) {
  Setup st = MakeSetup(dtype, shape, 16);
  const int64_t slot = st.batch.slot_mapping[0];
  KvWriteParams w;
  w.k = st.k_new.data();
  w.v = st.v_new.data();
  w.slot_mapping = &slot;
  w.num_tokens = 1;
  w.kv = LayerView(st.pages, 0);
  w.isa = isa;
  for (auto _ : state) {
    WriteKv(w);
    benchmark::ClobberMemory();
  }
}

void RegisterAll() {
  std::vector<CpuIsa> paths = {CpuIsa::kScalar};
  if (CpuHasAvx2()) paths.insert(paths.begin(), CpuIsa::kAvx2);
  for (CpuIsa isa : paths) {
    const std::string path(CpuIsaName(isa));
    for (const Shape& shape : kShapes) {
      for (KvDtype dtype : kAllKvDtypes) {
        const std::string fmt(KvDtypeName(dtype));
        for (int ctx : {128, 512}) {
          benchmark::RegisterBenchmark(
              ("attention/" + path + "/" + shape.name + "/" + fmt + "/ctx" + std::to_string(ctx))
                  .c_str(),
              BM_Attention, dtype, shape, ctx, 1, isa);
        }
        if (shape.head_dim == 8) {
          benchmark::RegisterBenchmark(
              ("prefill512/" + path + "/" + shape.name + "/" + fmt).c_str(), BM_Attention, dtype,
              shape, 512, 512, isa);
        }
        benchmark::RegisterBenchmark(("write/" + path + "/" + shape.name + "/" + fmt).c_str(),
                                     BM_DecodeWrite, dtype, shape, isa);
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu

int main(int argc, char** argv) {
  kvserve::cpu::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
