// CliFlags: the "--name value" / "--name=value" arguments of one kvserve
// subcommand, split once so that every subcommand reads and reports them the
// same way. Every flag takes a value except the switches a command names
// (given bare, their value is "yes"); "--help" / "-h" prints the usage.
//
// Example:
//   CliFlags flags("plan", kUsage);
//   if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
//   for (const CliFlag& f : flags.flags()) {
//     if (f.name == "--memory") ... else return flags.UsageError("unknown flag '" + f.name + "'");
//   }
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/format/kv_dtype_spec.h"
#include "model/model_config.h"

namespace kvserve::cli {

struct CliFlag {
  std::string name;  // with the leading "--"
  std::string value;
};

class CliFlags {
 public:
  CliFlags(std::string command, const char* usage, std::vector<std::string> switches = {})
      : command_(std::move(command)), usage_(usage), switches_(std::move(switches)) {}

  // Splits argv (argv[0] is the subcommand). Returns -1 to go on, or the exit
  // code: 0 after printing the usage for --help, 2 for a malformed argument.
  int Split(int argc, char** argv);
  const std::vector<CliFlag>& flags() const { return flags_; }

  // Prints "kvserve <command>: <message>" and a pointer to --help; returns 2.
  int UsageError(const std::string& message) const;
  // UsageError("<name>: '<value>' is not <want>").
  int BadValue(const CliFlag& flag, const std::string& want) const;

  // Value parsers: false when the text is not a number in [lo, hi].
  static bool ParseInt(const std::string& text, long long lo, long long hi, long long* out);
  static bool ParseFloat(const std::string& text, float* out);

 private:
  std::string command_;
  const char* usage_;
  std::vector<std::string> switches_;  // flags without a value
  std::vector<CliFlag> flags_;
};

// The model flags several commands share (--model, --tokenizer, --kv-dtype,
// --block-size, --threads), parsed and checked one way everywhere. A
// command names the ones it accepts; the others stay unknown to it.
//
// Example:
//   ModelFlags m;
//   for (const CliFlag& f : flags.flags()) {
//     if (std::optional<int> rc = m.Take(flags, f, kModelFlag | kThreadsFlag)) {
//       if (*rc >= 0) return *rc;
//       continue;
//     }
//     ... the command's own flags ...
//   }
enum ModelFlag : unsigned {
  kModelFlag = 1,      // --model PATH (a checkpoint, an HF directory or dummy:<preset>)
  kTokenizerFlag = 2,  // --tokenizer FILE (tokenizer.json or a SentencePiece .model)
  kKvDtypeFlag = 4,    // --kv-dtype D (one name or a per-layer list), repeatable
  kBlockSizeFlag = 8,  // --block-size B, in [1, 65536]
  kThreadsFlag = 16,   // --threads N, in [0, 1024] (0: what the cgroup and affinity allow)
  // --weight-dtype D (model.weight_dtype: auto, fp32, int8, int4, int4_asym; "int8+head int8" sets
  // the head, "int4/g128" the group size), repeatable
  kWeightDtypeFlag = 32,
};

// RunnerOptions' weight_dtype, weight_dtype_head and weight_group_size for a
// parsed --weight-dtype.
void SetWeightDtype(const WeightQuantSpec& q, std::string* body, std::string* head,
                    int32_t* group_size);

struct ModelFlags {
  std::string model;
  std::string tokenizer;
  std::vector<KvDtypeSpec> kv_dtypes;  // every --kv-dtype given, in order
  std::optional<int> block_size;
  std::optional<int> threads;
  // Every --weight-dtype given, in order: the text and its parse.
  std::vector<std::string> weight_dtype_names;
  std::vector<WeightQuantSpec> weight_dtypes;

  // Takes `flag` if it is one of `accepted` (a ModelFlag mask): nullopt when
  // it is not (the caller's own, or unknown), -1 when taken, else the exit
  // code after a usage error naming the flag.
  std::optional<int> Take(const CliFlags& flags, const CliFlag& flag, unsigned accepted);
};

}  // namespace kvserve::cli
