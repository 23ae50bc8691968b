// Where the CUDA runner puts each weight, checked on the host: fused QKV and
// gate/up matrices, alignment, tied heads, and the dummy generator's stream
// offsets that let the device fill the same weights the host loader makes.
#include "model/cuda/host/device_weight_layout.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <string>

#include "kernels/random_weights.h"
#include "model/loader/dummy_model.h"
#include "model/loader/quantize_weights.h"

namespace kvserve {
namespace {

TEST_CASE("Device weights: fused QKV and gate/up, 256-byte aligned, tied head shared", "[model]") {
  absl::StatusOr<ModelConfig> c = DummyPresetConfig("tiny");  // dim 128, 4 layers, tied
  REQUIRE(c.ok());
  const DeviceWeightLayout l = PlanDeviceWeights(*c, 2);
  REQUIRE(l.embeddings.offset == 0);
  REQUIRE(l.embeddings.rows == 512);
  REQUIRE(l.embeddings.cols == 128);
  const DeviceLayerWeights& l0 = l.layers[0];
  REQUIRE(l0.attn_norm.offset == 512 * 128 * 2);
  REQUIRE(l0.wqkv.offset == 512 * 128 * 2 + 256);
  REQUIRE(l0.wqkv.rows == 128 + 2 * 64);  // 8 heads, 4 kv heads, head_dim 16
  REQUIRE(l0.w_gate_up.rows == 2 * 352);
  REQUIRE(l0.w_down.cols == 352);
  REQUIRE(l.lm_head.offset == l.embeddings.offset);
  for (const DeviceLayerWeights& lw : l.layers) {
    for (const DeviceMatrix* m :
         {&lw.attn_norm, &lw.wqkv, &lw.wo, &lw.ffn_norm, &lw.w_gate_up, &lw.w_down}) {
      REQUIRE(m->offset % kWeightAlign == 0);
      REQUIRE(m->offset + m->numel() * 2 <= l.total_bytes);
    }
  }
  // Everything the model holds, in two bytes each, plus alignment padding.
  REQUIRE(l.total_bytes >= c->NumParams() * 2);
  REQUIRE(l.total_bytes < c->NumParams() * 2 + 256 * (2 + 6 * 4 + 1));

  absl::StatusOr<ModelConfig> llama = DummyPresetConfig("llama-3-8b");
  REQUIRE(llama.ok());
  const DeviceWeightLayout big = PlanDeviceWeights(*llama, 2);
  REQUIRE(big.lm_head.offset != big.embeddings.offset);
  REQUIRE(big.layers[0].wqkv.rows == 4096 + 2 * 1024);
  REQUIRE(big.total_bytes == 16060522496);  // 8,030,261,248 parameters in bf16
}

TEST_CASE("Weight pieces cover the arena once, q|k|v and gate|up in order", "[model]") {
  absl::StatusOr<LlamaWeights> w = LoadDummyModel("tiny", uint64_t{1} << 30);
  REQUIRE(w.ok());
  const DeviceWeightLayout l = PlanDeviceWeights(w->config, 4);
  absl::StatusOr<std::vector<WeightPiece>> pieces = PlanWeightPieces(*w, l);
  REQUIRE(pieces.ok());
  REQUIRE(pieces->size() == 1 + 4 * 9 + 1);  // tied: no output piece
  int64_t total = 0;
  std::set<int64_t> starts;
  for (const WeightPiece& p : *pieces) {
    REQUIRE(p.host != nullptr);
    REQUIRE(p.dummy_index == -1);
    REQUIRE(starts.insert(p.dst_offset).second);
    total += p.numel;
  }
  REQUIRE(total == w->config.NumParams());
  const WeightPiece& wk = (*pieces)[3];
  REQUIRE(wk.name == "layers.0.wk");
  REQUIRE(wk.host == w->layers[0].wk.data);
  REQUIRE(wk.dst_offset == l.layers[0].wqkv.offset + 128 * 128 * 4);
  const WeightPiece& up = (*pieces)[8];
  REQUIRE(up.name == "layers.0.w_up");
  REQUIRE(up.dst_offset == l.layers[0].w_gate_up.offset + 352 * 128 * 4);

  SECTION("a tensor of the wrong size or without data is named") {
    LlamaWeights bad = *w;
    bad.layers[2].wv.shape = {63, 128};
    REQUIRE(std::string(PlanWeightPieces(bad, l).status().message()) ==
            "weights: layers.2.wv has 8064 elements, the config needs 8192");
    bad = *w;
    bad.final_norm.data = nullptr;
    REQUIRE(std::string(PlanWeightPieces(bad, l).status().message()) ==
            "weights: final_norm is missing");
  }
}

TEST_CASE("A dummy model as shapes: each piece names the stream offset of its values", "[model]") {
  absl::StatusOr<LlamaWeights> host = LoadDummyModel("tiny", uint64_t{1} << 30);
  absl::StatusOr<LlamaWeights> shapes = LoadDummyModelShapes("dummy:tiny");
  REQUIRE(host.ok());
  REQUIRE(shapes.ok());
  REQUIRE(shapes->dummy_seed == kDummySeed);
  REQUIRE(shapes->tok_embeddings.data == nullptr);
  REQUIRE(shapes->tok_embeddings.shape == host->tok_embeddings.shape);
  const DeviceWeightLayout l = PlanDeviceWeights(shapes->config, 4);
  absl::StatusOr<std::vector<WeightPiece>> gen = PlanWeightPieces(*shapes, l);
  absl::StatusOr<std::vector<WeightPiece>> ref = PlanWeightPieces(*host, l);
  REQUIRE(gen.ok());
  REQUIRE(ref.ok());
  REQUIRE(gen->size() == ref->size());
  const uint64_t key = DummyStreamKey(kDummySeed);
  for (size_t i = 0; i < gen->size(); ++i) {
    const WeightPiece& g = (*gen)[i];
    const WeightPiece& r = (*ref)[i];
    INFO(g.name);
    REQUIRE(g.host == nullptr);
    REQUIRE(g.dst_offset == r.dst_offset);
    REQUIRE(g.numel == r.numel);
    // What the device would generate equals the host's values, bit for bit.
    for (int64_t j : {int64_t{0}, g.numel / 2, g.numel - 1}) {
      const float want = r.host[j];
      const float got = g.ones ? 1.0f : DummyWeight(key, static_cast<uint64_t>(g.dummy_index + j));
      REQUIRE(std::memcmp(&want, &got, 4) == 0);
    }
  }
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("Device weights in fp8_e4m3: padded rows, scales after, a tied head of its own",
          "[model]") {
  absl::StatusOr<LlamaWeights> w = LoadDummyModel("tiny", uint64_t{1} << 30);
  REQUIRE(w.ok());
  const ModelConfig& c = w->config;  // tied, hidden 352 (a multiple of 16), vocab 512
  const WeightQuantSpec spec = *ParseWeightQuant("fp8_e4m3", "fp8_e4m3");
  const DeviceWeightLayout l = PlanDeviceWeights(c, 2, spec.Resolve(c.vocab_size));
  const DeviceLayerWeights& l0 = l.layers[0];
  for (const DeviceMatrix* m : {&l0.wqkv, &l0.wo, &l0.w_gate_up, &l0.w_down, &l.lm_head}) {
    REQUIRE(m->fp8());
    REQUIRE(m->ld == (m->cols + 15) / 16 * 16);
    REQUIRE(m->scale_offset % kWeightAlign == 0);
    REQUIRE(m->scale_offset >= m->offset + m->rows * m->ld);
  }
  REQUIRE_FALSE(l0.attn_norm.fp8());
  REQUIRE(l.lm_head.offset != l.embeddings.offset);  // the table stays bf16
  // The bytes kvserve plan counts, plus each matrix's 256-byte alignment.
  const int64_t counted = DeviceFp8WeightBytesFor(c, spec);
  REQUIRE(l.total_bytes >= counted);
  // (per layer 6 matrices, 4 scale vectors and 4 empty variants).
  REQUIRE(l.total_bytes < counted + 256 * (3 + 4 * 14 + 2));

  // The pieces: codes (rows of cols bytes, ld apart) and fp32 scales.
  LlamaWeights q = *w;
  REQUIRE(QuantizeWeights(spec, &q).ok());
  absl::StatusOr<std::vector<WeightPiece>> pieces = PlanWeightPieces(q, l);
  REQUIRE(pieces.ok());
  const WeightPiece& wk = (*pieces)[4];  // embeddings, attn_norm, wq codes, wq scales, wk
  REQUIRE(wk.name == "layers.0.wk");
  REQUIRE(wk.codes == q.quantized->fp8_layers[0].wk.codes.data());
  REQUIRE(wk.dst_offset == l0.wqkv.offset + 128 * l0.wqkv.ld);
  const WeightPiece& wk_scale = (*pieces)[5];
  REQUIRE(wk_scale.keep_fp32);
  REQUIRE(wk_scale.host == q.quantized->fp8_layers[0].wk.scales.data());
  REQUIRE(wk_scale.dst_offset == l0.wqkv.scale_offset + 128 * 4);
  // Without the packed matrices the layout cannot be filled.
  REQUIRE(PlanWeightPieces(*w, l).status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvserve
