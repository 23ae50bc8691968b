// Loads llama2.c checkpoints: the legacy header (7 int32, negative vocab_size
// for a separate classifier) and the version-1 header (magic "ak42"
// 0x616b3432, version 1, 7 int32, shared-classifier byte, padded to 256).
// Weights are fp32 and used in place (read into memory, or mmapped: FileAccess). RoPE is
// interleaved, and BOS counts as a stop token (the TinyStories models put BOS between stories).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/loader/mapped_file.h"

namespace kvserve {

absl::StatusOr<LlamaWeights> LoadLlama2cCheckpoint(const std::string& path,
                                                   FileAccess access = FileAccess::kRead);
// The same from a file already in memory (MappedFile::FromBytes for bytes);
// the weights keep `file` alive.
absl::StatusOr<LlamaWeights> LoadLlama2cCheckpoint(std::shared_ptr<MappedFile> file);

// Writes weights as a llama2.c checkpoint (version 0 = legacy, 1 = "ak42").
absl::Status WriteLlama2cCheckpoint(const LlamaWeights& w, const std::string& path, int version);

}  // namespace kvserve
