// Fuzzes the safetensors header parser (model/loader/safetensors.h) on whole files
// held in memory, then reads every tensor it accepted as fp32.
//
// Accepted entries must lie inside the data section; a tensor read must give
// exactly shape-product elements.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/loader/mapped_file.h"
#include "model/loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  auto file = MappedFile::FromBytes("fuzz.safetensors",
                                    std::string(reinterpret_cast<const char*>(data), size));
  auto st = SafetensorsFile::Open(file);
  if (!st.ok()) {
    FUZZ_CHECK(!st.status().message().empty());
    return 0;
  }
  for (const auto& [name, entry] : (*st)->entries()) {
    FUZZ_CHECK(entry.begin <= entry.end && entry.end <= size);
    std::vector<float> converted;
    auto t = (*st)->ReadFp32(name, &converted);
    if (!t.ok()) continue;
    int64_t numel = 1;
    for (int64_t d : entry.shape) numel *= d;
    FUZZ_CHECK(t->numel() == numel);
    volatile float sink = 0;
    for (int64_t i = 0; i < t->numel(); ++i) sink = sink + t->data[i];
  }
  return 0;
}
