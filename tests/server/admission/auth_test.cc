#include "server/admission/auth.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace kvserve {
namespace {

TEST_CASE("The Bearer scheme is matched case-insensitively, the key exactly", "[server][auth]") {
  const ApiKeys keys({"s3cret"});
  REQUIRE(keys.Authorize("Bearer s3cret"));
  REQUIRE(keys.Authorize("bearer s3cret"));
  REQUIRE(keys.Authorize("BEARER s3cret"));
  REQUIRE(keys.Authorize("Bearer   s3cret "));
  REQUIRE_FALSE(keys.Authorize("Bearer S3CRET"));
  REQUIRE_FALSE(keys.Authorize("Bearer s3cre"));
  REQUIRE_FALSE(keys.Authorize("Bearer s3cret2"));
  REQUIRE_FALSE(keys.Authorize("Basic s3cret"));
  REQUIRE_FALSE(keys.Authorize("Bearers3cret"));
  REQUIRE_FALSE(keys.Authorize("Bearer "));
  REQUIRE_FALSE(keys.Authorize("s3cret"));
  REQUIRE_FALSE(keys.Authorize(""));
  REQUIRE(BearerToken("bEaReR abc") == std::optional<std::string_view>("abc"));
  REQUIRE_FALSE(BearerToken("Token abc").has_value());
}

TEST_CASE("The cache salt nests a client's cache_salt under its key's identity", "[server][auth]") {
  SECTION("no key: the client's salt as sent") {
    REQUIRE(TenantCacheSalt("", "") == "");
    REQUIRE(TenantCacheSalt("", "tenant-a") == "tenant-a");
  }
  SECTION("with a key: a digest, never the key, fixed length") {
    const std::string a = TenantCacheSalt("key-a", "s");
    REQUIRE(a.size() == 71);
    REQUIRE(a.starts_with("tenant:"));
    REQUIRE(a.find("key-a") == std::string::npos);
    REQUIRE(TenantCacheSalt("key-a", "s") == a);  // stable: A's cache stays A's
  }
  SECTION("another key, another salt, or none: another partition") {
    const std::string a = TenantCacheSalt("key-a", "s");
    REQUIRE(TenantCacheSalt("key-b", "s") != a);
    REQUIRE(TenantCacheSalt("key-a", "t") != a);
    REQUIRE(TenantCacheSalt("key-a", "") != a);
    REQUIRE(TenantCacheSalt("key-a", "") != TenantCacheSalt("key-b", ""));
    // B cannot name A's partition through its own salt.
    REQUIRE(TenantCacheSalt("key-b", a) != a);
  }
}

TEST_CASE("No key configured authorizes everything", "[server][auth]") {
  const ApiKeys none;
  REQUIRE(none.empty());
  REQUIRE(none.Authorize(""));
  REQUIRE(none.Authorize("Basic x"));
  REQUIRE(ApiKeys({""}).empty());
}

TEST_CASE("Keys come from server.api_key and server.api_key_file, all accepted", "[server][auth]") {
  const std::string dir = testing::MakeTempDir("auth");
  const std::string path = dir + "/keys";
  std::ofstream(path) << "# team keys\n  alpha-1  \n\nbeta-2\r\n# old: gamma\n";
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load("config-key", path);
  REQUIRE(keys.ok());
  REQUIRE(keys->size() == 3);
  for (const char* k : {"config-key", "alpha-1", "beta-2"}) {
    INFO(k);
    REQUIRE(keys->Authorize(std::string("Bearer ") + k));
  }
  REQUIRE_FALSE(keys->Authorize("Bearer gamma"));
  REQUIRE_FALSE(keys->Authorize("Bearer # team keys"));

  SECTION("errors name the key and the line") {
    absl::StatusOr<ApiKeys> missing = ApiKeys::Load("", dir + "/nope");
    REQUIRE(missing.status().message() == "server.api_key_file: cannot read '" + dir + "/nope'");
    std::ofstream(dir + "/spaced") << "ok\nbad key\n";
    absl::StatusOr<ApiKeys> spaced = ApiKeys::Load("", dir + "/spaced");
    REQUIRE(spaced.status().message() ==
            "server.api_key_file: " + dir + "/spaced line 2: a key may not contain whitespace");
    std::ofstream(dir + "/empty") << "# nothing\n\n";
    absl::StatusOr<ApiKeys> empty = ApiKeys::Load("k", dir + "/empty");
    REQUIRE(empty.status().message() == "server.api_key_file: " + dir + "/empty holds no key");
  }
}

TEST_CASE("Key comparison reads every byte wherever the first difference is", "[server][auth]") {
  // The comparison behind ApiKeys (and ConstantTimeEquals) with counting
  // accessors: a mismatch at the first, a middle or the last byte, or none,
  // costs the same reads, so timing cannot reveal how much of a key matched.
  const std::string key = "0123456789abcdef0123456789abcdef";
  for (size_t mismatch : {size_t{0}, size_t{13}, key.size() - 1, key.size()}) {
    std::string guess = key;
    if (mismatch < guess.size()) guess[mismatch] = '!';
    int reads_a = 0, reads_b = 0;
    const bool same = ConstantTimeEqualsWith(
        key.size(),
        [&](size_t i) {
          ++reads_a;
          return static_cast<uint8_t>(key[i]);
        },
        [&](size_t i) {
          ++reads_b;
          return static_cast<uint8_t>(guess[i]);
        });
    INFO("mismatch at " << mismatch);
    REQUIRE(same == (mismatch == key.size()));
    REQUIRE(reads_a == static_cast<int>(key.size()));
    REQUIRE(reads_b == static_cast<int>(key.size()));
  }
  REQUIRE(ConstantTimeEquals("abc", "abc"));
  REQUIRE_FALSE(ConstantTimeEquals("abc", "abd"));
  REQUIRE_FALSE(ConstantTimeEquals("abc", "abcd"));
  REQUIRE_FALSE(ConstantTimeEquals("", "a"));
}

}  // namespace
}  // namespace kvserve
