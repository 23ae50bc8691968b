#include "model/loader/safetensors.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "model/loader/hf_writer.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// A safetensors file with the given header text and data bytes, written
// byte for byte (so the header can be malformed at will).
std::string WriteRaw(const std::string& dir, const std::string& name, const std::string& header,
                     const std::string& data, int64_t header_len = -1) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << data;
  return path;
}

std::string Floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

TEST_CASE("fp16 and bf16 conversions are exact and round to nearest even", "[model]") {
  SECTION("every finite half and bfloat16 survives a round trip through fp32") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const uint16_t v = static_cast<uint16_t>(h);
      const bool half_nan = (v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0;
      if (!half_nan) REQUIRE(Fp32ToFp16(Fp16ToFp32(v)) == v);
      const bool bf_nan = (v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0;
      if (!bf_nan) REQUIRE(Fp32ToBf16(Bf16ToFp32(v)) == v);
    }
  }
  SECTION("known fp16 encodings") {
    REQUIRE(Fp32ToFp16(1.0f) == 0x3c00);
    REQUIRE(Fp32ToFp16(-2.0f) == 0xc000);
    REQUIRE(Fp32ToFp16(65504.0f) == 0x7bff);
    REQUIRE(Fp32ToFp16(65519.0f) == 0x7bff);
    REQUIRE(Fp32ToFp16(65520.0f) == 0x7c00);  // halfway, odd mantissa: up to infinity
    REQUIRE(Fp32ToFp16(1e6f) == 0x7c00);
    REQUIRE(Fp32ToFp16(std::ldexp(1.0f, -24)) == 0x0001);
    REQUIRE(Fp32ToFp16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway to even zero
    REQUIRE(Fp32ToFp16(std::ldexp(1.5f, -25)) == 0x0001);
    REQUIRE(Fp32ToFp16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: to even 2
    REQUIRE(Fp32ToFp16(-0.0f) == 0x8000);
    REQUIRE(Fp32ToFp16(0.1f) == 0x2e66);
    REQUIRE(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // halfway: even
    REQUIRE(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
    REQUIRE(std::isnan(Fp16ToFp32(Fp32ToFp16(std::numeric_limits<float>::quiet_NaN()))));
    REQUIRE(Fp16ToFp32(0x7c00) == std::numeric_limits<float>::infinity());
  }
  SECTION("known bf16 encodings") {
    REQUIRE(Fp32ToBf16(1.0f) == 0x3f80);
    REQUIRE(Fp32ToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
    REQUIRE(Fp32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
    REQUIRE(Fp32ToBf16(3.4e38f) == 0x7f80);  // rounds past the largest finite bf16
    REQUIRE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  }
}

TEST_CASE("Safetensors files written by kvserve read back in every dtype", "[model]") {
  const std::string dir = testing::MakeTempDir("safetensors");
  const std::vector<float> a = {1.0f, -2.5f, 0.1f, 3.0e-3f, 65504.0f, -0.0f};
  const std::vector<float> b = {7.0f, 8.0f, 9.0f};
  const std::vector<NamedTensor> tensors = {{"a", {a.data(), {2, 3}}}, {"b", {b.data(), {3}}}};

  for (SafetensorsDtype dtype :
       {SafetensorsDtype::kF32, SafetensorsDtype::kF16, SafetensorsDtype::kBF16}) {
    DYNAMIC_SECTION("dtype " << SafetensorsDtypeName(dtype)) {
      const std::string path = dir + "/" + SafetensorsDtypeName(dtype) + ".safetensors";
      REQUIRE(WriteSafetensors(path, tensors, dtype, {{"note", "test"}}).ok());
      auto st = SafetensorsFile::Open(path);
      REQUIRE(st.ok());
      REQUIRE((*st)->entries().size() == 2);
      REQUIRE((*st)->metadata().at("format") == "pt");
      REQUIRE((*st)->metadata().at("note") == "test");
      const SafetensorsEntry* e = (*st)->Find("a");
      REQUIRE(e != nullptr);
      REQUIRE(e->dtype == SafetensorsDtypeName(dtype));
      REQUIRE(e->shape == std::vector<int64_t>{2, 3});
      REQUIRE(e->end - e->begin == 6 * SafetensorsDtypeBytes(dtype));

      std::vector<float> converted;
      auto t = (*st)->ReadFp32("a", &converted);
      REQUIRE(t.ok());
      REQUIRE(t->shape == std::vector<int64_t>{2, 3});
      for (size_t i = 0; i < a.size(); ++i) {
        float want = a[i];
        if (dtype == SafetensorsDtype::kF16) want = Fp16ToFp32(Fp32ToFp16(a[i]));
        if (dtype == SafetensorsDtype::kBF16) want = Bf16ToFp32(Fp32ToBf16(a[i]));
        REQUIRE(std::bit_cast<uint32_t>(t->data[i]) == std::bit_cast<uint32_t>(want));
      }
      // F32 is used in place from the mmap; the others are converted copies.
      REQUIRE(converted.empty() == (dtype == SafetensorsDtype::kF32));
      REQUIRE((e->begin % 8) == 0);  // the writer pads the header to 8 bytes
    }
  }
}

TEST_CASE("Unaligned F32 data is copied, not used in place", "[model]") {
  const std::string dir = testing::MakeTempDir("safetensors");
  // A 57-byte header puts the data section at offset 65: not 4-byte aligned.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append(57 - header.size(), ' ');
  const std::string path = WriteRaw(dir, "odd.safetensors", header, Floats({1.5f, -3.25f}));
  auto st = SafetensorsFile::Open(path);
  REQUIRE(st.ok());
  std::vector<float> converted;
  auto t = (*st)->ReadFp32("x", &converted);
  REQUIRE(t.ok());
  REQUIRE(converted == std::vector<float>{1.5f, -3.25f});
  REQUIRE(t->data == converted.data());
}

TEST_CASE("Malformed safetensors headers are clear errors naming the file and field", "[model]") {
  const std::string dir = testing::MakeTempDir("safetensors-bad");
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  const std::string data16 = Floats({1, 2, 3, 4});

  SECTION("a file shorter than the 8-byte length is DataLoss") {
    const std::string path = dir + "/short.safetensors";
    std::ofstream(path) << "abc";
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(st.status(), path));
  }
  SECTION("a header length beyond the file is DataLoss") {
    const std::string path = WriteRaw(dir, "len.safetensors", "{" + ok_entry + "}", data16,
                                      /*header_len=*/1000);
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(st.status(), path));
    REQUIRE(Contains(st.status(), "header length 1000 goes beyond the end of the file"));
  }
  SECTION("bad JSON is InvalidArgument") {
    const std::string path = WriteRaw(dir, "json.safetensors", "{" + ok_entry, data16);
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(st.status(), path));
    REQUIRE(Contains(st.status(), "header is not valid JSON"));
  }
  SECTION("a header that is not an object is InvalidArgument") {
    const std::string path = WriteRaw(dir, "array.safetensors", "[1, 2]", "");
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(st.status(), "not a JSON object"));
  }
  SECTION("missing dtype, shape or data_offsets are named") {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", "missing field 'dtype'"},
        {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", "missing field 'shape'"},
        {R"({"w":{"dtype":"F32","shape":[2,2]}})", "missing field 'data_offsets'"},
        {R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})",
         "field 'shape' has a bad dimension -2"},
        {R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})",
         "field 'data_offsets' [16,0] is not [begin, end]"},
        {R"({"w":{"dtype":5,"shape":[2,2],"data_offsets":[0,16]}})",
         "field 'dtype' is not a string"},
        {R"({"w":[1]})", "entry is not a JSON object"},
    };
    for (const auto& [header, want] : cases) {
      const std::string path = WriteRaw(dir, "fields.safetensors", header, data16);
      auto st = SafetensorsFile::Open(path);
      INFO(header);
      REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(Contains(st.status(), path + ": tensor 'w': " + want));
    }
  }
  SECTION("offsets past the data section are DataLoss (a truncated file)") {
    const std::string path =
        WriteRaw(dir, "trunc.safetensors", "{" + ok_entry + "}", data16.substr(0, 12));
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE(Contains(st.status(), path + ": tensor 'w': data_offsets [0, 16] go beyond the data "
                                         "section (12 bytes)"));
  }
  SECTION("offsets that do not match shape x dtype size are InvalidArgument") {
    const std::string path =
        WriteRaw(dir, "size.safetensors",
                 R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}})", data16);
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(Contains(st.status(),
                     "tensor 'w': shape [2, 2] of dtype BF16 needs 8 bytes but "
                     "data_offsets [0, 16] span 16"));
  }
  SECTION("unsupported dtypes open, and fail when read, naming tensor and dtype") {
    const std::string header = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                               R"("f8":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]},)"
                               R"("odd":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,3]}})";
    const std::string path = WriteRaw(dir, "dtype.safetensors", header, data16);
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.ok());
    std::vector<float> converted;
    for (const auto& [name, dtype] :
         {std::pair{"ids", "I64"}, std::pair{"f8", "F8_E5M2"}, std::pair{"odd", "Q4_K"}}) {
      auto t = (*st)->ReadFp32(name, &converted);
      REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(Contains(t.status(), path + ": tensor '" + name + "' has dtype '" + dtype + "'"));
    }
  }
  SECTION("reading a tensor the file lacks is NotFound") {
    const std::string path = WriteRaw(dir, "ok.safetensors", "{" + ok_entry + "}", data16);
    auto st = SafetensorsFile::Open(path);
    REQUIRE(st.ok());
    std::vector<float> converted;
    auto t = (*st)->ReadFp32("nope", &converted);
    REQUIRE(t.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(t.status(), path + ": no tensor 'nope'"));
  }
  SECTION("a missing file is NotFound naming it") {
    auto st = SafetensorsFile::Open(dir + "/absent.safetensors");
    REQUIRE(st.status().code() == absl::StatusCode::kNotFound);
    REQUIRE(Contains(st.status(), dir + "/absent.safetensors"));
  }
}

}  // namespace
}  // namespace kvserve
