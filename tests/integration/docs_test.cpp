// The documentation keeps up with the code: every option `ckptfs --help`
// lists and every command `ckptfsctl --help` lists appears in the man pages
// and in the README.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include "test_tree.h"

namespace ckptfs::testing {
namespace {

const std::string kDaemon = CKPTFS_PATH;
const std::string kCtl = CKPTFSCTL_PATH;
const std::string kSource = CKPTFS_SOURCE_DIR;

// A man page as plain text: roff escapes for '-' and font changes removed.
std::string ManText(const std::string& path) {
  std::string s = ReadFile(path);
  s = std::regex_replace(s, std::regex(R"(\\-)"), "-");
  s = std::regex_replace(s, std::regex(R"(\\f[BIRP])"), "");
  s = std::regex_replace(s, std::regex(R"(\n\.(B|I|BI|IB|BR|RB|IR|RI|TP|IP|PP|TH|SH|B)\b ?)"), "\n");
  return s;
}

// Option names from `ckptfs --help`: "  name=VALUE ..." and "  flag  ...".
std::set<std::string> DaemonOptions() {
  std::istringstream help(RunCommand(kDaemon + " --help").out);
  std::set<std::string> out;
  std::string line;
  bool in_options = false;
  const std::regex opt(R"(^  ([a-z_]+)(=\S*)?(\s|$))");
  while (std::getline(help, line)) {
    if (line.find("options (-o):") != std::string::npos) in_options = true;
    if (line.rfind("fstab:", 0) == 0) in_options = false;
    std::smatch m;
    if (in_options && std::regex_search(line, m, opt)) out.insert(m[1].str() + (m[2].matched ? "=" : ""));
  }
  return out;
}

TEST(DocsTest, EveryDaemonOptionIsInTheManPageAndTheReadme) {
  const std::set<std::string> options = DaemonOptions();
  ASSERT_GE(options.size(), 12u);  // the parse found the option lists
  for (const char* expected : {"state=", "rescan=", "settle=", "symlinks=", "threads=", "log=", "readahead=",
                               "cache_size=", "gpu=", "gpu_cache_size=", "allow_other", "fsname="}) {
    EXPECT_TRUE(options.count(expected)) << expected << " is not in ckptfs --help";
  }
  const std::string man = ManText(kSource + "/packaging/man/ckptfs.8");
  const std::string readme = ReadFile(kSource + "/README.md");
  const std::string table = readme.substr(readme.find("| option | meaning | default |"));
  for (const auto& o : options) {
    EXPECT_NE(man.find(o), std::string::npos) << o << " is missing from packaging/man/ckptfs.8";
    EXPECT_NE(table.find("| `" + o), std::string::npos) << o << " is missing from the README's option table";
  }
}

TEST(DocsTest, EveryCtlCommandIsInTheManPageAndTheReadme) {
  std::istringstream help(RunCommand(kCtl + " --help").out);
  std::set<std::string> commands;
  std::string line;
  bool in_commands = false;
  while (std::getline(help, line)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in_commands = true;
      continue;
    }
    std::smatch m;
    if (in_commands && std::regex_search(line, m, std::regex(R"(^  ([a-z]+)\s)"))) commands.insert(m[1]);
  }
  ASSERT_GE(commands.size(), 10u);
  const std::string man = ManText(kSource + "/packaging/man/ckptfsctl.8");
  const std::string readme = ReadFile(kSource + "/README.md");
  for (const auto& c : commands) {
    EXPECT_NE(man.find(c + " "), std::string::npos) << c << " is missing from packaging/man/ckptfsctl.8";
    EXPECT_NE(readme.find("ckptfsctl " + c), std::string::npos) << c << " is missing from the README";
  }
}

}  // namespace
}  // namespace ckptfs::testing
