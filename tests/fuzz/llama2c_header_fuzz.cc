// Fuzzes the llama2.c checkpoint reader (model/loader/llama2c_loader.h) on whole
// files held in memory: legacy and version-1 ("ak42") headers.
//
// Accepted weights must point inside the file and have the header's shapes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "model/loader/llama2c_loader.h"
#include "model/loader/mapped_file.h"

namespace {

void CheckInside(const kvserve::Tensor& t, const uint8_t* begin, size_t size) {
  if (t.numel() == 0) return;
  const auto* p = reinterpret_cast<const uint8_t*>(t.data);
  FUZZ_CHECK(p >= begin && p + t.numel() * sizeof(float) <= begin + size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  auto file =
      MappedFile::FromBytes("fuzz.bin", std::string(reinterpret_cast<const char*>(data), size));
  auto w = LoadLlama2cCheckpoint(file);
  if (!w.ok()) {
    FUZZ_CHECK(!w.status().message().empty());
    return 0;
  }
  const ModelConfig& c = w->config;
  FUZZ_CHECK(static_cast<int>(w->layers.size()) == c.num_layers);
  FUZZ_CHECK(w->tok_embeddings.numel() == static_cast<int64_t>(c.vocab_size) * c.dim);
  CheckInside(w->tok_embeddings, file->data(), size);
  CheckInside(w->output, file->data(), size);
  CheckInside(w->final_norm, file->data(), size);
  for (const LayerWeights& l : w->layers) {
    CheckInside(l.wq, file->data(), size);
    CheckInside(l.w_up, file->data(), size);
  }
  return 0;
}
