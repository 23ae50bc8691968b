#include "model/tokenizer/tokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer/sentencepiece_model.h"

namespace kvserve {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> sp) : sp_(std::move(sp)) {
    const int n = sp_->piece_size();
    bytes_.resize(n);
    for (int id = 0; id < n; ++id) {
      if (sp_->IsControl(id)) continue;
      if (sp_->IsUnknown(id)) {
        bytes_[id] = " \xE2\x81\x87 ";  // SentencePiece's own rendering of <unk>
        continue;
      }
      std::string piece = sp_->IdToPiece(id);
      if (sp_->IsByte(id)) {
        // "<0xAB>"
        bytes_[id] = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
        continue;
      }
      std::string out;
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
          out.push_back(' ');
          i += kSpaceMark.size();
        } else {
          out.push_back(piece[i++]);
        }
      }
      bytes_[id] = std::move(out);
    }
  }

  int vocab_size() const override { return sp_->piece_size(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return sp_->eos_id(); }

  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids = sp_->Encode(std::string(text));
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_bos) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string TokenBytes(int32_t id, int32_t prev) const override {
    if (id < 0 || id >= static_cast<int32_t>(bytes_.size())) return {};
    const std::string& b = bytes_[id];
    if ((prev == bos_id() || prev < 0) && !b.empty() && b[0] == ' ' && !sp_->IsByte(id)) {
      return b.substr(1);
    }
    return b;
  }

  std::string IdToPiece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return {};
    return sp_->IdToPiece(id);
  }

 private:
  std::unique_ptr<SentencePieceModel> sp_;
  std::vector<std::string> bytes_;  // per id, what it adds to the text
};

class ByteLevelTokenizer final : public Tokenizer {
 public:
  explicit ByteLevelTokenizer(int vocab_size) : vocab_size_(vocab_size) {}
  int vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> out;
    if (add_bos) out.push_back(1);
    for (unsigned char c : text) out.push_back(3 + c);
    return out;
  }
  std::string TokenBytes(int32_t id, int32_t) const override {
    if (id < 3 || id >= 259) return {};
    return std::string(1, static_cast<char>(id - 3));
  }
  std::string IdToPiece(int32_t id) const override {
    if (id == 0) return "<unk>";
    if (id == 1) return "<s>";
    if (id == 2) return "</s>";
    return TokenBytes(id, -1);
  }

 private:
  int vocab_size_;
};

}  // namespace

std::string Tokenizer::Decode(std::span<const int32_t> ids, int32_t prev) const {
  std::string out;
  for (int32_t id : ids) {
    out += TokenBytes(id, prev);
    prev = id;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadSentencePiece(const std::string& path) {
  std::string error;
  std::unique_ptr<SentencePieceModel> sp = SentencePieceModel::Load(path, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer ", path, ": cannot load SentencePiece model: ", error));
  }
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(std::move(sp)));
}

std::unique_ptr<Tokenizer> Tokenizer::ByteLevel(int vocab_size) {
  return std::make_unique<ByteLevelTokenizer>(vocab_size < 259 ? 259 : vocab_size);
}

}  // namespace kvserve
