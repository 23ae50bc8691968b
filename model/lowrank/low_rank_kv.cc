#include "model/lowrank/low_rank_kv.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'L', 'O', 'W', 'R', 'K'};
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutFloats(std::string& out, const std::vector<float>& v) {
  static_assert(sizeof(float) == 4);
  const size_t at = out.size();
  out.resize(at + v.size() * 4);
  std::memcpy(out.data() + at, v.data(), v.size() * 4);  // little-endian hosts only
}

// Reads little-endian fields in order; fails once past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool U32(uint32_t* v) {
    if (pos_ + 4 > bytes_.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (pos_ + 8 > bytes_.size()) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool Floats(size_t n, std::vector<float>* v) {
    if (pos_ + n * 4 > bytes_.size()) return false;
    v->resize(n);
    std::memcpy(v->data(), bytes_.data() + pos_, n * 4);
    pos_ += n * 4;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

void HashTensor(uint64_t& h, const Tensor& t) {
  if (t.data == nullptr) return;
  h = Fnv1a64({reinterpret_cast<const uint8_t*>(t.data), static_cast<size_t>(t.numel()) * 4}, h);
}

std::string ShapeText(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, uint64_t hash) {
  return absl::StrFormat("%d layers, dim %d, %d heads, %d kv heads of %d, K/V weights hash %016x",
                         layers, dim, heads, kv_heads, head_dim, hash);
}

}  // namespace

uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t seed) {
  uint64_t h = seed;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= kFnvPrime;
  }
  return h;
}

uint64_t KvProjectionHash(const LlamaWeights& weights) {
  uint64_t h = Fnv1a64({});
  for (const LayerWeights& l : weights.layers) {
    for (const Tensor* t : {&l.wk, &l.wv, &l.bk, &l.bv, &l.k_norm}) HashTensor(h, *t);
  }
  return h;
}

absl::Status ValidateLowRankKv(const LowRankKv& kv, const std::string& what) {
  auto bad = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", msg));
  };
  if (kv.num_layers <= 0 || kv.dim <= 0 || kv.num_heads <= 0 || kv.num_kv_heads <= 0 ||
      kv.head_dim <= 0) {
    return bad("the model shape is not positive");
  }
  if (kv.num_heads % kv.num_kv_heads != 0) {
    return bad(
        absl::StrCat(kv.num_heads, " heads are not a multiple of ", kv.num_kv_heads, " kv heads"));
  }
  if (kv.group_heads <= 0 || kv.num_kv_heads % kv.group_heads != 0) {
    return bad(absl::StrCat("group_heads ", kv.group_heads, " does not divide ", kv.num_kv_heads,
                            " kv heads"));
  }
  if (static_cast<int32_t>(kv.layers.size()) != kv.num_layers) {
    return bad(absl::StrCat(kv.layers.size(), " layers of bases for ", kv.num_layers, " layers"));
  }
  const int64_t w = kv.group_width(), g = kv.num_groups();
  for (int32_t l = 0; l < kv.num_layers; ++l) {
    const LowRankLayer& lr = kv.layers[l];
    for (const auto& [rank, name] : {std::pair{lr.rank_k, "rank_k"}, {lr.rank_v, "rank_v"}}) {
      if (rank < 1 || rank > w) {
        return bad(absl::StrCat("layer ", l, ": ", name, " ", rank, " is outside [1, ", w,
                                "] (the group's kv width)"));
      }
    }
    if (static_cast<int64_t>(lr.k_basis.size()) != g * lr.rank_k * w ||
        lr.k_encoder.size() != lr.k_basis.size() ||
        static_cast<int64_t>(lr.v_basis.size()) != g * lr.rank_v * w ||
        lr.v_encoder.size() != lr.v_basis.size() ||
        static_cast<int64_t>(lr.k_mean.size()) != g * w ||
        static_cast<int64_t>(lr.v_mean.size()) != g * w) {
      return bad(absl::StrCat("layer ", l, ": the bases do not have the ranks' sizes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLowRankMatches(const LowRankKv& kv, const LlamaWeights& weights,
                                 const std::string& what) {
  const ModelConfig& c = weights.config;
  const uint64_t hash = KvProjectionHash(weights);
  if (kv.num_layers == c.num_layers && kv.dim == c.dim && kv.num_heads == c.num_heads &&
      kv.num_kv_heads == c.num_kv_heads && kv.head_dim == c.head_dim && kv.weights_hash == hash) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": calibrated for another model (the file: ",
      ShapeText(kv.num_layers, kv.dim, kv.num_heads, kv.num_kv_heads, kv.head_dim, kv.weights_hash),
      "; this model: ",
      ShapeText(c.num_layers, c.dim, c.num_heads, c.num_kv_heads, c.head_dim, hash),
      "); run kvserve calibrate-kv for it"));
}

std::vector<KvLayerDims> LowRankLayerDims(const LowRankKv& kv) {
  std::vector<KvLayerDims> out;
  for (const LowRankLayer& l : kv.layers) out.push_back({kv.num_groups(), l.stored_width()});
  return out;
}

absl::Status SaveLowRankKv(const LowRankKv& kv, const std::string& path) {
  KV_RETURN_IF_ERROR(ValidateLowRankKv(kv, absl::StrCat("low-rank file ", path)));
  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, kLowRankFileVersion);
  for (int32_t v :
       {kv.num_layers, kv.dim, kv.num_heads, kv.num_kv_heads, kv.head_dim, kv.group_heads}) {
    PutU32(out, static_cast<uint32_t>(v));
  }
  PutU64(out, kv.weights_hash);
  for (const LowRankLayer& l : kv.layers) {
    PutU32(out, static_cast<uint32_t>(l.rank_k));
    PutU32(out, static_cast<uint32_t>(l.rank_v));
  }
  for (const LowRankLayer& l : kv.layers) {
    for (const std::vector<float>* v :
         {&l.k_basis, &l.k_encoder, &l.v_basis, &l.v_encoder, &l.k_mean, &l.v_mean}) {
      PutFloats(out, *v);
    }
  }
  PutU64(out, Fnv1a64({reinterpret_cast<const uint8_t*>(out.data()), out.size()}));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("low-rank file ", path, ": cannot write it"));
  return absl::OkStatus();
}

absl::StatusOr<LowRankKv> LoadLowRankKv(const std::string& path) {
  const std::string what = absl::StrCat("low-rank file ", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(what, ": cannot open it"));
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  auto corrupt = [&](const std::string& msg) {
    return absl::DataLossError(absl::StrCat(what, ": ", msg));
  };
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a low-rank KV file (no KVSLOWRK magic)");
  }
  Reader r(bytes.subspan(sizeof(kMagic)));
  const char* section = "header";
  auto truncated = [&] {
    return corrupt(
        absl::StrCat("truncated (its ", bytes.size(), " bytes end inside the ", section, ")"));
  };
  uint32_t version = 0;
  if (!r.U32(&version)) return truncated();
  if (version != kLowRankFileVersion) {
    return corrupt(
        absl::StrCat("version ", version, "; this build reads version ", kLowRankFileVersion));
  }
  uint32_t fields[6];
  for (uint32_t& v : fields) {
    if (!r.U32(&v)) return truncated();
  }
  LowRankKv kv;
  kv.num_layers = static_cast<int32_t>(fields[0]);
  kv.dim = static_cast<int32_t>(fields[1]);
  kv.num_heads = static_cast<int32_t>(fields[2]);
  kv.num_kv_heads = static_cast<int32_t>(fields[3]);
  kv.head_dim = static_cast<int32_t>(fields[4]);
  kv.group_heads = static_cast<int32_t>(fields[5]);
  if (!r.U64(&kv.weights_hash)) return truncated();
  if (kv.num_layers <= 0 || kv.num_layers > 4096 || kv.group_heads <= 0 || kv.head_dim <= 0 ||
      kv.num_kv_heads <= 0 || kv.num_kv_heads % kv.group_heads != 0 ||
      int64_t{kv.num_kv_heads} * kv.head_dim > (1 << 20)) {
    return corrupt("the header's shape is not a model's");
  }
  kv.layers.resize(kv.num_layers);
  section = "ranks";
  const int64_t w = kv.group_width(), g = kv.num_groups();
  for (LowRankLayer& l : kv.layers) {
    uint32_t rk = 0, rv = 0;
    if (!r.U32(&rk) || !r.U32(&rv)) return truncated();
    if (rk < 1 || rk > w || rv < 1 || rv > w) {
      return corrupt(absl::StrCat("a rank (", rk, ", ", rv, ") is outside [1, ", w, "]"));
    }
    l.rank_k = static_cast<int32_t>(rk);
    l.rank_v = static_cast<int32_t>(rv);
  }
  section = "bases";
  for (LowRankLayer& l : kv.layers) {
    const size_t nk = static_cast<size_t>(g * l.rank_k * w);
    const size_t nv = static_cast<size_t>(g * l.rank_v * w);
    if (!r.Floats(nk, &l.k_basis) || !r.Floats(nk, &l.k_encoder) || !r.Floats(nv, &l.v_basis) ||
        !r.Floats(nv, &l.v_encoder) || !r.Floats(static_cast<size_t>(g * w), &l.k_mean) ||
        !r.Floats(static_cast<size_t>(g * w), &l.v_mean)) {
      return truncated();
    }
  }
  const size_t body = sizeof(kMagic) + r.pos();
  section = "checksum";
  uint64_t stored = 0;
  if (!r.U64(&stored)) return truncated();
  if (sizeof(kMagic) + r.pos() != bytes.size()) {
    return corrupt(
        absl::StrCat(bytes.size() - sizeof(kMagic) - r.pos(), " bytes after the checksum"));
  }
  if (Fnv1a64(bytes.first(body)) != stored) {
    return corrupt("checksum mismatch (the file is corrupt)");
  }
  KV_RETURN_IF_ERROR(ValidateLowRankKv(kv, what));
  return kv;
}

absl::StatusOr<LowRankKv> LoadLowRankKvFor(const std::string& path, const LlamaWeights& weights) {
  KV_ASSIGN_OR_RETURN(LowRankKv kv, LoadLowRankKv(path));
  KV_RETURN_IF_ERROR(CheckLowRankMatches(kv, weights, absl::StrCat("low-rank file ", path)));
  return kv;
}

}  // namespace kvserve
