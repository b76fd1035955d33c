// Why systemd sends SIGTERM: `systemctl stop` and `systemctl restart` both
// stop the service with SIGTERM, and the supervisor must unmount for the
// first and must not for the second. systemd keeps a service's fd store
// while a job is queued or running for the unit (v252: unit_may_gc() in
// src/core/unit.c releases resources only with no job), so during a restart
// job the /dev/fuse descriptor stays in the store and the next supervisor
// takes it back. The job's type tells the two apart; systemd answers it on
// its bus (org.freedesktop.systemd1, the unit's Job property, the job's
// JobType), asked here through libsystemd's sd-bus.
#pragma once

#include <string>

#include "ckptfs/status.h"

namespace ckptfs::supervisor {

// The type of the job systemd runs or has queued for the unit this process
// belongs to ("restart", "stop", ...), or "" when there is none. The bus is
// DBUS_SYSTEM_BUS_ADDRESS when set, else systemd's private socket
// (/run/systemd/private, root only), which needs no dbus-daemon.
Result<std::string> OwnUnitJobType();

// True when a SIGTERM received now is the stop half of a restart: the job
// type is "restart" (what `systemctl restart`, `try-restart` and
// `reload-or-restart` of a unit without ExecReload= become). Anything else,
// a failed question included, is a stop.
bool StoppingForRestart(std::string* why);

}  // namespace ckptfs::supervisor
