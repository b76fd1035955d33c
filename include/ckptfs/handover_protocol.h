// What a ckptfs supervisor and the daemon it runs tell each other
// (README, "Restart and upgrade").
//
// The supervisor holds the mount's /dev/fuse descriptor and starts the
// serving daemon with it inherited; the environment names the descriptors
// and carries what the daemon cannot learn itself. Over a SOCK_SEQPACKET
// socket pair they then exchange one small JSON object per message:
//
//   daemon -> supervisor   {"type":"init","request":HEX}   the INIT request the
//                                                         kernel sent (first daemon)
//                          {"type":"ready"}               serving from now on
//                          {"type":"restart","binary":P}  ckptfsctl restart: start
//                                                         P (or the same binary) and
//                                                         hand the connection over
//                          {"type":"inherit",             drained: its inodes with
//                           "inodes":[[INO,OPENS,ID]..]}  open files, for the successor
//                          {"type":"open-inode",          an inode's open count changed
//                           "inode":[INO,OPENS,ID]}       (kept for a crash's successor)
//   supervisor -> daemon   {"type":"drain"}               a successor serves: stop
//                                                         reading, finish, exit 0
//                          {"type":"resend",              the predecessor is gone:
//                           "inodes":[...]}               inherit its open inodes (none
//                                                         after a crash), admit requests,
//                                                         FUSE_NOTIFY_RESEND
//                          {"type":"handover-failed",     the daemon a restart
//                           "error":WHY}                  started died; this one serves on
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/status.h"

namespace ckptfs::handover {

// Environment of a supervised daemon.
inline constexpr const char* kEnvFuseFd = "CKPTFS_SUPERVISED_FUSE_FD";     // the inherited /dev/fuse descriptor
inline constexpr const char* kEnvLinkFd = "CKPTFS_SUPERVISOR_FD";          // its end of the socket pair
// The connection's per-thread channels (fuse_channels.h), comma-separated
// descriptors; absent when the supervisor could not make them.
inline constexpr const char* kEnvFuseChannels = "CKPTFS_SUPERVISED_FUSE_CHANNELS";
inline constexpr const char* kEnvInit = "CKPTFS_ADOPT_INIT";               // hex INIT request: take the connection over
inline constexpr const char* kEnvRestarts = "CKPTFS_RESTARTS";             // daemons started before this one
inline constexpr const char* kEnvLastExit = "CKPTFS_LAST_EXIT";            // how the previous one ended
inline constexpr const char* kEnvMountedAt = "CKPTFS_MOUNTED_AT";          // seconds since the epoch
inline constexpr const char* kEnvSupervisorPid = "CKPTFS_SUPERVISOR_PID";
inline constexpr const char* kEnvStartedAs = "CKPTFS_STARTED_AS";          // one of the roles below
inline constexpr const char* kEnvPredecessorPid = "CKPTFS_PREDECESSOR_PID";  // a successor's: the daemon it takes over from

// A daemon's role, as the supervisor started it (and `status` reports it):
// the first of the mount, the successor a `ckptfsctl restart` asked for, or
// a replacement started because none served.
inline constexpr const char* kStartedFirst = "first";
inline constexpr const char* kStartedSuccessor = "successor";
inline constexpr const char* kStartedReplacement = "replacement";

// The largest message either side sends (an INIT request in hex is ~250 bytes).
inline constexpr size_t kMaxMessage = 64 * 1024;

// `wait` false: fail at once rather than block when the peer lags behind.
Status Send(int fd, const nlohmann::json& message, bool wait = true);
// One message; an error at end of stream (the peer closed) or on bad JSON.
Result<nlohmann::json> Receive(int fd);

std::string ToHex(const std::vector<uint8_t>& bytes);
// Empty on anything but an even count of hex digits.
std::vector<uint8_t> FromHex(const std::string& hex);

}  // namespace ckptfs::handover
