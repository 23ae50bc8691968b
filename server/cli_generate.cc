// Placeholder until this subcommand lands; its owner replaces the file.
#include <cstdio>

#include "server/cli.h"

namespace kvserve::cli {

int RunGenerate(int argc, char** argv) {
  std::fprintf(stderr, "kvserve: this command is not built yet\n");
  return 1;
}

}  // namespace kvserve::cli
