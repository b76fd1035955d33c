// Probing a path as another user, for the security suite: a child process
// drops to the user's uid, gid and supplementary groups (as setpriv
// --reuid --regid --groups does) and tries each probe for real.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ckptfs::testing {

struct User {
  std::string name;
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
};

enum class Probe {
  kRead,   // open(O_RDONLY) and read a byte
  kList,   // opendir and readdir to the end
  kXattr,  // getxattr user.ckptfs.sha256 (in the mount) or read (in SRC: the same right)
  kStat,   // stat
};

struct Attempt {
  Probe probe;
  std::string path;
};

// One child process runs every attempt as `user`; true where it succeeded.
std::vector<bool> TryAs(const User& user, const std::vector<Attempt>& attempts);

// Runs `fn` in a child process that dropped to `user`, and returns what it
// returned; nullopt if the child could not become `user` or did not finish.
std::optional<std::string> InChildAs(const User& user, const std::function<std::string()>& fn);

// Runs `command` with /bin/sh as `user` (setpriv), returning its exit code
// and merged output.
struct AsResult {
  int exit_code = -1;
  std::string out;
};
AsResult RunAs(const User& user, const std::string& command);

}  // namespace ckptfs::testing
