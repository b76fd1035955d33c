// The daemon's command line, in the form mount.fuse3 uses:
//   ckptfs SRC MOUNTPOINT [-o opt[,opt...]]... [-f] [-d]
// ckptfs's own options are taken out; standard FUSE and mount options are
// passed on to libfuse; anything else is an error, reported before mounting.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckptfs/catalog.h"
#include "ckptfs/host_tier_fill.h"
#include "ckptfs/option_words.h"
#include "ckptfs/serving_policy.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/status.h"

namespace ckptfs {

// Every option is parsed once, into the types below; the words of those
// whose value is one of a few are in one table per type (option_words.h).

// log=LEVEL
enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };
inline constexpr OptionWord<LogLevel> kLogLevelWords[] = {{LogLevel::kTrace, "trace"}, {LogLevel::kDebug, "debug"},
                                                          {LogLevel::kInfo, "info"},   {LogLevel::kWarn, "warn"},
                                                          {LogLevel::kError, "error"}, {LogLevel::kOff, "off"}};

// log_file=PATH|stderr|syslog; kDefault: syslog once daemonized, stderr with -f.
enum class LogTo { kDefault, kStderr, kSyslog, kFile };
inline constexpr OptionWord<LogTo> kLogToWords[] = {{LogTo::kStderr, "stderr"}, {LogTo::kSyslog, "syslog"}};

// gpu=INDEX|auto|sim; kNone: no gpu= given.
enum class GpuChoice { kNone, kIndex, kAuto, kSim };
inline constexpr OptionWord<GpuChoice> kGpuWords[] = {{GpuChoice::kAuto, "auto"}, {GpuChoice::kSim, "sim"}};

// The words of the options that are on or off.
inline constexpr OptionWord<bool> kPassthroughWords[] = {{true, "auto"}, {false, "off"}};
inline constexpr OptionWord<bool> kShmemHugeWords[] = {{true, "advise"}, {false, "keep"}};
inline constexpr OptionWord<bool> kSuperviseWords[] = {{true, "on"}, {false, "off"}};

struct MountOptions {
  std::string source;      // SRC as given
  std::string mountpoint;  // as given
  bool foreground = false;  // -f
  bool debug = false;       // -d: FUSE request tracing, implies -f
  bool show_help = false;
  bool show_version = false;

  std::string state_dir;      // state=DIR (empty: DefaultStateDir())
  double rescan_s = 600;      // rescan=SECONDS; 0 turns the periodic rescan off
  bool rescan_given = false;  // rescan= was given (else a source without inotify gets kRemoteRescanS)
  double settle_s = 5;        // settle=SECONDS
  SymlinkPolicy symlinks = SymlinkPolicy::kContained;
  unsigned threads = 0;       // threads=N: FUSE and hashing threads; 0 = one per CPU
  unsigned max_watches = 0;   // max_watches=N: directories watched at most; 0 = half of max_user_watches
  LogLevel log_level = LogLevel::kInfo;  // log=LEVEL
  LogTo log_to = LogTo::kDefault;        // log_file=
  std::string log_file;                  // the PATH of log_file=PATH (log_to kFile)
  uint64_t readahead = 4ull << 20;  // readahead=SIZE, bytes
  // cache_size=SIZE or N% of physical memory; 0 = the default (25%).
  uint64_t cache_size = 0;
  double cache_percent = 0;
  // gpu=INDEX|auto|sim: the CUDA device that pinned host-tier copies are
  // registered with for DMA; kNone: none (they are mlocked). kSim is a
  // simulated device, for tests and for trying it without a GPU.
  GpuChoice gpu = GpuChoice::kNone;
  int gpu_index = 0;  // the INDEX of gpu=INDEX (gpu kIndex)
  // passthrough=auto|off: answer opens of resident files with kernel
  // passthrough when the kernel and our privileges allow it.
  bool passthrough = true;
  // fill=open|wait|preload|off: when files are copied into the host tier.
  FillPolicy fill = kDefaultFillPolicy;
  unsigned fill_depth = 0;  // fill_depth=N: chunk reads in flight for all fills; 0 = kDefaultFillDepth
  // fill_io=buffered|direct|auto: how fills read the source (see
  // SourceReader::Io): through its page cache, with O_DIRECT, or what is
  // cached from the cache and the rest with O_DIRECT.
  SourceReader::Io fill_io = SourceReader::Io::kAuto;
  // verify=auto|xxh3|sha256 (see Verify); without verify= set by parsing:
  // sha256 when manifests= is given, else auto.
  Verify verify = Verify::kAuto;
  bool verify_given = false;
  // trusted_writers=USER[:USER...]: uids whose copies verify=auto trusts as
  // root's and the mount owner's (SourceCopy::trusted).
  std::vector<uid_t> trusted_writers;
  // fill_on_index=free|off: whether files hashed at indexing are copied into
  // the host tier's free room from the bytes hashed (see HostTierFill).
  HostTierFill::Policy fill_on_index = HostTierFill::Policy::kFree;
  // page_reserve=auto|off|SIZE: 2 MiB pages the host tier keeps for its
  // next copies where fresh memory is slow (PageReserve). auto (SIZE 0):
  // half of the tier, at most kAutoPageReserveMax, on a VM that
  // reports free pages to its host; off: none; SIZE: that much there.
  bool page_reserve_off = false;
  uint64_t page_reserve_bytes = 0;
  // shmem_huge=advise|keep: whether the daemon may set the kernel's default
  // shmem huge-page policy to "advise" (see AskForShmemHugePages).
  bool shmem_huge_advise = true;
  bool allow_other = false;
  // supervise=on|off: a supervisor process holds the mount and restarts the
  // serving daemon when it dies (README, "Restart and upgrade").
  bool supervise = true;
  // handover_timeout=SECONDS: how long the successor a `ckptfsctl restart`
  // starts may take to report ready before it is stopped and the restart
  // fails (the serving daemon goes on).
  unsigned handover_timeout_s = 120;
  bool stamp_headers = false;  // stamp_headers: see HeaderStamper
  std::string fsname;         // fsname=, default: SRC
  // The shared manifest store (issue 15): manifests=DIR, the trusted public
  // keys manifest_keys=FILE, and the key that signs what this node publishes
  // manifest_sign=FILE. All absolute paths; empty: unused.
  std::string manifests;
  std::string manifest_keys;
  std::string manifest_sign;
  // Options handed to libfuse as "-o a,b,c" (always ro and default_permissions).
  std::vector<std::string> fuse_options;
};

// The periodic rescan when the source's filesystem does not report changes
// made by other clients (NFS, FUSE, ...) and rescan= was not given.
inline constexpr double kRemoteRescanS = 60;
// The shortest periodic rescan (rescan= other than 0): each walks all of SRC.
inline constexpr double kMinRescanS = 1;

// Parses argv (argv[0] is the program). Fails with a message naming the
// offending argument.
Result<MountOptions> ParseMountOptions(int argc, const char* const* argv);

// "4M" -> 4194304; accepts K, M, G, T (powers of 1024) and a plain byte count.
Result<uint64_t> ParseSize(const std::string& text);

// libfuse splits -o on commas and unescapes a backslash before any
// character, so a source path with a comma would otherwise inject options
// (SRC=/srv/a,allow_other turning allow_other on).
std::string EscapeFuseOption(const std::string& value);

// The -o string handed to libfuse: ro, the subtype and fsname (escaped),
// allow_other and the standard options passed through.
std::string FuseOptionString(const MountOptions& o);

// The most FUSE worker threads the session loop runs: twice the threads=
// (at least 4), so that requests waiting on the source do not hold up the
// rest. A supervisor makes as many channels (fuse_channels.h).
unsigned FuseLoopThreads(const MountOptions& o);

// The text of `ckptfs --help`.
std::string MountUsage();

}  // namespace ckptfs
