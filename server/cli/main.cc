// kvserve entry point: dispatches to the subcommands of server/cli/commands.h.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "server/cli/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: kvserve <command> [options]\n"
    "commands:\n"
    "  serve     run the daemon (gRPC + OpenAI-compatible HTTP)   kvserve serve --config FILE\n"
    "  generate  generate text offline from a prompt               kvserve generate --model PATH\n"
    "  convert   write a llama2.c checkpoint as an HF directory    kvserve convert --llama2c CKPT\n"
    "  eval-kv   KV cache quality report per format                kvserve eval-kv --model PATH\n"
    "            (or KV eviction study)                            kvserve eval-kv --policy all\n"
    "  train-evictor  train the learned KV eviction policy        kvserve train-evictor --out F\n"
    "  calibrate-kv  low-rank KV bases from text (cache.low_rank) kvserve calibrate-kv --model P\n"
    "  plan      KV capacity planner                               kvserve plan --model PRESET\n"
    "Run 'kvserve <command> --help' for the options of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built with lock-order cycle detection on, which costs
  // every lock a graph update; our lock order is flat (one mutex per stream).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string_view cmd = argv[1];
  if (cmd == "serve") return kvserve::cli::RunServe(argc - 1, argv + 1);
  if (cmd == "generate") return kvserve::cli::RunGenerate(argc - 1, argv + 1);
  if (cmd == "convert") return kvserve::cli::RunConvert(argc - 1, argv + 1);
  if (cmd == "eval-kv") return kvserve::cli::RunEvalKv(argc - 1, argv + 1);
  if (cmd == "calibrate-kv") return kvserve::cli::RunCalibrateKv(argc - 1, argv + 1);
  if (cmd == "plan") return kvserve::cli::RunPlan(argc - 1, argv + 1);
  if (cmd == "train-evictor") return kvserve::cli::RunTrainEvictor(argc - 1, argv + 1);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "kvserve: unknown command '%s'\n%s", argv[1], kUsage);
  return 2;
}
