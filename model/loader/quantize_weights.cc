#include "model/loader/quantize_weights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve {
namespace {

cpu::QuantKind KindOf(WeightQuant q) {
  switch (q) {
    case WeightQuant::kInt8:
      return cpu::QuantKind::kInt8;
    case WeightQuant::kInt4Asym:
      return cpu::QuantKind::kInt4Asym;
    default:
      return cpu::QuantKind::kInt4;
  }
}

cpu::QuantMatrix Pack(const Tensor& t, WeightQuant q, int group, cpu::ThreadPool* pool,
                      int64_t* num_weights) {
  *num_weights += t.shape.at(0) * t.shape.at(1);
  return cpu::QuantMatrix::Quantize(t.data, t.shape.at(0), t.shape.at(1), KindOf(q), group, pool);
}

// Rows [r0, r1) of m from w, by Fp8Matrix's rule.
void QuantizeFp8Rows(const float* w, int64_t r0, int64_t r1, Fp8Matrix* m) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * m->cols;
    uint8_t* codes = m->codes.data() + r * m->cols;
    float amax = 0.0f;
    for (int64_t c = 0; c < m->cols; ++c) amax = std::max(amax, std::abs(row[c]));
    const float scale = amax / cpu::kFp8E4m3Max;
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      std::fill(codes, codes + m->cols, uint8_t{0});
      m->scales[r] = 0.0f;
      continue;
    }
    for (int64_t c = 0; c < m->cols; ++c) codes[c] = cpu::FloatToFp8E4m3(row[c] / scale);
    m->scales[r] = scale;
  }
}

Fp8Matrix PackFp8(const Tensor& t, cpu::ThreadPool* pool, int64_t* num_weights) {
  Fp8Matrix m;
  m.rows = t.shape.at(0);
  m.cols = t.shape.at(1);
  *num_weights += m.rows * m.cols;
  m.codes.resize(static_cast<size_t>(m.rows * m.cols));
  m.scales.resize(static_cast<size_t>(m.rows));
  constexpr int64_t kRowsPerChunk = 16;  // each chunk writes its own rows
  const int chunks = static_cast<int>((m.rows + kRowsPerChunk - 1) / kRowsPerChunk);
  pool->Run(chunks, [&](int c) {
    QuantizeFp8Rows(t.data, c * kRowsPerChunk, std::min(m.rows, (c + 1) * kRowsPerChunk), &m);
  });
  return m;
}

}  // namespace

Fp8Matrix Fp8Matrix::Quantize(const float* w, int64_t rows, int64_t cols) {
  Fp8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.codes.resize(static_cast<size_t>(rows * cols));
  m.scales.resize(static_cast<size_t>(rows));
  QuantizeFp8Rows(w, 0, rows, &m);
  return m;
}

int64_t QuantizedLinears::bytes() const {
  int64_t n = output.bytes() + fp8_output.bytes();
  for (const Layer& l : layers) {
    n += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() +
         l.w_up.bytes() + l.w_down.bytes();
  }
  for (const Fp8Layer& l : fp8_layers) {
    n += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() +
         l.w_up.bytes() + l.w_down.bytes();
  }
  return n;
}

absl::Status QuantizeWeights(const WeightQuantSpec& requested, LlamaWeights* weights,
                             int num_threads) {
  const WeightQuantSpec spec = requested.Resolve(weights->config.vocab_size);
  if (weights->quantized != nullptr || weights->weight_quant.any()) {
    // A checkpoint shipped in fp8 stays so under a spec of kNone (as loaded),
    // and under fp8_e4m3 with the head left to auto (its head as shipped).
    const WeightQuantSpec& have = weights->weight_quant;
    if (have == spec || (!spec.any() && have.fp8()) ||
        (have.fp8() && requested.head_auto && requested.body == have.body)) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("model.weight_dtype: the weights are already quantized as ",
                     weights->weight_quant.ToString(), ", not ", spec.ToString()));
  }
  if (!spec.any()) return absl::OkStatus();
  if (weights->dummy_seed.has_value() || weights->tok_embeddings.data == nullptr) {
    return absl::FailedPreconditionError(
        spec.fp8() ? "model.weight_dtype: fp8_e4m3 weights are quantized on the host: the "
                     "weights must be loaded there first"
                   : "model.weight_dtype: int8/int4 weights need the weights on the host "
                     "(model.device: cpu)");
  }
  auto check = [](const Tensor& t, const std::string& name) -> absl::Status {
    if (t.data == nullptr || t.shape.size() != 2 || t.shape[0] <= 0 || t.shape[1] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.weight_dtype: ", name, " is not a 2-D matrix with data"));
    }
    return absl::OkStatus();
  };
  // Every matrix is checked before the first is quantized (seconds each).
  if (spec.body != WeightQuant::kNone) {
    for (size_t l = 0; l < weights->layers.size(); ++l) {
      const LayerWeights& w = weights->layers[l];
      const std::string p = absl::StrCat("layers.", l, ".");
      for (const auto& [t, name] : {std::pair{&w.wq, "wq"},
                                    {&w.wk, "wk"},
                                    {&w.wv, "wv"},
                                    {&w.wo, "wo"},
                                    {&w.w_gate, "w_gate"},
                                    {&w.w_up, "w_up"},
                                    {&w.w_down, "w_down"}}) {
        if (absl::Status s = check(*t, p + name); !s.ok()) return s;
      }
    }
  }
  if (spec.head != WeightQuant::kNone) {
    if (absl::Status s = check(weights->output, "output"); !s.ok()) return s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The pool lives for this call only: the forward pass makes its own,
  // after the weights.
  cpu::ThreadPool pool(num_threads);
  auto q = std::make_shared<QuantizedLinears>();
  const int g = spec.group_size;
  int64_t* n = &q->num_weights;
  if (spec.body == WeightQuant::kFp8E4m3) {
    for (const LayerWeights& w : weights->layers) {
      QuantizedLinears::Fp8Layer ql;
      ql.wq = PackFp8(w.wq, &pool, n);
      ql.wk = PackFp8(w.wk, &pool, n);
      ql.wv = PackFp8(w.wv, &pool, n);
      ql.wo = PackFp8(w.wo, &pool, n);
      ql.w_gate = PackFp8(w.w_gate, &pool, n);
      ql.w_up = PackFp8(w.w_up, &pool, n);
      ql.w_down = PackFp8(w.w_down, &pool, n);
      q->fp8_layers.push_back(std::move(ql));
    }
  } else if (spec.body != WeightQuant::kNone) {
    for (const LayerWeights& w : weights->layers) {
      QuantizedLinears::Layer ql;
      ql.wq = Pack(w.wq, spec.body, g, &pool, n);
      ql.wk = Pack(w.wk, spec.body, g, &pool, n);
      ql.wv = Pack(w.wv, spec.body, g, &pool, n);
      ql.wo = Pack(w.wo, spec.body, g, &pool, n);
      ql.w_gate = Pack(w.w_gate, spec.body, g, &pool, n);
      ql.w_up = Pack(w.w_up, spec.body, g, &pool, n);
      ql.w_down = Pack(w.w_down, spec.body, g, &pool, n);
      q->layers.push_back(std::move(ql));
    }
  }
  if (spec.head == WeightQuant::kFp8E4m3) {
    q->fp8_output = PackFp8(weights->output, &pool, n);
  } else if (spec.head != WeightQuant::kNone) {
    q->output = Pack(weights->output, spec.head, g, &pool, n);
  }
  q->threads = pool.num_threads();
  q->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  weights->weight_quant = spec;
  weights->quantized = std::move(q);
  return absl::OkStatus();
}

int64_t ForwardWeightBytes(const LlamaWeights& weights) {
  const ModelConfig& c = weights.config;
  const int64_t all = c.NumParams() * int64_t{sizeof(float)};
  if (weights.quantized == nullptr) return all;
  const QuantizedLinears& q = *weights.quantized;
  int64_t fp32_replaced = 0;
  if (!q.layers.empty()) {
    const int64_t qd = int64_t{c.num_heads} * c.head_dim,
                  kvd = int64_t{c.num_kv_heads} * c.head_dim;
    fp32_replaced += int64_t{c.num_layers} *
                     (2 * qd * c.dim + 2 * kvd * c.dim + 3 * int64_t{c.dim} * c.hidden_dim);
  }
  // A tied head is the embedding table, which stays: only an untied one is replaced.
  if (!q.output.empty() && !c.tie_word_embeddings) fp32_replaced += int64_t{c.vocab_size} * c.dim;
  return all - fp32_replaced * int64_t{sizeof(float)} + q.bytes();
}

int64_t ForwardWeightBytesFor(const ModelConfig& c, const WeightQuantSpec& requested) {
  const WeightQuantSpec spec = requested.Resolve(c.vocab_size);
  int64_t bytes = c.NumParams() * int64_t{sizeof(float)};
  const int g = spec.group_size;
  if (spec.body != WeightQuant::kNone) {
    const cpu::QuantKind k = KindOf(spec.body);
    const int64_t dim = c.dim, hid = c.hidden_dim;
    const int64_t qd = int64_t{c.num_heads} * c.head_dim,
                  kvd = int64_t{c.num_kv_heads} * c.head_dim;
    const int64_t packed =
        cpu::QuantMatrix::BytesFor(qd, dim, k, g) + 2 * cpu::QuantMatrix::BytesFor(kvd, dim, k, g) +
        cpu::QuantMatrix::BytesFor(dim, qd, k, g) + 2 * cpu::QuantMatrix::BytesFor(hid, dim, k, g) +
        cpu::QuantMatrix::BytesFor(dim, hid, k, g);
    const int64_t fp32 = (2 * qd * dim + 2 * kvd * dim + 3 * dim * hid) * int64_t{sizeof(float)};
    bytes += int64_t{c.num_layers} * (packed - fp32);
  }
  if (spec.head != WeightQuant::kNone) {
    bytes += cpu::QuantMatrix::BytesFor(c.vocab_size, c.dim, KindOf(spec.head), g);
    if (!c.tie_word_embeddings) bytes -= int64_t{c.vocab_size} * c.dim * int64_t{sizeof(float)};
  }
  return bytes;
}

int64_t DeviceFp8WeightBytesFor(const ModelConfig& c, const WeightQuantSpec& requested,
                                int64_t act_bytes) {
  const WeightQuantSpec spec = requested.Resolve(c.vocab_size);
  const int64_t dim = c.dim, hid = c.hidden_dim;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  auto pad = [](int64_t n) { return (n + kFp8InAlign - 1) / kFp8InAlign * kFp8InAlign; };
  // rows x cols in e4m3 with their inputs padded, and a scale a row.
  auto fp8 = [&](int64_t rows, int64_t cols) { return rows * pad(cols) + rows * 4; };
  int64_t bytes = c.NumParams() * act_bytes;
  if (spec.body == WeightQuant::kFp8E4m3) {
    const int64_t linear = 2 * qd * dim + 2 * kvd * dim + 3 * dim * hid;
    const int64_t packed =
        fp8(qd + 2 * kvd, dim) + fp8(dim, qd) + fp8(2 * hid, dim) + fp8(dim, hid);
    bytes += int64_t{c.num_layers} * (packed - linear * act_bytes);
  }
  if (spec.head == WeightQuant::kFp8E4m3) {
    // A tied head gets its own e4m3 copy; the embeddings stay.
    bytes += fp8(c.vocab_size, dim);
    if (!c.tie_word_embeddings) bytes -= int64_t{c.vocab_size} * dim * act_bytes;
  }
  return bytes;
}

}  // namespace kvserve
