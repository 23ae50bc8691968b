// The CUDA runner with model.attention_kernel: fast against reference
// through the CUDA stand-in, on dummy:tiny-hd64 (head_dim 64, GQA 4: a shape
// the tensor-core kernel takes; stories260K's head_dim 8 runs the reference
// kernel): the logits along one teacher-forced sequence (a prompt in chunks
// across block boundaries, then decode steps from the captured graphs) stay
// within the fast kernel's roundings of the reference kernel's, and differ
// from them (the fast kernel ran).
//
// Tolerance: the fast kernel rounds P to the compute type (2^-8 relative in
// bf16, 2^-11 in fp16) and quantized K/V values to fp16, so each attention
// output moves by up to about 4e-3 (bf16) or 2e-3 (quantized) of max|v|
// (tests/kernels/cuda_sim/paged_attention_mma_sim_test.cc); through two
// layers of random weights the logits (max |logit| 2.4) moved by at most
// 1.4e-4 (fp16), 5.4e-4 (int8), 1.0e-3 (bf16) and 2.8e-3 (k8v4): the bound
// is 1% of the largest logit, 0.024.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "model/cuda/cuda_model_runner.h"
#include "model/loader/model_loader.h"
#include "model/runner_factory.h"
#include "tests/model/cuda/teacher_forced.h"

namespace kvserve {
namespace {

std::unique_ptr<ModelRunner> Runner(const LlamaWeights& weights, const char* kv, const char* kernel,
                                    bool graphs) {
  RunnerOptions o;
  o.device = "cuda";
  o.dtype = "fp32";
  o.kv_dtype = *KvDtypeSpec::Parse(kv);
  o.block_size = 16;
  o.num_blocks = 12;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 32;
  o.max_model_len = 192;
  o.cuda_graphs = graphs;
  o.attention_kernel = kernel;
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(weights, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(dynamic_cast<CudaModelRunner*>(r->get()) != nullptr);
  return std::move(*r);
}

TEST_CASE("stub runner: fast attention gives the reference kernel's logits at head_dim 64",
          "[cuda_stub]") {
  absl::StatusOr<LoadedModel> m = LoadModel("dummy:tiny-hd64");
  REQUIRE(m.ok());
  REQUIRE(m->weights.config.head_dim == 64);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, m->weights.config.vocab_size - 1);
  std::vector<int32_t> prompt(70), tokens(24);
  for (int32_t& t : prompt) t = tok(rng);
  for (int32_t& t : tokens) t = tok(rng);
  for (const char* kv : {"bf16", "fp16", "int8", "k8v4"}) {
    for (bool graphs : {true, false}) {
      INFO("kv " << kv << " graphs " << graphs);
      std::unique_ptr<ModelRunner> fast = Runner(m->weights, kv, "fast", graphs);
      std::unique_ptr<ModelRunner> ref = Runner(m->weights, kv, "reference", graphs);
      const auto lf = testing::TeacherForced(*fast, prompt, tokens, 24);
      const auto lr = testing::TeacherForced(*ref, prompt, tokens, 24);
      double worst = 0.0, scale = 0.0;
      for (size_t k = 0; k < tokens.size(); ++k) {
        for (size_t v = 0; v < lr[k].size(); ++v) {
          REQUIRE(std::isfinite(lf[k][v]));
          worst = std::max(worst, double(std::fabs(lf[k][v] - lr[k][v])));
          scale = std::max(scale, double(std::fabs(lr[k][v])));
        }
      }
      UNSCOPED_INFO("kv " << kv << " graphs " << graphs << ": max |logit diff| " << worst
                          << ", max |logit| " << scale);
      REQUIRE(worst > 0.0);
      REQUIRE(worst <= 0.01 * std::max(scale, 1.0));
    }
  }
}

}  // namespace
}  // namespace kvserve
