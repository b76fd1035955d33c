// tests/support/faulty_fs.cpp mounted for a test: started as a child process,
// waited for, and always unmounted and reaped (in the destructor, so a
// failing test cleans up too).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs::testing {

class FaultyFsMount {
 public:
  // Runs `faultyfs BACKING MNT TRIGGER [EXTRA]`; ok() once it is mounted.
  FaultyFsMount(const std::string& faultyfs, const std::string& backing, const std::string& mnt,
                const std::string& trigger, const char* extra = nullptr)
      : mnt_(mnt) {
    MakeDirs(mnt);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl(faultyfs.c_str(), faultyfs.c_str(), backing.c_str(), mnt.c_str(), trigger.c_str(), extra,
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    mounted_ = pid_ > 0 && WaitFor([&] { return IsMounted(mnt_); });
  }
  ~FaultyFsMount() {
    if (IsMounted(mnt_)) RunCommand("fusermount3 -u -z " + ShellQuote(mnt_));
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  FaultyFsMount(const FaultyFsMount&) = delete;
  FaultyFsMount& operator=(const FaultyFsMount&) = delete;

  bool ok() const { return mounted_; }

 private:
  std::string mnt_;
  pid_t pid_ = -1;
  bool mounted_ = false;
};

}  // namespace ckptfs::testing
