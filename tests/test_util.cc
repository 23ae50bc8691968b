#include "tests/test_util.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace kvserve::testing {
namespace fs = std::filesystem;

std::string SharedDir() {
  if (const char* env = std::getenv("KVSERVE_SHARED"); env != nullptr && *env != '\0') {
    return env;
  }
  fs::path p = fs::path(KVSERVE_SOURCE_DIR) / ".." / "shared";
  if (!fs::exists(p / "models")) {
    std::fprintf(stderr, "shared/ not found beside the repository; set KVSERVE_SHARED\n");
    std::abort();
  }
  return fs::weakly_canonical(p).string();
}

std::string Stories260kDir() { return SharedDir() + "/models/stories260k"; }
std::string Stories260kCheckpoint() { return Stories260kDir() + "/stories260K.bin"; }
std::string Stories260kTokenizer() { return Stories260kDir() + "/tok512.model"; }

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::abort();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string GoldenGreedyText() {
  std::string text = ReadFileOrDie(Stories260kDir() + "/golden_greedy_256.txt");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

int RunShell(const std::string& command, std::string* out) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

std::string PythonWithModule(const std::string& module) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KVSERVE_PYTHON"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const std::string& py : candidates) {
    std::string out;
    if (RunShell(ShellQuote(py) + " -c " + ShellQuote("import " + module) + " 2>&1", &out) == 0) {
      return py;
    }
  }
  return "";
}

// KVSERVE_BIN and KVSERVE_TEST_TMP let a copy of the binaries run away from
// the build tree (the GPU bundle does).
std::string KvserveBinary() {
  if (const char* env = std::getenv("KVSERVE_BIN"); env != nullptr && *env != '\0') return env;
  return std::string(KVSERVE_BINARY_DIR) + "/kvserve";
}

std::string MakeTempDir(const std::string& prefix) {
  fs::path base = fs::path(KVSERVE_BINARY_DIR) / "test-tmp";
  if (const char* env = std::getenv("KVSERVE_TEST_TMP"); env != nullptr && *env != '\0') {
    base = env;
  }
  fs::create_directories(base);
  std::string tmpl = (base / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

NpmWorkdir::NpmWorkdir(const std::string& src, const std::vector<std::string>& files,
                       const std::string& prefix) {
  std::string out;
  has_node_ = RunShell("command -v node && command -v npm 2>&1", &out) == 0;
  dir_ = MakeTempDir(prefix);
  for (const std::string& f : files) {
    fs::copy_file(fs::path(KVSERVE_SOURCE_DIR) / src / f, fs::path(dir_) / f);
  }
}

NpmWorkdir::~NpmWorkdir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // node_modules can hold hundreds of MB
}

bool NpmWorkdir::Install() {
  log_.clear();
  return RunShell(
             "cd " + ShellQuote(dir_) + " && npm ci --no-audit --no-fund --loglevel=error 2>&1",
             &log_) == 0;
}

}  // namespace kvserve::testing
