#include "ckptfs/catalog_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include <spdlog/spdlog.h>

#include "ckptfs/indexer.h"
#include "ckptfs/mutex.h"
#include "ckptfs/scan_planner.h"

namespace ckptfs {

namespace {

constexpr uint32_t kWatchMask = IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO |
                                IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;
// Directories watched at most when fs.inotify.max_user_watches cannot be
// read: half the kernel's old default.
constexpr size_t kDefaultWatchBudget = 4096;
// Events arrive in bursts (a copy writes many files); wait this long after
// one before rescanning, so a burst costs one walk. A directory renamed into
// the tree is no burst (a trainer's finished .tmp-step-N/ renamed to
// step-N/): it is walked at once, since the arrival's time to loaded is
// what such a writer waits on (still no more often than one walk per
// kDebounceS).
constexpr double kDebounceS = 0.3;
// Indexed checkpoints are shown at most this often (each publish rebuilds
// the view), and always once the last has been indexed.
constexpr double kPublishEveryS = 0.25;

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t WallNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// "5s", "0.5s": as an operator writes the option, not std::to_string's "5.000000".
std::string SecondsText(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gs", seconds);
  return buf;
}

// A sub-scan holding only some of a scan's checkpoints.
CatalogScan Only(const CatalogScan& scan, const std::vector<const CheckpointSource*>& keep) {
  CatalogScan out;
  out.root = scan.root;
  out.real_root = scan.real_root;
  for (const auto* cp : keep) out.checkpoints.push_back(*cp);
  return out;
}

ExposedCheckpoint ToExposed(const CheckpointSource& src, const IndexedCheckpoint& indexed, Index& index) {
  ExposedCheckpoint e;
  e.rel_path = src.rel_path;
  e.abs_path = src.abs_path;
  e.name = indexed.name;
  e.total_size = indexed.total_size;
  e.indexed_at = index.CheckpointIndexedAt(indexed.name).value_or(WallNanos() / 1'000'000'000);
  e.dir_access = src.dir_access;
  e.subdirs = src.subdirs;
  for (const auto& f : indexed.files) {
    e.files.push_back({f.member.rel_path, f.member.open_path, f.member.stamp, f.hashes.sha256,
                       std::make_shared<const std::vector<ChunkHash>>(f.hashes.chunks), f.stamped_size, f.member.owner,
                       f.member.access,
                       f.hashes.chain ? std::make_shared<const ChunkChain>(*f.hashes.chain) : nullptr});
  }
  e.inputs = View::InputsOf(e);
  return e;
}

CheckpointState StateOf(const CheckpointSource& cp, CheckpointState::Phase phase, std::string reason = "") {
  CheckpointState st;
  st.path = cp.abs_path;
  st.access = cp.dir_access;
  st.phase = phase;
  st.reason = std::move(reason);
  st.files = cp.members.size();
  st.size = cp.TotalSize();
  return st;
}

CheckpointState ExposedState(const CheckpointSource& cp, const ExposedCheckpoint& e) {
  CheckpointState st = StateOf(cp, CheckpointState::Phase::kExposed);
  st.name = e.name;
  st.files = e.files.size();
  st.size = e.total_size;
  st.indexed_at = e.indexed_at;
  return st;
}

}  // namespace

const char* PhaseName(CheckpointState::Phase phase) {
  switch (phase) {
    case CheckpointState::Phase::kExposed: return "exposed";
    case CheckpointState::Phase::kIndexing: return "indexing";
    case CheckpointState::Phase::kPending: return "pending";
    case CheckpointState::Phase::kInvalid: return "invalid";
  }
  return "?";
}

// The descriptors exist from construction on: RequestRescan (from a control
// command or SIGHUP) may come before Start(), and the first scan, run by
// ShowIndexed() before mounting, already adds its inotify watches.
CatalogWatcher::CatalogWatcher(Options options, Index* index, View* view, ChangeCallback on_change)
    : options_(std::move(options)), index_(index), view_(view), on_change_(std::move(on_change)) {
  options_.catalog.cancel = &stop_;  // Stop() cuts a walk short at its next directory
  inotify_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_.valid()) {
    spdlog::warn("inotify unavailable ({}); changes under {} are seen by the periodic rescan only",
                 std::strerror(errno), options_.source);
  }
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  watch_budget_ = options_.max_watches;
  if (watch_budget_ == 0) {
    std::ifstream limit("/proc/sys/fs/inotify/max_user_watches");
    uint64_t n = 0;
    watch_budget_ = (limit >> n) && n >= 2 ? static_cast<size_t>(n / 2) : kDefaultWatchBudget;
  }
}

CatalogWatcher::~CatalogWatcher() { Stop(); }

void CatalogWatcher::ShowIndexed() {
  ScanOnce(Triggers(), /*index_unknown=*/false);
  ++scans_;
}

void CatalogWatcher::Start() {
  scheduler_ = std::make_unique<IndexScheduler>(index_, options_.threads);
  thread_ = std::thread([this] { Run(); });
}

// The scanning thread first, then the indexer's workers: a hash in progress
// stops at its next chunk, and nothing more is shown.
void CatalogWatcher::Stop() {
  stop_ = true;
  if (thread_.joinable()) {
    Wake();
    thread_.join();
  }
  if (scheduler_) scheduler_->Stop();
}

void CatalogWatcher::Wake() {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full with one write; nothing else to do.
  }
}

void CatalogWatcher::RequestRescan() {
  rescan_requested_ = true;
  Wake();
}

void CatalogWatcher::RequestRescanSoon() {
  soon_requested_ = true;
  Wake();
}

void CatalogWatcher::Withdraw(const std::string& name, const std::string& reason) {
  {
    MutexLock lock(requests_mu_);
    withdrawals_[name] = reason;
    HeldOut& held = held_out_[name];
    held.reason = reason;
    ++held.withdrawals;
  }
  Wake();
}

void CatalogWatcher::EndWithdrawal(const std::string& name) {
  {
    MutexLock lock(requests_mu_);
    auto it = held_out_.find(name);
    if (it != held_out_.end() && --it->second.withdrawals <= 0) held_out_.erase(it);
  }
  RequestRescan();
}

void CatalogWatcher::ForgetHashed(uint64_t dev, uint64_t ino) {
  if (scheduler_) scheduler_->ForgetRecent(dev, ino);
}

bool CatalogWatcher::Post(std::function<void()> task) {
  {
    MutexLock lock(requests_mu_);
    if (posted_.size() >= kMaxPosted) return false;
    posted_.push_back(std::move(task));
  }
  Wake();
  return true;
}

void CatalogWatcher::RunPosted() {
  std::deque<std::function<void()>> tasks;
  {
    MutexLock lock(requests_mu_);
    tasks.swap(posted_);
  }
  for (auto& task : tasks) task();
}

bool CatalogWatcher::scan_pending() const {
  if (busy_ || deadline_pending_ || rescan_requested_ || soon_requested_) return true;
  {
    MutexLock lock(requests_mu_);
    if (!withdrawals_.empty() || !posted_.empty()) return true;
  }
  MutexLock lock(mu_);
  return publish_deferred_ || retry_at_ > 0;
}

bool CatalogWatcher::WithdrawalsWaiting() const {
  MutexLock lock(requests_mu_);
  return !withdrawals_.empty();
}

void CatalogWatcher::Run() {
  double next_periodic = std::numeric_limits<double>::infinity();
  double next_debounced = std::numeric_limits<double>::infinity();
  double last_scan_end = -std::numeric_limits<double>::infinity();
  constexpr double kReadTriggeredEveryS = 1.0;
  bool read_triggered = false;
  while (!stop_) {
    busy_ = true;  // before the requests are taken: scan_pending() never reads all false between
    const double now = MonotonicSeconds();
    if (soon_requested_.exchange(false)) {
      read_triggered = true;
      next_debounced = std::min(next_debounced, std::max(now + kDebounceS, last_scan_end + kReadTriggeredEveryS));
    }
    RunPosted();  // before the scan a report's withdrawal asks for
    const bool withdrew = ApplyWithdrawals();
    PublishIfDue();
    if (const double retry = TakeRetryRequest(); retry > 0) {
      next_settle_deadline_ = next_settle_deadline_ > 0 ? std::min(next_settle_deadline_, retry) : retry;
    }
    const bool asked = rescan_requested_.exchange(false);
    const bool periodic = now >= next_periodic;
    if (asked || periodic || now >= next_debounced || (next_settle_deadline_ > 0 && now >= next_settle_deadline_)) {
      // A rescan asked for (SIGHUP, ckptfsctl rescan, a read that found a
      // source changed, a withdrawal) or the periodic one walks everything
      // (see NeedsFullWalk).
      WalkTriggers why = Triggers();
      why.asked = asked || withdrew;
      why.periodic = periodic;
      why.read_triggered = read_triggered;
      read_triggered = false;
      next_debounced = std::numeric_limits<double>::infinity();
      next_settle_deadline_ = 0;
      ScanOnce(why);
      ++scans_;
      if (std::exchange(followup_scan_, false)) next_debounced = MonotonicSeconds() + kDebounceS;
      last_scan_end = MonotonicSeconds();
      next_periodic = options_.rescan_s > 0 ? MonotonicSeconds() + options_.rescan_s
                                            : std::numeric_limits<double>::infinity();
      continue;
    }
    double until = std::min({next_periodic, next_debounced, NextPublishDue()});
    if (next_settle_deadline_ > 0) until = std::min(until, next_settle_deadline_);
    deadline_pending_ = !std::isinf(next_debounced) || next_settle_deadline_ > 0;
    busy_ = false;
    const double wait_s = until - now;
    const int timeout_ms =
        std::isinf(wait_s) ? -1 : static_cast<int>(std::clamp(wait_s * 1000 + 1, 0.0, double{INT_MAX}));
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {inotify_.valid() ? inotify_.get() : -1, POLLIN, 0}};
    ::poll(fds, 2, timeout_ms);
    busy_ = true;  // what woke it (a request, an inotify event) is pending from here on
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      if (::read(wake_.get(), &v, sizeof v) < 0) {
      }
    }
    if (fds[1].revents & POLLIN) {
      const Drained drained = DrainInotify();
      if (drained != Drained::kNothing) {
        // An arrival as soon as the last walk is kDebounceS behind: a
        // writer renaming directories in a loop gets no more walks than a
        // burst of writes would.
        const double t = MonotonicSeconds();
        const double at = drained == Drained::kArrival ? std::max(t, last_scan_end + kDebounceS) : t + kDebounceS;
        next_debounced = std::min(next_debounced, at);
      }
    }
  }
  // What was posted still runs (a damaged file's index row is forgotten
  // before the daemon exits, or its successor would show it again).
  RunPosted();
}

CatalogWatcher::Drained CatalogWatcher::DrainInotify() {
  alignas(inotify_event) char buf[16384];
  Drained drained = Drained::kNothing;
  for (;;) {
    ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      NoteDirty(*ev);
      if (ev->mask & IN_IGNORED) {
        ForgetWatch(ev->wd);
        file_watches_.erase(ev->wd);
      }
      const bool arrival = (ev->mask & IN_MOVED_TO) && (ev->mask & IN_ISDIR);
      if (arrival) {
        drained = Drained::kArrival;
      } else if (drained == Drained::kNothing) {
        drained = Drained::kChange;
      }
      p += sizeof(inotify_event) + ev->len;
    }
  }
  return drained;
}

// The directory an event happened in is dirty, and so is a subdirectory it
// names (created, removed, moved or chmod'ed); an event from an unknown
// watch, or a lost queue, leaves nothing to trust but a full walk.
void CatalogWatcher::NoteDirty(const inotify_event& ev) {
  if (auto f = file_watches_.find(ev.wd); f != file_watches_.end() && !(ev.mask & IN_Q_OVERFLOW)) {
    dirty_dirs_.insert(f->second.begin(), f->second.end());
    return;
  }
  // The end of a watch the daemon removed itself (a file that no longer
  // has other links): nothing changed.
  if ((ev.mask & IN_IGNORED) && ev.wd != -1 && !watches_.count(ev.wd)) return;
  auto w = watches_.find(ev.wd);
  if ((ev.mask & IN_Q_OVERFLOW) || w == watches_.end()) {
    full_walk_needed_ = true;
    return;
  }
  const std::string& root = watched_root_;
  for (const std::string& path : w->second) {
    std::string rel;
    if (path != root) {
      if (path.compare(0, root.size() + 1, root + "/") != 0) {
        full_walk_needed_ = true;
        return;
      }
      rel = path.substr(root.size() + 1);
    }
    if (ev.len > 0 && (ev.mask & IN_ISDIR)) dirty_dirs_.insert(rel.empty() ? ev.name : rel + "/" + ev.name);
    dirty_dirs_.insert(std::move(rel));
  }
}

// Directories in the order their watches matter: those whose changes
// change what is served or who may reach it (CatalogScan::serving_dirs)
// first, then the others (where a checkpoint may yet arrive). Within each
// kind, the owners of the directories take turns, each owner's shallowest
// first: a SRC writer who makes a million empty directories, or a thousand
// tiny checkpoints, takes only its own turns, never those of the directories
// that keep another user's revocation immediate, nor every watch the
// daemon's user has. Only the first watch_budget_ are watched; watches of
// directories gone from SRC, or pushed past the budget, are removed.
void CatalogWatcher::UpdateWatches(const CatalogScan& scan) {
  if (!inotify_.valid()) return;
  watched_root_ = scan.root;
  struct Ranked {
    bool other = false;  // not a serving directory
    size_t turn = 0;     // its place among its owner's directories of its kind
    long depth = 0;
    const std::string* rel = nullptr;
  };
  std::map<std::pair<bool, uid_t>, std::vector<Ranked>> by_owner;
  auto rank = [&](const std::string& rel, uid_t owner) {
    const bool other = scan.serving_dirs.count(rel) == 0;
    const long depth = rel.empty() ? 0 : 1 + std::count(rel.begin(), rel.end(), '/');
    by_owner[{other, owner}].push_back(Ranked{other, 0, depth, &rel});
  };
  for (const auto& [rel, access] : scan.dirs) rank(rel, access.self.uid);
  // Serving directories the walk did not read: those that members' links
  // lead into under a hidden name (.blobs/): a chmod there changes who may
  // read the member as much as one in a directory walked.
  for (const std::string& rel : scan.serving_dirs) {
    struct stat st;
    if (scan.dirs.count(rel) == 0 && ::stat((scan.root + "/" + rel).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      rank(rel, st.st_uid);
    }
  }
  std::vector<Ranked> order;
  for (auto& [key, dirs] : by_owner) {
    std::stable_sort(dirs.begin(), dirs.end(), [](const Ranked& a, const Ranked& b) { return a.depth < b.depth; });
    for (size_t i = 0; i < dirs.size(); ++i) dirs[i].turn = i;
    order.insert(order.end(), dirs.begin(), dirs.end());
  }
  std::sort(order.begin(), order.end(), [](const Ranked& a, const Ranked& b) {
    return std::tie(a.other, a.turn, a.depth, *a.rel) < std::tie(b.other, b.turn, b.depth, *b.rel);
  });
  watchable_dirs_ = order.size();
  if (order.size() > watch_budget_) {
    if (!std::exchange(watch_budget_logged_, true)) {
      spdlog::warn("{} has {} directories, more than the {} watched (max_watches=): changes in the others ({}) are "
                   "seen by the periodic rescan only",
                   scan.root, order.size(), watch_budget_,
                   order[watch_budget_].other ? "none inside or above a checkpoint"
                                              : "some of them inside or above a checkpoint");
    }
    order.resize(watch_budget_);
  }
  auto path_of = [&](const std::string& rel) { return rel.empty() ? scan.root : scan.root + "/" + rel; };
  std::set<std::string> wanted;
  for (const Ranked& r : order) wanted.insert(path_of(*r.rel));
  for (auto it = watch_of_.begin(); it != watch_of_.end();) {
    const auto [path, wd] = *it++;
    if (!wanted.count(path)) Unlabel(wd, path);  // gone from SRC, or past the budget
  }
  for (const Ranked& r : order) {
    const std::string& rel = *r.rel;
    const std::string path = path_of(rel);
    // A path the walk took from the previous tree names the directory it
    // watched then. One it read again may name another now (a directory
    // renamed into its place, the old one renamed aside): the kernel says
    // which, by the watch it gives. Hidden ones are never read: always ask.
    auto known = watch_of_.find(path);
    if (known != watch_of_.end() && scan.dirs.count(rel) != 0 && !scan.Walked(rel)) continue;
    const int wd = ::inotify_add_watch(inotify_.get(), path.c_str(), kWatchMask);
    if (known != watch_of_.end() && known->second == wd) continue;
    if (known != watch_of_.end()) Unlabel(known->second, path);  // it names another directory now, or none
    if (wd < 0) {
      if (errno == ENOSPC && !watch_limit_logged_) {
        spdlog::warn("inotify watch limit reached at {}; raise fs.inotify.max_user_watches, until then changes "
                     "below it are seen by the periodic rescan only",
                     path);
        watch_limit_logged_ = true;
      }
      continue;
    }
    // A directory walked before its watch existed may have changed in
    // between, unseen: the next scan reads it again, and comes soon.
    if (!watches_.count(wd)) {
      dirty_dirs_.insert(rel);
      followup_scan_ = true;
    }
    watches_[wd].insert(path);
    watch_of_[path] = wd;
  }
  UpdateFileWatches(scan);
}

// `path` no longer names the directory of watch `wd`; a watch that names
// none is removed (its IN_IGNORED then finds no watch: nothing changed).
void CatalogWatcher::Unlabel(int wd, const std::string& path) {
  watch_of_.erase(path);
  auto it = watches_.find(wd);
  if (it == watches_.end()) return;
  it->second.erase(path);
  if (!it->second.empty()) return;
  ::inotify_rm_watch(inotify_.get(), wd);
  watches_.erase(it);
}

// The kernel ended watch `wd` (its directory is gone, or unmounted).
void CatalogWatcher::ForgetWatch(int wd) {
  auto it = watches_.find(wd);
  if (it == watches_.end()) return;
  for (const std::string& path : it->second) watch_of_.erase(path);
  watches_.erase(it);
}

// Files with more than one link are watched themselves, so that a chmod, a
// chown or a write through a name outside SRC (or outside every watched
// directory) is seen at once, as in the directories. At most
// kMaxFileWatches: each is one of the user's inotify watches, and a SRC
// writer may make many links; past that, such changes are seen by the
// periodic rescan, as before.
void CatalogWatcher::UpdateFileWatches(const CatalogScan& scan) {
  constexpr size_t kMaxFileWatches = 4096;
  std::map<int, std::set<std::string>> now;
  for (const auto& [path, file] : scan.linked_files) {
    if (now.size() >= kMaxFileWatches) {
      if (!std::exchange(file_watch_limit_logged_, true)) {
        spdlog::warn("more than {} files with several links in {}: a change made through another of their names "
                     "is seen by the periodic rescan only, beyond the first {}",
                     kMaxFileWatches, scan.root, kMaxFileWatches);
      }
      break;
    }
    // The watch goes on the inode the walk saw, whatever a SRC writer did
    // to the path since: opened without following its last component,
    // checked, and named through the descriptor. (By the path, a component
    // swapped for a link could land it on a directory already watched,
    // whose events would then be taken for this file's.)
    UniqueFd fd(::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != file.dev ||
        st.st_ino != file.ino) {
      continue;  // gone or replaced meanwhile: its directory's events tell the next scan
    }
    const std::string by_fd = "/proc/self/fd/" + std::to_string(fd.get());
    const int wd = ::inotify_add_watch(inotify_.get(), by_fd.c_str(), kWatchMask);
    if (wd < 0 || watches_.count(wd)) continue;  // no watch to be had: the periodic rescan sees it
    // Changed between the walk's stat and this watch, unseen: the next scan
    // reads its directories again, and comes soon (as for a new directory).
    if (!file_watches_.count(wd)) {
      dirty_dirs_.insert(file.dirs.begin(), file.dirs.end());
      followup_scan_ = true;
    }
    now[wd].insert(file.dirs.begin(), file.dirs.end());
  }
  for (const auto& [wd, dirs] : file_watches_) {
    if (!now.count(wd) && !watches_.count(wd)) ::inotify_rm_watch(inotify_.get(), wd);
  }
  file_watches_ = std::move(now);
}

void CatalogWatcher::SetState(CheckpointState state) {
  MutexLock lock(mu_);
  PutStateLocked(std::move(state));
}

void CatalogWatcher::PutStateLocked(CheckpointState state) {
  if (state.phase != CheckpointState::Phase::kExposed && state.phase != CheckpointState::Phase::kInvalid) {
    if (auto it = exposed_.find(state.path); it != exposed_.end()) {
      state.name = it->second.name;
      state.revalidating = true;
    }
  }
  states_[state.path] = std::move(state);
}

// With how far the indexer is with each checkpoint it works on: a queued
// one is "indexing" from its first lookup on, with the files begun.
std::vector<CheckpointState> CatalogWatcher::States() const {
  MutexLock lock(mu_);
  std::vector<CheckpointState> out;
  for (const auto& [path, s] : states_) {
    out.push_back(s);
    auto job = indexing_.find(path);
    if (job == indexing_.end() || !scheduler_) continue;
    auto progress = scheduler_->ProgressOf(job->second.job);
    if (!progress || !progress->started) continue;
    CheckpointState& st = out.back();
    if (st.phase == CheckpointState::Phase::kPending) {
      st.phase = CheckpointState::Phase::kIndexing;
      st.reason.clear();
    }
    st.bytes_done = progress->bytes_done;
    st.bytes_total = progress->bytes_total;
    for (const auto& f : progress->hashing) st.hashing.push_back({f.path, f.done, f.size});
  }
  return out;
}

CatalogWatcher::ScanStats CatalogWatcher::LastScan() const {
  MutexLock lock(mu_);
  return last_scan_;
}

View::Changes CatalogWatcher::PublishLocked() {
  TakeWithdrawalsLocked();  // nothing withdrawn or held out is ever published
  // Whatever was exposed is in this publish: a deferred one is done, and the
  // checkpoints it shows are exposed in status from now on (not before: a
  // status that says exposed means the view shows it).
  last_publish_ = MonotonicSeconds();
  publish_deferred_ = false;
  for (auto& [path, st] : unpublished_states_) {
    auto e = exposed_.find(path);
    if (e != exposed_.end() && e->second.name == st.name) states_[path] = std::move(st);
  }
  unpublished_states_.clear();
  std::vector<ExposedCheckpoint> list;
  list.reserve(exposed_.size());
  for (const auto& [path, e] : exposed_) list.push_back(e);
  if (options_.before_publish) options_.before_publish();
  return view_->Publish(list, last_dirs_, last_hub_refs_);
}

void CatalogWatcher::Notify(const View::Changes& changes) {
  if (!changes.empty() && on_change_) on_change_(changes);
}

bool CatalogWatcher::TakeWithdrawalsLocked() {
  std::map<std::string, std::string> withdrawals;
  bool asked;
  {
    MutexLock lock(requests_mu_);
    withdrawals.swap(withdrawals_);
    asked = !withdrawals.empty();
    // Still held out: a scan or an indexer may have shown them again since.
    for (const auto& [name, held] : held_out_) withdrawals.emplace(name, held.reason);
  }
  bool removed = false;
  for (const auto& [name, reason] : withdrawals) {
    for (auto it = exposed_.begin(); it != exposed_.end();) {
      if (it->second.name != name) {
        ++it;
        continue;
      }
      auto& st = states_[it->first];
      st.phase = CheckpointState::Phase::kPending;
      st.reason = "withdrawn: " + reason;
      st.revalidating = false;  // nothing is served for it now
      st.name.clear();
      unpublished_states_.erase(it->first);
      it = exposed_.erase(it);
      removed = true;
    }
  }
  return asked || removed;
}

void CatalogWatcher::Publish() {
  View::Changes changes;
  {
    MutexLock lock(mu_);
    TakeWithdrawalsLocked();
    changes = PublishLocked();
  }
  Notify(changes);
}

bool CatalogWatcher::ApplyWithdrawals() {
  if (!WithdrawalsWaiting()) return false;
  Publish();
  return true;
}

WalkTriggers CatalogWatcher::Triggers() const {
  WalkTriggers why;
  why.events_lost = full_walk_needed_;
  why.have_previous_walk = last_tree_ != nullptr;
  why.inotify = inotify_.valid();
  return why;
}

void CatalogWatcher::WithdrawEverything(const Status& why) {
  if (why.message() != last_scan_error_) {
    spdlog::error("cannot scan source: {}; withdrawing every checkpoint until it is back", why.message());
    last_scan_error_ = why.message();
  }
  View::Changes changes;
  std::vector<IndexScheduler::JobId> cancelled;  // nothing they find is shown now
  {
    MutexLock lock(mu_);
    exposed_.clear();
    states_.clear();
    unpublished_states_.clear();
    for (const auto& [path, job] : indexing_) cancelled.push_back(job.job);
    indexing_.clear();
    last_dirs_.clear();
    last_hub_refs_.clear();
    changes = PublishLocked();
  }
  for (IndexScheduler::JobId job : cancelled) scheduler_->Cancel(job);
  Notify(changes);
}

// Events that arrive from here on are for the next scan.
std::optional<CatalogScan> CatalogWatcher::Walk(bool incremental) {
  RewalkHint hint;
  if (incremental) hint = {std::move(last_tree_), std::move(dirty_dirs_)};
  last_tree_.reset();
  dirty_dirs_.clear();
  full_walk_needed_ = false;
  followup_scan_ = false;
  auto result = ScanSourceTree(options_.source, options_.catalog, incremental ? &hint : nullptr);
  if (stop_) return std::nullopt;  // a walk cut short by Stop() saw only part of the tree
  if (!result.ok()) {
    WithdrawEverything(result.status());
    return std::nullopt;
  }
  if (!last_scan_error_.empty()) {
    spdlog::info("source {} is readable again", options_.source);
    last_scan_error_.clear();
  }
  last_tree_ = result->tree;
  UpdateWatches(*result);
  for (const auto& w : result->warnings) spdlog::debug("{}", w);
  return std::move(*result);
}

KnownCheckpoints CatalogWatcher::Known() const {
  MutexLock lock(mu_);
  KnownCheckpoints known;
  for (const auto& [path, st] : states_) known[path].reason = st.reason;
  for (const auto& [path, e] : exposed_) known[path].shown_name = e.name;
  for (auto& [path, k] : known) {
    auto fp = shown_fingerprints_.find(path);
    if (fp != shown_fingerprints_.end()) k.shown_fingerprint = fp->second;
  }
  return known;
}

// One pass over the index, reading no file.
IndexReport CatalogWatcher::LookUp(const CatalogScan& scan, const std::vector<const CheckpointSource*>& which) const {
  IndexerOptions lookup;
  lookup.threads = options_.threads;
  lookup.lookup_only = true;
  lookup.manifests = options_.manifests;
  IndexReport known = Indexer(index_, lookup).Run(Only(scan, which));
  for (const auto& w : known.warnings) spdlog::warn("{}", w);
  return known;
}

void CatalogWatcher::ScanOnce(const WalkTriggers& why, bool index_unknown) {
  const double started = MonotonicSeconds();
  const bool incremental = !NeedsFullWalk(why);
  std::optional<CatalogScan> scan = Walk(incremental);
  if (!scan) return;
  const KnownCheckpoints known = Known();
  const ScanPlanner planner(known, static_cast<int64_t>(options_.settle_s * 1e9));
  const ScanTriage triage = planner.Triage(*scan);
  const IndexReport lookups = LookUp(*scan, triage.look_up);
  const ScanPlan plan = planner.Plan(triage, lookups.checkpoints, WallNanos());
  if (plan.settle_wait_ns > 0) next_settle_deadline_ = MonotonicSeconds() + plan.settle_wait_ns / 1e9 + 0.05;
  std::vector<ExposedCheckpoint> shown;
  for (const auto& s : plan.show) shown.push_back(ToExposed(*s.source, *s.indexed, *index_));
  ScanStats stats;
  stats.incremental = incremental;
  stats.dirs_reused = scan->dirs_reused;
  stats.checkpoints = plan.valid;
  stats.checkpoints_kept = plan.keep.size();
  stats.files_looked_up = plan.files_looked_up;
  stats.directories = std::max<size_t>(scan->dirs.size(), watchable_dirs_);
  stats.watched_directories = watch_of_.size();
  Apply(*scan, plan, std::move(shown), stats, started);
  if (index_unknown) IndexQueued(*scan, plan);
}

void CatalogWatcher::Apply(const CatalogScan& scan, const ScanPlan& plan, std::vector<ExposedCheckpoint> shown,
                           ScanStats stats, double started) {
  const std::string settle = SecondsText(options_.settle_s);
  View::Changes changes;
  std::vector<IndexScheduler::JobId> superseded;
  {
    MutexLock lock(mu_);
    last_dirs_ = scan.dirs;
    last_hub_refs_ = scan.hub_refs;
    for (const auto& w : plan.withdraw) {
      exposed_.erase(w.path);
      if (w.why == ScanPlan::Why::kRemoved) spdlog::info("checkpoint {} removed from the source; withdrawn", w.path);
    }
    for (const auto& path : plan.vanished) {
      shown_fingerprints_.erase(path);
      states_.erase(path);
    }
    // Who may reach a changed checkpoint is decided by this walk, now; what
    // it holds by the index, once the new digest is known.
    for (const auto& r : plan.revalidate) {
      auto it = exposed_.find(r.source->abs_path);
      if (it == exposed_.end()) continue;  // withdrawn meanwhile (a chunk failed its check)
      if (!states_[r.source->abs_path].revalidating) {
        spdlog::info("checkpoint {} changed; {} is served until it is verified again", r.source->abs_path,
                     r.shown_name);
      }
      it->second = ReachedAsNow(it->second, *r.source);
    }
    for (const auto& [cp, announce] : plan.invalid) {
      CheckpointState st = StateOf(*cp, CheckpointState::Phase::kInvalid, *cp->invalid_reason);
      st.problems_shown = cp->invalid_problems_shown;
      if (announce) spdlog::warn("checkpoint {} is invalid and not shown: {}", cp->abs_path, st.reason);
      states_[cp->abs_path] = std::move(st);
    }
    for (const auto& w : plan.wait) {
      PutStateLocked(StateOf(*w.source, CheckpointState::Phase::kPending,
                             "changed " + std::to_string(w.quiet_ns / 1'000'000) + " ms ago; waiting for settle=" +
                                 settle));
    }
    for (size_t i = 0; i < plan.show.size(); ++i) {
      const CheckpointSource& cp = *plan.show[i].source;
      if (plan.show[i].announce) spdlog::info("checkpoint {} is {}", cp.abs_path, shown[i].name);
      states_[cp.abs_path] = ExposedState(cp, shown[i]);
      exposed_[cp.abs_path] = std::move(shown[i]);
      shown_fingerprints_[cp.abs_path] = plan.fingerprints.at(cp.abs_path);
    }
    for (const auto* cp : plan.index) {
      PutStateLocked(StateOf(*cp, CheckpointState::Phase::kPending, "queued for indexing"));
    }
    // A job of an older walk that ends from here on finds itself replaced,
    // and shows nothing of what this walk decided otherwise.
    superseded = ForgetSupersededJobsLocked(plan);
    // A digest withdrawn meanwhile is not shown again, not even for a moment.
    TakeWithdrawalsLocked();
    changes = PublishLocked();
    stats.seconds = MonotonicSeconds() - started;
    stats.nodes = view_->LastPublish();
    last_scan_ = stats;
  }
  for (IndexScheduler::JobId job : superseded) scheduler_->Cancel(job);
  Notify(changes);
}

IndexerOptions CatalogWatcher::HashingOptions() {
  IndexerOptions options;
  options.threads = options_.threads;
  options.before_hash = options_.before_hash;
  options.manifests = options_.manifests;
  options.copies = options_.copies;
  options.cancel = &stop_;
  // Withdrawn digests leave the view before the next file is opened, and
  // within a chunk of the one being read (a 10 GB shard takes a while).
  options.between_files = [this] { ApplyWithdrawals(); };
  options.on_bytes = [this](uint64_t) { ApplyWithdrawals(); };
  return options;
}

// On an indexer's worker: the checkpoint's job is done (or failed), and still
// the one for its path (a newer walk may have replaced it).
void CatalogWatcher::OnIndexed(const CheckpointSource& cp, const Sha256Digest& fingerprint, uint64_t token,
                               IndexReport report) {
  for (const auto& w : report.warnings) spdlog::warn("{}", w);
  const IndexedCheckpoint& indexed = report.checkpoints.front();
  if (indexed.error) {
    RecordIndexingFailure(cp, indexed, token);
    return;
  }
  ExposedCheckpoint e = ToExposed(cp, indexed, *index_);
  const std::string name = e.name;
  if (Expose(cp, std::move(e), fingerprint, token)) {
    spdlog::info("checkpoint {} is {} ({} files hashed)", cp.abs_path, name, report.files_hashed);
  }
}

bool CatalogWatcher::TakeJobLocked(const std::string& path, uint64_t token) {
  auto it = indexing_.find(path);
  if (it == indexing_.end() || it->second.token != token) return false;
  indexing_.erase(it);
  return true;
}

void CatalogWatcher::RecordIndexingFailure(const CheckpointSource& cp, const IndexedCheckpoint& indexed,
                                           uint64_t token) {
  const auto phase = indexed.unsettled ? CheckpointState::Phase::kPending : CheckpointState::Phase::kInvalid;
  CheckpointState st = StateOf(cp, phase, *indexed.error);
  const std::string reason = st.reason;
  View::Changes changes;
  {
    MutexLock lock(mu_);
    if (!TakeJobLocked(cp.abs_path, token)) return;
    if (indexed.unsettled) {
      // Still changing: a digest it showed stays while it settles.
      const double at = MonotonicSeconds() + std::max(options_.settle_s, 0.5);
      retry_at_ = retry_at_ > 0 ? std::min(retry_at_, at) : at;
    } else if (exposed_.erase(cp.abs_path) != 0) {
      // Its new content cannot be verified, and what it served before is
      // gone from the source with it.
      shown_fingerprints_.erase(cp.abs_path);
      unpublished_states_.erase(cp.abs_path);
      changes = PublishLocked();
    }
    PutStateLocked(std::move(st));
  }
  Notify(changes);
  if (indexed.unsettled) {
    spdlog::info("checkpoint {} is still changing; will retry: {}", cp.abs_path, reason);
    Wake();  // the scanning thread comes back to it
  } else {
    spdlog::warn("checkpoint {} is invalid and not shown: {}", cp.abs_path, reason);
  }
}

// Many small checkpoints finish faster than the view is worth rebuilding, so
// a publish comes at most every kPublishEveryS; one that is not due yet is
// left to the scanning thread, which publishes when it is.
bool CatalogWatcher::Expose(const CheckpointSource& cp, ExposedCheckpoint e, const Sha256Digest& fingerprint,
                            uint64_t token) {
  View::Changes changes;
  bool deferred = false;
  {
    MutexLock lock(mu_);
    if (!TakeJobLocked(cp.abs_path, token)) return false;
    unpublished_states_[cp.abs_path] = ExposedState(cp, e);
    exposed_[cp.abs_path] = std::move(e);
    // The walk as hashed; a file the indexer found changed and hashed again
    // has a newer stamp than this, so the next walk differs and looks it up
    // afresh.
    shown_fingerprints_[cp.abs_path] = fingerprint;
    const double now = MonotonicSeconds();
    if (TakeWithdrawalsLocked() || now - last_publish_ >= kPublishEveryS) {
      changes = PublishLocked();
    } else {
      deferred = publish_deferred_ = true;
    }
  }
  Notify(changes);
  if (deferred) Wake();
  return true;
}

void CatalogWatcher::PublishIfDue() {
  {
    MutexLock lock(mu_);
    if (!publish_deferred_ || MonotonicSeconds() - last_publish_ < kPublishEveryS) return;
  }
  Publish();
}

double CatalogWatcher::NextPublishDue() const {
  MutexLock lock(mu_);
  return publish_deferred_ ? last_publish_ + kPublishEveryS : std::numeric_limits<double>::infinity();
}

double CatalogWatcher::TakeRetryRequest() {
  MutexLock lock(mu_);
  return std::exchange(retry_at_, 0);
}

// Hands the plan's queue to the scheduler, which indexes the checkpoints
// concurrently, each shown as its job ends; this thread goes back to
// watching at once. A checkpoint already being indexed as walked now keeps
// its job; one walked differently since, or no longer queued (changed again,
// gone, or known now), has its job cancelled.
std::vector<IndexScheduler::JobId> CatalogWatcher::ForgetSupersededJobsLocked(const ScanPlan& plan) {
  std::vector<IndexScheduler::JobId> superseded;
  for (auto it = indexing_.begin(); it != indexing_.end();) {
    auto walked = plan.fingerprints.find(it->first);
    const bool queued = std::any_of(plan.index.begin(), plan.index.end(),
                                    [&](const CheckpointSource* cp) { return cp->abs_path == it->first; });
    if (queued && walked != plan.fingerprints.end() && walked->second == it->second.fingerprint) {
      ++it;
      continue;
    }
    superseded.push_back(it->second.job);
    it = indexing_.erase(it);
  }
  return superseded;
}

void CatalogWatcher::IndexQueued(const CatalogScan& scan, const ScanPlan& plan) {
  {
    MutexLock lock(mu_);
    for (const CheckpointSource* cp : plan.index) {
      const Sha256Digest& fingerprint = plan.fingerprints.at(cp->abs_path);
      // Kept by Apply only while it is indexed as walked now.
      if (indexing_.count(cp->abs_path) != 0) continue;
      spdlog::info("indexing checkpoint {} ({} files, {} bytes)", cp->abs_path, cp->members.size(), cp->TotalSize());
      auto one = std::make_shared<const CatalogScan>(Only(scan, {cp}));
      // Under mu_, so that the job is known before its end can be reported.
      const uint64_t token = next_token_++;
      const IndexScheduler::JobId job =
          scheduler_->Submit(one, HashingOptions(), [this, one, fingerprint, token](IndexReport report) {
            OnIndexed(one->checkpoints.front(), fingerprint, token, std::move(report));
          });
      indexing_[cp->abs_path] = {fingerprint, token, job};
    }
  }
}

ExposedCheckpoint CatalogWatcher::ReachedAsNow(const ExposedCheckpoint& shown, const CheckpointSource& now) {
  // What the walk no longer finds as it was shown is for root alone until
  // the new digest is known: access must never outlive what a walk vouches for.
  static const AccessPath kRootOnly{nullptr, {0, 0, 0}};
  ExposedCheckpoint e = shown;
  e.dir_access = now.dir_access;
  for (auto& [rel, access] : e.subdirs) {
    auto it = now.subdirs.find(rel);
    access = it != now.subdirs.end() ? it->second : kRootOnly;
  }
  std::map<std::string_view, const MemberFile*> members;
  for (const auto& m : now.members) members.emplace(m.rel_path, &m);
  for (auto& f : e.files) {
    auto it = members.find(f.rel_path);
    if (it != members.end() && it->second->open_path == f.source_path) {
      f.owner = it->second->owner;
      f.access = it->second->access;
    } else {
      f.access = kRootOnly;
    }
  }
  e.inputs = View::InputsOf(e);
  return e;
}

}  // namespace ckptfs
