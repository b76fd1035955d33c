#include "ckptfs/source_filesystem.h"

#include <sys/stat.h>
#include <sys/statfs.h>

#include <cstdint>

#include "ckptfs/mount_table.h"

namespace ckptfs {

std::string RemoteFilesystemName(long f_type) {
  // Magic numbers from linux/magic.h and the filesystems' own headers.
  struct Known {
    uint32_t magic;
    const char* name;
  };
  static constexpr Known kRemote[] = {
      {0x6969, "nfs"},           {0xFF534D42, "cifs"},       {0xFE534D42, "smb2"},       {0x517B, "smbfs"},
      {0x65735546, "fuse"},      {0x00C36400, "ceph"},       {0x0BD00BD0, "lustre"},     {0x47504653, "gpfs"},
      {0x5346414F, "afs"},       {0x6B414653, "afs"},        {0x73757245, "coda"},       {0x01021997, "9p"},
      {0x7461636F, "ocfs2"},     {0x01161970, "gfs2"},       {0x20030528, "orangefs"},   {0x19830326, "beegfs"},
      {0x013111A8, "ibrix"},     {0xAAD7AAEA, "panfs"},      {0x564C, "ncpfs"},
  };
  for (const auto& k : kRemote) {
    if (static_cast<uint32_t>(f_type) == k.magic) return k.name;
  }
  return "";
}

SourceFilesystem DetectSourceFilesystem(const std::string& path) {
  SourceFilesystem out;
  struct statfs sfs {};
  struct stat st {};
  const bool have_statfs = ::statfs(path.c_str(), &sfs) == 0;
  const std::string remote = have_statfs ? RemoteFilesystemName(static_cast<long>(sfs.f_type)) : "";
  out.inotify_complete = remote.empty();
  if (::stat(path.c_str(), &st) == 0) {
    if (auto mount = MountOfDevice(st.st_dev)) out.type = mount->fstype;
  }
  if (out.type.empty()) out.type = remote.empty() ? "unknown" : remote;
  return out;
}

}  // namespace ckptfs
