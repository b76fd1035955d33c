#include "ckptfs/hub_refs.h"

#include <unistd.h>

#include <array>
#include <cerrno>

#include "source_file.h"

namespace ckptfs {

bool IsHubRepoDirName(std::string_view name) {
  for (std::string_view prefix : {"models--", "datasets--", "spaces--"}) {
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

Result<std::string> ReadHubRef(const std::string& root, const std::string& path) {
  auto opened = OpenSourceFile(root, path);
  if (!opened.ok()) return opened.status();
  if (static_cast<uint64_t>(opened->st.st_size) > kMaxHubRefBytes) {
    return Status::Error("hub ref " + path + " is " + std::to_string(opened->st.st_size) +
                         " bytes, more than a ref holds (" + std::to_string(kMaxHubRefBytes) + "); not mirrored");
  }
  // One byte more than allowed, to notice a file that grew since the fstat.
  // Read into a buffer of the walk's own, and kept at its size: a ref's
  // 40 bytes held in a buffer of 4 KiB cost the view 8x what a file does.
  std::array<char, kMaxHubRefBytes + 1> buf;
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pread(opened->fd.get(), buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read hub ref " + path, errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (done > kMaxHubRefBytes) return Status::Changed(path + ": grew while it was read");
  return std::string(buf.data(), done);
}

}  // namespace ckptfs
