#include "model/loader/dummy_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/random_weights.h"
#include "util/byte_size.h"

namespace kvserve {
namespace {

constexpr char kMaxBytesEnv[] = "KVSERVE_DUMMY_MAX_BYTES";
constexpr uint64_t kHugePage = uint64_t{2} << 20;

struct Preset {
  const char* name;
  const char* architecture;
  int dim, hidden_dim, num_layers, num_heads, num_kv_heads, vocab_size, max_positions;
  float rope_theta;
  int sliding_window;
  bool tied;
  int32_t bos_id, eos_id;
};

// The real models copy their published config.json; tiny is a stories260K-like toy;
// stories110m-shape is stories110M's body (llama2.c) with a 512-token vocabulary.
constexpr Preset kPresets[] = {
    {"tiny", "LlamaForCausalLM", 128, 352, 4, 8, 4, 512, 2048, 10000.0f, 0, true, 1, 2},
    {"llama-2-7b", "LlamaForCausalLM", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0f, 0, false, 1,
     2},
    {"llama-2-70b", "LlamaForCausalLM", 8192, 28672, 80, 64, 8, 32000, 4096, 10000.0f, 0, false, 1,
     2},
    {"llama-3-8b", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0f, 0, false,
     128000, 128001},
    {"mistral-7b", "MistralForCausalLM", 4096, 14336, 32, 32, 8, 32000, 32768, 10000.0f, 4096,
     false, 1, 2},
    {"stories110m-shape", "LlamaForCausalLM", 768, 2048, 12, 12, 12, 512, 1024, 10000.0f, 0, false,
     1, 2},
    // tiny at head_dim 64 with GQA 4, the shape the fast CUDA attention kernel
    // takes (tests of the CUDA path on the CPU).
    {"tiny-hd64", "LlamaForCausalLM", 256, 512, 2, 4, 1, 512, 2048, 10000.0f, 0, true, 1, 2},
};

void FillRandom(float* data, uint64_t n, uint64_t seed) {
  const uint64_t stream = DummyStreamKey(seed);
  auto fill = [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) data[i] = DummyWeight(stream, i);
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t threads = n < (uint64_t{1} << 22) ? 1 : std::min<uint64_t>(hw, 32);
  if (threads == 1) {
    fill(0, n);
    return;
  }
  std::vector<std::thread> workers;
  const uint64_t chunk = (n + threads - 1) / threads;
  for (uint64_t t = 1; t < threads; ++t) {
    workers.emplace_back(fill, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
  }
  fill(0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
}

std::string_view StripPrefix(std::string_view name) {
  if (name.substr(0, sizeof(kDummyPrefix) - 1) == kDummyPrefix) {
    name.remove_prefix(sizeof(kDummyPrefix) - 1);
  }
  return name;
}

std::string HumanBytes(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
}

// The tensors of config `c` with their shapes and no data.
LlamaWeights ShapesOf(const ModelConfig& c) {
  const int64_t dim = c.dim, hid = c.hidden_dim;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  LlamaWeights w;
  w.config = c;
  w.tok_embeddings.shape = {c.vocab_size, dim};
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    l.attn_norm.shape = {dim};
    l.wq.shape = {q_dim, dim};
    l.wk.shape = {kv_dim, dim};
    l.wv.shape = {kv_dim, dim};
    l.wo.shape = {dim, q_dim};
    l.ffn_norm.shape = {dim};
    l.w_gate.shape = {hid, dim};
    l.w_down.shape = {dim, hid};
    l.w_up.shape = {hid, dim};
  }
  w.final_norm.shape = {dim};
  w.output.shape = {c.vocab_size, dim};
  return w;
}

}  // namespace

DummyOffsets DummyTensorOffsets(const ModelConfig& c) {
  const LlamaWeights w = ShapesOf(c);
  DummyOffsets o;
  int64_t next = 0;
  auto take = [&next](const Tensor& t) {
    const int64_t at = next;
    next += t.numel();
    return at;
  };
  o.tok_embeddings = take(w.tok_embeddings);
  for (const LayerWeights& l : w.layers) {
    DummyLayerOffsets lo;
    lo.attn_norm = take(l.attn_norm);
    lo.wq = take(l.wq);
    lo.wk = take(l.wk);
    lo.wv = take(l.wv);
    lo.wo = take(l.wo);
    lo.ffn_norm = take(l.ffn_norm);
    lo.w_gate = take(l.w_gate);
    lo.w_down = take(l.w_down);
    lo.w_up = take(l.w_up);
    o.layers.push_back(lo);
  }
  o.final_norm = take(w.final_norm);
  o.output = c.tie_word_embeddings ? o.tok_embeddings : take(w.output);
  o.total = next;
  return o;
}

absl::StatusOr<LlamaWeights> LoadDummyModelShapes(std::string_view name, uint64_t seed) {
  auto config = DummyPresetConfig(name);
  if (!config.ok()) return config.status();
  LlamaWeights w = ShapesOf(*config);
  w.dummy_seed = seed;
  return w;
}

std::vector<std::string> DummyPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<ModelConfig> DummyPresetConfig(std::string_view name) {
  const std::string_view preset = StripPrefix(name);
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.name = p.name;
    c.architecture = p.architecture;
    c.dim = p.dim;
    c.hidden_dim = p.hidden_dim;
    c.num_layers = p.num_layers;
    c.num_heads = p.num_heads;
    c.num_kv_heads = p.num_kv_heads;
    c.head_dim = p.dim / p.num_heads;
    c.vocab_size = p.vocab_size;
    c.max_position_embeddings = p.max_positions;
    c.rope_theta = p.rope_theta;
    c.rms_norm_eps = 1e-5f;
    c.rope_style = RopeStyle::kNeox;
    c.tie_word_embeddings = p.tied;
    c.sliding_window = p.sliding_window;
    c.bos_id = p.bos_id;
    c.eos_id = p.eos_id;
    c.bos_is_stop = false;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dummy model preset '", std::string(preset),
                   "'; known presets: ", absl::StrJoin(DummyPresetNames(), ", ")));
}

absl::StatusOr<uint64_t> DummyMaxBytesFromEnv() {
  const char* env = std::getenv(kMaxBytesEnv);
  if (env == nullptr || *env == '\0') return kDefaultDummyMaxBytes;
  absl::StatusOr<int64_t> bytes = ParseByteSize(env, kMaxBytesEnv);
  if (!bytes.ok()) return bytes.status();
  return static_cast<uint64_t>(*bytes);
}

absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name) {
  auto max_bytes = DummyMaxBytesFromEnv();
  if (!max_bytes.ok()) return max_bytes.status();
  return LoadDummyModel(name, *max_bytes);
}

absl::StatusOr<LlamaWeights> LoadDummyModel(std::string_view name, uint64_t max_bytes,
                                            uint64_t seed) {
  auto config = DummyPresetConfig(name);
  if (!config.ok()) return config.status();
  const ModelConfig& c = *config;
  const uint64_t numel = static_cast<uint64_t>(c.NumParams());
  const uint64_t bytes = numel * sizeof(float);
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kDummyPrefix, c.name, " needs ", HumanBytes(bytes), " of fp32 weights (",
                     numel, " parameters), over the limit of ", HumanBytes(max_bytes), "; set ",
                     kMaxBytesEnv, " to allow more (shapes alone come from DummyPresetConfig)"));
  }
  // Uninitialized (every element is filled below), in 2 MiB-aligned memory
  // offered to the kernel as huge pages: every matrix then starts 64-byte
  // aligned (no load of a kernel straddles two cache lines), and streaming
  // the weights once per decode step takes 512 times fewer TLB misses.
  const uint64_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  float* raw = static_cast<float*>(std::aligned_alloc(kHugePage, rounded));
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(kDummyPrefix, c.name, ": cannot allocate ",
                                                     HumanBytes(bytes), " of fp32 weights"));
  }
#if defined(MADV_HUGEPAGE)
  madvise(raw, rounded, MADV_HUGEPAGE);  // advice only: without it, 4 KiB pages
#endif
  std::shared_ptr<float[]> buffer(raw, [](float* p) { std::free(p); });
  FillRandom(buffer.get(), numel, seed);

  // Carve the buffer into tensors in the fixed order; norms become all-ones
  // so activations keep a sane scale through the layers.
  LlamaWeights w = ShapesOf(c);
  const DummyOffsets off = DummyTensorOffsets(c);
  auto place = [&](Tensor& t, int64_t offset, bool is_norm = false) {
    t.data = buffer.get() + offset;
    if (is_norm) std::fill_n(buffer.get() + offset, t.numel(), 1.0f);
  };
  place(w.tok_embeddings, off.tok_embeddings);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    const DummyLayerOffsets& lo = off.layers[l];
    place(lw.attn_norm, lo.attn_norm, true);
    place(lw.wq, lo.wq);
    place(lw.wk, lo.wk);
    place(lw.wv, lo.wv);
    place(lw.wo, lo.wo);
    place(lw.ffn_norm, lo.ffn_norm, true);
    place(lw.w_gate, lo.w_gate);
    place(lw.w_down, lo.w_down);
    place(lw.w_up, lo.w_up);
  }
  place(w.final_norm, off.final_norm, true);
  place(w.output, off.output);
  if (static_cast<uint64_t>(off.total) != numel) {
    std::fprintf(stderr, "kvserve: dummy weights use %llu of %llu parameters\n",
                 static_cast<unsigned long long>(off.total),
                 static_cast<unsigned long long>(numel));
    std::abort();
  }
  w.storage = std::move(buffer);
  return w;
}

}  // namespace kvserve
