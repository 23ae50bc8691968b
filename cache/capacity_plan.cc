#include "cache/capacity_plan.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status Positive(int64_t v, const char* field) {
  if (v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", v));
}

}  // namespace

std::vector<KvDtypeSpec> DefaultPlanDtypes(int block_size) {
  std::vector<KvDtypeSpec> out;
  for (KvDtype d : kCpuKvDtypes) {
    if (d == KvDtype::kInt4Kc && block_size < kInt4KcMinBlockSize) continue;
    out.push_back(d);
  }
  return out;
}

absl::StatusOr<std::vector<KvFormatCapacity>> PlanCapacity(const CapacityPlanRequest& req) {
  KV_RETURN_IF_ERROR(Positive(req.num_layers, "num_layers"));
  KV_RETURN_IF_ERROR(Positive(req.num_kv_heads, "num_kv_heads"));
  KV_RETURN_IF_ERROR(Positive(req.head_dim, "head_dim"));
  KV_RETURN_IF_ERROR(Positive(req.context_tokens, "context"));
  KV_RETURN_IF_ERROR(Positive(req.block_size, "block_size"));
  if (req.memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory must be >= 0, got ", req.memory_bytes));
  }
  if (req.weight_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight bytes must be >= 0, got ", req.weight_bytes));
  }
  if (req.batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 0, got ", req.batch));
  }
  if (req.max_seqs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_seqs must be >= 0, got ", req.max_seqs));
  }
  const int64_t budget = std::max<int64_t>(0, req.memory_bytes - req.weight_bytes);
  const std::vector<KvDtypeSpec> specs =
      req.dtypes.empty() ? DefaultPlanDtypes(req.block_size) : req.dtypes;
  // fp16 is the yardstick whether or not it is planned.
  KV_ASSIGN_OR_RETURN(KvFormat fp16, KvFormat::Create(KvDtype::kFp16, req.num_kv_heads,
                                                      req.head_dim, req.block_size));
  const int64_t fp16_bytes_per_token = fp16.bytes_per_token_per_layer() * req.num_layers;
  const int64_t fp16_tokens = budget / (fp16.block_bytes() * req.num_layers) * req.block_size;
  std::vector<KvFormatCapacity> plan;
  for (const KvDtypeSpec& spec : specs) {
    KV_ASSIGN_OR_RETURN(std::vector<KvDtype> layers, spec.Resolve(req.num_layers, "kv_dtype"));
    KvFormatCapacity c;
    c.spec = spec;
    c.dtype = layers.front();
    int64_t tail_block_bytes = 0;
    for (KvDtype dtype : layers) {
      KV_ASSIGN_OR_RETURN(KvFormat f,
                          KvFormat::Create(dtype, req.num_kv_heads, req.head_dim, req.block_size,
                                           req.int4_group_size, KvElem::kFp16));
      c.bytes_per_token += f.bytes_per_token_per_layer();
      c.block_bytes += f.block_bytes();
      tail_block_bytes += f.tail_block_bytes();
    }
    c.num_tail_blocks = tail_block_bytes > 0 ? 2 * req.max_seqs : 0;
    c.tail_bytes = c.num_tail_blocks * tail_block_bytes;
    c.kv_budget_bytes = budget;
    c.num_blocks = std::max<int64_t>(0, budget - c.tail_bytes) / c.block_bytes;
    c.num_tokens = c.num_blocks * req.block_size;
    c.blocks_per_seq = CeilDiv(req.context_tokens, req.block_size);
    c.max_seqs = c.num_blocks / c.blocks_per_seq;
    c.batch_bytes = req.batch * c.blocks_per_seq * c.block_bytes + c.tail_bytes;
    c.batch_fits = c.batch_bytes <= budget;
    c.tokens_vs_fp16 = static_cast<double>(fp16_bytes_per_token) / c.bytes_per_token;
    c.tokens_vs_fp16_in_budget =
        fp16_tokens > 0 ? static_cast<double>(c.num_tokens) / fp16_tokens : 0.0;
    plan.push_back(c);
  }
  return plan;
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view what,
                                      ByteSizeUnit unit) {
  const std::string t(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": '", std::string(text), "' ", std::string(why),
        unit == ByteSizeUnit::kRequired ? " (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, 4096B)"
                                        : " (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, "
                                          "or a plain byte count)"));
  };
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) {
    ++i;
  }
  double value = 0;
  if (i == 0 || !absl::SimpleAtod(t.substr(0, i), &value)) return bad("is not a byte size");
  const std::string suffix =
      absl::AsciiStrToLower(absl::StripLeadingAsciiWhitespace(t.substr(i)));
  // IEC units are powers of 1024, SI units (and, as in Kubernetes
  // quantities, the bare letters) powers of 1000. Case does not matter.
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"b", 1.0},      {"k", 1e3},       {"kb", 1e3},      {"m", 1e6},      {"mb", 1e6},
      {"g", 1e9},      {"gb", 1e9},      {"t", 1e12},      {"tb", 1e12},    {"ki", 0x1p10},
      {"kib", 0x1p10}, {"mi", 0x1p20},   {"mib", 0x1p20},  {"gi", 0x1p30},  {"gib", 0x1p30},
      {"ti", 0x1p40},  {"tib", 0x1p40}};
  double mult = 0;
  if (suffix.empty()) {
    if (unit == ByteSizeUnit::kRequired) return bad("has no unit");
    mult = 1;
  } else {
    for (const auto& [name, m] : kUnits) {
      if (suffix == name) mult = m;
    }
    if (mult == 0) return bad("has an unknown unit");
  }
  const double bytes = std::round(value * mult);
  if (!(bytes >= 0) || bytes > 9.2e18) return bad("is out of range");
  if (mult == 1 && value != std::floor(value)) return bad("is not a whole number of bytes");
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.2f GiB (%.2f GB)", b / (1 << 30), b / 1e9);
  }
  if (bytes >= (int64_t{1} << 20)) {
    return absl::StrFormat("%.2f MiB (%.2f MB)", b / (1 << 20), b / 1e6);
  }
  if (bytes >= 1024) return absl::StrFormat("%d B (%.1f KiB)", bytes, b / 1024);
  return absl::StrFormat("%d B", bytes);
}

}  // namespace kvserve
