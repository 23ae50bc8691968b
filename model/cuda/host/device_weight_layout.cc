#include "model/cuda/host/device_weight_layout.h"

#include "absl/strings/str_cat.h"
#include "model/loader/dummy_model.h"
#include "model/loader/quantize_weights.h"

namespace kvserve {
namespace {

int64_t AlignUp(int64_t n) { return (n + kWeightAlign - 1) / kWeightAlign * kWeightAlign; }

}  // namespace

DeviceWeightLayout PlanDeviceWeights(const ModelConfig& c, int64_t elem_bytes,
                                     const WeightQuantSpec& quant) {
  DeviceWeightLayout l;
  l.elem_bytes = elem_bytes;
  int64_t cursor = 0;
  auto take_dtype = [&](int64_t rows, int64_t cols) {
    DeviceMatrix m{AlignUp(cursor), rows, cols};
    cursor = m.offset + rows * cols * elem_bytes;
    return m;
  };
  auto take_fp8 = [&](int64_t rows, int64_t cols) {
    DeviceMatrix m{AlignUp(cursor), rows, cols};
    m.ld = (cols + kFp8InAlign - 1) / kFp8InAlign * kFp8InAlign;
    m.scale_offset = AlignUp(m.offset + rows * m.ld);
    cursor = m.scale_offset + rows * int64_t{sizeof(float)};
    return m;
  };
  const bool fp8_body = quant.body == WeightQuant::kFp8E4m3;
  const bool fp8_head = quant.head == WeightQuant::kFp8E4m3;
  auto take = [&](int64_t rows, int64_t cols) { return take_dtype(rows, cols); };
  auto take_linear = [&](int64_t rows, int64_t cols) {
    return fp8_body ? take_fp8(rows, cols) : take_dtype(rows, cols);
  };
  const int64_t dim = c.dim, hid = c.hidden_dim;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  l.embeddings = take(c.vocab_size, dim);
  l.layers.resize(c.num_layers);
  for (DeviceLayerWeights& lw : l.layers) {
    lw.attn_norm = take(1, dim);
    lw.wqkv = take_linear(q_dim + 2 * kv_dim, dim);
    lw.wo = take_linear(dim, q_dim);
    lw.ffn_norm = take(1, dim);
    lw.w_gate_up = take_linear(2 * hid, dim);
    lw.w_down = take_linear(dim, hid);
    lw.bqkv = take(c.qkv_bias ? 1 : 0, q_dim + 2 * kv_dim);
    lw.bo = take(c.o_bias ? 1 : 0, dim);
    lw.q_norm = take(c.qk_norm ? 1 : 0, c.head_dim);
    lw.k_norm = take(c.qk_norm ? 1 : 0, c.head_dim);
  }
  l.final_norm = take(1, dim);
  if (fp8_head) {
    l.lm_head = take_fp8(c.vocab_size, dim);  // tied: its own copy
  } else {
    l.lm_head = c.tie_word_embeddings ? l.embeddings : take(c.vocab_size, dim);
  }
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
  const bool any_fp8 = l.layers.empty() ? false : l.layers[0].wqkv.fp8();
  const bool head_fp8 = l.lm_head.fp8();
  const QuantizedLinears* q = w.quantized.get();
  if (!generated && ((any_fp8 && (q == nullptr || q->fp8_layers.size() != l.layers.size())) ||
                     (head_fp8 && (q == nullptr || q->fp8_output.empty())))) {
    return absl::FailedPreconditionError(
        "weights: the layout has fp8_e4m3 matrices the weights do not carry (QuantizeWeights "
        "packs them on the host)");
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
  // fp8 matrix f goes to `m` from row `row`: its codes, then its scales.
  auto add_fp8 = [&](const std::string& name, const Fp8Matrix& f, const DeviceMatrix& m,
                     int64_t row, int64_t rows) {
    if (!status.ok()) return;
    if (f.rows != rows || f.cols != m.cols ||
        static_cast<int64_t>(f.codes.size()) != rows * m.cols ||
        static_cast<int64_t>(f.scales.size()) != rows) {
      status = absl::InvalidArgumentError(absl::StrCat("weights: ", name, " (fp8) is ", f.rows,
                                                       " x ", f.cols, ", the config needs ", rows,
                                                       " x ", m.cols));
      return;
    }
    WeightPiece p;
    p.name = name;
    p.numel = rows * m.cols;
    p.dst_offset = m.offset + row * m.ld;
    p.codes = f.codes.data();
    p.cols = m.cols;
    p.dst_ld = m.ld;
    pieces.push_back(p);
    WeightPiece s;
    s.name = name + ".scale";
    s.numel = rows;
    s.dst_offset = m.scale_offset + row * int64_t{sizeof(float)};
    s.host = f.scales.data();
    s.keep_fp32 = true;
    pieces.push_back(std::move(s));
  };
  // A generated matrix into an fp8 `m` from row `row` (scale_dst set).
  auto add_generated_fp8 = [&](const std::string& name, const Tensor& t, const DeviceMatrix& m,
                               int64_t row, int64_t rows, int64_t dummy_index) {
    if (!status.ok()) return;
    if (t.numel() != rows * m.cols) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "weights: ", name, " has ", t.numel(), " elements, the config needs ", rows * m.cols));
      return;
    }
    WeightPiece p;
    p.name = name;
    p.numel = rows * m.cols;
    p.dst_offset = m.offset + row * m.ld;
    p.dummy_index = dummy_index;
    p.cols = m.cols;
    p.dst_ld = m.ld;
    p.scale_dst = m.scale_offset + row * int64_t{sizeof(float)};
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
    // A matrix of the body: its fp8 codes and scales, or its host values.
    auto linear = [&](const char* n, const Tensor& t, Fp8Matrix QuantizedLinears::Fp8Layer::*f,
                      const DeviceMatrix& m, int64_t row, int64_t rows, int64_t dummy_index) {
      if (any_fp8 && generated) {
        add_generated_fp8(p + n, t, m, row, rows, dummy_index);
      } else if (any_fp8) {
        add_fp8(p + n, q->fp8_layers[i].*f, m, row, rows);
      } else {
        add(p + n, t, m, row, rows, dummy_index, false);
      }
    };
    using F = QuantizedLinears::Fp8Layer;
    linear("wq", lw.wq, &F::wq, dl.wqkv, 0, q_dim, d.wq);
    linear("wk", lw.wk, &F::wk, dl.wqkv, q_dim, kv_dim, d.wk);
    linear("wv", lw.wv, &F::wv, dl.wqkv, q_dim + kv_dim, kv_dim, d.wv);
    linear("wo", lw.wo, &F::wo, dl.wo, 0, c.dim, d.wo);
    add(p + "ffn_norm", lw.ffn_norm, dl.ffn_norm, 0, 1, d.ffn_norm, true);
    linear("w_gate", lw.w_gate, &F::w_gate, dl.w_gate_up, 0, hid, d.w_gate);
    linear("w_up", lw.w_up, &F::w_up, dl.w_gate_up, hid, hid, d.w_up);
    linear("w_down", lw.w_down, &F::w_down, dl.w_down, 0, c.dim, d.w_down);
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
  if (head_fp8 && generated) {
    // A tied dummy head is the embedding table's stream.
    add_generated_fp8("output", c.tie_word_embeddings ? w.tok_embeddings : w.output, l.lm_head, 0,
                      c.vocab_size, c.tie_word_embeddings ? dummy.tok_embeddings : dummy.output);
  } else if (head_fp8) {
    add_fp8("output", q->fp8_output, l.lm_head, 0, c.vocab_size);
  } else if (!c.tie_word_embeddings) {
    add("output", w.output, l.lm_head, 0, c.vocab_size, dummy.output, false);
  }
  if (!status.ok()) return status;
  return pieces;
}

}  // namespace kvserve
