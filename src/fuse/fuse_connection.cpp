// The FUSE connection around the operations: its custom I/O and kernel
// passthrough (AttachConnection), and what a restart hands from one daemon
// to the next (drain, resend, the inodes open and how the kernel holds them).
#include "ckptfs/fuse_ops.h"

#include <string>
#include <utility>
#include <vector>

#include "connection_io.h"
#include "passthrough_shim.h"

namespace ckptfs::fuse {

Status AttachConnection(FsContext& ctx, fuse_session* se, bool passthrough_wanted, ConnectionSetup setup) {
  ctx.passthrough = std::make_shared<KernelPassthrough>(passthrough_wanted);
  if (Status s = ctx.passthrough->Attach(setup.fd); !s.ok()) ctx.passthrough->Disable(s.message());
  ConnectionIo::Options io;
  io.adopted_init = std::move(setup.adopted_init);
  io.shared_device = setup.shared_device;
  io.channels = std::move(setup.channels);
  io.on_init_request = std::move(setup.on_init_request);
  io.passthrough = ctx.passthrough.get();
  ctx.connection = std::make_shared<ConnectionIo>(std::move(io));
  return ctx.connection->Install(se, setup.fd);
}

void DrainConnection(FsContext& ctx) {
  if (ctx.passthrough) ctx.passthrough->KeepBackingsOpen();  // the successor may inherit them
  if (ctx.connection) ctx.connection->Drain();
}

Status ResendRequests(FsContext& ctx) {
  if (!ctx.connection) return Status::Error("no FUSE connection");
  return ctx.connection->Resend();
}

bool KernelHasResend(const FsContext& ctx) { return ctx.connection && ctx.connection->kernel_has_resend(); }

std::vector<InheritedInode> HandOverOpenInodes(FsContext& ctx) {
  if (ctx.passthrough) ctx.passthrough->KeepBackingsOpen();
  std::vector<InheritedInode> out;
  for (const auto& [ino, held] : ctx.open_modes.Snapshot()) {
    const bool passthrough = held.choice.passthrough && held.choice.backing;
    out.push_back({ino, held.opens, passthrough ? KernelPassthrough::BackingId(*held.choice.backing) : 0});
  }
  return out;
}

void WatchOpenInodes(FsContext& ctx, std::function<void(uint64_t ino)> changed) {
  ctx.open_modes.SetObserver(std::move(changed));
}

InheritedInode OpenInodeRecord(const FsContext& ctx, uint64_t ino) {
  const auto held = ctx.open_modes.Find(ino);
  if (!held) return {ino, 0, 0};
  const bool passthrough = held->choice.passthrough && held->choice.backing;
  return {ino, held->opens, passthrough ? KernelPassthrough::BackingId(*held->choice.backing) : 0};
}

void InheritOpenInodes(FsContext& ctx, const std::vector<InheritedInode>& inodes) {
  std::vector<int> kept;
  for (const auto& i : inodes) {
    OpenModes::Choice c;
    if (i.backing_id > 0 && ctx.passthrough) {
      c.passthrough = true;
      c.backing = ctx.passthrough->AdoptBacking(i.backing_id);
      kept.push_back(i.backing_id);
    } else {
      c.why = "open through the chunk path before a restart";
    }
    ctx.open_modes.Inherit(i.ino, i.opens, std::move(c));
  }
  if (ctx.passthrough) ctx.passthrough->CloseStaleBackings(kept);
  if (ctx.connection) ctx.connection->Admit();
}

std::pair<std::string, std::string> PassthroughState(const FsContext& ctx) {
  if (!ctx.passthrough) return {"off", "not attached"};
  static const char* kNames[] = {"pending", "on", "off"};
  return {kNames[static_cast<int>(ctx.passthrough->mode())], ctx.passthrough->reason()};
}

}  // namespace ckptfs::fuse
