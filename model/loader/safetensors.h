// SafetensorsFile: a read-only view of one .safetensors file, mmapped.
//
// The format is an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// optionally "__metadata__": {str: str}}), then the data section; offsets are
// relative to its start. Open checks the structure of every entry (fields
// present, offsets inside the data section and equal to shape x element size);
// the dtype is checked when a tensor is read, so a checkpoint may carry tensors
// of other dtypes (e.g. I64 buffers) as long as nobody reads them.
//
// ReadFp32 hands out fp32 tensors: F32 data is used in place from the mmap
// when it is 4-byte aligned (the usual case); F16/BF16 (and unaligned F32) are
// converted into a caller-owned vector.
//
// Errors name the file and the tensor or field: truncated data is DataLoss,
// anything malformed or unsupported is InvalidArgument, a missing tensor is
// NotFound.
//
// Thread-safety: immutable after Open; const methods are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_weights.h"
#include "model/loader/mapped_file.h"

namespace kvserve {

// The element types kvserve reads (and writes, see hf_writer.h).
enum class SafetensorsDtype : uint8_t { kF32, kF16, kBF16 };
const char* SafetensorsDtypeName(SafetensorsDtype dtype);  // "F32", "F16", "BF16"
size_t SafetensorsDtypeBytes(SafetensorsDtype dtype);

// IEEE binary16 / bfloat16 <-> fp32. Narrowing rounds to nearest even,
// overflows to infinity and keeps NaN a NaN.
float Fp16ToFp32(uint16_t h);
float Bf16ToFp32(uint16_t b);
uint16_t Fp32ToFp16(float f);
uint16_t Fp32ToBf16(float f);

struct SafetensorsEntry {
  std::string dtype;  // as written in the header, e.g. "BF16" or "I64"
  std::vector<int64_t> shape;
  size_t begin = 0;  // absolute byte offsets in the file
  size_t end = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::shared_ptr<SafetensorsFile>> Open(
      const std::string& path, FileAccess access = FileAccess::kRead);
  // The same from a file already in memory (MappedFile::FromBytes for bytes).
  static absl::StatusOr<std::shared_ptr<SafetensorsFile>> Open(std::shared_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  const MappedFile& file() const { return *file_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsEntry* Find(const std::string& name) const;

  // The tensor as fp32. When it cannot be used in place (F16, BF16, unaligned
  // F32) its values are converted into *converted and the view points at that
  // vector's buffer: keep the vector alive and do not resize it (moving it is
  // fine). In-place views stay valid as long as this file is alive.
  absl::StatusOr<Tensor> ReadFp32(const std::string& name, std::vector<float>* converted) const;
  // The bytes of a tensor stored as `dtype` (e.g. "F8_E4M3", read as shipped);
  // InvalidArgument naming the tensor when it is another dtype.
  absl::StatusOr<std::span<const uint8_t>> ReadRaw(const std::string& name,
                                                   const std::string& dtype) const;

 private:
  SafetensorsFile() = default;
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kvserve
