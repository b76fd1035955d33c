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
  inotify_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_.valid()) {
    spdlog::warn("inotify unavailable ({}); changes under {} are seen by the periodic rescan only",
                 std::strerror(errno), options_.source);
  }
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
}

CatalogWatcher::~CatalogWatcher() { Stop(); }

void CatalogWatcher::ShowIndexed() {
  ScanOnce(/*index_unknown=*/false);
  ++scans_;
}

void CatalogWatcher::Start() {
  thread_ = std::thread([this] { Run(); });
}

void CatalogWatcher::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full with one write; nothing else to do.
  }
  thread_.join();
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
    if (soon_requested_.exchange(false)) {
      read_triggered = true;
      next_debounced = std::min(next_debounced, std::max(now + kDebounceS, last_scan_end + kReadTriggeredEveryS));
    }
    std::map<std::string, std::string> withdrawals;
    {
      std::lock_guard lock(mu_);
      withdrawals.swap(withdrawals_);
      for (const auto& [name, reason] : withdrawals) {
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
    }
    if (!withdrawals.empty()) PublishExposed();
    const bool asked = rescan_requested_.exchange(false);
    const bool periodic = now >= next_periodic;
    if (asked || periodic || now >= next_debounced || (next_settle_deadline_ > 0 && now >= next_settle_deadline_)) {
      // A rescan asked for (SIGHUP, ckptfsctl rescan, a read that found a
      // source changed, a withdrawal) or the periodic one walks everything:
      // they are how changes that raise no inotify event are found. One
      // that only inotify or settling started re-reads the dirty directories.
      if (asked || periodic || !withdrawals.empty() || read_triggered) full_walk_needed_ = true;
      read_triggered = false;
      next_debounced = std::numeric_limits<double>::infinity();
      next_settle_deadline_ = 0;
      ScanOnce();
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
  states_[state.path] = std::move(state);
}

std::vector<CheckpointState> CatalogWatcher::States() const {
  std::lock_guard lock(mu_);
  std::vector<CheckpointState> out;
  for (const auto& [path, s] : states_) out.push_back(s);
  return out;
}

void CatalogWatcher::PublishExposed() {
  std::vector<ExposedCheckpoint> list;
  {
    std::lock_guard lock(mu_);
    for (const auto& [path, e] : exposed_) list.push_back(e);
  }
  auto changes = view_->Publish(list, last_dirs_, last_hub_refs_);
  if (!changes.empty() && on_change_) on_change_(changes);
}

CatalogWatcher::ScanStats CatalogWatcher::LastScan() const {
  std::lock_guard lock(mu_);
  return last_scan_;
}

void CatalogWatcher::ScanOnce(bool index_unknown) {
  const double started = MonotonicSeconds();
  // Events that arrive from here on are for the next scan. Without inotify
  // every scan walks everything.
  RewalkHint hint;
  const bool incremental = !full_walk_needed_ && last_tree_ && inotify_.valid();
  if (incremental) hint = {std::move(last_tree_), std::move(dirty_dirs_)};
  last_tree_.reset();
  dirty_dirs_.clear();
  full_walk_needed_ = false;
  followup_scan_ = false;
  auto result = ScanSourceTree(options_.source, options_.catalog, incremental ? &hint : nullptr);
  if (result.ok()) last_tree_ = result->tree;
  if (!result.ok()) {
    if (result.status().message() != last_scan_error_) {
      spdlog::error("cannot scan source: {}; withdrawing every checkpoint until it is back",
                    result.status().message());
      last_scan_error_ = result.status().message();
    }
    {
      std::lock_guard lock(mu_);
      exposed_.clear();
      states_.clear();
    }
    last_dirs_.clear();
    last_hub_refs_.clear();
    PublishExposed();
    return;
  }
  if (!last_scan_error_.empty()) {
    spdlog::info("source {} is readable again", options_.source);
    last_scan_error_.clear();
  }
  const CatalogScan& scan = *result;
  last_dirs_ = scan.dirs;
  last_hub_refs_ = scan.hub_refs;
  UpdateWatches(scan);
  for (const auto& w : scan.warnings) spdlog::debug("{}", w);

  const int64_t now_ns = WallNanos();
  const int64_t settle_ns = static_cast<int64_t>(options_.settle_s * 1e9);
  std::vector<const CheckpointSource*> valid, to_index;
  std::set<std::string> seen;
  std::map<std::string, CheckpointState> old_states;
  {
    std::lock_guard lock(mu_);
    old_states = states_;
  }
  double settle_wait_s = 0;

  for (const auto& cp : scan.checkpoints) {
    seen.insert(cp.abs_path);
    CheckpointState st;
    st.path = cp.abs_path;
    st.access = cp.dir_access;
    st.files = cp.members.size();
    st.size = cp.TotalSize();
    if (!cp.valid()) {
      st.phase = CheckpointState::Phase::kInvalid;
      st.reason = *cp.invalid_reason;
      st.reason_shown = cp.invalid_reason_shown.value_or(st.reason);
      auto old = old_states.find(cp.abs_path);
      if (old == old_states.end() || old->second.reason != st.reason) {
        spdlog::warn("checkpoint {} is invalid and not shown: {}", cp.abs_path, st.reason);
      }
      std::lock_guard lock(mu_);
      exposed_.erase(cp.abs_path);
      states_[cp.abs_path] = st;
      continue;
    }
    valid.push_back(&cp);
  }

  // A checkpoint shown and walked exactly as last time stays as it is: no
  // index lookup per file, nothing rebuilt (a change elsewhere in a tree
  // with a 100,000-file checkpoint must not cost seconds). A withdrawal
  // removes it from exposed_, so a withdrawn one is always looked up again.
  std::map<std::string, Sha256Digest> fingerprints;
  ScanStats stats;
  stats.checkpoints = valid.size();
  stats.incremental = incremental;
  stats.dirs_reused = scan.dirs_reused;
  {
    std::vector<const CheckpointSource*> changed;
    for (const auto* cp : valid) {
      const Sha256Digest fp = cp->WalkFingerprint();
      fingerprints[cp->abs_path] = fp;
      std::lock_guard lock(mu_);
      auto shown = shown_fingerprints_.find(cp->abs_path);
      if (shown != shown_fingerprints_.end() && shown->second == fp && exposed_.count(cp->abs_path)) continue;
      changed.push_back(cp);
    }
    stats.checkpoints_kept = valid.size() - changed.size();
    valid.swap(changed);
  }
  for (const auto* cp : valid) stats.files_looked_up += cp->members.size();

  // One pass over the index, reading no file: what it knows is shown at
  // once; the rest is hashed below once it has settled.
  IndexerOptions lookup;
  lookup.threads = options_.threads;
  lookup.lookup_only = true;
  IndexReport known = Indexer(index_, lookup).Run(Only(scan, valid));
  std::vector<std::pair<const CheckpointSource*, const IndexedCheckpoint*>> ready;
  for (size_t i = 0; i < valid.size(); ++i) {
    const CheckpointSource& cp = *valid[i];
    if (!known.checkpoints[i].error) {
      ready.emplace_back(&cp, &known.checkpoints[i]);
      continue;
    }
    int64_t newest = 0;
    for (const auto& m : cp.members) newest = std::max({newest, m.stamp.ctime_ns, m.stamp.mtime_ns});
    if (now_ns - newest < settle_ns) {
      CheckpointState st;
      st.path = cp.abs_path;
    st.access = cp.dir_access;
      st.files = cp.members.size();
      st.size = cp.TotalSize();
      const double wait = static_cast<double>(settle_ns - (now_ns - newest)) / 1e9;
      settle_wait_s = settle_wait_s == 0 ? wait : std::min(settle_wait_s, wait);
      st.phase = CheckpointState::Phase::kPending;
      st.reason = "changed " + std::to_string((now_ns - newest) / 1'000'000) + " ms ago; waiting for settle=" +
                  SecondsText(options_.settle_s);
      std::lock_guard lock(mu_);
      if (exposed_.erase(cp.abs_path)) spdlog::info("checkpoint {} changed; withdrawn until re-indexed", cp.abs_path);
      states_[cp.abs_path] = st;
      continue;
    }
    to_index.push_back(&cp);
  }
  if (settle_wait_s > 0) next_settle_deadline_ = MonotonicSeconds() + settle_wait_s + 0.05;

  {
    // Forget checkpoints that are gone from the tree.
    std::lock_guard lock(mu_);
    for (auto it = states_.begin(); it != states_.end();) {
      if (!seen.count(it->first)) {
        if (exposed_.erase(it->first)) spdlog::info("checkpoint {} removed from the source; withdrawn", it->first);
        shown_fingerprints_.erase(it->first);
        it = states_.erase(it);
      } else {
        ++it;
      }
    }
    // Checkpoints that changed and now need hashing leave the view at once.
    for (const auto* cp : to_index) {
      if (exposed_.erase(cp->abs_path)) spdlog::info("checkpoint {} changed; withdrawn until re-indexed", cp->abs_path);
    }
  }

  // Known to the index: shown at once.
  for (const auto& [src, indexed] : ready) {
    ExposedCheckpoint e = ToExposed(*src, *indexed, *index_);
    CheckpointState st;
    st.path = src->abs_path;
    st.access = src->dir_access;
    st.phase = CheckpointState::Phase::kExposed;
    st.name = e.name;
    st.files = e.files.size();
    st.size = e.total_size;
    st.indexed_at = e.indexed_at;
    {
      std::lock_guard lock(mu_);
      auto old = exposed_.find(st.path);
      if (old == exposed_.end() || old->second.name != e.name) spdlog::info("checkpoint {} is {}", st.path, e.name);
      exposed_[st.path] = std::move(e);
      shown_fingerprints_[st.path] = fingerprints.at(st.path);
    }
    SetState(st);
  }
  for (const auto* cp : to_index) {
    CheckpointState st;
    st.path = cp->abs_path;
    st.access = cp->dir_access;
    st.phase = CheckpointState::Phase::kPending;
    st.reason = "queued for indexing";
    st.files = cp->members.size();
    st.size = cp->TotalSize();
    SetState(st);
  }
  PublishExposed();
  stats.seconds = MonotonicSeconds() - started;
  stats.nodes = view_->LastPublish();
  {
    std::lock_guard lock(mu_);
    last_scan_ = stats;
  }
  if (!index_unknown) return;

  // The rest: hashed one checkpoint at a time, each shown when done. Many
  // small ones finish faster than the view is worth rebuilding, so publish
  // at most a few times a second (and always after the last).
  constexpr double kPublishEveryS = 0.25;
  double last_publish = MonotonicSeconds();
  bool unpublished = false;
  for (const auto* cp : to_index) {
    if (stop_) return;
    CheckpointState st;
    st.path = cp->abs_path;
    st.access = cp->dir_access;
    st.phase = CheckpointState::Phase::kIndexing;
    st.files = cp->members.size();
    st.size = cp->TotalSize();
    SetState(st);
    spdlog::info("indexing checkpoint {} ({} files, {} bytes)", cp->abs_path, st.files, st.size);
    IndexerOptions options;
    options.threads = options_.threads;
    options.before_hash = options_.before_hash;
    options.cancel = &stop_;
    options.on_plan = [this, path = cp->abs_path](uint64_t total) {
      std::lock_guard lock(mu_);
      states_[path].bytes_total = total;
    };
    options.on_bytes = [this, path = cp->abs_path](uint64_t n) {
      std::lock_guard lock(mu_);
      states_[path].bytes_done += n;
    };
    IndexReport report = Indexer(index_, options).Run(Only(scan, {cp}));
    for (const auto& w : report.warnings) spdlog::warn("{}", w);
    const auto& indexed = report.checkpoints.front();
    if (indexed.error) {
      st.phase = indexed.unsettled ? CheckpointState::Phase::kPending : CheckpointState::Phase::kInvalid;
      st.reason = *indexed.error;
      if (indexed.unsettled) {
        spdlog::info("checkpoint {} is still changing; will retry: {}", cp->abs_path, st.reason);
        next_settle_deadline_ = MonotonicSeconds() + std::max(options_.settle_s, 0.5);
      } else {
        spdlog::warn("checkpoint {} is invalid and not shown: {}", cp->abs_path, st.reason);
      }
      SetState(st);
      continue;
    }
    ExposedCheckpoint e = ToExposed(*cp, indexed, *index_);
    st.phase = CheckpointState::Phase::kExposed;
    st.name = e.name;
    st.indexed_at = e.indexed_at;
    spdlog::info("checkpoint {} is {} ({} files hashed)", cp->abs_path, e.name, report.files_hashed);
    {
      std::lock_guard lock(mu_);
      exposed_[cp->abs_path] = std::move(e);
      // The walk as hashed; a file the indexer found changed and hashed
      // again has a newer stamp than this, so the next walk differs and
      // looks it up afresh.
      shown_fingerprints_[cp->abs_path] = fingerprints.at(cp->abs_path);
    }
    SetState(st);
    unpublished = true;
    if (MonotonicSeconds() - last_publish >= kPublishEveryS) {
      PublishExposed();
      last_publish = MonotonicSeconds();
      unpublished = false;
    }
  }
  if (unpublished) PublishExposed();
}

}  // namespace ckptfs
