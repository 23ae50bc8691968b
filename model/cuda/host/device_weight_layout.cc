#include "model/cuda/host/device_weight_layout.h"

#include "absl/strings/str_cat.h"
#include "model/loader/dummy_model.h"

namespace kvserve {
namespace {

int64_t AlignUp(int64_t n) { return (n + kWeightAlign - 1) / kWeightAlign * kWeightAlign; }

}  // namespace

DeviceWeightLayout PlanDeviceWeights(const ModelConfig& c, int64_t elem_bytes) {
  DeviceWeightLayout l;
  l.elem_bytes = elem_bytes;
  int64_t cursor = 0;
  auto take = [&](int64_t rows, int64_t cols) {
    DeviceMatrix m{AlignUp(cursor), rows, cols};
    cursor = m.offset + rows * cols * elem_bytes;
    return m;
  };
  const int64_t dim = c.dim, hid = c.hidden_dim;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  l.embeddings = take(c.vocab_size, dim);
  l.layers.resize(c.num_layers);
  for (DeviceLayerWeights& lw : l.layers) {
    lw.attn_norm = take(1, dim);
    lw.wqkv = take(q_dim + 2 * kv_dim, dim);
    lw.wo = take(dim, q_dim);
    lw.ffn_norm = take(1, dim);
    lw.w_gate_up = take(2 * hid, dim);
    lw.w_down = take(dim, hid);
    lw.bqkv = take(c.qkv_bias ? 1 : 0, q_dim + 2 * kv_dim);
    lw.bo = take(c.o_bias ? 1 : 0, dim);
    lw.q_norm = take(c.qk_norm ? 1 : 0, c.head_dim);
    lw.k_norm = take(c.qk_norm ? 1 : 0, c.head_dim);
  }
  l.final_norm = take(1, dim);
  l.lm_head = c.tie_word_embeddings ? l.embeddings : take(c.vocab_size, dim);
  l.total_bytes = AlignUp(cursor);
  return l;
}

absl::StatusOr<std::vector<WeightPiece>> PlanWeightPieces(const LlamaWeights& w,
                                                          const DeviceWeightLayout& l) {
  const ModelConfig& c = w.config;
  if (static_cast<int>(w.layers.size()) != c.num_layers ||
      static_cast<int>(l.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", w.layers.size(), " layers, the config says ", c.num_layers));
  }
  const bool generated = w.dummy_seed.has_value();
  if (generated && (c.qkv_bias || c.o_bias || c.qk_norm)) {
    return absl::InvalidArgumentError(
        "weights: generated dummy weights have no biases or q/k norms");
  }
  DummyOffsets dummy;
  if (generated) dummy = DummyTensorOffsets(c);
  std::vector<WeightPiece> pieces;
  absl::Status status;
  // Tensor t goes to `m` starting at row `row`; dummy_index is its stream
  // offset when generated.
  auto add = [&](const std::string& name, const Tensor& t, const DeviceMatrix& m, int64_t row,
                 int64_t rows, int64_t dummy_index, bool is_norm) {
    if (!status.ok()) return;
    const int64_t numel = rows * m.cols;
    if (t.numel() != numel) {
      status = absl::InvalidArgumentError(absl::StrCat("weights: ", name, " has ", t.numel(),
                                                       " elements, the config needs ", numel));
      return;
    }
    WeightPiece p;
    p.name = name;
    p.numel = numel;
    p.dst_offset = m.offset + row * m.cols * l.elem_bytes;
    if (generated) {
      p.ones = is_norm;
      p.dummy_index = is_norm ? -1 : dummy_index;
    } else if (t.data == nullptr) {
      status = absl::InvalidArgumentError(absl::StrCat("weights: ", name, " is missing"));
      return;
    } else {
      p.host = t.data;
    }
    pieces.push_back(std::move(p));
  };
  // A host-only vector of `numel` values at byte `offset` (variants).
  auto add_at = [&](const std::string& name, const Tensor& t, int64_t offset, int64_t numel) {
    if (!status.ok()) return;
    if (t.numel() != numel || t.data == nullptr) {
      status = absl::InvalidArgumentError(
          t.data == nullptr ? absl::StrCat("weights: ", name, " is missing")
                            : absl::StrCat("weights: ", name, " has ", t.numel(),
                                           " elements, the config needs ", numel));
      return;
    }
    WeightPiece p;
    p.name = name;
    p.numel = numel;
    p.dst_offset = offset;
    p.host = t.data;
    pieces.push_back(std::move(p));
  };
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t hid = c.hidden_dim;
  const DummyLayerOffsets no_layer{};
  add("tok_embeddings", w.tok_embeddings, l.embeddings, 0, c.vocab_size, dummy.tok_embeddings,
      false);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& lw = w.layers[i];
    const DeviceLayerWeights& dl = l.layers[i];
    const DummyLayerOffsets& d = generated ? dummy.layers[i] : no_layer;
    const std::string p = absl::StrCat("layers.", i, ".");
    add(p + "attn_norm", lw.attn_norm, dl.attn_norm, 0, 1, d.attn_norm, true);
    add(p + "wq", lw.wq, dl.wqkv, 0, q_dim, d.wq, false);
    add(p + "wk", lw.wk, dl.wqkv, q_dim, kv_dim, d.wk, false);
    add(p + "wv", lw.wv, dl.wqkv, q_dim + kv_dim, kv_dim, d.wv, false);
    add(p + "wo", lw.wo, dl.wo, 0, c.dim, d.wo, false);
    add(p + "ffn_norm", lw.ffn_norm, dl.ffn_norm, 0, 1, d.ffn_norm, true);
    add(p + "w_gate", lw.w_gate, dl.w_gate_up, 0, hid, d.w_gate, false);
    add(p + "w_up", lw.w_up, dl.w_gate_up, hid, hid, d.w_up, false);
    add(p + "w_down", lw.w_down, dl.w_down, 0, c.dim, d.w_down, false);
    if (c.qkv_bias) {
      // The bias rows are one row of [q | k | v]: place each as a "row" of
      // the matching width by offsetting in elements.
      add_at(p + "bq", lw.bq, dl.bqkv.offset, q_dim);
      add_at(p + "bk", lw.bk, dl.bqkv.offset + q_dim * l.elem_bytes, kv_dim);
      add_at(p + "bv", lw.bv, dl.bqkv.offset + (q_dim + kv_dim) * l.elem_bytes, kv_dim);
    }
    if (c.o_bias) add_at(p + "bo", lw.bo, dl.bo.offset, c.dim);
    if (c.qk_norm) {
      add_at(p + "q_norm", lw.q_norm, dl.q_norm.offset, c.head_dim);
      add_at(p + "k_norm", lw.k_norm, dl.k_norm.offset, c.head_dim);
    }
  }
  add("final_norm", w.final_norm, l.final_norm, 0, 1, dummy.final_norm, true);
  if (!c.tie_word_embeddings) {
    add("output", w.output, l.lm_head, 0, c.vocab_size, dummy.output, false);
  }
  if (!status.ok()) return status;
  return pieces;
}

}  // namespace kvserve
