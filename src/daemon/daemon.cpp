#include "daemon.h"


#include "fleet.h"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "cache_sizing.h"
#include "ckptfs/systemd_fdstore.h"
#include "gpu_probe.h"
#include "kernel_tuning.h"
#include "mount_point_checks.h"
#include "supervised_mount.h"
#include "test_hooks.h"

namespace ckptfs::daemon {

namespace {

// FsContext::max_background: the kernel's default is 12, in one queue for
// every user, so twelve read-aheads of one user's readers made another's
// wait in the kernel, behind them, before the daemon's per-uid share
// (FsContext::source_reads) could see it.
constexpr unsigned kMaxBackground = 64;

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

Status CheckDirectory(const std::string& what, const std::string& path, struct stat* st) {
  if (::stat(path.c_str(), st) != 0) return Status::FromErrno(what + " " + path, errno);
  if (!S_ISDIR(st->st_mode)) return Status::Error(what + " " + path + ": Not a directory");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::Create(MountOptions o, DaemonLog* log, const char* argv0,
                                               std::unique_ptr<FdHandover> handover) {
  std::unique_ptr<Daemon> d(new Daemon(std::move(o), log, std::move(handover)));
  struct stat source_st;
  if (Status s = d->CheckPaths(&source_st); !s.ok()) return s;
  // The gpu= device, decided before mounting so a bad gpu= option stops us here.
  auto cuda_device = ChooseCudaDevice(d->options_);
  if (!cuda_device.ok()) return cuda_device.status();
  d->cuda_device_ = *cuda_device;
  if (d->options_.shmem_huge_advise) {
    // Before the first copy is made: SealedCopy reads the policy once.
    auto tuned = AskForShmemHugePages();
    if (!tuned.ok()) spdlog::warn("{}", tuned.status().message());
    else if (!tuned->empty()) spdlog::info("{}", *tuned);
  }
  if (Status s = d->OpenIndexAndView(source_st, argv0); !s.ok()) return s;
  // The supervisor only holds the mount: its children watch and serve.
  if (d->supervising()) return d;
  if (d->handover_ && FailStartForTest()) return Status::Error("failing this start for a test (CKPTFS_TEST_FAIL_START)");
  d->StartWatcher();
  return d;
}

int Daemon::RunSupervisor(int argc, char** argv) {
  index_.reset();
  return daemon::RunSupervisor(session_->Release(), options_, argc, argv, *log_);
}

// Everything about the paths that can be refused is refused before
// mounting; from here on only canonical paths (fuse_daemonize changes to "/").
Status Daemon::CheckPaths(struct stat* source_st) {
  MountOptions& o = options_;
  if (Status s = CheckDirectory("source", o.source, source_st); !s.ok()) return s;
  // A supervised daemon's mount point is mounted already, by its supervisor,
  // and so is a supervisor's that systemd restarts with the stored
  // connection: a stat would wait on the very connection it is to serve.
  const bool mounted_already = handover_ || supervisor::StoredConnectionWaiting();
  struct stat mount_st;
  if (!mounted_already) {
    if (Status s = CheckDirectory("mount point", o.mountpoint, &mount_st); !s.ok()) return s;
  }
  state_dir_ = o.state_dir.empty() ? DefaultStateDir() : o.state_dir;
  if (Status s = PrepareStateDir(state_dir_); !s.ok()) {
    return Status::Error(s.message() + " (choose another with -o state=DIR)");
  }
  const std::string real_source = RealPath(o.source);
  const std::string real_mountpoint = mounted_already ? o.mountpoint : RealPath(o.mountpoint);
  if (real_source == real_mountpoint) return Status::Error("mount point " + o.mountpoint + " is the source itself");
  if (!mounted_already) {
    if (Status s = CheckSourceOutsideMount(o.source, real_source, real_mountpoint); !s.ok()) return s;
    if (Status s = CheckNoCkptfsMountAt(real_mountpoint); !s.ok()) return s;
  }
  std::vector<std::string> warnings;
  auto manifests = OpenManifestStore(o, &warnings);
  for (const auto& w : warnings) spdlog::warn("{}", w);
  if (!manifests.ok()) return manifests.status();
  manifests_ = std::move(*manifests);
  source_fs_ = DetectSourceFilesystem(real_source);
  if (std::string note = AdaptRescanToFilesystem(source_fs_, o); !note.empty()) spdlog::info("{}", note);
  if (o.verify == Verify::kAuto && !source_fs_.inotify_complete) {
    // auto answers the node's local users; a file server is another party.
    spdlog::warn("SRC is on {}, whose server can change bytes behind an intact stamp; verify=auto checks root's "
                 "copies against their XXH3-128s only: mount with verify=sha256 if that server is not trusted",
                 source_fs_.type);
  }
  if (o.fsname == o.source) o.fsname = real_source;
  o.source = real_source;
  o.mountpoint = real_mountpoint;
  return Status::Ok();
}

// The index is opened, and every checkpoint it knows is put in the view,
// before mounting: a start that cannot work fails here with its cause and a
// non-zero exit (the parent of a daemonized ckptfs exits only after this).
Status Daemon::OpenIndexAndView(const struct stat& source_st, const char* argv0) {
  view_ = std::make_unique<View>(options_.source, Ownership::FromStat(source_st), options_.trusted_writers,
                                 FileStamp::FromStat(source_st).dev);
  ctx_.view = view_.get();
  ctx_.readahead = options_.readahead;
  ctx_.max_background = kMaxBackground;
  ctx_.entry_reply_delay = EntryReplyDelayForTest();
  auto session = FuseSession::Create(options_, argv0, &ctx_);
  if (!session.ok()) return session.status();
  session_ = std::move(*session);
  std::vector<std::string> warnings;
  auto index = Index::Open(state_dir_, &warnings);
  for (const auto& w : warnings) spdlog::warn("{}", w);
  if (!index.ok()) return index.status();
  index_ = std::move(*index);
  return Status::Ok();
}

void Daemon::StartWatcher() {
  CatalogWatcher::Options wo;
  wo.source = options_.source;
  wo.catalog.symlinks = options_.symlinks;
  wo.catalog.excluded_paths = {options_.mountpoint};  // never walk into our own mount, however reached
  wo.rescan_s = options_.rescan_s;
  wo.settle_s = options_.settle_s;
  wo.threads = options_.threads;
  wo.max_watches = options_.max_watches;
  wo.before_hash = PauseBeforeHashHook(&stopping_);
  wo.before_publish = HoldPublishHook(&stopping_);
  wo.manifests = manifests_.get();
  FuseSession* se = session_.get();
  watcher_ = std::make_unique<CatalogWatcher>(wo, index_.get(), view_.get(), [se](const View::Changes& changes) {
    for (const auto& [parent, name] : changes.entries) se->InvalidateEntry(parent, name);
    // Attributes cached for a day must not keep granting what SRC revoked.
    for (InodeId ino : changes.inodes) se->InvalidateInode(ino, -1, 0);
  });
  watcher_->ShowIndexed();
}

Status Daemon::Mount() {
  if (handover_) {
    if (Status s = AttachToConnection(); !s.ok()) return s;
  } else {
    if (!session_->Mount(options_.mountpoint).ok()) {
      return Status::Error("cannot mount " + options_.source + " at " + options_.mountpoint +
                           " (is /dev/fuse there, and fusermount3 installed?)");
    }
    log_->BeforeDaemonize();
    fuse::ConnectionSetup setup;
    setup.fd = fuse_session_fd(session_->get());
    if (Status s = fuse::AttachConnection(ctx_, session_->get(), options_.passthrough, std::move(setup)); !s.ok()) {
      spdlog::warn("kernel passthrough off: {}", s.message());
    }
  }
  // The supervisor mounted and daemonized already.
  if (fuse_daemonize(options_.foreground || handover_ != nullptr) != 0) return Status::Error("cannot daemonize");
  log_->AfterMount();
  // Another path to our own mount (a bind mount inside SRC) is refused by
  // its device, known only now that it is mounted.
  if (auto dev = MountDeviceNumber(options_.mountpoint)) watcher_->ExcludeDevice(*dev);
  LowerOomScore();

  // From here on threads may start, and CUDA may be touched.
  StartCaches();
  watcher_->SetCopies(index_fill_.get());
  StartControl();
  // One that takes the mount over gets no INIT, where the limit of
  // background requests is asked for: raise it where it is still lower (a
  // mount started by a daemon from before the limit).
  if (handover_ && !handover_->adopted_init().empty()) {
    auto raised = RaiseBackgroundLimit(options_.mountpoint, kMaxBackground);
    if (!raised.ok()) {
      spdlog::info("cannot check the FUSE connection's limit of background requests: {}", raised.status().message());
    } else if (!raised->empty()) {
      spdlog::info("FUSE connection's background requests raised ({})", *raised);
    }
  }
  ctx_.on_init = [this] {
    readahead_setter_ = std::thread([this] { SetBdiReadahead(options_.mountpoint, options_.readahead, stopping_); });
  };
  spdlog::info("mounted {} at {} (state {}, index {})", options_.source, options_.mountpoint, state_dir_,
               index_->path());
  watcher_->Start();
  if (handover_) {
    handover_->Listen(ctx_);
    handover_->SendReady();
  }
  return Status::Ok();
}

// Serves the supervisor's /dev/fuse descriptor: as its first daemon, or
// taking over from one that died or is handing over (then with the
// connection's INIT request, replayed to libfuse).
Status Daemon::AttachToConnection() {
  FdHandover* handover = handover_.get();
  fuse::ConnectionSetup setup{handover->fuse_fd(), handover->adopted_init(), /*shared_device=*/true,
                        handover->TakeChannels(),
                        [handover](const std::vector<uint8_t>& init) { handover->SendInit(init); }};
  Status s = fuse::AttachConnection(ctx_, session_->get(), options_.passthrough, std::move(setup));
  if (!session_->InstallSignalHandlers() || !s.ok()) {
    return Status::Error("cannot serve the supervisor's FUSE connection: " + s.message());
  }
  log_->BeforeDaemonize();
  // The first daemon of a daemonized mount still holds its starter's streams
  // (for the errors of a failed start); not from here on.
  if (!options_.foreground) DetachStandardStreams();
  return Status::Ok();
}

void Daemon::StartCaches() {
  const MountOptions& o = options_;
  device_ = OpenDevice(o, cuda_device_);
  const uint64_t host_bytes = HostCacheBytes(o);
  const uint64_t chunk_bytes = ChunkCacheBytes(o, host_bytes);
  // With gpu=, pinned whole files are registered with its device for DMA.
  const uint64_t descriptors = DescriptorBudget(o);
  spdlog::info("host tier: {} bytes for whole files, at most {} of them in memfds (RLIMIT_NOFILE and "
               "vm.max_map_count allow; files up to {} bytes are held in memory)",
               host_bytes - chunk_bytes, descriptors, SealedCopy::kMemoryCopyMax);
  files_ = std::make_unique<FileCache>(host_bytes - chunk_bytes, device_.get(), descriptors);
  std::string no_reserve;
  if (const uint64_t reserve = PageReserveBytes(o, host_bytes - chunk_bytes, &no_reserve); reserve > 0) {
    auto made = PageReserve::Create(reserve);
    if (made.ok()) {
      files_->KeepPageReserve(std::move(*made),
                              ReserveAtOnceForTest() ? PageReserve::Pace::AtOnce() : PageReserve::Pace::Background());
      spdlog::info(
          "host tier: a page reserve of up to {} bytes in 2 MiB pages, taken in the background, for the copies "
          "fills make (this VM reports free memory to its host: fresh 2 MiB pages are slow here)",
          reserve);
    } else {
      spdlog::warn("host tier: no page reserve: {}", made.status().message());
    }
  } else if (o.page_reserve_bytes > 0) {
    spdlog::warn("host tier: page_reserve={} is not used: {}", o.page_reserve_bytes, no_reserve);
  } else {
    spdlog::debug("host tier: no page reserve: {}", no_reserve);
  }
  cache_ = std::make_unique<ChunkCache>(ChunkCache::Options{.capacity = chunk_bytes, .below = files_.get()});
  // On a network or FUSE source a kept descriptor's fstat may answer from
  // cached attributes; there every read opens its file (close-to-open).
  reader_ = std::make_unique<SourceReader>(o.source, source_fs_.inotify_complete ? SourceReader::kKeptOpen : 0);
  readahead_pool_ = std::make_unique<ThreadPool>(EffectiveThreads(o.threads));
  if (o.verify != Verify::kXxh3) {
    // 32 bytes a 4 MiB chunk: 2^20 chunks (4 TiB of files) in 32 MiB.
    constexpr uint64_t kProvenChunks = uint64_t{1} << 20;
    proven_ = std::make_unique<ProvenChunkTables>(kProvenChunks);
  }
  FileServer::Options serving;
  serving.fill = o.fill;
  serving.verify = o.verify;
  serving.stamp_headers = o.stamp_headers;
  serving.fill_depth = FillDepth(o);
  serving.fill_io = o.fill_io;
  serving.readahead_budget_chunks = std::max<uint64_t>(1, chunk_bytes / kChunkSize / 4);
  serving.cache_chunks = chunk_bytes / kChunkSize;
  serving.max_waiting_opens = std::max(1u, FuseLoopThreads(o) / 2);
  server_ = std::make_unique<FileServer>(
      FileServer::Parts{view_.get(), cache_.get(), files_.get(), reader_.get(), readahead_pool_.get(), proven_.get()},
      serving,
      FileServer::Reports{[this] { watcher_->RequestRescanSoon(); }, CorruptChunkReport(), ChainProvenReport()});
  ctx_.server = server_.get();
  ctx_.background = readahead_pool_.get();
  if (o.verify != Verify::kXxh3) {
    // As many as may wait for copies at open, half the FUSE threads' worth,
    // and at least two: each uid may hold half of them, so that another
    // user's proof always finds one.
    const unsigned proving = std::max(2u, serving.max_waiting_opens);
    proving_reads_ = std::make_unique<FairPool>(proving, proving / 2);
    ctx_.proving_reads = proving_reads_.get();
  }
  {
    // Twice the FUSE threads, as many for one uid: a reader alone reads the
    // source at the depth the FUSE threads gave it, and another user's
    // reads always find as many threads free.
    const unsigned fuse_threads = FuseLoopThreads(o);
    source_reads_ = std::make_unique<FairPool>(2 * fuse_threads, fuse_threads);
    ctx_.source_reads = source_reads_.get();
  }
  // Copies made as files are hashed: into free room only, and none with
  // fill=off (the tier then holds chunks only).
  const auto fill_on_index = o.fill == FillPolicy::kOff ? HostTierFill::Policy::kOff : o.fill_on_index;
  index_fill_ = std::make_unique<HostTierFill>(files_.get(), fill_on_index, o.stamp_headers);
  ctx_.drop_page_cache = [this](InodeId ino) { session_->InvalidateInode(ino, 0, 0); };
}

// What a chunk that does not match the index leads to. On a FUSE worker, which must not wait for the index nor the view (both
// busy while a scan publishes): the digest is withdrawn at once, and held
// out of the view, and the rest is posted to the watcher's thread. There
// the index forgets the copy, and only then is the digest let back and
// the rescan that hashes the copy again asked for (a scan before would
// find the file known and show the digest again). Should kMaxPosted
// reports wait already, this worker does its own: a flood of damaged
// files slows its readers down, and loses no report.
FileServer::CorruptChunkReport Daemon::CorruptChunkReport() {
  return [this](const View::Node& file, const SourceCopy& copy, const Status& why, bool withdraw) {
    if (withdraw) watcher_->Withdraw(file.digest, why.message());
    auto forget = [this, copy, withdraw, digest = file.digest] {
      if (Status s = index_->ForgetFile(copy.stamp.dev, copy.stamp.ino); !s.ok()) spdlog::error("{}", s.message());
      watcher_->ForgetHashed(copy.stamp.dev, copy.stamp.ino);
      DistrustRecordOf(manifests_.get(), options_.source, copy);
      // The copy gets the digest of what it holds now.
      if (withdraw) {
        watcher_->EndWithdrawal(digest);
      } else {
        watcher_->RequestRescanSoon();
      }
    };
    if (!watcher_->Post(forget)) forget();
  };
}

// A chain a pass over the whole file proved goes into the index rows of
// the file's copies, on the watcher's thread (a reader's thread does not
// write the index). One that finds that queue full is dropped: the file is
// proven again after the next restart, as it was before.
FileServer::ChainProvenReport Daemon::ChainProvenReport() {
  return [this](const View::Node& file, std::shared_ptr<const ChunkChain> chain) {
    std::vector<FileStamp> stamps;
    for (const SourceCopy& copy : file.copies) stamps.push_back(copy.stamp);
    if (stamps.empty()) stamps.push_back(file.stamp);
    (void)watcher_->Post([this, stamps = std::move(stamps), sha256 = file.sha256, chain = std::move(chain)] {
      for (const FileStamp& stamp : stamps) {
        if (Status s = index_->AddChain(stamp, sha256, *chain); !s.ok()) spdlog::warn("{}", s.message());
      }
    });
  };
}

void Daemon::StartControl() {
  // What was pinned is pinned again by a daemon that takes the mount over; a
  // new mount starts with nothing pinned.
  pins_ = std::make_unique<PinList>(state_dir_, options_.mountpoint);
  const bool taking_over = handover_ && !handover_->adopted_init().empty();
  if (taking_over) repin_ = std::thread([this] { RestorePins(ctx_, *pins_, stop_repin_); });
  commands_ = std::make_unique<CommandTable>(MakeCommands());
  control_ = std::make_unique<ControlServer>(ControlSocketPath(options_.mountpoint, state_dir_), commands_->AsHandler());
  if (Status s = control_->Start(/*take_over=*/taking_over); !s.ok()) {
    // The pin list is left alone too: it may be that other daemon's.
    spdlog::warn("{}; ckptfsctl cannot reach this mount", s.message());
    return;
  }
  if (!taking_over) pins_->Clear();
  view_->SetRootXattr("user.ckptfs.control", control_->path());
}

// A descriptor libfuse clones is this process's own: at a crash the kernel
// fails the requests read from it. Under a supervisor the threads read from
// the channels the supervisor made and holds (fuse_channels.h), so the
// successor's resend retries them.
bool Daemon::Serve() { return session_->Loop(FuseLoopThreads(options_), /*clone_fd=*/!handover_) == 0; }

void Daemon::RequestRescan() {
  if (watcher_) watcher_->RequestRescan();
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (control_) spdlog::info("unmounting {}", options_.mountpoint);
  stopping_ = true;
  if (readahead_setter_.joinable()) readahead_setter_.join();
  // A drained daemon answers the reads the loop handed to the proving and
  // source pools first, as the loop's own handlers were before it returned (a kernel
  // without FUSE_NOTIFY_RESEND would never send them to the successor, and
  // stopping the fills would fail them). Unmounted, nobody waits for them:
  // they are dropped below, with the fills they wait for.
  if (handover_ && handover_->drained()) {
    ctx_.proving_reads = nullptr;
    ctx_.source_reads = nullptr;
    proving_reads_.reset();  // finishes what is queued, then joins
    source_reads_.reset();
  }
  // Intake first: no new commands, fills or read-ahead. Queued read-ahead is
  // dropped, not run: it would call into the watcher and the index.
  if (handover_) handover_->Stop(ctx_);  // a drained daemon hands its open inodes over
  if (control_) control_->Stop();
  stop_repin_ = true;
  if (server_) server_->StopFills();
  if (proving_reads_) proving_reads_->Cancel();  // the proofs under way stop with the fills
  if (source_reads_) source_reads_->Cancel();
  if (repin_.joinable()) repin_.join();
  if (readahead_pool_) readahead_pool_->Cancel();
  // The watcher's thread: an in-progress walk or hash stops at its next step.
  if (watcher_) watcher_->Stop();
  // Only then the mount, and the index last (closing SQLite folds the WAL in).
  session_.reset();
  index_.reset();
}

Daemon::~Daemon() { Shutdown(); }

}  // namespace ckptfs::daemon
