// Batch invariance of the CUDA runner, one body for the stand-in
// (tests/cuda_stub) and a device ([gpu], tests/model/cuda): a sequence's
// logits are the same bits alone, in a batch of 7 and replayed from a graph
// bucket (issue 23). What makes it hold on a device too: the GEMMs run one
// cuBLASLt algorithm per shape whatever the row count, without split-K
// (kernels/cuda/layers/gemm.h; the stand-in's heuristic picks other summation
// orders for other row counts, so a per-row-count plan fails there), every
// attention plan splits a row's keys at the same kAttentionPartitionKeys
// whatever the batch (model/cuda/host/graph_buckets.h), and the other
// kernels compute a row from that row alone. Bit equality between runs of
// one binary on one device holds for device math as for the stand-in's: it
// compares the runner with itself, never with the CPU.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "model/cuda/cuda_model_runner.h"
#include "tests/cuda_stub/stub_engine.h"

namespace kvserve::testing {
namespace batch_invariance {

// One sequence as the test drives it: tokens, blocks, cached length.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int32_t cached = 0;
};

// A step of rows[k] new tokens of each sequence, each wanting its last row's
// logits.
inline BatchInput Step(std::vector<Seq*> seqs, const std::vector<int32_t>& rows, int bs) {
  BatchInput b;
  b.Clear();
  int32_t width = 0;
  for (Seq* s : seqs) width = std::max<int32_t>(width, static_cast<int32_t>(s->blocks.size()));
  b.max_blocks_per_seq = width;
  for (size_t k = 0; k < seqs.size(); ++k) {
    Seq& s = *seqs[k];
    for (int32_t i = s.cached; i < s.cached + rows[k]; ++i) {
      b.token_ids.push_back(s.tokens[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(int64_t{s.blocks[i / bs]} * bs + i % bs);
    }
    b.query_start.push_back(b.num_tokens());
    s.cached += rows[k];
    b.context_len.push_back(s.cached);
    std::vector<int32_t> row(width, 0);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.block_table.insert(b.block_table.end(), row.begin(), row.end());
    b.logits_rows.push_back(b.num_tokens() - 1);
  }
  return b;
}

inline std::vector<float> Run(ModelRunner& r, const BatchInput& b) {
  std::vector<float> logits(b.logits_rows.size() * 512);
  const absl::Status s = r.Forward(b, logits);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return logits;
}

// Sequence k: 10 + 3k prompt tokens (token ids cycled), blocks 4k .. 4k + 3.
inline Seq MakeSeq(int k) {
  Seq s;
  std::mt19937 rng(100 + k);
  for (int i = 0; i < 40; ++i) s.tokens.push_back(1 + static_cast<int32_t>(rng() % 500));
  for (int j = 0; j < 4; ++j) s.blocks.push_back(4 * k + j);
  return s;
}

}  // namespace batch_invariance

// Sequence 0's prefill and three decode steps' logits, eager and graphs,
// alone and in a batch of 7, on the CUDA runner this binary links, with
// `kv` pages: every run's bits equal the first's.
inline void CheckBatchInvariance(const char* kv) {
  namespace bi = batch_invariance;
  StubSetup s;
  s.kv_dtype = kv;
  s.max_num_seqs = 8;
  s.max_num_batched_tokens = 160;                   // the 7 prompts together: 133 rows
  std::vector<std::vector<float>> prefill, decode;  // sequence 0's rows
  for (bool graphs : {false, true}) {
    s.cuda_graphs = graphs;
    for (int batch : {1, 7}) {
      INFO("graphs " << graphs << ", batch " << batch);
      std::unique_ptr<ModelRunner> r = testing::MakeStubRunner(s);
      auto* cuda = dynamic_cast<CudaModelRunner*>(r.get());
      std::vector<bi::Seq> seqs;
      for (int k = 0; k < batch; ++k) seqs.push_back(bi::MakeSeq(k));
      std::vector<bi::Seq*> ptrs;
      std::vector<int32_t> prompt, one;
      for (int k = 0; k < batch; ++k) {
        ptrs.push_back(&seqs[k]);
        prompt.push_back(10 + 3 * k);
        one.push_back(1);
      }
      BatchInput b = bi::Step(ptrs, prompt, 16);
      if (r->num_tail_blocks() > 0) {
        for (int k = 0; k < batch; ++k) b.tail_ids.push_back(k);
      }
      const std::vector<float> p = bi::Run(*r, b);
      prefill.emplace_back(p.begin(), p.begin() + 512);
      // Three decode steps (graphs: bucket 1 alone, bucket 8 for 7).
      std::vector<float> d;
      for (int step = 0; step < 3; ++step) {
        BatchInput bd = bi::Step(ptrs, one, 16);
        bd.tail_ids = b.tail_ids;
        const std::vector<float> l = bi::Run(*r, bd);
        d.insert(d.end(), l.begin(), l.begin() + 512);
      }
      decode.push_back(d);
      REQUIRE(cuda->counters().graph_steps == (graphs ? 3 : 0));
    }
  }
  for (size_t i = 1; i < prefill.size(); ++i) {
    INFO("run " << i << " against run 0 (eager, alone)");
    REQUIRE(std::memcmp(prefill[i].data(), prefill[0].data(), 512 * 4) == 0);
    REQUIRE(std::memcmp(decode[i].data(), decode[0].data(), decode[0].size() * 4) == 0);
  }
}

}  // namespace kvserve::testing
