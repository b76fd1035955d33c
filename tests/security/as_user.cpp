#include "as_user.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "test_tree.h"

namespace ckptfs::testing {

namespace {

bool TryOne(const Attempt& a) {
  switch (a.probe) {
    case Probe::kRead: {
      int fd = ::open(a.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return false;
      char c;
      const bool ok = ::read(fd, &c, 1) >= 0;
      ::close(fd);
      return ok;
    }
    case Probe::kList: {
      DIR* d = ::opendir(a.path.c_str());
      if (d == nullptr) return false;
      while (::readdir(d) != nullptr) {
      }
      ::closedir(d);
      return true;
    }
    case Probe::kXattr: {
      char buf[256];
      return ::getxattr(a.path.c_str(), "user.ckptfs.sha256", buf, sizeof buf) >= 0;
    }
    case Probe::kStat: {
      struct stat st;
      return ::stat(a.path.c_str(), &st) == 0;
    }
  }
  return false;
}

std::string Join(const std::vector<gid_t>& groups) {
  std::string out;
  for (gid_t g : groups) out += (out.empty() ? "" : ",") + std::to_string(g);
  return out;
}

}  // namespace

std::optional<std::string> InChildAs(const User& user, const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgroups(user.groups.size(), user.groups.data()) != 0 || ::setresgid(user.gid, user.gid, user.gid) != 0 ||
        ::setresuid(user.uid, user.uid, user.uid) != 0) {
      ::_exit(3);
    }
    const std::string out = fn();
    ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 4);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return got;
}

std::vector<bool> TryAs(const User& user, const std::vector<Attempt>& attempts) {
  std::optional<std::string> got = InChildAs(user, [&] {
    std::string out;
    for (const auto& a : attempts) out += TryOne(a) ? '1' : '0';
    return out;
  });
  if (!got || got->size() != attempts.size()) return {};
  std::vector<bool> out;
  for (char c : *got) out.push_back(c == '1');
  return out;
}

AsResult RunAs(const User& user, const std::string& command) {
  const std::string groups = user.groups.empty() ? "--clear-groups" : "--groups=" + Join(user.groups);
  CommandResult r = RunCommand("setpriv --reuid=" + std::to_string(user.uid) + " --regid=" + std::to_string(user.gid) +
                                   " " + groups + " sh -c " + ShellQuote(command),
                               /*merge_stderr=*/true);
  return {r.exit_code, r.out};
}

}  // namespace ckptfs::testing
