// Per-layer KV precision as cache.kv_dtype and --kv-dtype write it: one
// dtype, or a list with NAME*N and NAME* entries; errors name the field.
#include "cache/format/kv_dtype_spec.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvserve {
namespace {

using Layers = std::vector<KvDtype>;
constexpr KvDtype kI8 = KvDtype::kInt8, kKc = KvDtype::kInt4Kc, kF16 = KvDtype::kFp16;

Layers Resolve(const std::string& text, int layers) {
  absl::StatusOr<KvDtypeSpec> s = KvDtypeSpec::Parse(text);
  REQUIRE(s.ok());
  absl::StatusOr<Layers> r = s->Resolve(layers);
  REQUIRE(r.ok());
  return *r;
}

std::string Error(const std::string& text, int layers = 5, const char* what = "cache.kv_dtype") {
  absl::StatusOr<KvDtypeSpec> s = KvDtypeSpec::Parse(text, what);
  if (!s.ok()) return std::string(s.status().message());
  absl::StatusOr<Layers> r = s->Resolve(layers, what);
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("a KV dtype spec gives one dtype per layer", "[cache]") {
  SECTION("one name: every layer") {
    REQUIRE(Resolve("int4_kc", 5) == Layers(5, kKc));
    REQUIRE(Resolve(" INT8 ", 1) == Layers{kI8});
    REQUIRE(KvDtypeSpec::Parse("int4_kc")->is_uniform());
    REQUIRE(KvDtypeSpec(kKc) == *KvDtypeSpec::Parse("int4_kc"));
  }
  SECTION("first and last int8, the rest int4_kc") {
    REQUIRE(Resolve("int8,int4_kc*,int8", 5) == Layers{kI8, kKc, kKc, kKc, kI8});
    REQUIRE(Resolve("int8, int4_kc* ,int8", 2) == Layers{kI8, kI8});  // NAME* may be empty
    REQUIRE(Resolve("int4_kc*,int8", 3) == Layers{kKc, kKc, kI8});
  }
  SECTION("exact counts") {
    REQUIRE(Resolve("fp16*2,int8*3", 5) == Layers{kF16, kF16, kI8, kI8, kI8});
    REQUIRE(Resolve("int8*1", 1) == Layers{kI8});
  }
  SECTION("canonical text round-trips") {
    for (const char* text :
         {"int4_kc", "int8,int4_kc*,int8", "fp16*2,int8*3", "int8*1", "k8v4,fp8_e4m3*"}) {
      const KvDtypeSpec s = *KvDtypeSpec::Parse(text);
      INFO(text << " -> " << s.ToString());
      REQUIRE(*KvDtypeSpec::Parse(s.ToString()) == s);
    }
    REQUIRE(KvDtypeSpec::Parse("fp8, int8 *, fp16*1")->ToString() == "fp8_e4m3,int8*,fp16");
    REQUIRE(KvDtypeSpec::Parse("int8*1")->ToString() == "int8*1");
    REQUIRE(KvDtypeSpec(KvDtype::kFp32).ToString() == "fp32");
  }
  SECTION("Uses") {
    const KvDtypeSpec s = *KvDtypeSpec::Parse("int8,int4_kc*,int8");
    REQUIRE(s.Uses(kKc));
    REQUIRE(s.Uses(kI8));
    REQUIRE_FALSE(s.Uses(kF16));
    REQUIRE(s.first_dtype() == kI8);
    REQUIRE_FALSE(s.is_uniform());
  }
}

TEST_CASE("bad KV dtype specs name the field", "[cache]") {
  REQUIRE(Error("int3").rfind("cache.kv_dtype: 'int3' names an unknown dtype 'int3'", 0) == 0);
  REQUIRE(Error("int8,,int8").rfind("cache.kv_dtype: 'int8,,int8' has an empty entry", 0) == 0);
  REQUIRE(Error("int8*,int4*").find("more than one NAME* entry") != std::string::npos);
  REQUIRE(Error("int8*0").find("bad repeat 'int8*0'") != std::string::npos);
  REQUIRE(Error("int8*x").find("bad repeat") != std::string::npos);
  REQUIRE(Error("int8,int4_kc*3,int8", 6) ==
          "cache.kv_dtype: 'int8,int4_kc*3,int8' names 5 layers but the model has 6 (NAME* fills "
          "the layers left)");
  REQUIRE(Error("int8,int4_kc*,int8", 1) ==
          "cache.kv_dtype: 'int8,int4_kc*,int8' names 2 layers but the model has 1");
  REQUIRE(Error("fp32,int8", 5, "--kv-dtype").rfind("--kv-dtype: 'fp32,int8' names 2 layers", 0) ==
          0);
}

}  // namespace
}  // namespace kvserve
