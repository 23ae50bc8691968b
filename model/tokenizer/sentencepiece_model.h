// SentencePieceModel: a thin pimpl over sentencepiece::SentencePieceProcessor.
// Debian's sentencepiece header declares its own absl::string_view, which
// clashes with Abseil's, so only sentencepiece_model.cc includes it and this
// header includes no Abseil either.
//
// Thread-safety: const methods are safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kvserve {

class SentencePieceModel {
 public:
  // nullptr and *error set when the file cannot be loaded.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();

  int piece_size() const;
  int bos_id() const;
  int eos_id() const;
  bool IsByte(int id) const;
  bool IsControl(int id) const;
  bool IsUnknown(int id) const;
  std::string IdToPiece(int id) const;
  std::vector<int> Encode(const std::string& text) const;

 private:
  struct Impl;
  explicit SentencePieceModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve
