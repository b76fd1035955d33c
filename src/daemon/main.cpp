// ckptfs: the daemon. Mounts SRC at MOUNTPOINT as a read-only,
// content-addressed view (DESIGN.md section 2) and keeps it in step with SRC.
//
// Order matters: everything that can fail is checked before mounting; the
// mount comes up before any indexing (so it is there within a second however
// large the tree); threads start only after fuse_daemonize, because a fork
// keeps only the thread that called it.
#include "ckptfs/fuse_ops.h"

#include <sys/sysmacros.h>
#include <sys/wait.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "ckptfs/build_info.h"
#include "cache_commands.h"
#include "daemon_log.h"
#include "fd_handover.h"
#include "pin_list.h"
#include "supervised_mount.h"
#include "query_filter.h"
#include "ckptfs/header_stamper.h"
#include "ckptfs/catalog_watcher.h"
#include "ckptfs/chunk_cache.h"
#include "ckptfs/device_memory.h"
#include "ckptfs/file_filler.h"
#include "ckptfs/control.h"
#include "ckptfs/index.h"
#include "ckptfs/mount_options.h"
#include "ckptfs/thread_pool.h"

using namespace ckptfs;

namespace {

CatalogWatcher* g_watcher_for_sighup = nullptr;  // set once, read by the signal handler

void OnSighup(int) {
  if (g_watcher_for_sighup) g_watcher_for_sighup->RequestRescan();  // an eventfd write: signal-safe
}

// libfuse splits -o on commas and unescapes a backslash before any
// character, so a source path with a comma would otherwise inject options
// (SRC=/srv/a,allow_other turning allow_other on).
std::string EscapeFuseOption(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// Raises the kernel's read-ahead for this mount (its BDI), found through
// /proc/self/mountinfo so that nothing here has to stat the mount itself.
// The kernel sets the BDI's read-ahead from the INIT reply, so this runs
// after INIT; it retries until the value sticks.
// The "major:minor" of the filesystem mounted last at `mountpoint`, from
// /proc/self/mountinfo (so that nothing here stats into the mount).
std::string MountDevice(const std::string& mountpoint) {
  std::ifstream info("/proc/self/mountinfo");
  std::string line, devno;
  while (std::getline(info, line)) {
    std::istringstream ss(line);
    std::string id, parent, dev, root, point;
    ss >> id >> parent >> dev >> root >> point;
    if (point == mountpoint) devno = dev;  // the last one is ours
  }
  return devno;
}

void SetBdiReadahead(const std::string& mountpoint, uint64_t bytes) {
  const std::string devno = MountDevice(mountpoint);
  if (devno.empty()) return;
  const std::string path = "/sys/class/bdi/" + devno + "/read_ahead_kb";
  const std::string want = std::to_string(bytes / 1024);
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      std::ofstream out(path);
      out << want;
      out.flush();
      if (!out) {
        spdlog::warn("cannot set {} to {} KiB: {}; the kernel's default read-ahead stays", path, want,
                     std::strerror(errno));
        return;
      }
    }
    std::ifstream in(path);
    std::string got;
    in >> got;
    if (got == want) {
      spdlog::debug("read-ahead of {} set to {} KiB", mountpoint, want);
      return;
    }
  }
  spdlog::warn("read-ahead of {} did not stay at {} KiB", mountpoint, want);
}

// Reads in flight per fill. Fills are CPU-bound once the source is in memory
// (read, XXH3, write): more than one per CPU only contends (measured with 2
// CPUs: depth 2 2.7 GB/s, depth 4 1.6 to 2.5 GB/s).
unsigned FillDepth(const MountOptions& o) { return o.fill_depth ? o.fill_depth : std::min(4u, EffectiveThreads(0)); }

nlohmann::json LastScanJson(const CatalogWatcher::ScanStats& s) {
  return {{"seconds", s.seconds},
          {"incremental", s.incremental},
          {"dirs_reused", s.dirs_reused},
          {"checkpoints", s.checkpoints},
          {"checkpoints_kept", s.checkpoints_kept},
          {"files_looked_up", s.files_looked_up},
          {"nodes_built", s.nodes.built},
          {"nodes_reused", s.nodes.reused}};
}

nlohmann::json StatusJson(const std::vector<CheckpointState>& states, const CatalogWatcher& watcher,
                          const MountOptions& o, const std::string& state_dir, const std::string& index_path,
                          const std::string& log_destination, const daemon::FsContext& ctx,
                          const nlohmann::json& daemon_json) {
  nlohmann::json list = nlohmann::json::array();
  size_t counts[4] = {0, 0, 0, 0};
  for (const auto& s : states) {
    ++counts[static_cast<int>(s.phase)];
    nlohmann::json j{{"path", s.path}, {"state", PhaseName(s.phase)}, {"files", s.files}, {"size", s.size}};
    if (!s.name.empty()) j["name"] = s.name;
    if (!s.reason.empty()) j["reason"] = s.reason;
    if (s.phase == CheckpointState::Phase::kIndexing) {
      j["bytes_done"] = s.bytes_done;
      j["bytes_total"] = s.bytes_total;
    }
    if (s.indexed_at) j["indexed_at"] = s.indexed_at;
    list.push_back(j);
  }
  return {{"ok", true},
          {"source", o.source},
          {"mountpoint", o.mountpoint},
          {"state_dir", state_dir},
          {"index", index_path},
          {"pid", ::getpid()},
          {"daemon", daemon_json},
          {"scans", watcher.scans_completed()},
          {"last_scan", LastScanJson(watcher.LastScan())},
          {"counts",
           {{"exposed", counts[0]}, {"indexing", counts[1]}, {"pending", counts[2]}, {"invalid", counts[3]}}},
          {"options",
           {{"rescan", o.rescan_s},
            {"settle", o.settle_s},
            {"symlinks", o.symlinks == SymlinkPolicy::kFollow ? "follow" : "contained"},
            {"threads", EffectiveThreads(o.threads)},
            {"readahead", o.readahead},
            {"allow_other", o.allow_other},
            {"stamp_headers", o.stamp_headers},
            {"passthrough", o.passthrough ? "auto" : "off"},
            {"fill", o.fill},
            {"fill_depth", FillDepth(o)},
            {"log", o.log_level},
            {"log_file", log_destination}}},
          {"passthrough", {{"mode", PassthroughState(ctx).first}, {"reason", PassthroughState(ctx).second}}},
          {"reads", {{"requests", ctx.reads.load()}, {"bytes", ctx.bytes_read.load()}, {"failed", ctx.failed_reads.load()}}},
          {"cache",
           {{"host", ctx.files->GetStats().capacity},
            {"chunks", ctx.cache->Stats().host.capacity},
            {"gpu", ctx.cache->Stats().gpu.capacity},
            {"pinned_memory", ctx.cache->Stats().host_pinned_memory && ctx.files->GetStats().locked_memory}}},
          {"checkpoints", list}};
}

// Every engine reads through this filesystem: when memory runs out, the
// kernel should kill a runaway engine first, not the filesystem under all of
// them. Lowering the score needs privilege; without it the default stays.
void LowerOomScore() {
  constexpr int kOomScoreAdj = -500;
  FILE* f = std::fopen("/proc/self/oom_score_adj", "w");
  const bool ok = f != nullptr && std::fprintf(f, "%d", kOomScoreAdj) > 0 && std::fflush(f) == 0;
  const int err = errno;
  if (f != nullptr) std::fclose(f);
  if (!ok) {
    spdlog::info("cannot lower oom_score_adj to {}: {} (it needs CAP_SYS_RESOURCE)", kOomScoreAdj, std::strerror(err));
  }
}

// Test seam (tests/security): CKPTFS_TEST_PAUSE_BEFORE_HASH=NAME:DIR makes the
// indexer, before it opens a file named NAME, create DIR/paused and wait (60 s
// at most) for DIR/resume, so a test can change the tree between the walk and
// the open at a known moment. Unset in production: then this does nothing.
std::function<void(const std::string&)> PauseBeforeHashHook() {
  const char* spec = std::getenv("CKPTFS_TEST_PAUSE_BEFORE_HASH");
  if (spec == nullptr || std::strchr(spec, ':') == nullptr) return nullptr;
  const std::string s(spec);
  const std::string name = s.substr(0, s.find(':')), dir = s.substr(s.find(':') + 1);
  return [name, dir](const std::string& path) {
    if (path.substr(path.rfind('/') + 1) != name) return;
    std::FILE* f = std::fopen((dir + "/paused").c_str(), "w");
    if (f != nullptr) std::fclose(f);
    for (int i = 0; i < 6000 && ::access((dir + "/resume").c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
}

uint64_t PhysicalMemory() {
  return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// How many CUDA devices are usable, asked in a child process: a process that
// has touched CUDA cannot use it after fork, and the daemon forks to
// daemonize after this check.
int ProbeCudaDevices() {
  if (!BuiltWithCuda()) return 0;
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(CudaDeviceCount(), 100));
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

// The host tier's size from cache_size, bounded by what the machine has.
uint64_t HostCacheBytes(const MountOptions& o) {
  const uint64_t ram = PhysicalMemory();
  uint64_t bytes = o.cache_size;
  if (bytes == 0) bytes = static_cast<uint64_t>(static_cast<double>(ram) * (o.cache_percent > 0 ? o.cache_percent : 25) / 100);
  const uint64_t ceiling = ram / 10 * 9;
  if (bytes > ceiling) {
    spdlog::warn("cache_size={} is more than this machine's memory allows; using {} bytes (90% of {})", bytes,
                 ceiling, ram);
    bytes = ceiling;
  }
  return std::max<uint64_t>(bytes / kChunkSize * kChunkSize, 4 * kChunkSize);
}

// The chunk path's share of the host cache: 1/8 of it, 16 MiB to 256 MiB
// (enough for a few readers' chunks and their read-ahead); all of it when no
// whole files are kept. The rest holds whole files.
uint64_t ChunkCacheBytes(const MountOptions& o, uint64_t host_bytes) {
  if (o.fill == "off") return host_bytes;
  constexpr uint64_t kMin = 4 * kChunkSize, kMax = 64 * kChunkSize;
  return std::min(host_bytes, std::clamp(host_bytes / 8 / kChunkSize * kChunkSize, kMin, kMax));
}

// One row per digest directory: its by-name paths and sources, from the
// checkpoint states the caller may see.
nlohmann::json LsJson(const std::vector<CheckpointState>& states, const View& view, const std::string& source) {
  const auto by_name = daemon::VisibleByName(states, view, source);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& s : states) {
    if (s.phase != CheckpointState::Phase::kExposed) continue;
    auto& row = rows[s.name];
    if (row.is_null()) {
      row = {{"name", s.name}, {"files", s.files}, {"size", s.size}, {"indexed_at", s.indexed_at},
             {"sources", nlohmann::json::array()}, {"by_name", by_name.at(s.name)}};
    }
    row["sources"].push_back(s.path);
  }
  nlohmann::json list = nlohmann::json::array();
  for (auto& [name, row] : rows) list.push_back(std::move(row));
  return {{"ok", true}, {"checkpoints", list}};
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = ParseMountOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "ckptfs: %s\n", parsed.status().message().c_str());
    return 2;
  }
  MountOptions o = std::move(*parsed);
  if (o.show_help) {
    std::fputs(MountUsage().c_str(), stdout);
    return 0;
  }
  if (o.show_version) {
    std::printf("%s\n", BuildDescription().c_str());
    return 0;
  }
  // Set when a supervisor started this process to serve its mount.
  const auto handover = daemon::FdHandover::FromEnvironment();
  const int64_t started_at = static_cast<int64_t>(std::time(nullptr));
  auto log = daemon::DaemonLog::Start(o);
  if (!log.ok()) {
    std::fprintf(stderr, "ckptfs: %s\n", log.status().message().c_str());
    return 1;
  }
  // Descriptors for every reader and control client: the soft limit of 1024
  // is a relic of select(), and running out would turn reads into EIO.
  if (auto limit = RaiseOpenFileLimit(); !limit.ok()) spdlog::warn("{}", limit.status().message());

  // Everything that can be refused is refused before mounting.
  struct stat src_st;
  if (::stat(o.source.c_str(), &src_st) != 0) {
    spdlog::critical("source {}: {}", o.source, std::strerror(errno));
    return 1;
  }
  if (!S_ISDIR(src_st.st_mode)) {
    spdlog::critical("source {}: Not a directory", o.source);
    return 1;
  }
  // A supervised daemon's mount point is already mounted, by its supervisor:
  // a stat would wait on the very connection this process is to serve.
  struct stat mnt_st;
  if (!handover && ::stat(o.mountpoint.c_str(), &mnt_st) != 0) {
    spdlog::critical("mount point {}: {}", o.mountpoint, std::strerror(errno));
    return 1;
  }
  if (!handover && !S_ISDIR(mnt_st.st_mode)) {
    spdlog::critical("mount point {}: Not a directory", o.mountpoint);
    return 1;
  }
  const std::string state_dir = o.state_dir.empty() ? DefaultStateDir() : o.state_dir;
  if (Status s = PrepareStateDir(state_dir); !s.ok()) {
    spdlog::critical("{} (choose another with -o state=DIR)", s.message());
    return 1;
  }
  const std::string real_source = RealPath(o.source);
  const std::string real_mountpoint = handover ? o.mountpoint : RealPath(o.mountpoint);
  if (real_source == real_mountpoint) {
    spdlog::critical("mount point {} is the source itself", o.mountpoint);
    return 1;
  }
  // fuse_daemonize changes to "/": from here on only canonical paths.
  if (o.fsname == o.source) o.fsname = real_source;
  o.source = real_source;
  o.mountpoint = real_mountpoint;

  // The GPU tier, decided before mounting so a bad gpu= option stops us here.
  int cuda_device = -1;
  if (!o.gpu.empty() && o.gpu != "sim") {
    const int devices = ProbeCudaDevices();
    if (o.gpu == "auto") {
      if (devices > 0) cuda_device = 0;
      else spdlog::warn("gpu=auto: no usable CUDA device ({}); going on without a GPU tier",
                        BuiltWithCuda() ? "no driver or no device" : "built without CUDA");
    } else {
      const int idx = std::atoi(o.gpu.c_str());
      if (!BuiltWithCuda()) {
        spdlog::critical("gpu={}: this ckptfs was built without CUDA", o.gpu);
        return 1;
      }
      if (idx >= devices) {
        spdlog::critical("gpu={}: no such CUDA device ({} usable); use gpu=auto to go on without one", o.gpu, devices);
        return 1;
      }
      cuda_device = idx;
    }
  }

  View view(real_source, Ownership::FromStat(src_st));
  daemon::FsContext ctx;
  ctx.view = &view;
  ctx.readahead = o.readahead;

  // No default_permissions: the kernel would judge each inode by one owner
  // and one mode, which cannot express "any source copy grants it" (DESIGN.md
  // section 2); the FUSE operations check every request's caller instead.
  std::string fuse_opts = "ro,subtype=ckptfs,fsname=" + EscapeFuseOption(o.fsname);
  if (o.allow_other) fuse_opts += ",allow_other";
  for (const auto& f : o.fuse_options) fuse_opts += "," + f;
  std::vector<std::string> fuse_argv_s = {argv[0], "-o", fuse_opts};
  if (o.debug) fuse_argv_s.push_back("-d");
  std::vector<char*> fuse_argv;
  for (auto& s : fuse_argv_s) fuse_argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());

  const fuse_lowlevel_ops ops = daemon::MakeOperations();
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &ctx);
  if (se == nullptr) {
    spdlog::critical("cannot create the FUSE session (options: {})", fuse_opts);
    return 1;
  }
  // The index is opened, and every checkpoint it knows is put in the view,
  // before mounting: a start that cannot work fails here with its cause and
  // a non-zero exit (the parent of a daemonized ckptfs exits only after
  // this), and when `mount` returns the known checkpoints are visible.
  std::vector<std::string> warnings;
  auto index = Index::Open(state_dir, &warnings);
  for (const auto& w : warnings) spdlog::warn("{}", w);
  if (!index.ok()) {
    spdlog::critical("{}", index.status().message());
    fuse_session_destroy(se);
    return 1;
  }
  if (o.supervise && !handover) {  // this process holds the mount; a child serves it
    index->reset();
    return daemon::RunSupervisor(se, o, argc, argv, **log);
  }
  if (handover && daemon::FailStartForTest()) return 1;

  CatalogWatcher::Options wo;
  wo.source = real_source;
  wo.catalog.symlinks = o.symlinks;
  wo.catalog.excluded_paths = {real_mountpoint};  // never walk into our own mount, however reached
  wo.rescan_s = o.rescan_s;
  wo.settle_s = o.settle_s;
  wo.threads = o.threads;
  wo.before_hash = PauseBeforeHashHook();
  CatalogWatcher watcher(wo, index->get(), &view, [se](const View::Changes& changes) {
    for (const auto& [parent, name] : changes.entries) {
      fuse_lowlevel_notify_inval_entry(se, parent, name.c_str(), name.size());
    }
    // Attributes cached for a day must not keep granting what SRC revoked.
    for (InodeId ino : changes.inodes) fuse_lowlevel_notify_inval_inode(se, ino, -1, 0);
  });
  watcher.ShowIndexed();

  if (handover) {  // the supervisor mounted and daemonized; serve its descriptor
    daemon::ConnectionSetup setup{handover->fuse_fd(), handover->adopted_init(), /*shared_device=*/true,
                                  [&handover](const std::vector<uint8_t>& init) { handover->SendInit(init); }};
    if (Status s = daemon::AttachConnection(ctx, se, o.passthrough, std::move(setup));
        fuse_set_signal_handlers(se) != 0 || !s.ok()) {
      spdlog::critical("cannot serve the supervisor's FUSE connection: {}", s.message());
      fuse_session_destroy(se);
      return 1;
    }
    (*log)->BeforeDaemonize();
    // The first daemon of a daemonized mount still holds its starter's
    // streams (for the errors of a failed start); not from here on.
    if (!o.foreground) daemon::DetachStandardStreams();
  } else if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    spdlog::critical("cannot mount {} at {} (is /dev/fuse there, and fusermount3 installed?)", o.source,
                     o.mountpoint);
    fuse_session_destroy(se);
    return 1;
  } else {
    (*log)->BeforeDaemonize();
    daemon::ConnectionSetup setup;
    setup.fd = fuse_session_fd(se);
    if (Status s = daemon::AttachConnection(ctx, se, o.passthrough, std::move(setup)); !s.ok()) {
      spdlog::warn("kernel passthrough off: {}", s.message());
    }
  }
  if (fuse_daemonize(o.foreground || handover) != 0) {
    spdlog::critical("cannot daemonize");
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return 1;
  }
  (*log)->AfterMount();
  // Another path to our own mount (a bind mount inside SRC) is refused by
  // its device, known only now that it is mounted.
  if (unsigned major = 0, minor = 0; std::sscanf(MountDevice(real_mountpoint).c_str(), "%u:%u", &major, &minor) == 2) {
    watcher.ExcludeDevice(makedev(major, minor));
  }

  LowerOomScore();

  // From here on threads may start, and CUDA may be touched.
  std::unique_ptr<DeviceMemory> device;
  uint64_t gpu_bytes = 0;
  if (cuda_device >= 0 || o.gpu == "sim") {
    if (o.gpu == "sim") {
      gpu_bytes = o.gpu_cache_size ? o.gpu_cache_size : 1ull << 30;
      device = MakeSimulatedDevice(gpu_bytes);
    } else if (auto d = MakeCudaDevice(cuda_device); d.ok()) {
      device = std::move(*d);
    } else {
      spdlog::error("GPU tier disabled: {}", d.status().message());
    }
    if (device) {
      if (o.gpu_cache_size) gpu_bytes = o.gpu_cache_size;
      else gpu_bytes = static_cast<uint64_t>(static_cast<double>(device->TotalBytes()) *
                                             (o.gpu_cache_percent > 0 ? o.gpu_cache_percent : 50) / 100);
      gpu_bytes = gpu_bytes / kChunkSize * kChunkSize;
      spdlog::info("GPU tier: {} bytes on {}", gpu_bytes, device->Describe());
    }
  }
  const uint64_t host_bytes = HostCacheBytes(o);
  const uint64_t chunk_bytes = ChunkCacheBytes(o, host_bytes);
  FileCache files(host_bytes - chunk_bytes);
  ChunkCache cache({.host_capacity = chunk_bytes,
                    .gpu_capacity = gpu_bytes,
                    .device = device.get(),
                    .cuda_host_memory = cuda_device >= 0 && device != nullptr});
  SourceReader reader(real_source);
  ThreadPool readahead_pool(EffectiveThreads(o.threads));
  ctx.cache = &cache;
  ctx.files = &files;
  ctx.fill = o.fill == "open"      ? daemon::FillPolicy::kOpen
             : o.fill == "wait"    ? daemon::FillPolicy::kWait
             : o.fill == "preload" ? daemon::FillPolicy::kPreload
                                   : daemon::FillPolicy::kOff;
  ctx.reader = &reader;
  ctx.readahead_pool = &readahead_pool;
  ctx.readahead_budget_chunks = std::max<uint64_t>(1, chunk_bytes / kChunkSize / 4);
  ctx.cache_chunks = chunk_bytes / kChunkSize;
  daemon::HeaderStamper stamper;
  if (o.stamp_headers) ctx.stamper = &stamper;
  daemon::FileFiller filler(ctx, FillDepth(o));
  ctx.filler = &filler;

  ctx.on_source_changed = [&watcher] { watcher.RequestRescanSoon(); };
  ctx.drop_page_cache = [se](InodeId ino) { fuse_lowlevel_notify_inval_inode(se, ino, 0, 0); };
  ctx.on_corrupt_chunk = [&](const View::Node& file, const Status& why) {
    if (Status s = (*index)->ForgetFile(file.stamp.dev, file.stamp.ino); !s.ok()) spdlog::error("{}", s.message());
    watcher.Withdraw(file.digest, why.message());
  };

  daemon::PinList pins(state_dir, real_mountpoint);
  const bool taking_over = handover && !handover->adopted_init().empty();
  if (!taking_over) pins.Clear();
  std::atomic<bool> stop_repin{false};
  std::thread repin;
  if (taking_over) repin = std::thread([&] { daemon::RestorePins(ctx, pins, stop_repin); });

  ControlServer control(ControlSocketPath(real_mountpoint, state_dir), [&](const ControlServer::Request& r) {
    const std::string cmd = r.body["cmd"];
    if (cmd == "status") {
      nlohmann::json daemon_json = handover ? handover->StatusJson() : daemon::UnsupervisedStatusJson(started_at);
      daemon_json["kernel_resend"] = daemon::KernelHasResend(ctx);
      return StatusJson(daemon::VisibleStates(watcher.States(), r), watcher, o, state_dir, (*index)->path(),
                        (*log)->destination(), ctx, daemon_json);
    }
    if (cmd == "ls") return LsJson(daemon::VisibleStates(watcher.States(), r), view, real_source);
    if (cmd == "stats") {
      return daemon::HandleStats(ctx, daemon::VisibleByName(daemon::VisibleStates(watcher.States(), r), view,
                                                             real_source));
    }
    if (cmd == "preload" || cmd == "unpin" || cmd == "evict") {
      const nlohmann::json reply = cmd == "preload" ? daemon::HandlePreload(ctx, r)
                                   : cmd == "unpin" ? daemon::HandleUnpin(ctx, r)
                                                    : daemon::HandleEvict(ctx, r);
      pins.Record(r, reply);  // a daemon that takes the mount over pins the same
      return reply;
    }
    if (cmd == "rescan") {
      if (!r.privileged) {
        return nlohmann::json{{"ok", false},
                              {"error", "rescan is for root or the mount's owner (uid " + std::to_string(::geteuid()) +
                                            "); you are uid " + std::to_string(r.peer_uid)}};
      }
      watcher.RequestRescan();
      return nlohmann::json{{"ok", true}};
    }
    if (cmd == "restart") {
      if (handover) return handover->HandleRestart(r);
      return nlohmann::json{{"ok", false},
                            {"error", "this mount has no supervisor (supervise=off): unmount and mount it again"}};
    }
    return nlohmann::json{{"ok", false}, {"error", "unknown command: " + cmd}};
  });
  if (Status s = control.Start(); !s.ok()) {
    spdlog::warn("{}; ckptfsctl cannot reach this mount", s.message());
  } else {
    view.SetRootXattr("user.ckptfs.control", control.path());
  }

  g_watcher_for_sighup = &watcher;
  struct sigaction sa {};
  sa.sa_handler = OnSighup;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGHUP, &sa, nullptr);  // after libfuse's handlers: HUP means rescan, not exit

  std::thread readahead_setter;
  ctx.on_init = [&] {
    readahead_setter = std::thread([&] { SetBdiReadahead(real_mountpoint, o.readahead); });
  };

  spdlog::info("mounted {} at {} (state {}, index {})", o.source, o.mountpoint, state_dir, (*index)->path());
  watcher.Start();

  if (handover) {
    handover->Listen(ctx);
    handover->SendReady();
  }
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  // A cloned descriptor is this process's own: at a crash the kernel fails
  // the requests read from it. Under a supervisor every request is read from
  // the shared descriptor, so the successor's resend retries them.
  fuse_loop_cfg_set_clone_fd(cfg, handover ? 0 : 1);
  fuse_loop_cfg_set_max_threads(cfg, std::max(4u, 2 * EffectiveThreads(o.threads)));
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  if (readahead_setter.joinable()) readahead_setter.join();

  // Shutdown, in the order that keeps every part's users alive: no new
  // commands, no queued read-ahead (it would call into the watcher and the
  // index), the watcher's thread stopped (an in-progress hash gives up at its
  // next chunk), and only then the mount and the index.
  spdlog::info("unmounting {}", o.mountpoint);
  g_watcher_for_sighup = nullptr;
  if (handover) handover->Stop(ctx);
  control.Stop();
  stop_repin = true;
  filler.Stop();
  if (repin.joinable()) repin.join();
  readahead_pool.Cancel();
  watcher.Stop();
  fuse_remove_signal_handlers(se);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  index->reset();  // closes SQLite, folding the WAL in
  return rc == 0 ? 0 : 1;
}
