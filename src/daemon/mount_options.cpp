#include "mount_options.h"

#include "ckptfs/hashes.h"
#include "ckptfs/thread_pool.h"

#include <pwd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

namespace ckptfs {

namespace {

// Refused, not ignored: an fstab line that sized the removed tier should say
// so at mount rather than silently lose what it asked for.
constexpr char kRemovedGpuCacheSize[] =
    "option gpu_cache_size= is gone: the GPU chunk tier was removed (its reads copied device memory back to the "
    "host, slower than the host tier); pinned host-tier copies, registered with the gpu= device, are the "
    "GPU-facing cache (see README)";

// Options that mean something to mount(8), fstab or systemd, not to us; they
// may reach us when mount.fuse3 passes them on, and are ignored.
bool IsMountBookkeeping(const std::string& opt) {
  static const char* kIgnored[] = {"defaults", "auto", "noauto", "nofail", "_netdev", "user", "nouser", "users",
                                   "owner", "group", "loop"};
  for (const char* o : kIgnored) {
    if (opt == o) return true;
  }
  return opt.rfind("x-", 0) == 0 || opt.rfind("comment=", 0) == 0;
}

// Standard options passed through to libfuse's mount.
bool IsFuseOption(const std::string& opt) {
  static const char* kFlags[] = {"ro", "allow_other", "allow_root", "default_permissions", "auto_unmount",
                                 "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime",
                                 "relatime", "norelatime", "strictatime", "diratime", "nodiratime", "async",
                                 "sync", "dirsync", "lazytime", "nolazytime"};
  for (const char* f : kFlags) {
    if (opt == f) return true;
  }
  for (const char* prefix : {"subtype=", "max_read=", "blksize=", "context=", "fscontext=", "defcontext=",
                             "rootcontext="}) {
    if (opt.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// A duration from 0 to a year; with `min_nonzero`, one that is not 0 must
// be at least that long.
Result<double> ParseSeconds(const std::string& key, const std::string& value, double min_nonzero = 0) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  // A year at most: durations become nanosecond counts in int64 (settle=9.3e9
  // would overflow into "no settle"), and nothing here needs longer.
  constexpr double kMaxSeconds = 365.0 * 24 * 3600;
  if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0 || v > kMaxSeconds ||
      (v > 0 && v < min_nonzero)) {
    if (min_nonzero > 0) {
      char min[32];
      std::snprintf(min, sizeof min, "%g", min_nonzero);
      return Status::Error("option " + key + "=" + value + ": expected a number of seconds from " + min +
                           " to 31536000 (a year), or 0 for none");
    }
    return Status::Error("option " + key + "=" + value + ": expected a number of seconds from 0 to 31536000 (a year)");
  }
  return v;
}

// 1 to `max`.
Result<unsigned> ParseCount(const std::string& key, const std::string& value, long max) {
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (*end != '\0' || n < 1 || n > max) {
    return Status::Error("option " + key + "=" + value + ": expected 1 to " + std::to_string(max));
  }
  return static_cast<unsigned>(n);
}

// cache_size=: a size, or a percentage of memory.
Status ApplyCacheSize(const std::string& key, const std::string& value, MountOptions& o) {
  if (value.back() == '%') {
    char* end = nullptr;
    double pct = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size() - 1 || !(pct > 0 && pct <= 100)) {
      return Status::Error("option " + key + "=" + value + ": expected a size (e.g. 32G) or a percentage (1% to 100%)");
    }
    o.cache_percent = pct;
    return Status::Ok();
  }
  auto v = ParseSize(value);
  if (!v.ok()) return Status::Error("option " + key + "=" + value + ": " + v.status().message());
  if (*v < kChunkSize * 4) return Status::Error("option " + key + "=" + value + ": at least 16M (four 4 MiB chunks)");
  o.cache_size = *v;
  return Status::Ok();
}

// page_reserve=auto|off|SIZE.
Status ApplyPageReserve(const std::string& value, MountOptions& o) {
  o.page_reserve_off = value == "off";
  o.page_reserve_bytes = 0;
  if (value == "auto" || value == "off") return Status::Ok();
  auto v = ParseSize(value);
  if (!v.ok())
    return Status::Error("option page_reserve=" + value +
                         ": expected auto, off or a size (e.g. 4G): " + v.status().message());
  if (*v < (2u << 20)) return Status::Error("option page_reserve=" + value + ": at least 2M (one 2 MiB page)");
  o.page_reserve_bytes = *v;
  return Status::Ok();
}

// Sets `out` to the value VALUE is the word of; refuses it unless it is one
// of `words`: "expected a, b or c".
template <class T, size_t N>
Status SetFromWord(const std::string& key, const std::string& value, const OptionWord<T> (&words)[N], T& out) {
  std::optional<T> v = ValueOfWord(words, value);
  if (!v) return Status::Error("option " + key + "=" + value + ": expected " + WordChoices(words));
  out = *v;
  return Status::Ok();
}

// gpu=INDEX|auto|sim
Status ApplyGpu(const std::string& value, MountOptions& o) {
  if (auto choice = ValueOfWord(kGpuWords, value)) {
    o.gpu = *choice;
    return Status::Ok();
  }
  char* end = nullptr;
  errno = 0;
  long idx = std::strtol(value.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || idx < 0 || idx > INT_MAX) {
    return Status::Error("option gpu=" + value + ": expected a device index, auto or sim");
  }
  o.gpu = GpuChoice::kIndex;
  o.gpu_index = static_cast<int>(idx);
  return Status::Ok();
}

// log_file=PATH|stderr|syslog
// trusted_writers=USER[:USER...], each a name or a uid. A name is looked up
// once, here: the uid is what a copy's owner is compared with.
Status ApplyTrustedWriters(const std::string& value, MountOptions& o) {
  constexpr size_t kMaxTrustedWriters = 64;
  o.trusted_writers.clear();
  size_t begin = 0;
  while (begin <= value.size()) {
    const size_t end = std::min(value.find(':', begin), value.size());
    const std::string user = value.substr(begin, end - begin);
    begin = end + 1;
    if (user.empty()) return Status::Error("trusted_writers=" + value + ": an empty user name");
    if (o.trusted_writers.size() == kMaxTrustedWriters) {
      return Status::Error("trusted_writers=: at most " + std::to_string(kMaxTrustedWriters) + " users");
    }
    char* rest = nullptr;
    errno = 0;
    const unsigned long uid = std::strtoul(user.c_str(), &rest, 10);
    if (std::isdigit(static_cast<unsigned char>(user[0])) && *rest == '\0' && errno == 0 && uid < UINT32_MAX) {
      o.trusted_writers.push_back(static_cast<uid_t>(uid));
      continue;
    }
    passwd pw{}, *found = nullptr;
    std::vector<char> buf(16384);
    if (::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
      return Status::Error("trusted_writers=: no user named '" + user + "' (give a name this node knows, or a uid)");
    }
    o.trusted_writers.push_back(found->pw_uid);
  }
  return Status::Ok();
}

Status ApplyLogFile(const std::string& value, MountOptions& o) {
  if (auto to = ValueOfWord(kLogToWords, value)) {
    o.log_to = *to;
    return Status::Ok();
  }
  // fstab has no working directory to be relative to.
  if (value[0] != '/') return Status::Error("option log_file=" + value + ": expected an absolute path, stderr or syslog");
  o.log_to = LogTo::kFile;
  o.log_file = value;
  return Status::Ok();
}

// The options of the form KEY=VALUE, one branch each in the order of
// --help (MountUsage); nothing when KEY is none of them.
std::optional<Status> ApplyKeyedOption(const std::string& key, const std::string& value, bool has_value,
                                       MountOptions& o) {
  auto need_value = [&]() -> Status {
    if (!has_value || value.empty()) return Status::Error("option " + key + " needs a value (" + key + "=...)");
    return Status::Ok();
  };

  if (key == "state") {
    if (Status s = need_value(); !s.ok()) return s;
    if (value[0] != '/') return Status::Error("option state=" + value + ": must be an absolute path");
    o.state_dir = value;
  } else if (key == "rescan" || key == "settle") {
    if (Status s = need_value(); !s.ok()) return s;
    // A full rescan walks all of SRC: more often than kMinRescanS
    // would keep a core walking and never help (rescan=1e-9 used to be taken).
    auto v = ParseSeconds(key, value, key == "rescan" ? kMinRescanS : 0);
    if (!v.ok()) return v.status();
    (key == "rescan" ? o.rescan_s : o.settle_s) = *v;
    if (key == "rescan") o.rescan_given = true;
  } else if (key == "manifests" || key == "manifest_keys" || key == "manifest_sign") {
    if (Status s = need_value(); !s.ok()) return s;
    if (value[0] != '/') return Status::Error("option " + key + "=" + value + ": must be an absolute path");
    (key == "manifests" ? o.manifests : key == "manifest_keys" ? o.manifest_keys : o.manifest_sign) = value;
  } else if (key == "max_watches") {
    if (Status s = need_value(); !s.ok()) return s;
    auto n = ParseCount(key, value, 1L << 30);
    if (!n.ok()) return n.status();
    o.max_watches = *n;
  } else if (key == "symlinks") {
    return SetFromWord(key, value, kSymlinkPolicyWords, o.symlinks);
  } else if (key == "threads" || key == "fill_depth") {
    if (Status s = need_value(); !s.ok()) return s;
    auto n = ParseCount(key, value, key == "threads" ? 1024 : 64);
    if (!n.ok()) return n.status();
    (key == "threads" ? o.threads : o.fill_depth) = *n;
  } else if (key == "log") {
    return SetFromWord(key, value, kLogLevelWords, o.log_level);
  } else if (key == "log_file") {
    if (Status s = need_value(); !s.ok()) return s;
    return ApplyLogFile(value, o);
  } else if (key == "readahead") {
    if (Status s = need_value(); !s.ok()) return s;
    auto v = ParseSize(value);
    if (!v.ok()) return Status::Error("option readahead=" + value + ": " + v.status().message());
    if (*v < 4096 || *v > (1ull << 30)) return Status::Error("option readahead=" + value + ": expected 4K to 1G");
    o.readahead = *v;
  } else if (key == "cache_size") {
    if (Status s = need_value(); !s.ok()) return s;
    if (Status s = ApplyCacheSize(key, value, o); !s.ok()) return s;
  } else if (key == "gpu_cache_size") {
    return Status::Error(kRemovedGpuCacheSize);
  } else if (key == "gpu") {
    if (Status s = need_value(); !s.ok()) return s;
    return ApplyGpu(value, o);
  } else if (key == "passthrough") {
    return SetFromWord(key, value, kPassthroughWords, o.passthrough);
  } else if (key == "fill") {
    return SetFromWord(key, value, kFillPolicyWords, o.fill);
  } else if (key == "fill_on_index") {
    return SetFromWord(key, value, kFillOnIndexWords, o.fill_on_index);
  } else if (key == "fill_io") {
    return SetFromWord(key, value, kSourceIoWords, o.fill_io);
  } else if (key == "verify") {
    o.verify_given = true;
    return SetFromWord(key, value, kVerifyWords, o.verify);
  } else if (key == "trusted_writers") {
    if (Status s = need_value(); !s.ok()) return s;
    return ApplyTrustedWriters(value, o);
  } else if (key == "page_reserve") {
    if (Status s = need_value(); !s.ok()) return s;
    return ApplyPageReserve(value, o);
  } else if (key == "shmem_huge") {
    return SetFromWord(key, value, kShmemHugeWords, o.shmem_huge_advise);
  } else if (key == "supervise") {
    return SetFromWord(key, value, kSuperviseWords, o.supervise);
  } else if (key == "handover_timeout") {
    if (Status s = need_value(); !s.ok()) return s;
    auto n = ParseCount(key, value, 3600);
    if (!n.ok()) return n.status();
    o.handover_timeout_s = *n;
  } else if (key == "fsname") {
    if (Status s = need_value(); !s.ok()) return s;
    o.fsname = value;
  } else {
    return std::nullopt;
  }
  return Status::Ok();
}

Status ApplyOption(const std::string& opt, MountOptions& o) {
  const auto eq = opt.find('=');
  const std::string key = opt.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : opt.substr(eq + 1);
  if (auto applied = ApplyKeyedOption(key, value, eq != std::string::npos, o)) return *applied;
  if (opt == "rw") {
    return Status::Error("option rw: ckptfs is read-only");
  } else if (opt == "stamp_headers") {
    o.stamp_headers = true;
  } else if (opt == "allow_other") {
    o.allow_other = true;
  } else if (IsMountBookkeeping(opt)) {
    // mount(8) and systemd bookkeeping; nothing for the filesystem to do.
  } else if (IsFuseOption(opt)) {
    if (opt != "ro" && opt != "default_permissions") o.fuse_options.push_back(opt);
  } else {
    return Status::Error("unknown option '" + opt + "' (see ckptfs --help)");
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ParseSize(const std::string& text) {
  if (text.empty()) return Status::Error("empty size");
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0 || text[0] == '-') return Status::Error("not a size: " + text);
  std::string suffix = end;
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (suffix.size() == 2 && (suffix[1] == 'i' || suffix[1] == 'I')) suffix.pop_back();
  int shift = 0;
  if (suffix.empty()) shift = 0;
  else if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  else if (suffix == "T" || suffix == "t") shift = 40;
  else return Status::Error("unknown size suffix in " + text + " (use K, M, G or T)");
  if (shift > 0 && v > (~0ull >> shift)) return Status::Error("size too large: " + text);
  return static_cast<uint64_t>(v) << shift;
}

Result<MountOptions> ParseMountOptions(int argc, const char* const* argv) {
  MountOptions o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      o.show_help = true;
    } else if (a == "-V" || a == "--version") {
      o.show_version = true;
    } else if (a == "-f") {
      o.foreground = true;
    } else if (a == "-d" || a == "-odebug") {
      o.debug = true;
      o.foreground = true;
    } else if (a == "-o" || (a.rfind("-o", 0) == 0 && a.size() > 2)) {
      std::string list;
      if (a == "-o") {
        if (i + 1 >= argc) return Status::Error("-o needs an option list");
        list = argv[++i];
      } else {
        list = a.substr(2);
      }
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        std::string opt = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!opt.empty()) {
          if (opt == "debug") {
            o.debug = o.foreground = true;
          } else if (Status s = ApplyOption(opt, o); !s.ok()) {
            return s;
          }
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (!a.empty() && a[0] == '-') {
      return Status::Error("unknown argument '" + a + "' (see ckptfs --help)");
    } else {
      positional.push_back(a);
    }
  }
  if (o.show_help || o.show_version) return o;
  if (positional.size() != 2) {
    return Status::Error("expected SRC and MOUNTPOINT, got " + std::to_string(positional.size()) +
                         " argument(s) (see ckptfs --help)");
  }
  o.source = positional[0];
  o.mountpoint = positional[1];
  if (o.fsname.empty()) o.fsname = o.source;
  // Storage shared with other nodes (and their writers) is checked against
  // forgery, not only corruption, unless the operator says otherwise.
  if (!o.verify_given) o.verify = o.manifests.empty() ? Verify::kAuto : Verify::kSha256;
  if (o.manifests.empty() && (!o.manifest_keys.empty() || !o.manifest_sign.empty())) {
    return Status::Error("options manifest_keys= and manifest_sign= need manifests=DIR");
  }
  if (!o.manifests.empty() && o.manifest_keys.empty() && o.manifest_sign.empty()) {
    return Status::Error("option manifests=" + o.manifests +
                         " needs manifest_keys=FILE (keys to trust) or manifest_sign=FILE (a key to sign with, "
                         "whose public half is trusted); make keys with ckptfsctl keygen");
  }
  return o;
}

std::string EscapeFuseOption(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// No default_permissions: the kernel would judge each inode by one owner and
// one mode, which cannot express "any source copy grants it" (DESIGN.md
// section 2); the FUSE operations check every request's caller instead.
std::string FuseOptionString(const MountOptions& o) {
  std::string fuse_opts = "ro,subtype=ckptfs,fsname=" + EscapeFuseOption(o.fsname);
  if (o.allow_other) fuse_opts += ",allow_other";
  for (const auto& f : o.fuse_options) fuse_opts += "," + f;
  return fuse_opts;
}

// Long, but one text: the --help that docs_test checks README and the man page against.
std::string MountUsage() {
  return R"(usage: ckptfs SRC MOUNTPOINT [-o OPTION[,OPTION...]]... [-f] [-d]

Mounts the model checkpoints under SRC as a read-only, content-addressed view
at MOUNTPOINT: one directory sha256-<hex> per distinct checkpoint (the SHA-256
of its canonical manifest) and by-name/ links that mirror SRC. When mount
returns, every checkpoint the index already knows is visible; the others
appear as they are indexed.

  -f                   stay in the foreground and log to standard error
                       (otherwise: daemonize and log to syslog/journald;
                       log_file= chooses either way)
  -d                   also trace every FUSE request (implies -f)
  -h, --help           print this help
  -V, --version        print the version

ckptfs options (-o):
  state=DIR            index and state directory (default /var/lib/ckptfs for
                       root, else $XDG_STATE_HOME/ckptfs)
  rescan=SECONDS       periodic full rescan of SRC, for changes inotify misses:
                       1 to 31536000, or 0 to turn it off (default 600, or 60
                       when SRC is on a filesystem where other clients'
                       changes raise no inotify event: NFS, SMB, Ceph,
                       Lustre, FUSE, ...)
  settle=SECONDS       index a checkpoint once none of its files changed for
                       this long: 0 to 31536000 (default 5)
  max_watches=N        inotify watches on directories of SRC at most
                       (default: half of fs.inotify.max_user_watches);
                       those inside or above a checkpoint come first, then
                       the rest, the directories' owners taking turns;
                       changes past the budget are seen by the periodic
                       rescan
  symlinks=POLICY      contained: follow links only when they resolve inside
                       SRC (default); follow: follow every link
  threads=N            FUSE and hashing threads (default: one per CPU)
  log=LEVEL            trace, debug, info (default), warn, error or off
  log_file=PATH|stderr|syslog
                       where the log goes once mounted: append to PATH
                       (absolute; for machines without journald or syslog),
                       standard error (kept even when daemonized), or syslog
                       (default: syslog, or stderr with -f); until the mount
                       is up every line also goes to standard error
  readahead=SIZE       kernel read-ahead for the mount, e.g. 4M (default 4M)
  cache_size=SIZE|N%   host cache, e.g. 32G or 40% (default 25% of physical
                       memory), taken as it fills: whole verified files in
                       sealed memfds, plus 1/8 (16M to 256M) for the chunk
                       path's 4 MiB chunks (all of it with fill=off); copies
                       evicted while readers still hold them (an open file,
                       a mapping) count until they let go
  passthrough=auto|off auto (default): an open of a file resident in the
                       host tier is handed to the kernel (FUSE passthrough,
                       Linux 6.9+, CAP_SYS_ADMIN), so reads and mmap run at
                       page-cache speed; off: every read comes to the daemon
  fill=wait|open|preload|off  when files are copied into the host tier:
                       wait (default): at their first open, which waits for
                       the copy and then passes through (a file that does
                       not fit is served by the chunk path; an O_DIRECT
                       open, or one of a loader reading every shard's
                       header first, begins the copy and is served from it
                       as it is made); open: in the
                       background at their first open, which the chunk path
                       serves meanwhile; both then copy the other shards
                       beside it in the background while they fit; preload:
                       only by ckptfsctl preload; off: never (chunks only)
  fill_on_index=free|off  free (default): a file hashed at indexing is also
                       copied into the host tier's free room from the very
                       bytes hashed, so a new checkpoint is resident (and
                       passes through) when its digest appears, from one
                       read of the disk; nothing resident is evicted for it
                       (a file that does not fit is filled at its first
                       open, as fill= says); off: indexing only hashes
  page_reserve=auto|off|SIZE  on a VM that reports free memory to its
                       host (where a fresh 2 MiB page is slow to touch),
                       the host tier keeps up to SIZE of its free room in
                       2 MiB pages, taken in the background (at most
                       about half of one CPU when others want it) from
                       memory that holds nothing (while more than 1G is
                       free), and hands them to the copies it makes, at
                       indexing and at first opens (faster arrivals and
                       loads); a claim short of room takes them back
                       first. auto (default): half of the tier, at
                       most 8G, where free pages are reported (none
                       elsewhere); off: none; SIZE: at least 2M
  fill_depth=N         4 MiB source reads in flight for all fills together
                       (default 16)
  verify=auto|xxh3|sha256  what every byte served is checked against:
                       xxh3: each 4 MiB chunk's XXH3-128 from the index
                       (catches corruption, not bytes crafted to pass it);
                       sha256: also the file's SHA-256, each chunk
                       against the SHA-256 chain the index took with it
                       (for a row without one, from before it or from a
                       manifest: a whole copy before it is sealed and, on
                       the chunk path, a pass over the whole file first);
                       auto: sha256 for bytes
                       read from a copy that users other than root, the
                       mount's owner and trusted_writers= may change (they
                       own it or a directory from SRC down to it, or it or
                       such a directory has a group or other write bit, or
                       it is on another filesystem than SRC's), xxh3 for
                       the others. Copies made at indexing are
                       checked against the SHA-256 either way (they are
                       made from the bytes hashed). Default: sha256 with
                       manifests= (shared storage), else auto
  trusted_writers=USER[:USER...]  users (names or uids) whose copies
                       verify=auto reads on their XXH3-128s alone, as it
                       does root's and the mount owner's: the accounts
                       that write SRC (a trainer, a hub downloader) and
                       that you trust not to forge bytes (default: none)
  fill_io=auto|buffered|direct  how fills read the source: auto
                       (default): a 4 MiB chunk mostly in the source's page
                       cache from there, one mostly not with O_DIRECT, so
                       that a copy in the host tier is not also kept in the
                       source's page cache; buffered: always through the
                       page cache; direct: always with O_DIRECT (a source
                       that refuses O_DIRECT is read buffered; stats says
                       so)
  shmem_huge=advise|keep   advise (default): when the kernel's
                       transparent_hugepage/shmem_enabled is still its
                       default (never), set it to advise, so the host
                       tier's memfds get 2 MiB pages (loads and fills run
                       faster; only shmem mappings that ask are affected);
                       the setting stays after unmount; keep: leave it alone
  gpu=INDEX|auto|sim   register pinned host-tier copies (preload --pin) with
                       CUDA device INDEX (cudaHostRegister, read-only), so
                       an engine's copy of them to the device is a DMA;
                       auto: the first device if there is one (else a
                       warning); sim: a simulated device (testing). Nothing
                       is kept in device memory
  manifests=DIR        shared manifest store (on the filesystem that holds
                       SRC): before hashing a file, use a trusted record of
                       it (same path, size and mtime) that another node
                       published; publish the records of files hashed here
                       that every user may read (when manifest_sign= is
                       given). Every chunk read is
                       still checked; a record that does not match its file
                       gives EIO, is reported and the file is hashed here
  manifest_keys=FILE   Ed25519 public keys (PEM) whose records are trusted;
                       unsigned and other records are ignored with a warning
  manifest_sign=FILE   Ed25519 private key (PEM, from ckptfsctl keygen) that
                       signs the records this node publishes; its public
                       half is trusted too
  supervise=on|off     on (default): a small supervisor process holds the
                       mount and runs the serving daemon as its child; when
                       the daemon dies it starts another, which takes the
                       mount over (no "Transport endpoint is not connected"),
                       and `ckptfsctl restart` upgrades it in place; off: one
                       process, and the mount dies with it
  handover_timeout=SECONDS  how long the new daemon of a `ckptfsctl restart`
                       may take to serve, 1 to 3600 (default 120); then it
                       is stopped and the old one serves on
  stamp_headers        serve each *.safetensors file with "ckptfs.checkpoint"
                       and "ckptfs.sha256" added to its header's __metadata__,
                       so caches keyed on raw headers tell checkpoints apart
                       (off by default: then every byte is the source's)

FUSE and mount options (-o), passed on:
  allow_other          let every user in; each request is then checked
                       against the source: a user gets what some source
                       copy would give them, and no more
  fsname=NAME          source name shown in /proc/mounts (default SRC)
  subtype=, max_read=, auto_unmount, nodev, nosuid, noexec, noatime, ...
  ro                   always on
  default_permissions  ignored: the daemon checks each request itself
  defaults, nofail, _netdev, auto, noauto, user, users, x-*   ignored

fstab: type ckptfs (through mount.ckptfs) or fuse.ckptfs (through mount.fuse3):
  SRC  /models  ckptfs       ro,allow_other,nofail  0 0
  SRC  /models  fuse.ckptfs  ro,allow_other,nofail  0 0

Restart and upgrade: with supervise=on a daemon that dies is restarted and
resumes the mount; `ckptfsctl restart MOUNTPOINT` hands it to a new binary.
SIGTERM to the supervisor (the process mount started) unmounts, except under
systemd during a restart job (systemctl restart ckptfs@X), which keeps it.
Recovery after the whole mount died ("Transport endpoint is not connected";
supervise=off, or the supervisor was killed): fusermount3 -u -z MOUNTPOINT
(or umount -l MOUNTPOINT), then mount again.
)";
}

unsigned FuseLoopThreads(const MountOptions& o) { return std::max(4u, 2 * EffectiveThreads(o.threads)); }

}  // namespace ckptfs
