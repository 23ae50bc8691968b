#include "model/loader/llama2c_loader.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/loader/mapped_file.h"
#include "model/loader/weight_check.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr size_t kV1HeaderBytes = 256;

// An end offset, exact when it fits 64 bits.
std::string EndString(unsigned __int128 end) {
  if (end <= std::numeric_limits<uint64_t>::max()) return absl::StrCat(static_cast<uint64_t>(end));
  return absl::StrCat(static_cast<double>(end));
}

// Hands out consecutive fp32 tensors from the mapped file, checking bounds.
class TensorCursor {
 public:
  TensorCursor(const MappedFile& f, size_t offset) : f_(f), offset_(offset) {}

  // `layer` >= 0 names a per-layer slice ("layers.3.wq").
  absl::StatusOr<Tensor> Next(const char* name, std::vector<int64_t> shape, int64_t layer = -1) {
    Tensor t;
    t.shape = std::move(shape);
    // In 128 bits: a header's int32 sizes can make numel x 4 overflow 64.
    const unsigned __int128 bytes = static_cast<unsigned __int128>(t.numel()) * sizeof(float);
    if (offset_ + bytes > f_.size()) {
      return absl::DataLossError(
          absl::StrCat(f_.path(), ": truncated checkpoint: tensor '", name, "' needs bytes ",
                       offset_, "..", EndString(offset_ + bytes), " but the file has ", f_.size()));
    }
    t.data = reinterpret_cast<const float*>(f_.data() + offset_);
    offset_ += static_cast<size_t>(bytes);
    const std::string full =
        layer < 0 ? std::string(name) : absl::StrCat("layers.", layer, ".", name);
    KV_RETURN_IF_ERROR(CheckFinite(t.data, t.numel(), full, f_.path()));
    return t;
  }
  void Skip(size_t bytes) { offset_ += bytes; }
  size_t offset() const { return offset_; }

 private:
  const MappedFile& f_;
  size_t offset_;
};

}  // namespace

absl::StatusOr<LlamaWeights> LoadLlama2cCheckpoint(const std::string& path, FileAccess access) {
  auto file_or = MappedFile::Open(path, access);
  if (!file_or.ok()) return file_or.status();
  return LoadLlama2cCheckpoint(*std::move(file_or));
}

absl::StatusOr<LlamaWeights> LoadLlama2cCheckpoint(std::shared_ptr<MappedFile> file) {
  const MappedFile& f = *file;
  const std::string& path = f.path();

  int32_t hdr[7];
  int version = 0;
  bool shared_classifier = true;
  size_t offset = 0;
  if (f.size() >= 8 && std::memcmp(f.data(), &kMagic, 4) == 0) {
    int32_t v;
    std::memcpy(&v, f.data() + 4, 4);
    if (v != 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": llama2.c checkpoint version ", v,
                                                     " is not supported (only 0 and 1 are)"));
    }
    if (f.size() < kV1HeaderBytes) {
      return absl::DataLossError(absl::StrCat(path, ": truncated version-1 header"));
    }
    version = 1;
    std::memcpy(hdr, f.data() + 8, sizeof(hdr));
    shared_classifier = f.data()[8 + sizeof(hdr)] != 0;
    offset = kV1HeaderBytes;
  } else {
    if (f.size() < sizeof(hdr)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated header (", f.size(), " bytes)"));
    }
    std::memcpy(hdr, f.data(), sizeof(hdr));
    shared_classifier = hdr[5] > 0;
    offset = sizeof(hdr);
  }

  ModelConfig c;
  c.name = std::filesystem::path(path).stem().string();
  c.architecture = "LlamaForCausalLM";
  c.dim = hdr[0];
  c.hidden_dim = hdr[1];
  c.num_layers = hdr[2];
  c.num_heads = hdr[3];
  c.num_kv_heads = hdr[4];
  if (hdr[5] == std::numeric_limits<int32_t>::min()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad llama2.c header: vocab_size ", hdr[5], " is out of range"));
  }
  c.vocab_size = hdr[5] < 0 ? -hdr[5] : hdr[5];
  c.max_position_embeddings = hdr[6];
  c.head_dim = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kInterleaved;
  c.tie_word_embeddings = shared_classifier;
  c.bos_id = 1;
  c.eos_id = 2;
  c.bos_is_stop = true;
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad llama2.c header: ", s.message()));
  }
  if (c.dim % c.num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad llama2.c header: dim ", c.dim, " not divisible by n_heads"));
  }

  const int64_t L = c.num_layers, dim = c.dim, hid = c.hidden_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  LlamaWeights w;
  w.config = c;
  TensorCursor cur(f, offset);
  // Per-layer tensors are stored as [L][...]; hand out one slice per layer.
  // The layers are added as their first tensor is found in the file, so a
  // header's num_layers allocates nothing that the file does not back.
  auto per_layer = [&](const char* name, std::vector<int64_t> shape,
                       Tensor LayerWeights::*member) -> absl::Status {
    for (int64_t l = 0; l < L; ++l) {
      if (static_cast<int64_t>(w.layers.size()) == l) w.layers.emplace_back();
      KV_ASSIGN_OR_RETURN(w.layers[l].*member, cur.Next(name, shape, l));
    }
    return absl::OkStatus();
  };
  if (version == 0) {
    KV_ASSIGN_OR_RETURN(w.tok_embeddings, cur.Next("token_embedding_table", {c.vocab_size, dim}));
    KV_RETURN_IF_ERROR(per_layer("rms_att_weight", {dim}, &LayerWeights::attn_norm));
    KV_RETURN_IF_ERROR(per_layer("wq", {dim, dim}, &LayerWeights::wq));
    KV_RETURN_IF_ERROR(per_layer("wk", {kv_dim, dim}, &LayerWeights::wk));
    KV_RETURN_IF_ERROR(per_layer("wv", {kv_dim, dim}, &LayerWeights::wv));
    KV_RETURN_IF_ERROR(per_layer("wo", {dim, dim}, &LayerWeights::wo));
    KV_RETURN_IF_ERROR(per_layer("rms_ffn_weight", {dim}, &LayerWeights::ffn_norm));
    KV_RETURN_IF_ERROR(per_layer("w1", {hid, dim}, &LayerWeights::w_gate));
    KV_RETURN_IF_ERROR(per_layer("w2", {dim, hid}, &LayerWeights::w_down));
    KV_RETURN_IF_ERROR(per_layer("w3", {hid, dim}, &LayerWeights::w_up));
    KV_ASSIGN_OR_RETURN(w.final_norm, cur.Next("rms_final_weight", {dim}));
    // freq_cis_real and freq_cis_imag: RoPE tables we recompute.
    KV_RETURN_IF_ERROR(
        cur.Next("freq_cis_real", {c.max_position_embeddings, c.head_dim / 2}).status());
    KV_RETURN_IF_ERROR(
        cur.Next("freq_cis_imag", {c.max_position_embeddings, c.head_dim / 2}).status());
  } else {
    KV_RETURN_IF_ERROR(per_layer("attention_norm", {dim}, &LayerWeights::attn_norm));
    KV_RETURN_IF_ERROR(per_layer("ffn_norm", {dim}, &LayerWeights::ffn_norm));
    KV_ASSIGN_OR_RETURN(w.final_norm, cur.Next("norm", {dim}));
    KV_ASSIGN_OR_RETURN(w.tok_embeddings, cur.Next("tok_embeddings", {c.vocab_size, dim}));
    KV_RETURN_IF_ERROR(per_layer("wq", {dim, dim}, &LayerWeights::wq));
    KV_RETURN_IF_ERROR(per_layer("wk", {kv_dim, dim}, &LayerWeights::wk));
    KV_RETURN_IF_ERROR(per_layer("wv", {kv_dim, dim}, &LayerWeights::wv));
    KV_RETURN_IF_ERROR(per_layer("wo", {dim, dim}, &LayerWeights::wo));
    KV_RETURN_IF_ERROR(per_layer("w1", {hid, dim}, &LayerWeights::w_gate));
    KV_RETURN_IF_ERROR(per_layer("w2", {dim, hid}, &LayerWeights::w_down));
    KV_RETURN_IF_ERROR(per_layer("w3", {hid, dim}, &LayerWeights::w_up));
  }
  if (shared_classifier) {
    w.output = w.tok_embeddings;
  } else {
    KV_ASSIGN_OR_RETURN(w.output, cur.Next("wcls", {c.vocab_size, dim}));
  }
  w.fingerprint = FingerprintHex(FingerprintBytes(f.data(), f.size()));
  w.storage = file;
  return w;
}

absl::Status WriteLlama2cCheckpoint(const LlamaWeights& w, const std::string& path, int version) {
  const ModelConfig& c = w.config;
  if (version != 0 && version != 1) {
    return absl::InvalidArgumentError(absl::StrCat("llama2.c version ", version, " unsupported"));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  const bool shared = c.tie_word_embeddings;
  int32_t hdr[7] = {c.dim,
                    c.hidden_dim,
                    c.num_layers,
                    c.num_heads,
                    c.num_kv_heads,
                    shared ? c.vocab_size : -c.vocab_size,
                    c.max_position_embeddings};
  auto put = [&](const Tensor& t) {
    out.write(reinterpret_cast<const char*>(t.data), t.numel() * sizeof(float));
  };
  auto put_layers = [&](Tensor LayerWeights::*m) {
    for (const LayerWeights& l : w.layers) put(l.*m);
  };
  if (version == 0) {
    out.write(reinterpret_cast<const char*>(hdr), sizeof(hdr));
    put(w.tok_embeddings);
    put_layers(&LayerWeights::attn_norm);
    put_layers(&LayerWeights::wq);
    put_layers(&LayerWeights::wk);
    put_layers(&LayerWeights::wv);
    put_layers(&LayerWeights::wo);
    put_layers(&LayerWeights::ffn_norm);
    put_layers(&LayerWeights::w_gate);
    put_layers(&LayerWeights::w_down);
    put_layers(&LayerWeights::w_up);
    put(w.final_norm);
    // RoPE tables as llama2.c's export writes them (unused by readers that recompute).
    std::vector<float> re, im;
    for (int p = 0; p < c.max_position_embeddings; ++p) {
      for (int i = 0; i < c.head_dim / 2; ++i) {
        double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.head_dim);
        re.push_back(static_cast<float>(std::cos(p * freq)));
        im.push_back(static_cast<float>(std::sin(p * freq)));
      }
    }
    out.write(reinterpret_cast<const char*>(re.data()), re.size() * sizeof(float));
    out.write(reinterpret_cast<const char*>(im.data()), im.size() * sizeof(float));
  } else {
    char header[kV1HeaderBytes] = {};
    int32_t v = 1;
    hdr[5] = c.vocab_size;
    std::memcpy(header, &kMagic, 4);
    std::memcpy(header + 4, &v, 4);
    std::memcpy(header + 8, hdr, sizeof(hdr));
    header[8 + sizeof(hdr)] = shared ? 1 : 0;
    out.write(header, sizeof(header));
    put_layers(&LayerWeights::attn_norm);
    put_layers(&LayerWeights::ffn_norm);
    put(w.final_norm);
    put(w.tok_embeddings);
    put_layers(&LayerWeights::wq);
    put_layers(&LayerWeights::wk);
    put_layers(&LayerWeights::wv);
    put_layers(&LayerWeights::wo);
    put_layers(&LayerWeights::w_gate);
    put_layers(&LayerWeights::w_down);
    put_layers(&LayerWeights::w_up);
  }
  if (!shared) put(w.output);
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvserve
