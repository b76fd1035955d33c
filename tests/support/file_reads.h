// Reading a file every way a reader of the mount does, for tests that
// compare what the mount serves with the source byte for byte.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ckptfs::testing {

// With O_DIRECT, so every request reaches the filesystem (the kernel's page
// cache would otherwise answer repeats). "<open: ...>" / "<read: ...>" on error.
std::string ReadDirect(const std::string& path, uint64_t offset = 0, size_t len = SIZE_MAX);
// read(2) in 1 MiB pieces; "<open: ...>" / "<read: ...>" on error.
std::string ReadBuffered(const std::string& path);
// mmap of the whole file, every byte copied out; "<mmap: ...>" on error.
std::string ReadMapped(const std::string& path);

// Every regular file below `src` compared with the same path below `mnt`,
// by read(2) and by mmap: one line per difference, empty when all agree.
// `files` (if given) counts the files compared.
std::string CompareTree(const std::string& src, const std::string& mnt, size_t* files = nullptr);

// /proc/PID/fd/N for every descriptor of `pid` that is one of ckptfs's
// host-tier memfds.
std::vector<std::string> HostTierMemfds(pid_t pid);

// Whether descriptor `fd` of `pid` and `other_fd` of `other` are the same
// open file (kcmp(2) KCMP_FILE, as systemd's same_fd compares), not merely
// the same inode: every clone of a FUSE connection is /dev/fuse.
bool SameOpenFile(pid_t pid, int fd, pid_t other, int other_fd);

}  // namespace ckptfs::testing
