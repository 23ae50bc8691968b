#include "server/admission/auth.h"

#include <openssl/sha.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// (Debian's Abseil has its own string_view, hence these small helpers.)
std::string_view Strip(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(a[i])) !=
        absl::ascii_tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

ApiKeys::Digest Sha256(std::string_view text) {
  ApiKeys::Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  const bool same = ConstantTimeEqualsWith(
      n, [&a](size_t i) { return static_cast<uint8_t>(a[i]); },
      [&b](size_t i) { return static_cast<uint8_t>(b[i]); });
  return same && a.size() == b.size();
}

std::optional<std::string_view> BearerToken(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  std::string_view token = Strip(authorization.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (!k.empty()) digests_.push_back(Sha256(k));
  }
}

absl::StatusOr<std::vector<std::string>> ApiKeys::ReadKeyFile(const std::string& key_file) {
  std::ifstream in(key_file);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("server.api_key_file: cannot read '", key_file, "'"));
  }
  std::vector<std::string> keys;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::string_view k = Strip(line);
    if (k.empty() || k.front() == '#') continue;
    for (char c : k) {
      if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
        return absl::InvalidArgumentError(absl::StrCat("server.api_key_file: ", key_file, " line ",
                                                       line_no,
                                                       ": a key may not contain "
                                                       "whitespace"));
      }
    }
    keys.emplace_back(k);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.api_key_file: ", key_file, " holds no key"));
  }
  return keys;
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& key, const std::string& key_file) {
  std::vector<std::string> keys;
  if (!key.empty()) keys.push_back(key);
  if (!key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> more = ReadKeyFile(key_file);
    if (!more.ok()) return more.status();
    keys.insert(keys.end(), more->begin(), more->end());
  }
  return ApiKeys(keys);
}

bool ApiKeys::MatchesToken(std::string_view token) const {
  if (digests_.empty()) return true;
  const Digest presented = Sha256(token);
  // Every key is compared in full: the loop never stops at a match.
  bool any = false;
  for (const Digest& d : digests_) {
    const bool same = ConstantTimeEqualsWith(
        d.size(), [&d](size_t i) { return d[i]; }, [&presented](size_t i) { return presented[i]; });
    any = any | same;
  }
  return any;
}

std::string TenantCacheSalt(std::string_view key, std::string_view client_salt) {
  if (key.empty()) return std::string(client_salt);
  const ApiKeys::Digest identity = Sha256(key);
  std::string material(reinterpret_cast<const char*>(identity.data()), identity.size());
  material.append(client_salt);
  const ApiKeys::Digest salted = Sha256(material);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "tenant:";
  for (uint8_t b : salted) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

bool ApiKeys::Authorize(std::string_view authorization) const {
  if (digests_.empty()) return true;
  std::optional<std::string_view> token = BearerToken(authorization);
  // A missing or malformed header still costs one digest and comparison.
  return MatchesToken(token.value_or(std::string_view())) && token.has_value();
}

}  // namespace kvserve
