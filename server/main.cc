// kvserve entry point: dispatches to the subcommands.
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  std::fprintf(stderr, "usage: kvserve <generate|convert|serve|eval-kv|plan> ...\n");
  return 2;
}
