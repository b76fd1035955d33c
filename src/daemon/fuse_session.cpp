#include "fuse_session.h"

#include <utility>

#include <algorithm>

namespace ckptfs::daemon {

Result<std::unique_ptr<FuseSession>> FuseSession::Create(const MountOptions& o, const char* argv0, fuse::FsContext* ctx) {
  const std::string fuse_opts = FuseOptionString(o);
  std::unique_ptr<FuseSession> s(new FuseSession());
  s->argv_strings_ = {argv0, "-o", fuse_opts};
  if (o.debug) s->argv_strings_.push_back("-d");
  for (auto& a : s->argv_strings_) s->argv_.push_back(a.data());
  s->args_ = FUSE_ARGS_INIT(static_cast<int>(s->argv_.size()), s->argv_.data());
  const fuse_lowlevel_ops ops = fuse::MakeOperations();  // copied by libfuse
  s->se_ = fuse_session_new(&s->args_, &ops, sizeof ops, ctx);
  if (s->se_ == nullptr) return Status::Error("cannot create the FUSE session (options: " + fuse_opts + ")");
  return s;
}

FuseSession::~FuseSession() {
  if (se_ != nullptr) {
    Unmount();
    fuse_session_destroy(se_);
  }
  fuse_opt_free_args(&args_);
}

Status FuseSession::Mount(const std::string& mountpoint) {
  handlers_ = fuse_set_signal_handlers(se_) == 0;
  if (!handlers_ || fuse_session_mount(se_, mountpoint.c_str()) != 0) {
    return Status::Error("cannot mount at " + mountpoint);
  }
  mounted_ = true;
  return Status::Ok();
}

bool FuseSession::InstallSignalHandlers() {
  handlers_ = handlers_ || fuse_set_signal_handlers(se_) == 0;
  return handlers_;
}

fuse_session* FuseSession::Release() {
  if (handlers_) fuse_remove_signal_handlers(se_);
  handlers_ = false;
  mounted_ = false;
  return std::exchange(se_, nullptr);
}

int FuseSession::Loop(unsigned max_threads, bool clone_fd) {
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(cfg, clone_fd ? 1 : 0);
  fuse_loop_cfg_set_max_threads(cfg, max_threads);
  const int rc = fuse_session_loop_mt(se_, cfg);
  fuse_loop_cfg_destroy(cfg);
  return rc;
}

void FuseSession::Unmount() {
  if (handlers_) fuse_remove_signal_handlers(se_);
  handlers_ = false;
  if (mounted_) fuse_session_unmount(se_);
  mounted_ = false;
}

void FuseSession::InvalidateEntry(InodeId parent, const std::string& name) {
  fuse_lowlevel_notify_inval_entry(se_, parent, name.c_str(), name.size());
}

void FuseSession::InvalidateInode(InodeId ino, off_t offset, off_t length) {
  fuse_lowlevel_notify_inval_inode(se_, ino, offset, length);
}

}  // namespace ckptfs::daemon
