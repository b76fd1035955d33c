// The daemon of one mount: it owns every part, in dependency order (the
// index, the view, the FUSE session, the watcher, the cache tiers and the
// source reader, the fill and read-ahead pools, the control server), starts
// them in that order and stops them in the reverse one, as LevelDB's DBImpl
// does: Shutdown() stops intake, drains background work, and only then
// unmounts and closes the index.
//
// Start order matters: everything that can fail is checked in Create(),
// before mounting; the mount comes up before any indexing (so it is there
// within a second however large the tree); threads start only after
// fuse_daemonize, because a fork keeps only the thread that called it.
#pragma once

#include <ctime>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "ckptfs/catalog_watcher.h"
#include "ckptfs/chunk_cache.h"
#include "ckptfs/command_table.h"
#include "ckptfs/control.h"
#include "ckptfs/device_memory.h"
#include "ckptfs/fair_pool.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/file_server.h"
#include "ckptfs/fuse_ops.h"
#include "ckptfs/host_tier_fill.h"
#include "ckptfs/index.h"
#include "fd_handover.h"
#include "pin_list.h"
#include "ckptfs/manifest_store.h"
#include "ckptfs/source_filesystem.h"
#include "mount_options.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/thread_pool.h"
#include "ckptfs/view.h"
#include "daemon_log.h"
#include "fuse_session.h"

namespace ckptfs::daemon {

class Daemon {
 public:
  // Refuses a start that cannot work, with its cause: a source or mount
  // point that is not a directory, an unusable state directory, a bad gpu=,
  // an index that cannot be opened. Puts every checkpoint the index knows in
  // the view, so that when `mount` returns they are visible. Mounts nothing.
  // `log` must outlive the daemon.
  // `handover`: set when a supervisor started this process to serve the
  // mount it holds (FdHandover::FromEnvironment); then the mount point is
  // not looked at (a stat would wait on the connection this process is to
  // serve).
  static Result<std::unique_ptr<Daemon>> Create(MountOptions o, DaemonLog* log, const char* argv0,
                                                std::unique_ptr<FdHandover> handover);
  ~Daemon();  // Shutdown()
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // With supervise=on and no supervisor yet, this process becomes the
  // supervisor: it mounts, and children serve (supervised_mount.h).
  bool supervising() const { return options_.supervise && !handover_; }
  // Gives the FUSE session to the supervisor and runs it; its exit status.
  int RunSupervisor(int argc, char** argv);

  // Mounts (or, under a supervisor, attaches to its connection), daemonizes
  // (unless -f), then builds the cache tiers and starts
  // every thread: fills, read-ahead, the watcher, the control server.
  Status Mount();
  // Serves FUSE requests until unmounted or signalled; false when the loop
  // ended with an error.
  bool Serve();
  // Stops intake (control commands, fills and read-ahead not yet started),
  // waits for the work in flight (each piece gives up at its next chunk),
  // stops the watcher (an in-progress walk or hash stops at the next
  // directory or chunk), unmounts, and closes the index last. Idempotent.
  void Shutdown();

  // Async-signal-safe (an eventfd write): for SIGHUP.
  void RequestRescan();

 private:
  Daemon(MountOptions o, DaemonLog* log, std::unique_ptr<FdHandover> handover)
      : options_(std::move(o)), log_(log), handover_(std::move(handover)), started_at_(std::time(nullptr)) {}

  Status CheckPaths(struct stat* source_st);
  Status OpenIndexAndView(const struct stat& source_st, const char* argv0);
  void StartWatcher();
  Status AttachToConnection();
  nlohmann::json DaemonStatusJson();
  nlohmann::json RecordPins(const ControlServer::Request& r, nlohmann::json reply);
  void StartCaches();
  FileServer::CorruptChunkReport CorruptChunkReport();
  FileServer::ChainProvenReport ChainProvenReport();
  void StartControl();
  CommandTable MakeCommands();

  // Parts in dependency order: each uses only those above it. Shutdown()
  // and the destructor take them down from the bottom up.
  MountOptions options_;  // with canonical source and mount point
  DaemonLog* log_;
  std::unique_ptr<FdHandover> handover_;  // the supervisor's link, if one started us
  const int64_t started_at_;              // seconds since the epoch
  std::string state_dir_;
  SourceFilesystem source_fs_;                // what SRC is on; decides the rescan default
  std::unique_ptr<ManifestStore> manifests_;  // manifests=DIR (a fleet's shared records), or null
  int cuda_device_ = -1;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Index> index_;
  std::unique_ptr<View> view_;
  fuse::FsContext ctx_;  // what the FUSE operations see of the parts
  std::unique_ptr<FuseSession> session_;
  std::unique_ptr<CatalogWatcher> watcher_;
  std::unique_ptr<DeviceMemory> device_;
  std::unique_ptr<FileCache> files_;
  std::unique_ptr<HostTierFill> index_fill_;  // fill_on_index: the indexer's copies into files_
  std::unique_ptr<ChunkCache> cache_;
  std::unique_ptr<SourceReader> reader_;
  std::unique_ptr<ThreadPool> readahead_pool_;
  std::unique_ptr<FairPool> proving_reads_;     // FsContext::proving_reads (verify=sha256 or auto)
  std::unique_ptr<FairPool> source_reads_;      // FsContext::source_reads
  std::unique_ptr<ProvenChunkTables> proven_;  // verify=sha256 or auto
  std::unique_ptr<FileServer> server_;         // the files' bytes, from the parts above
  std::unique_ptr<PinList> pins_;  // pinned paths, re-pinned by a daemon that takes the mount over
  std::atomic<bool> stop_repin_{false};
  std::thread repin_;
  std::unique_ptr<CommandTable> commands_;
  std::unique_ptr<ControlServer> control_;
  std::thread readahead_setter_;  // raises the BDI read-ahead after INIT
  bool shut_down_ = false;
};

}  // namespace ckptfs::daemon
