// CliFlags: the "--name value" / "--name=value" arguments of one kvserve
// subcommand, split once so that every subcommand reads and reports them the
// same way. Every flag takes a value; "--help" / "-h" prints the usage.
//
// Example:
//   CliFlags flags("plan", kUsage);
//   if (int rc = flags.Split(argc, argv); rc >= 0) return rc;
//   for (const CliFlag& f : flags.flags()) {
//     if (f.name == "--memory") ... else return flags.UsageError("unknown flag '" + f.name + "'");
//   }
#pragma once

#include <string>
#include <vector>

namespace kvserve::cli {

struct CliFlag {
  std::string name;   // with the leading "--"
  std::string value;
};

class CliFlags {
 public:
  CliFlags(std::string command, const char* usage) : command_(std::move(command)), usage_(usage) {}

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
  std::vector<CliFlag> flags_;
};

}  // namespace kvserve::cli
