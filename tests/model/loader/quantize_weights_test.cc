// QuantizeWeights on several threads packs every matrix of a model into the
// bytes one thread packs (stories260K: w_down's 172 inputs end inside a
// group; dummy:tiny: a tied head), for each dtype of the body and the head,
// and records what it quantized.
#include "model/loader/quantize_weights.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "model/loader/model_loader.h"
#include "tests/model/stories260k.h"

namespace kvserve {
namespace {

bool SameBytes(const cpu::QuantMatrix& a, const cpu::QuantMatrix& b) {
  if (a.empty() || b.empty()) return a.empty() == b.empty();
  if (a.kind() != b.kind() || a.out() != b.out() || a.in() != b.in() ||
      a.group_size() != b.group_size() || a.block_stride() != b.block_stride()) {
    return false;
  }
  if (std::memcmp(a.block(0), b.block(0), a.num_blocks() * a.block_stride()) != 0) return false;
  if (a.kind() != cpu::QuantKind::kInt8) return true;
  const size_t n = a.num_blocks() * cpu::kQuantBlock;
  return std::memcmp(a.channel_scales(), b.channel_scales(), n * sizeof(float)) == 0 &&
         std::memcmp(a.channel_sums(), b.channel_sums(), n * sizeof(int32_t)) == 0;
}

TEST_CASE("QuantizeWeights on 4 threads packs the bytes of 1", "[model]") {
  absl::StatusOr<LoadedModel> tiny = LoadModel("dummy:tiny");
  REQUIRE(tiny.ok());
  const LlamaWeights* models[] = {&testing::Stories260k(), &tiny->weights};
  for (const LlamaWeights* w : models) {
    for (const char* body : {"int8", "int4", "int4_asym"}) {
      for (const char* head : {"int8", "int4_asym"}) {
        for (int group : {32, 128}) {
          INFO(w->config.name << " " << body << " head " << head << " group " << group);
          const WeightQuantSpec spec = *ParseWeightQuant(body, head, group);
          LlamaWeights one = *w, four = *w;
          REQUIRE(QuantizeWeights(spec, &one, 1).ok());
          REQUIRE(QuantizeWeights(spec, &four, 4).ok());
          const QuantizedLinears &a = *one.quantized, &b = *four.quantized;
          REQUIRE(a.threads == 1);
          REQUIRE(b.threads == 4);
          int64_t packed = a.output.out() * a.output.in();
          for (const QuantizedLinears::Layer& x : a.layers) {
            for (const cpu::QuantMatrix* m :
                 {&x.wq, &x.wk, &x.wv, &x.wo, &x.w_gate, &x.w_up, &x.w_down}) {
              packed += m->out() * m->in();
            }
          }
          REQUIRE(a.num_weights == packed);
          REQUIRE(b.num_weights == a.num_weights);
          REQUIRE(a.layers.size() == b.layers.size());
          REQUIRE(SameBytes(a.output, b.output));
          for (size_t l = 0; l < a.layers.size(); ++l) {
            INFO("layer " << l);
            const QuantizedLinears::Layer &x = a.layers[l], &y = b.layers[l];
            REQUIRE(SameBytes(x.wq, y.wq));
            REQUIRE(SameBytes(x.wk, y.wk));
            REQUIRE(SameBytes(x.wv, y.wv));
            REQUIRE(SameBytes(x.wo, y.wo));
            REQUIRE(SameBytes(x.w_gate, y.w_gate));
            REQUIRE(SameBytes(x.w_up, y.w_up));
            REQUIRE(SameBytes(x.w_down, y.w_down));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve
