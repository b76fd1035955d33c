// The daemon's command line (mount_options.h): every option in the form
// mount.fuse3 passes it, bad values refused with a message naming them, and
// the -o string handed to libfuse, checked by libfuse's own parser so that a
// comma or backslash in SRC cannot inject an option.
#include "mount_options.h"

#include "ckptfs/file_server.h"

#define FUSE_USE_VERSION 312
#include <fuse_opt.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckptfs {
namespace {

Result<MountOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ckptfs");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseMountOptions(static_cast<int>(argv.size()), argv.data());
}

MountOptions ParseOk(const std::string& opts) {
  auto o = Parse({"/srv/src", "/models", "-o", opts});
  EXPECT_TRUE(o.ok()) << opts << ": " << o.status().message();
  return o.ok() ? *o : MountOptions{};
}

std::string ErrorOf(std::vector<std::string> args) {
  auto o = Parse(std::move(args));
  return o.ok() ? "(accepted)" : o.status().message();
}

TEST(MountOptionsTest, DefaultsAndPositionals) {
  auto o = Parse({"/srv/src", "/models"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->source, "/srv/src");
  EXPECT_EQ(o->mountpoint, "/models");
  EXPECT_EQ(o->fsname, "/srv/src");
  EXPECT_FALSE(o->foreground);
  EXPECT_EQ(o->rescan_s, 600);
  EXPECT_EQ(o->settle_s, 5);
  EXPECT_EQ(o->symlinks, SymlinkPolicy::kContained);
  EXPECT_EQ(o->readahead, 4ull << 20);
  EXPECT_EQ(o->fill, FillPolicy::kWait);
  EXPECT_TRUE(o->passthrough);
  EXPECT_FALSE(o->allow_other);
  EXPECT_FALSE(o->stamp_headers);
  EXPECT_TRUE(o->fuse_options.empty());
}

TEST(MountOptionsTest, EveryOwnOptionIsApplied) {
  const MountOptions o = ParseOk(
      "state=/var/lib/x,rescan=0,settle=2.5,symlinks=follow,threads=8,fill_depth=3,log=debug,"
      "log_file=/var/log/ckptfs.log,readahead=8M,cache_size=32G,gpu=1,passthrough=off,"
      "fill=wait,fsname=models,stamp_headers,allow_other,page_reserve=3G");
  EXPECT_EQ(o.state_dir, "/var/lib/x");
  EXPECT_EQ(o.rescan_s, 0);
  EXPECT_EQ(o.settle_s, 2.5);
  EXPECT_EQ(o.symlinks, SymlinkPolicy::kFollow);
  EXPECT_EQ(o.threads, 8u);
  EXPECT_EQ(o.fill_depth, 3u);
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
  EXPECT_EQ(o.log_to, LogTo::kFile);
  EXPECT_EQ(o.log_file, "/var/log/ckptfs.log");
  EXPECT_EQ(o.readahead, 8ull << 20);
  EXPECT_EQ(o.cache_size, 32ull << 30);
  EXPECT_EQ(o.gpu, GpuChoice::kIndex);
  EXPECT_EQ(o.gpu_index, 1);
  EXPECT_FALSE(o.passthrough);
  EXPECT_EQ(o.fill, FillPolicy::kWait);
  EXPECT_EQ(o.fsname, "models");
  EXPECT_TRUE(o.stamp_headers);
  EXPECT_TRUE(o.allow_other);
  EXPECT_EQ(o.page_reserve_bytes, 3ull << 30);
  EXPECT_FALSE(o.page_reserve_off);
  EXPECT_TRUE(o.fuse_options.empty()) << "allow_other is ours to pass on, once";
  EXPECT_TRUE(ParseOk("page_reserve=off").page_reserve_off);
  const MountOptions automatic = ParseOk("page_reserve=4G,page_reserve=auto");  // the last one counts
  EXPECT_FALSE(automatic.page_reserve_off);
  EXPECT_EQ(automatic.page_reserve_bytes, 0u);
}

// Each word of an option is read into its value, and that value is shown
// (`ckptfsctl status`, `stats`) as the same word, from the same table.
template <class T, size_t N>
void ExpectWordsRoundTrip(const std::string& key, const OptionWord<T> (&table)[N],
                          const std::vector<std::pair<std::string, T>>& expected, T MountOptions::*field) {
  EXPECT_EQ(N, expected.size()) << key << ": a word the test does not know, or one gone";
  for (const auto& [word, value] : expected) {
    EXPECT_TRUE(ParseOk(key + "=" + word).*field == value) << key << "=" << word;
    EXPECT_EQ(WordOf(table, value), word) << key << "=" << word;
  }
}

TEST(MountOptionsTest, EveryEnumeratedValueIsParsedOnceAndShownAsItsWord) {
  using Io = SourceReader::Io;
  using Fill = HostTierFill::Policy;
  ExpectWordsRoundTrip<LogLevel>("log", kLogLevelWords,
                                 {{"trace", LogLevel::kTrace},
                                  {"debug", LogLevel::kDebug},
                                  {"info", LogLevel::kInfo},
                                  {"warn", LogLevel::kWarn},
                                  {"error", LogLevel::kError},
                                  {"off", LogLevel::kOff}},
                                 &MountOptions::log_level);
  ExpectWordsRoundTrip<FillPolicy>(
      "fill", kFillPolicyWords,
      {{"open", FillPolicy::kOpen}, {"wait", FillPolicy::kWait}, {"preload", FillPolicy::kPreload}, {"off", FillPolicy::kOff}},
      &MountOptions::fill);
  ExpectWordsRoundTrip<Io>("fill_io", kSourceIoWords,
                           {{"buffered", Io::kBuffered}, {"direct", Io::kDirect}, {"auto", Io::kAuto}},
                           &MountOptions::fill_io);
  ExpectWordsRoundTrip<Fill>("fill_on_index", kFillOnIndexWords, {{"free", Fill::kFree}, {"off", Fill::kOff}},
                             &MountOptions::fill_on_index);
  ExpectWordsRoundTrip<Verify>("verify", kVerifyWords,
                               {{"xxh3", Verify::kXxh3}, {"sha256", Verify::kSha256}, {"auto", Verify::kAuto}},
                               &MountOptions::verify);
  ExpectWordsRoundTrip<SymlinkPolicy>("symlinks", kSymlinkPolicyWords,
                                      {{"contained", SymlinkPolicy::kContained}, {"follow", SymlinkPolicy::kFollow}},
                                      &MountOptions::symlinks);
  ExpectWordsRoundTrip<bool>("passthrough", kPassthroughWords, {{"auto", true}, {"off", false}},
                             &MountOptions::passthrough);
  ExpectWordsRoundTrip<bool>("shmem_huge", kShmemHugeWords, {{"advise", true}, {"keep", false}},
                             &MountOptions::shmem_huge_advise);
  ExpectWordsRoundTrip<bool>("supervise", kSuperviseWords, {{"on", true}, {"off", false}}, &MountOptions::supervise);
  ExpectWordsRoundTrip<LogTo>("log_file", kLogToWords, {{"stderr", LogTo::kStderr}, {"syslog", LogTo::kSyslog}},
                              &MountOptions::log_to);
  ExpectWordsRoundTrip<GpuChoice>("gpu", kGpuWords, {{"auto", GpuChoice::kAuto}, {"sim", GpuChoice::kSim}},
                                  &MountOptions::gpu);
  EXPECT_EQ(ParseOk("gpu=0").gpu, GpuChoice::kIndex);
  EXPECT_EQ(ParseOk("gpu=7").gpu_index, 7);
  EXPECT_EQ(ParseOk("cache_size=40%").cache_percent, 40);
}

// The defaults of the options not given, as --help states them.
TEST(MountOptionsTest, DefaultsOfTheEnumeratedOptions) {
  const MountOptions o = ParseOk("settle=1");
  EXPECT_EQ(o.log_level, LogLevel::kInfo);
  EXPECT_EQ(o.log_to, LogTo::kDefault);
  EXPECT_EQ(o.gpu, GpuChoice::kNone);
  EXPECT_EQ(o.fill, FillPolicy::kWait);
  EXPECT_EQ(o.fill_io, SourceReader::Io::kAuto);
  EXPECT_EQ(o.fill_on_index, HostTierFill::Policy::kFree);
  EXPECT_TRUE(o.shmem_huge_advise);
  EXPECT_TRUE(o.supervise);
}

// One default fill policy: what a file server does when no one set its
// policy is what the mount option's default says.
TEST(MountOptionsTest, TheFileServersFillPolicyIsTheOptionsDefault) {
  const FileServer::Options serving;
  EXPECT_EQ(serving.fill, ParseOk("settle=1").fill);
  EXPECT_EQ(serving.fill, MountOptions{}.fill);
}

// Storage shared with other nodes (manifests=) is checked against forgery by
// default; a mount of its own storage against corruption, and against
// forgery where users other than root and the mount's owner write (auto).
TEST(MountOptionsTest, VerifyIsSha256WhereStorageIsSharedUnlessSaidOtherwise) {
  EXPECT_EQ(ParseOk("settle=1").verify, Verify::kAuto);
  EXPECT_EQ(ParseOk("verify=xxh3").verify, Verify::kXxh3);
  EXPECT_EQ(ParseOk("verify=sha256").verify, Verify::kSha256);
  EXPECT_EQ(ParseOk("manifests=/srv/m,manifest_keys=/etc/k.pem").verify, Verify::kSha256);
  EXPECT_EQ(ParseOk("manifests=/srv/m,manifest_keys=/etc/k.pem,verify=xxh3").verify, Verify::kXxh3);
  auto bad = Parse({"/srv/src", "/models", "-o", "verify=md5"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("verify=md5"), std::string::npos) << bad.status().message();
}

// trusted_writers= takes names and uids, colon-separated (a comma ends the
// option), and refuses a name this node does not know rather than trust
// nobody, or the wrong uid, in silence.
TEST(MountOptionsTest, TrustedWritersAreNamesOrUids) {
  EXPECT_TRUE(ParseOk("settle=1").trusted_writers.empty());
  EXPECT_EQ(ParseOk("trusted_writers=root:1001:65534").trusted_writers, (std::vector<uid_t>{0, 1001, 65534}));
  std::string many = "trusted_writers=1";  // the bound: 64 users
  for (int uid = 2; uid <= 64; ++uid) many += ":" + std::to_string(uid);
  EXPECT_EQ(ParseOk(many).trusted_writers.size(), 64u);
  auto past = Parse({"/srv/src", "/models", "-o", many + ":65"});
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("at most 64"), std::string::npos) << past.status().message();
  for (const char* bad : {"trusted_writers=no-such-user-ckptfs", "trusted_writers=1001::1002",
                          "trusted_writers=", "trusted_writers=1x"}) {
    auto r = Parse({"/srv/src", "/models", "-o", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("trusted_writers="), std::string::npos) << r.status().message();
  }
}

TEST(MountOptionsTest, FuseOptionsPassOnAndBookkeepingIsIgnored) {
  const MountOptions o = ParseOk(
      "ro,default_permissions,nodev,nosuid,noatime,auto_unmount,subtype=x,max_read=131072,defaults,nofail,_netdev,"
      "auto,noauto,user,users,x-systemd.automount,comment=foo");
  EXPECT_EQ(o.fuse_options,
            (std::vector<std::string>{"nodev", "nosuid", "noatime", "auto_unmount", "subtype=x", "max_read=131072"}));
}

// mount.ckptfs passes every option on (it keeps no list of its own): each
// one that means something to mount(8), fstab or systemd is ignored here.
TEST(MountOptionsTest, EveryMountBookkeepingOptionIsIgnored) {
  for (const char* opt : {"_netdev", "nofail", "auto", "noauto", "user", "nouser", "users", "owner", "group",
                          "defaults", "comment=systemd.x", "x-systemd.automount", "x-systemd.requires=/mnt/nfs",
                          "loop"}) {
    const MountOptions o = ParseOk(opt);
    EXPECT_TRUE(o.fuse_options.empty()) << opt;
  }
}

TEST(MountOptionsTest, FlagsAndOptionListForms) {
  auto o = Parse({"-f", "/srv/src", "-orescan=1", "/models", "-o", "settle=3", "-o", "debug"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_TRUE(o->foreground);
  EXPECT_TRUE(o->debug);
  EXPECT_EQ(o->rescan_s, 1);
  EXPECT_EQ(o->settle_s, 3);
  auto d = Parse({"/a", "/b", "-d"});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->debug && d->foreground);
  EXPECT_TRUE(Parse({"-odebug", "/a", "/b"})->debug);
  EXPECT_TRUE(Parse({"--help"})->show_help);
  EXPECT_TRUE(Parse({"-h"})->show_help);
  EXPECT_TRUE(Parse({"-V"})->show_version);
  EXPECT_TRUE(Parse({"--version"})->show_version);
  EXPECT_EQ(ParseOk(",,rescan=7,").rescan_s, 7) << "empty items in a list are skipped";
}

TEST(MountOptionsTest, BadValuesAreRefusedNamingTheOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"state=relative/dir", "option state=relative/dir: must be an absolute path"},
      {"state", "option state needs a value"},
      {"state=", "option state needs a value"},
      {"rescan=-1", "option rescan=-1: expected a number of seconds"},
      {"rescan=soon", "option rescan=soon: expected a number of seconds"},
      {"settle=nan", "option settle=nan: expected a number of seconds"},
      {"settle=9.3e9", "option settle=9.3e9: expected a number of seconds from 0 to 31536000"},
      {"symlinks=always", "option symlinks=always: expected contained or follow"},
      {"threads=0", "option threads=0: expected 1 to 1024"},
      {"threads=1025", "option threads=1025: expected 1 to 1024"},
      {"threads=4x", "option threads=4x: expected 1 to 1024"},
      {"fill_depth=65", "option fill_depth=65: expected 1 to 64"},
      {"log=loud", "option log=loud: expected trace, debug, info, warn, error or off"},
      {"log_file=ckptfs.log", "option log_file=ckptfs.log: expected an absolute path, stderr or syslog"},
      {"readahead=1K", "option readahead=1K: expected 4K to 1G"},
      {"readahead=2G", "option readahead=2G: expected 4K to 1G"},
      {"readahead=4X", "option readahead=4X: unknown size suffix"},
      {"cache_size=8M", "option cache_size=8M: at least 16M"},
      {"cache_size=0%", "option cache_size=0%: expected a size (e.g. 32G) or a percentage"},
      {"cache_size=101%", "option cache_size=101%: expected a size (e.g. 32G) or a percentage"},
      {"cache_size=-5G", "option cache_size=-5G: not a size"},
      // The GPU chunk tier was removed: an fstab line that still sizes it
      // is told so, in one line, instead of losing it silently.
      {"gpu_cache_size=40G", "option gpu_cache_size= is gone: the GPU chunk tier was removed"},
      {"gpu_cache_size=50%", "option gpu_cache_size= is gone: the GPU chunk tier was removed"},
      {"gpu=-1", "option gpu=-1: expected a device index, auto or sim"},
      {"gpu=first", "option gpu=first: expected a device index, auto or sim"},
      // Once taken, then cut to an int where it was used: device 0.
      {"gpu=4294967296", "option gpu=4294967296: expected a device index, auto or sim"},
      {"gpu=99999999999999999999", "option gpu=99999999999999999999: expected a device index, auto or sim"},
      {"passthrough=on", "option passthrough=on: expected auto or off"},
      {"fill=never", "option fill=never: expected open, wait, preload or off"},
      {"page_reserve=1M", "option page_reserve=1M: at least 2M (one 2 MiB page)"},
      {"page_reserve=lots", "option page_reserve=lots: expected auto, off or a size"},
      {"page_reserve", "option page_reserve needs a value"},
      {"fsname=", "option fsname needs a value"},
      {"rw", "option rw: ckptfs is read-only"},
      {"writeback", "unknown option 'writeback' (see ckptfs --help)"},
  };
  for (const auto& [opt, message] : cases) {
    const std::string got = ErrorOf({"/a", "/b", "-o", opt});
    EXPECT_EQ(got.find(message), 0u) << opt << " -> " << got;
  }
}

TEST(MountOptionsTest, BadCommandLinesAreRefused) {
  EXPECT_EQ(ErrorOf({"/a", "/b", "-o"}), "-o needs an option list");
  EXPECT_EQ(ErrorOf({"/a", "/b", "--frobnicate"}), "unknown argument '--frobnicate' (see ckptfs --help)");
  EXPECT_EQ(ErrorOf({"/a"}).find("expected SRC and MOUNTPOINT, got 1 argument(s)"), 0u);
  EXPECT_EQ(ErrorOf({"/a", "/b", "/c"}).find("expected SRC and MOUNTPOINT, got 3 argument(s)"), 0u);
}

TEST(MountOptionsTest, SizesTakeBinarySuffixesAndRefuseOverflow) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4K"), 4096u);
  EXPECT_EQ(*ParseSize("4k"), 4096u);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("4MB"), 4ull << 20);
  EXPECT_EQ(*ParseSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseSize("1T"), 1ull << 40);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("G").ok());
  EXPECT_FALSE(ParseSize("-1").ok());
  EXPECT_FALSE(ParseSize("4P").ok());
  EXPECT_EQ(ParseSize("99999999999T").status().message(), "size too large: 99999999999T");
  EXPECT_FALSE(ParseSize("99999999999999999999999").ok());
}

// What libfuse makes of the -o string: the fsname intact, and allow_other
// only when asked for.
struct FuseSeen {
  char* fsname = nullptr;
  int allow_other = 0;
  int subtype_seen = 0;
};

FuseSeen ParseAsLibfuse(const std::string& option_string) {
  static const fuse_opt kSpec[] = {{"fsname=%s", offsetof(FuseSeen, fsname), 0},
                                   {"allow_other", offsetof(FuseSeen, allow_other), 1},
                                   {"subtype=ckptfs", offsetof(FuseSeen, subtype_seen), 1},
                                   FUSE_OPT_END};
  std::string arg0 = "ckptfs", dash_o = "-o", opts = option_string;
  char* argv[] = {arg0.data(), dash_o.data(), opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, argv);
  FuseSeen seen;
  EXPECT_EQ(fuse_opt_parse(&args, &seen, kSpec, nullptr), 0) << option_string;
  fuse_opt_free_args(&args);
  return seen;
}

TEST(MountOptionsTest, CommasAndBackslashesInTheSourceCannotInjectOptions) {
  EXPECT_EQ(EscapeFuseOption("/srv/a,allow_other"), "/srv/a\\,allow_other");
  EXPECT_EQ(EscapeFuseOption("C:\\models"), "C:\\\\models");
  for (const std::string src : {"/srv/a,allow_other", "/srv/back\\slash", "/srv/tail\\", "/srv/plain"}) {
    auto o = Parse({src, "/models"});
    ASSERT_TRUE(o.ok()) << src;
    FuseSeen seen = ParseAsLibfuse(FuseOptionString(*o));
    ASSERT_NE(seen.fsname, nullptr) << src;
    EXPECT_EQ(std::string(seen.fsname), src);
    EXPECT_EQ(seen.allow_other, 0) << src << " turned allow_other on";
    EXPECT_EQ(seen.subtype_seen, 1);
    std::free(seen.fsname);
  }
  auto with = Parse({"/srv/a", "/models", "-o", "allow_other,nodev"});
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(FuseOptionString(*with), "ro,subtype=ckptfs,fsname=/srv/a,allow_other,nodev");
  EXPECT_EQ(ParseAsLibfuse(FuseOptionString(*with)).allow_other, 1);
}

}  // namespace
}  // namespace ckptfs
