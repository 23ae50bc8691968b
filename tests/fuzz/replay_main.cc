// The seed-corpus replay of a fuzz target (make test, any compiler): the
// target's LLVMFuzzerTestOneInput run once on every file of the corpus
// folders (or files) given on the command line, in name order, without
// libFuzzer. A FUZZ_CHECK failure or a sanitizer report stops the run; the
// corpora hold the hand-written seeds and the inputs of every crash found
// by `make fuzz` (regress_*), so the normal and the sanitizer builds check
// them on each run. Mutation is libFuzzer's, in `make fuzz` (clang).
//
//   fuzz_replay_<target> CORPUS_DIR_OR_FILE...
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& entry : fs::directory_iterator(argv[i])) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else if (fs::is_regular_file(argv[i], ec)) {
      inputs.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "%s: no such file or folder\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs in the given corpora\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: unreadable\n", p.string().c_str());
      return 1;
    }
    // libFuzzer passes a pointer it owns; a copy of exactly `size` bytes
    // lets ASan catch a read past the end of the input.
    std::vector<uint8_t> data(bytes.begin(), bytes.end());
    static const uint8_t kEmpty = 0;
    LLVMFuzzerTestOneInput(data.empty() ? &kEmpty : data.data(), data.size());
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return 0;
}
