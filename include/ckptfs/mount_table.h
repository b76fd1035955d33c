// The mounts this process sees, from /proc/self/mountinfo: used wherever a
// path's mount must be known for what it is (the source's filesystem type,
// the mount's device, whether a path lies on a real ckptfs mount).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ckptfs {

struct MountEntry {
  std::string mount_point;    // octal escapes (\040 for a space) decoded
  dev_t device = 0;           // st_dev of every file on the mount
  std::string device_text;    // "maj:min", as mountinfo writes it
  std::string fstype;         // "ext4", "fuse.ckptfs", ...
  std::string source;         // the mount source ("/srv/checkpoints" for ckptfs)
  std::string super_options;  // "rw,user_id=0,group_id=0,allow_other" for FUSE
};

// Every mount, in mount order (a mount stacked on another comes after it).
std::vector<MountEntry> ReadMountTable();

// The topmost mount whose mount point is exactly `path` (canonical).
std::optional<MountEntry> MountAt(const std::string& path);

// The mount that holds canonical `path`: of the mounts whose mount point is
// `path` or one of its ancestors, the deepest, and of those the last mounted.
std::optional<MountEntry> MountHolding(const std::string& path);

// The topmost mount with this device number.
std::optional<MountEntry> MountOfDevice(dev_t device);

// A numeric option of a mount's super options ("user_id" of
// "rw,user_id=0,group_id=0"); nullopt when absent.
std::optional<unsigned long> SuperOption(const MountEntry& mount, const std::string& key);

// statfs(2) f_type of FUSE filesystems.
inline constexpr long kFuseSuperMagic = 0x65735546;
// The filesystem type ckptfs mounts show in the mount table.
inline constexpr const char* kCkptfsMountType = "fuse.ckptfs";

}  // namespace ckptfs
