// Under systemd, the service manager's file descriptor store keeps a
// supervised mount's /dev/fuse descriptor and its INIT request
// (FileDescriptorStoreMax= in mount/ckptfs@.service). If the supervisor
// itself dies, systemd restarts it (Restart=always) and hands both back
// (LISTEN_FDS, LISTEN_FDNAMES "fuse" and "fuse-init"): the new supervisor
// takes the mount over instead of mounting, and readers never see ENOTCONN.
// The same happens on `systemctl restart` (systemd keeps the store while the
// restart job runs; see systemd_job.h), where the supervisor that stops also
// leaves the open-file record ("fuse-open-inodes") for its successor.
// Outside systemd (no NOTIFY_SOCKET) every call here does nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::supervisor {

struct StoredConnection {
  UniqueFd fuse;
  std::vector<uint8_t> init_request;  // empty if the INIT was never stored
  std::string open_inodes;            // the open-file record (JSON), empty if none
  std::vector<UniqueFd> channels;     // its per-thread channels (fuse_channels.h), if stored
};

// The connection systemd passed to this process, if any; the descriptors
// are removed from the environment's count (sd_listen_fds unsets it).
std::optional<StoredConnection> TakeStoredConnection();

// systemd passed this process a stored FUSE connection (LISTEN_FDNAMES has
// "fuse"): the mount point is mounted already, and nothing may stat it
// before a daemon serves, or it waits on the connection it is to serve.
bool StoredConnectionWaiting();
// systemd's notification socket is set (Type=notify).
bool UnderSystemd();
// FDSTORE=1 with FDNAME=fuse.
Status StoreFuseFd(int fd);
// FDSTORE=1 with FDNAME=fuse-channel, for each of the connection's channels.
Status StoreFuseChannels(const std::vector<int>& channels);
// FDSTORE=1 with FDNAME=fuse-init: the INIT request in a sealed memfd.
Status StoreInitRequest(const std::vector<uint8_t>& request);
// FDSTORE=1 with FDNAME=fuse-open-inodes: the open-file record, in a
// sealed memfd, replacing any stored before.
Status StoreOpenInodes(const std::string& json);
// FDSTOREREMOVE=1 of the open-file record: once taken back it is stale.
void ForgetOpenInodes();
// READY=1 (and STATUS=): the first daemon serves.
void NotifyReady(const std::string& status);

}  // namespace ckptfs::supervisor
