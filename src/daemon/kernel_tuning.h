// Settings the daemon asks of the kernel for its mount and itself: the
// mount's read-ahead (its BDI) and the daemon's OOM score. Each is best
// effort: without the privilege or the file, the kernel's default stays and
// the log says why.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "ckptfs/status.h"

namespace ckptfs::daemon {

// The "major:minor" of the filesystem mounted last at `mountpoint`, from
// /proc/self/mountinfo (so that nothing here stats into the mount); empty
// when none is.
std::string MountDevice(const std::string& mountpoint);
// The same as a device number.
std::optional<dev_t> MountDeviceNumber(const std::string& mountpoint);

// Raises the kernel's read-ahead for the mount at `mountpoint` to `bytes`.
// The kernel sets the BDI's read-ahead from the INIT reply, so this runs
// after INIT; it retries until the value sticks, for about a second, or
// until `stop` turns true (the daemon is shutting down).
void SetBdiReadahead(const std::string& mountpoint, uint64_t bytes, const std::atomic<bool>& stop);

// Raises the FUSE connection of the mount at `mountpoint` to `max_background`
// background requests (and its congestion threshold to three quarters of
// that) through fusectl, wherever fusectl is mounted, when they are lower.
// The daemon asks for them in its INIT reply; this is for one that takes a
// connection over, which gets no INIT: a mount started by a daemon from
// before that keeps the kernel's default (12) until it is raised here.
// Returns what was done, for the log (empty when nothing was), or why not.
Result<std::string> RaiseBackgroundLimit(const std::string& mountpoint, unsigned max_background);

// Every engine reads through this filesystem: when memory runs out, the
// kernel should kill a runaway engine first, not the filesystem under all of
// them. Lowering the score needs privilege; without it the default stays.
void LowerOomScore();

// The host tier's copies are memfds (shmem). Whether they get 2 MiB pages is
// the kernel's global shmem_enabled policy, and its default, "never", leaves
// them in 4 KiB pages: a safetensors load from them then runs about 1.4x
// slower than from an ext4 page cache (which uses large folios), and a fill
// about 3x slower (measured; README, "Kernel passthrough"). When the policy
// is still that default, this sets it to "advise", which gives huge pages
// only to shmem mappings that ask for them with MADV_HUGEPAGE (the daemon's
// own mappings of its copies), leaving every other program's shared memory
// as it was. Any other value (an administrator's choice, or deny) is left
// alone. Returns what was done, for the log (empty when nothing was), or why
// it could not be.
Result<std::string> AskForShmemHugePages(const std::string& thp_dir = "/sys/kernel/mm/transparent_hugepage");

}  // namespace ckptfs::daemon
