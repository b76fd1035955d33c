// The documentation keeps up with the code: every option `ckptfs --help`
// lists and every command and option `ckptfsctl --help` lists appears in the
// man pages and in the README; the man pages render cleanly; the README and
// the man pages state the digest and view contract themselves, and their
// digest recipes give the implementation's digests.
#include <gtest/gtest.h>

#include <cctype>
#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "test_tree.h"
#include "test_binaries.h"

namespace ckptfs::testing {
namespace {

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
  for (const char* expected : {"state=", "rescan=", "settle=", "symlinks=", "threads=", "log=", "log_file=",
                               "readahead=", "cache_size=", "gpu=", "allow_other", "fsname="}) {
    EXPECT_TRUE(options.count(expected)) << expected << " is not in ckptfs --help";
  }
  const std::string man = ManText(kSource + "/packaging/man/ckptfs.8");
  const std::string readme = ReadFile(kSource + "/README.md");
  const std::string table = readme.substr(readme.find("| option | meaning | default |"));
  for (const auto& o : options) {
    EXPECT_NE(man.find(o), std::string::npos) << o << " is missing from packaging/man/ckptfs.8";
    EXPECT_NE(table.find("| `" + o), std::string::npos) << o << " is missing from the README's option table";
  }
  for (const char* flag : {"-f", "-d", "-h", "--help", "-V", "--version"}) {
    EXPECT_NE(RunCommand(kDaemon + " --help").out.find(std::string(" ") + flag), std::string::npos) << flag;
    EXPECT_NE(man.find(flag), std::string::npos) << flag << " is missing from packaging/man/ckptfs.8";
    EXPECT_NE(table.find(std::string("`") + flag + "`"), std::string::npos) << flag << " is missing from the README";
  }
}

// The long options of `ckptfsctl --help` and of every `ckptfsctl CMD --help`.
std::set<std::string> CtlOptions(const std::set<std::string>& commands) {
  std::set<std::string> out;
  std::vector<std::string> helps{RunCommand(kCtl + " --help").out};
  for (const auto& c : commands) helps.push_back(RunCommand(kCtl + " " + c + " --help").out);
  const std::regex opt(R"(^  (-[a-zA-Z],)?(--[a-z][a-z-]*))");
  for (const auto& help : helps) {
    std::istringstream lines(help);
    std::string line;
    bool in_options = false;
    while (std::getline(lines, line)) {
      if (line.rfind("Options:", 0) == 0) in_options = true;
      else if (!line.empty() && line[0] != ' ') in_options = false;
      std::smatch m;
      if (in_options && std::regex_search(line, m, opt) && m[2] != "--help") out.insert(m[2]);
    }
  }
  return out;
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
  const std::set<std::string> options = CtlOptions(commands);
  for (const char* expected : {"--state", "--manifest", "--no-nested", "--json", "--pin", "--prometheus"}) {
    EXPECT_TRUE(options.count(expected)) << expected << " was not found in ckptfsctl's help";
  }
  for (const auto& o : options) {
    EXPECT_NE(man.find(o), std::string::npos) << o << " is missing from packaging/man/ckptfsctl.8";
    EXPECT_NE(readme.find(o), std::string::npos) << o << " is missing from the README";
  }
}

// Both fstab types, the same way in --help, the README and ckptfs(8).
TEST(DocsTest, FstabLinesShowBothTypes) {
  const std::string help = RunCommand(kDaemon + " --help").out;
  const std::string man = ManText(kSource + "/packaging/man/ckptfs.8");
  const std::string readme = ReadFile(kSource + "/README.md");
  for (const auto& [where, text] : {std::pair{"ckptfs --help", help}, {"ckptfs.8", man}, {"README.md", readme}}) {
    EXPECT_TRUE(std::regex_search(text, std::regex(R"(/models +ckptfs +ro,allow_other)"))) << where;
    EXPECT_TRUE(std::regex_search(text, std::regex(R"(/models +fuse\.ckptfs +ro,allow_other)"))) << where;
  }
}

// What `man` shows: no space before a comma, every prose .TP tag (a plain
// word, such as "Permissions") on a line of its own rather than run into its
// text, and the paths the package installs.
TEST(DocsTest, ManPagesRenderCleanly) {
  for (const char* page : {"ckptfs.8", "ckptfsctl.8"}) {
    const std::string source = ReadFile(kSource + "/packaging/man/" + page);
    const std::string path = kSource + "/packaging/man/" + page;
    const CommandResult shown = RunCommand("MANWIDTH=80 man -l " + path);
    ASSERT_EQ(shown.exit_code, 0) << shown.out;
    EXPECT_EQ(RunCommand("man --warnings -l " + path + " 2>&1 >/dev/null").out, "") << page;
    EXPECT_FALSE(std::regex_search(shown.out, std::regex(R"(\w ,)"))) << page << " has a space before a comma";
    std::istringstream lines(source);
    std::string line, prev;
    while (std::getline(lines, line)) {
      if (prev == ".TP" && std::regex_match(line, std::regex(R"([A-Za-z][A-Za-z ]*)"))) {
        EXPECT_NE(shown.out.find("\n       " + line + "\n"), std::string::npos)
            << page << ": the tag \"" << line << "\" runs into its text";
      }
      prev = line;
    }
  }
  const std::string ckptfs8 = ReadFile(kSource + "/packaging/man/ckptfs.8");
  EXPECT_NE(ckptfs8.find("/usr/lib/systemd/system/models.mount"), std::string::npos);
  EXPECT_FALSE(std::regex_search(ckptfs8, std::regex(R"((^|[^r])/lib/systemd)"))) << "the package installs /usr/lib";
}

// A clone or an installed package has no DESIGN.md: the README and the man
// pages carry the contract themselves.
TEST(DocsTest, ReadmeAndManPagesStandAlone) {
  const std::string readme = ReadFile(kSource + "/README.md");
  const std::string man = ManText(kSource + "/packaging/man/ckptfs.8");
  for (const auto& [where, text] : {std::pair{"README.md", readme}, {"ckptfs.8", man},
                                    {"ckptfsctl.8", ManText(kSource + "/packaging/man/ckptfsctl.8")}}) {
    EXPECT_EQ(text.find("DESIGN"), std::string::npos) << where << " points at a file that is not there";
  }
  // Lower case, markup and line breaks gone: terms are found across lines.
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    t = std::regex_replace(t, std::regex("[`*]"), "");
    return std::regex_replace(t, std::regex(R"(\s+)"), " ");
  };
  for (const char* term : {"ascending byte order", "two spaces", "begins with", "fully resolved target",
                           "dangling", "newline or a backslash", "sockets, fifos", "nested checkpoints",
                           "user.ckptfs.digest", "user.ckptfs.sources", "user.ckptfs.sha256", "refs/", "eio",
                           "erofs", "symlinks=follow", "search permission", "when mount returns"}) {
    EXPECT_NE(lower(readme).find(term), std::string::npos) << "README.md does not state: " << term;
    EXPECT_NE(lower(man).find(term), std::string::npos) << "ckptfs.8 does not state: " << term;
  }
}

// The shell blocks of the README's digest section, and the .nf blocks of
// ckptfs(8)'s, with CHECKPOINT and ckptfsctl filled in.
std::vector<std::string> DigestRecipes(const std::string& state) {
  std::vector<std::string> out;
  const std::string readme = ReadFile(kSource + "/README.md");
  const size_t begin = readme.find("## The digest");
  const std::string section = readme.substr(begin, readme.find("\n## ", begin + 1) - begin);
  const std::regex block("```sh\n([^`]*)```");
  for (auto it = std::sregex_iterator(section.begin(), section.end(), block); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1]);
  }
  const std::string man = ReadFile(kSource + "/packaging/man/ckptfs.8");
  const size_t mbegin = man.find(".SH THE DIGEST");
  const std::string msection = man.substr(mbegin, man.find(".SH ", mbegin + 1) - mbegin);
  const std::regex nf(R"(\.nf\n\.RS\n([\s\S]*?)\.RE\n\.fi)");
  for (auto it = std::sregex_iterator(msection.begin(), msection.end(), nf); it != std::sregex_iterator(); ++it) {
    std::string text = std::regex_replace((*it)[1].str(), std::regex(R"(\\-)"), "-");
    out.push_back(std::regex_replace(text, std::regex(R"(\\e)"), "\\"));
  }
  for (auto& r : out) r = std::regex_replace(r, std::regex(R"(\bckptfsctl )"), kCtl + " --state " + state + " ");
  return out;
}

TEST(DocsTest, DigestRecipesGiveTheImplementationsDigests) {
  TempDir tmp("ckptfs-docs");
  const std::string src = tmp / "src";
  ASSERT_EQ(RunCommand(std::string(MAKE_DEMO_TREE_PATH) + " " + src).exit_code, 0);
  // What the rules have to get right: subdirectories, dot-paths, a link into
  // blobs/, a checkpoint nested below a plain subdirectory, and a directory
  // named like a weight file (not a weight file).
  WriteFile(src + "/run7/tok/sub/vocab.txt", "a b c\n");
  WriteFile(src + "/run7/tok/.cache/x", "skipped");
  WriteFile(src + "/run7/blobs/0a1b", "blob bytes\n");
  Symlink("../blobs/0a1b", src + "/run7/tok/merges.txt");
  WriteFile(src + "/run7/exports/onnx/model.gguf", "nested two levels down");
  WriteFile(src + "/run7/logs.bin/events", "a directory, not a weight file");
  const std::vector<std::string> recipes = DigestRecipes(tmp / "state");
  ASSERT_EQ(recipes.size(), 5u) << "three in the README, two in ckptfs.8";
  for (const char* rel : {"run7", "base", "run7/exports/onnx"}) {
    const std::string dir = src + "/" + rel;
    const std::string expected = RunCommand(kCtl + " --state " + tmp / "state" + " digest " + dir).out.substr(0, 71);
    ASSERT_EQ(expected.rfind("sha256-", 0), 0u) << rel;
    for (const auto& recipe : recipes) {
      const bool flat_only = recipe.find("-exec") == std::string::npos && recipe.find("--no-nested") == std::string::npos;
      if (flat_only && std::string(rel) == "run7") continue;  // said to be for checkpoints without nested ones
      const std::string command = std::regex_replace(recipe, std::regex("CHECKPOINT"), ShellQuote(dir));
      CommandResult r = RunCommand(command, true);
      EXPECT_EQ("sha256-" + r.out.substr(0, 64), expected) << rel << ": " << recipe << "\n" << r.out;
    }
  }
}

}  // namespace
}  // namespace ckptfs::testing
