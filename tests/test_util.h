// Test helpers: where the shared reference model and data live, and where the
// built binaries are. KVSERVE_SHARED overrides ../shared beside the repository,
// KVSERVE_BIN the kvserve binary and KVSERVE_TEST_TMP the scratch folder.
#pragma once

#include <string>
#include <vector>

namespace kvserve::testing {

// The shared/ folder (models, data); aborts the test run if it is missing.
std::string SharedDir();
// shared/models/stories260k
std::string Stories260kDir();
std::string Stories260kCheckpoint();
std::string Stories260kTokenizer();
// golden_greedy_256.txt without its final newline.
std::string GoldenGreedyText();
// The first python interpreter that can import `module` ($KVSERVE_PYTHON,
// python3, /usr/bin/python3: a pyenv or venv python3 on PATH may lack
// Debian's python3-* packages); empty when none can.
std::string PythonWithModule(const std::string& module);
// A scratch copy of an npm test folder with its pinned packages installed
// (`npm ci`, never in the source tree); removed with everything npm wrote
// when the object dies.
//   NpmWorkdir npm("tests/model/node", {"package.json", "package-lock.json"}, "bpe");
//   if (!npm.has_node()) { WARN(...); return; }
//   REQUIRE(npm.Install());  // npm.log() says why not
class NpmWorkdir {
 public:
  // src: a folder relative to the source tree; files: what to copy from it.
  NpmWorkdir(const std::string& src, const std::vector<std::string>& files,
             const std::string& prefix);
  ~NpmWorkdir();
  NpmWorkdir(const NpmWorkdir&) = delete;
  NpmWorkdir& operator=(const NpmWorkdir&) = delete;

  // node and npm are on PATH (Debian packages nodejs, npm).
  bool has_node() const { return has_node_; }
  // Runs npm ci; false on failure, with its output in log().
  bool Install();
  const std::string& dir() const { return dir_; }
  const std::string& log() const { return log_; }

 private:
  std::string dir_;
  std::string log_;
  bool has_node_ = false;
};
// The build's kvserve binary.
std::string KvserveBinary();
// A fresh empty directory under the build tree's test scratch area.
std::string MakeTempDir(const std::string& prefix);
// Runs `command` through /bin/sh, appends what it prints on stdout to *out,
// and returns its exit code (-1 if it could not run or died by a signal).
int RunShell(const std::string& command, std::string* out);
// `s` single-quoted for /bin/sh.
std::string ShellQuote(const std::string& s);
// Reads a whole file; aborts when it cannot.
std::string ReadFileOrDie(const std::string& path);

}  // namespace kvserve::testing
