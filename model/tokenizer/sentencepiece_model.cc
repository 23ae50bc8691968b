#include "model/tokenizer/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace kvserve {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceModel::SentencePieceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  auto impl = std::make_unique<Impl>();
  auto st = impl->sp.Load(path);
  if (!st.ok()) {
    *error = st.ToString();
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(std::move(impl)));
}

int SentencePieceModel::piece_size() const { return impl_->sp.GetPieceSize(); }
int SentencePieceModel::bos_id() const { return impl_->sp.bos_id(); }
int SentencePieceModel::eos_id() const { return impl_->sp.eos_id(); }
bool SentencePieceModel::IsByte(int id) const { return impl_->sp.IsByte(id); }
bool SentencePieceModel::IsControl(int id) const { return impl_->sp.IsControl(id); }
bool SentencePieceModel::IsUnknown(int id) const { return impl_->sp.IsUnknown(id); }
std::string SentencePieceModel::IdToPiece(int id) const { return impl_->sp.IdToPiece(id); }

std::vector<int> SentencePieceModel::Encode(const std::string& text) const {
  std::vector<int> ids;
  impl_->sp.Encode(text, &ids).IgnoreError();  // fails only on an unloaded model
  return ids;
}

}  // namespace kvserve
