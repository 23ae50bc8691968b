#include "model/loader/safetensors.h"

#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvserve {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

using json = nlohmann::json;

// Element sizes of every dtype the safetensors format defines, so that Open can
// check the offsets of tensors it will never read.
size_t KnownDtypeBytes(const std::string& dtype) {
  static const std::map<std::string, size_t, std::less<>> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

const char* SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
  }
  return "?";
}

size_t SafetensorsDtypeBytes(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 ? 4 : 2;
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: mant * 2^-24, exact in fp32.
    const float mag = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -mag : mag;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float Bf16ToFp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t Fp32ToFp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet mantissa bit)
    return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u);
  }
  // 65520 is halfway between the largest half (65504, odd mantissa) and 2^16,
  // so it and everything above rounds to infinity.
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  const uint32_t e = x >> 23;
  if (e < 113) {                        // below the smallest normal half (2^-14): subnormal or zero
    if (x <= 0x33000000u) return sign;  // <= 2^-25 rounds (to even) to zero
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 == mant >> shift
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((e - 112) << 10) | ((x >> 13) & 0x3ffu);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry bumps the exponent
  return sign | static_cast<uint16_t>(r);
}

uint16_t Fp32ToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       FileAccess access) {
  auto mapped = MappedFile::Open(path, access);
  if (!mapped.ok()) return mapped.status();
  return Open(*std::move(mapped));
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(
    std::shared_ptr<MappedFile> file) {
  std::shared_ptr<SafetensorsFile> st(new SafetensorsFile());
  st->file_ = std::move(file);
  const MappedFile& f = *st->file_;
  const std::string& path = f.path();

  if (f.size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": file is ", f.size(),
                                            " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len;
  std::memcpy(&header_len, f.data(), 8);
  if (header_len > f.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " goes beyond the end of the file (", f.size(),
                                            " bytes): truncated, or not a safetensors file"));
  }
  const char* text = reinterpret_cast<const char*>(f.data() + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }

  const size_t data_start = 8 + header_len;
  const size_t data_size = f.size() - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": field '__metadata__' is not a JSON object"));
      }
      for (const auto& [k, v] : entry.items()) {
        st->metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      }
      continue;
    }
    // (An init-capture: clang 14 cannot capture a structured binding.)
    auto bad = [&path, &name = name](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", why));
    };
    if (!entry.is_object()) return bad("entry is not a JSON object");
    SafetensorsEntry e;

    auto dtype = entry.find("dtype");
    if (dtype == entry.end()) return bad("missing field 'dtype'");
    if (!dtype->is_string()) return bad("field 'dtype' is not a string");
    e.dtype = dtype->get<std::string>();

    auto shape = entry.find("shape");
    if (shape == entry.end()) return bad("missing field 'shape'");
    if (!shape->is_array()) return bad("field 'shape' is not an array");
    uint64_t numel = 1;
    for (const json& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return bad(absl::StrCat("field 'shape' has a bad dimension ", d.dump()));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 62) / dim) {
        return bad(absl::StrCat("field 'shape' ", shape->dump(), " is too large"));
      }
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }

    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end()) return bad("missing field 'data_offsets'");
    if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_integer() ||
        !(*offsets)[1].is_number_integer() || (*offsets)[0].get<int64_t>() < 0 ||
        (*offsets)[1].get<int64_t>() < (*offsets)[0].get<int64_t>()) {
      return bad(absl::StrCat("field 'data_offsets' ", offsets->dump(),
                              " is not [begin, end] with 0 <= begin <= end"));
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (end > data_size) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': data_offsets [", begin,
                                              ", ", end, "] go beyond the data section (",
                                              data_size, " bytes): the file is truncated"));
    }
    // numel <= 2^62 and elem <= 8: in 128 bits the product cannot wrap around
    // (in 64 it could, to match a tiny span).
    const size_t elem = KnownDtypeBytes(e.dtype);
    const unsigned __int128 need = static_cast<unsigned __int128>(numel) * elem;
    if (elem != 0 && need != end - begin) {
      const std::string need_text = need > std::numeric_limits<uint64_t>::max()
                                        ? std::string("more than 2^64")
                                        : absl::StrCat(static_cast<uint64_t>(need));
      return bad(absl::StrCat("shape ", ShapeString(e.shape), " of dtype ", e.dtype, " needs ",
                              need_text, " bytes but data_offsets [", begin, ", ", end, "] span ",
                              end - begin));
    }
    e.begin = data_start + begin;
    e.end = data_start + end;
    st->entries_.emplace(name, std::move(e));
  }
  return st;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<Tensor> SafetensorsFile::ReadFp32(const std::string& name,
                                                 std::vector<float>* converted) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(path(), ": no tensor '", name, "'"));
  }
  Tensor t;
  t.shape = e->shape;
  const uint8_t* src = file_->data() + e->begin;
  const size_t n = static_cast<size_t>(t.numel());
  if (e->dtype == "F32") {
    if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      t.data = reinterpret_cast<const float*>(src);
      return t;
    }
    converted->resize(n);
    std::memcpy(converted->data(), src, n * sizeof(float));
  } else if (e->dtype == "F16" || e->dtype == "BF16") {
    const bool is_f16 = e->dtype == "F16";
    converted->resize(n);
    float* dst = converted->data();
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      dst[i] = is_f16 ? Fp16ToFp32(v) : Bf16ToFp32(v);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor '", name, "' has dtype '", e->dtype,
                     "', which kvserve cannot load (supported: F32, F16, BF16)"));
  }
  t.data = converted->data();
  return t;
}

absl::StatusOr<std::span<const uint8_t>> SafetensorsFile::ReadRaw(const std::string& name,
                                                                  const std::string& dtype) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(path(), ": no tensor '", name, "'"));
  }
  if (e->dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": tensor '", name, "' has dtype '", e->dtype, "', expected ", dtype));
  }
  return std::span<const uint8_t>(file_->data() + e->begin, e->end - e->begin);
}

}  // namespace kvserve
