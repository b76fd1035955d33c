#include "ckptfs/catalog_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include "ckptfs/indexer.h"
#include "ckptfs/scan_planner.h"

namespace ckptfs {

namespace {

constexpr uint32_t kWatchMask = IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO |
                                IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;
// Events arrive in bursts (a copy writes many files); wait this long after
// one before rescanning, so a burst costs one walk.
constexpr double kDebounceS = 0.3;

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
                       std::make_shared<const std::vector<ChunkHash>>(f.hashes.chunks), f.stamped_size,
                       f.member.owner, f.member.access});
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
}

CatalogWatcher::~CatalogWatcher() { Stop(); }

void CatalogWatcher::ShowIndexed() {
  ScanOnce(Triggers(), /*index_unknown=*/false);
  ++scans_;
}

void CatalogWatcher::Start() {
  indexing_thread_ = std::thread([this] { IndexLoop(); });
  thread_ = std::thread([this] { Run(); });
}

void CatalogWatcher::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full with one write; nothing else to do.
  }
  {
    std::lock_guard lock(mu_);  // so that the indexing thread cannot miss the wake-up
  }
  queued_.notify_all();
  thread_.join();
  indexing_thread_.join();
}

void CatalogWatcher::RequestRescan() {
  rescan_requested_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
  }
}

void CatalogWatcher::RequestRescanSoon() {
  soon_requested_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
  }
}

void CatalogWatcher::Withdraw(const std::string& name, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    withdrawals_[name] = reason;
  }
  RequestRescan();
}

void CatalogWatcher::Run() {
  double next_periodic = std::numeric_limits<double>::infinity();
  double next_debounced = std::numeric_limits<double>::infinity();
  double last_scan_end = -std::numeric_limits<double>::infinity();
  constexpr double kReadTriggeredEveryS = 1.0;
  bool read_triggered = false;
  while (!stop_) {
    const double now = MonotonicSeconds();
    if (const double retry = retry_at_.exchange(0); retry > 0) {
      next_settle_deadline_ = next_settle_deadline_ > 0 ? std::min(next_settle_deadline_, retry) : retry;
    }
    if (soon_requested_.exchange(false)) {
      read_triggered = true;
      next_debounced = std::min(next_debounced, std::max(now + kDebounceS, last_scan_end + kReadTriggeredEveryS));
    }
    const bool withdrew = ApplyWithdrawals();
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
    double until = std::min(next_periodic, next_debounced);
    if (next_settle_deadline_ > 0) until = std::min(until, next_settle_deadline_);
    const double wait_s = until - now;
    const int timeout_ms = std::isinf(wait_s) ? -1 : static_cast<int>(std::min(wait_s * 1000 + 1, double{INT_MAX}));
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {inotify_.valid() ? inotify_.get() : -1, POLLIN, 0}};
    ::poll(fds, 2, timeout_ms);
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      if (::read(wake_.get(), &v, sizeof v) < 0) {
      }
    }
    if ((fds[1].revents & POLLIN) && DrainInotify()) {
      next_debounced = std::min(next_debounced, MonotonicSeconds() + kDebounceS);
    }
  }
}

bool CatalogWatcher::DrainInotify() {
  alignas(inotify_event) char buf[16384];
  bool any = false;
  for (;;) {
    ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      NoteDirty(*ev);
      if (ev->mask & IN_IGNORED) watches_.erase(ev->wd);
      any = true;
      p += sizeof(inotify_event) + ev->len;
    }
  }
  return any;
}

// The directory an event happened in is dirty, and so is a subdirectory it
// names (created, removed, moved or chmod'ed); an event from an unknown
// watch, or a lost queue, leaves nothing to trust but a full walk.
void CatalogWatcher::NoteDirty(const inotify_event& ev) {
  auto w = watches_.find(ev.wd);
  if ((ev.mask & IN_Q_OVERFLOW) || w == watches_.end()) {
    full_walk_needed_ = true;
    return;
  }
  const std::string& root = watched_root_;
  const std::string& path = w->second;
  std::string rel;
  if (path != root) {
    if (path.compare(0, root.size() + 1, root + "/") != 0) {
      full_walk_needed_ = true;
      return;
    }
    rel = path.substr(root.size() + 1);
  }
  dirty_dirs_.insert(rel);
  if (ev.len > 0 && (ev.mask & IN_ISDIR)) dirty_dirs_.insert(rel.empty() ? ev.name : rel + "/" + ev.name);
}

void CatalogWatcher::UpdateWatches(const CatalogScan& scan) {
  if (!inotify_.valid()) return;
  std::set<std::string> watched;
  for (const auto& [wd, path] : watches_) watched.insert(path);
  watched_root_ = scan.root;
  for (const auto& [rel, owner] : scan.dirs) {
    const std::string path = rel.empty() ? scan.root : scan.root + "/" + rel;
    if (watched.count(path)) continue;
    int wd = ::inotify_add_watch(inotify_.get(), path.c_str(), kWatchMask);
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
    watches_[wd] = path;
  }
}

void CatalogWatcher::SetState(CheckpointState state) {
  std::lock_guard lock(mu_);
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

std::vector<CheckpointState> CatalogWatcher::States() const {
  std::lock_guard lock(mu_);
  std::vector<CheckpointState> out;
  for (const auto& [path, s] : states_) out.push_back(s);
  return out;
}

CatalogWatcher::ScanStats CatalogWatcher::LastScan() const {
  std::lock_guard lock(mu_);
  return last_scan_;
}

View::Changes CatalogWatcher::PublishLocked() {
  std::vector<ExposedCheckpoint> list;
  list.reserve(exposed_.size());
  for (const auto& [path, e] : exposed_) list.push_back(e);
  return view_->Publish(list, last_dirs_, last_hub_refs_);
}

void CatalogWatcher::Notify(const View::Changes& changes) {
  if (!changes.empty() && on_change_) on_change_(changes);
}

bool CatalogWatcher::TakeWithdrawalsLocked() {
  if (withdrawals_.empty()) return false;
  for (const auto& [name, reason] : withdrawals_) {
    for (auto it = exposed_.begin(); it != exposed_.end();) {
      if (it->second.name != name) {
        ++it;
        continue;
      }
      auto& st = states_[it->first];
      st.phase = CheckpointState::Phase::kPending;
      st.reason = "withdrawn: " + reason;
      it = exposed_.erase(it);
    }
  }
  withdrawals_.clear();
  return true;
}

void CatalogWatcher::Publish() {
  View::Changes changes;
  {
    std::lock_guard lock(mu_);
    TakeWithdrawalsLocked();
    changes = PublishLocked();
  }
  Notify(changes);
}

bool CatalogWatcher::ApplyWithdrawals() {
  {
    std::lock_guard lock(mu_);
    if (withdrawals_.empty()) return false;
  }
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
  {
    std::lock_guard lock(mu_);
    exposed_.clear();
    states_.clear();
    queue_.clear();
    walked_fingerprints_.clear();
    last_dirs_.clear();
    last_hub_refs_.clear();
    changes = PublishLocked();
  }
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
  std::lock_guard lock(mu_);
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
  Apply(*scan, plan, std::move(shown), stats, started, index_unknown);
}

void CatalogWatcher::Apply(const CatalogScan& scan, const ScanPlan& plan, std::vector<ExposedCheckpoint> shown,
                           ScanStats stats, double started, bool queue) {
  const std::string settle = SecondsText(options_.settle_s);
  View::Changes changes;
  {
    std::lock_guard lock(mu_);
    last_dirs_ = scan.dirs;
    last_hub_refs_ = scan.hub_refs;
    walked_fingerprints_ = plan.fingerprints;
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
      st.reason_shown = cp->invalid_reason_shown.value_or(st.reason);
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
    if (queue) QueueLocked(scan, plan);
    // A digest withdrawn meanwhile is not shown again, not even for a moment.
    TakeWithdrawalsLocked();
    changes = PublishLocked();
    stats.seconds = MonotonicSeconds() - started;
    stats.nodes = view_->LastPublish();
    last_scan_ = stats;
  }
  Notify(changes);
}

IndexerOptions CatalogWatcher::HashingOptions(const std::string& path) {
  IndexerOptions options;
  options.threads = options_.threads;
  options.before_hash = options_.before_hash;
  options.manifests = options_.manifests;
  options.cancel = &stop_;
  // Withdrawn digests leave the view before the next file is opened, and
  // within a chunk of the one being read (a 10 GB shard takes a while).
  options.between_files = [this] { ApplyWithdrawals(); };
  options.on_plan = [this, path](uint64_t total) {
    std::lock_guard lock(mu_);
    states_[path].bytes_total = total;
  };
  options.on_bytes = [this, path](uint64_t n) {
    bool withdrawn = false;
    {
      std::lock_guard lock(mu_);
      states_[path].bytes_done += n;
      withdrawn = !withdrawals_.empty();
    }
    if (withdrawn) ApplyWithdrawals();
  };
  return options;
}

void CatalogWatcher::RecordIndexingFailure(const CheckpointSource& cp, const IndexedCheckpoint& indexed) {
  const auto phase = indexed.unsettled ? CheckpointState::Phase::kPending : CheckpointState::Phase::kInvalid;
  CheckpointState st = StateOf(cp, phase, *indexed.error);
  if (indexed.unsettled) {
    // Still changing: a digest it showed stays while it settles.
    spdlog::info("checkpoint {} is still changing; will retry: {}", cp.abs_path, st.reason);
    retry_at_ = MonotonicSeconds() + std::max(options_.settle_s, 0.5);
    uint64_t one = 1;
    if (::write(wake_.get(), &one, sizeof one) < 0) {
    }
    SetState(std::move(st));
    return;
  }
  spdlog::warn("checkpoint {} is invalid and not shown: {}", cp.abs_path, st.reason);
  // Its new content cannot be verified, and what it served before is gone
  // from the source with it.
  View::Changes changes;
  {
    std::lock_guard lock(mu_);
    PutStateLocked(std::move(st));
    if (exposed_.erase(cp.abs_path) != 0) {
      shown_fingerprints_.erase(cp.abs_path);
      changes = PublishLocked();
    }
  }
  Notify(changes);
}

CatalogWatcher::Shown CatalogWatcher::Expose(const CheckpointSource& cp, ExposedCheckpoint e,
                                             const Sha256Digest& fingerprint, bool publish) {
  View::Changes changes;
  {
    std::lock_guard lock(mu_);
    auto walked = walked_fingerprints_.find(cp.abs_path);
    if (walked == walked_fingerprints_.end() || walked->second != fingerprint) return Shown::kNo;
    states_[cp.abs_path] = ExposedState(cp, e);
    exposed_[cp.abs_path] = std::move(e);
    // The walk as hashed; a file the indexer found changed and hashed again
    // has a newer stamp than this, so the next walk differs and looks it up
    // afresh.
    shown_fingerprints_[cp.abs_path] = fingerprint;
    if (TakeWithdrawalsLocked()) publish = true;
    if (publish) changes = PublishLocked();
  }
  Notify(changes);
  return publish ? Shown::kPublished : Shown::kLater;
}

void CatalogWatcher::QueueLocked(const CatalogScan& scan, const ScanPlan& plan) {
  std::map<std::string, const CheckpointSource*> wanted;
  for (const auto* cp : plan.index) wanted[cp->abs_path] = cp;
  auto still_wanted = [&](const std::string& path, const Sha256Digest& fingerprint) {
    return wanted.count(path) != 0 && plan.fingerprints.at(path) == fingerprint;
  };
  std::deque<IndexJob> kept;
  for (auto& job : queue_) {
    const std::string path = job.source().abs_path;
    if (!still_wanted(path, job.fingerprint)) continue;
    wanted.erase(path);
    kept.push_back(std::move(job));
  }
  queue_ = std::move(kept);
  // Being hashed as walked now: its progress stands.
  if (indexing_path_ && still_wanted(*indexing_path_, *indexing_fingerprint_)) wanted.erase(*indexing_path_);
  for (const auto& [path, cp] : wanted) {
    PutStateLocked(StateOf(*cp, CheckpointState::Phase::kPending, "queued for indexing"));
    queue_.push_back({Only(scan, {cp}), plan.fingerprints.at(path)});
  }
  if (!queue_.empty()) queued_.notify_one();
}

void CatalogWatcher::IndexLoop() {
  double last_publish = MonotonicSeconds();
  bool unpublished = false;
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (queue_.empty() && unpublished) {
      lock.unlock();
      Publish();
      unpublished = false;
      last_publish = MonotonicSeconds();
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      queued_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      continue;
    }
    IndexJob job = std::move(queue_.front());
    queue_.pop_front();
    indexing_path_ = job.source().abs_path;
    indexing_fingerprint_ = job.fingerprint;
    lock.unlock();
    switch (IndexOne(job, last_publish)) {
      case Shown::kPublished:
        last_publish = MonotonicSeconds();
        unpublished = false;
        break;
      case Shown::kLater: unpublished = true; break;
      case Shown::kNo: break;
    }
    lock.lock();
    indexing_path_.reset();
    indexing_fingerprint_.reset();
  }
}

CatalogWatcher::Shown CatalogWatcher::IndexOne(const IndexJob& job, double last_publish) {
  // Many small checkpoints finish faster than the view is worth rebuilding,
  // so publish at most a few times a second (IndexLoop publishes whatever
  // is left when the queue runs dry).
  constexpr double kPublishEveryS = 0.25;
  const CheckpointSource& cp = job.source();
  ApplyWithdrawals();
  SetState(StateOf(cp, CheckpointState::Phase::kIndexing));
  spdlog::info("indexing checkpoint {} ({} files, {} bytes)", cp.abs_path, cp.members.size(), cp.TotalSize());
  IndexReport report = Indexer(index_, HashingOptions(cp.abs_path)).Run(job.scan);
  if (stop_) return Shown::kNo;
  for (const auto& w : report.warnings) spdlog::warn("{}", w);
  const IndexedCheckpoint& indexed = report.checkpoints.front();
  if (indexed.error) {
    RecordIndexingFailure(cp, indexed);
    return Shown::kNo;
  }
  ExposedCheckpoint e = ToExposed(cp, indexed, *index_);
  const std::string name = e.name;
  const bool due = MonotonicSeconds() - last_publish >= kPublishEveryS;
  const Shown shown = Expose(cp, std::move(e), job.fingerprint, due);
  if (shown == Shown::kNo) {
    // Walked otherwise since it was queued: the job queued from that walk
    // shows it (its files are in the index now, so that costs lookups only).
    spdlog::debug("checkpoint {} changed while it was indexed; the newer walk decides", cp.abs_path);
  } else {
    spdlog::info("checkpoint {} is {} ({} files hashed)", cp.abs_path, name, report.files_hashed);
  }
  return shown;
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
