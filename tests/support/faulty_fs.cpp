// ckptfs-test-faultyfs FILE MOUNTPOINT TRIGGER [wide|two|twin]: a source filesystem that fails.
// Serves FILE as MOUNTPOINT/m/model.safetensors; once the path TRIGGER exists,
// reads that touch bytes [8 MiB, 12 MiB) fail with EIO, as a disk with a bad
// sector would. Used to test ckptfs over a source whose reads start failing
// after it was indexed. If TRIGGER holds "change", the reads work but the
// file's times move on, as if it had been rewritten in place; no inotify
// event tells ckptfs (changes made by a FUSE server raise none), so only the
// stamp checks of a read can notice. If it holds "timeout", those reads fail
// with ETIMEDOUT instead, as a network filesystem's do when its server is
// away. If it holds "stall", they fail with EIO and, besides, reads that
// touch the first 4 MiB (the first chunk) wait until TRIGGER says something
// else or is gone, as a read stuck on a dying disk does; requests are
// served by several threads, so only those reads wait. Attributes are never
// cached, so a stat sees the change at once.
// With `wide`, MOUNTPOINT/wide/ also holds kWideDirs empty directories; once
// TRIGGER holds "slow", listing each of them takes kSlowListing, and the
// first slow listing creates TRIGGER.slowed: a tree whose walk takes a
// minute, and a sign that a walk is in progress (for teardown tests).
// With `two`, MOUNTPOINT/n/model.safetensors holds FILE's bytes, each
// inverted, and never fails: a second checkpoint, to show that what
// stalls the first leaves it served. With `twin`, it holds FILE's very
// bytes (and never fails), beside an n/config.json of its own: another
// digest that shares m's file.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::vector<char> g_data;
std::string g_trigger;
std::vector<char> g_second;  // with `two` or `twin`: n/model.safetensors
bool g_wide = false, g_two = false, g_twin = false;
constexpr fuse_ino_t kDir = 2, kFile = 3, kWide = 4, kSecondDir = 5, kSecondFile = 6, kSecondConfig = 7,
                     kFirstWideDir = 1000;
constexpr char kConfig[] = "{}\n";            // with `twin`: n/config.json
bool HasSecond() { return g_two || g_twin; }  // n/ is there
constexpr uint64_t kBadBegin = 8 << 20, kBadEnd = 12 << 20, kStalledEnd = 4 << 20;
constexpr int kWideDirs = 3000;
constexpr auto kSlowListing = std::chrono::milliseconds(20);

// What TRIGGER asks for now.
enum class Fault { kNone, kBadSector, kChanged, kSlow, kTimeout, kStall };
Fault CurrentFault() {
  std::ifstream t(g_trigger);
  if (!t) return Fault::kNone;
  std::string word;
  t >> word;
  if (word == "slow") return Fault::kSlow;
  if (word == "timeout") return Fault::kTimeout;
  if (word == "stall") return Fault::kStall;
  return word == "change" ? Fault::kChanged : Fault::kBadSector;
}

std::string WideName(fuse_ino_t ino) { return "d" + std::to_string(ino - kFirstWideDir); }
bool IsWideDir(fuse_ino_t ino) { return g_wide && ino >= kFirstWideDir && ino < kFirstWideDir + kWideDirs; }

void Attr(fuse_ino_t ino, struct stat* st) {
  std::memset(st, 0, sizeof *st);
  st->st_ino = ino;
  st->st_mtim.tv_sec = st->st_ctim.tv_sec = CurrentFault() == Fault::kChanged ? 1700000001 : 1700000000;
  if (ino == kFile || ino == kSecondFile || ino == kSecondConfig) {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(ino == kSecondConfig ? sizeof kConfig - 1 : g_data.size());
  } else {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
  }
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_entry_param e{};
  if (parent == FUSE_ROOT_ID && std::strcmp(name, "m") == 0) e.ino = kDir;
  else if (HasSecond() && parent == FUSE_ROOT_ID && std::strcmp(name, "n") == 0) e.ino = kSecondDir;
  else if (HasSecond() && parent == kSecondDir && std::strcmp(name, "model.safetensors") == 0) e.ino = kSecondFile;
  else if (g_twin && parent == kSecondDir && std::strcmp(name, "config.json") == 0) e.ino = kSecondConfig;
  else if (g_wide && parent == FUSE_ROOT_ID && std::strcmp(name, "wide") == 0) e.ino = kWide;
  else if (g_wide && parent == kWide && name[0] == 'd' && IsWideDir(kFirstWideDir + std::atoi(name + 1))) {
    e.ino = kFirstWideDir + std::atoi(name + 1);
  } else if (parent == kDir && std::strcmp(name, "model.safetensors") == 0) e.ino = kFile;
  else {
    fuse_reply_err(req, ENOENT);
    return;
  }
  e.entry_timeout = 3600;
  e.attr_timeout = 0;
  Attr(e.ino, &e.attr);
  fuse_reply_entry(req, &e);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  Attr(ino, &st);
  fuse_reply_attr(req, &st, 0);
}

std::vector<std::pair<std::string, fuse_ino_t>> Entries(fuse_ino_t ino) {
  std::vector<std::pair<std::string, fuse_ino_t>> entries = {{".", ino}, {"..", FUSE_ROOT_ID}};
  if (ino == FUSE_ROOT_ID) {
    entries.emplace_back("m", kDir);
    if (g_wide) entries.emplace_back("wide", kWide);
    if (HasSecond()) entries.emplace_back("n", kSecondDir);
  } else if (ino == kDir) {
    entries.emplace_back("model.safetensors", kFile);
  } else if (ino == kSecondDir) {
    entries.emplace_back("model.safetensors", kSecondFile);
    if (g_twin) entries.emplace_back("config.json", kSecondConfig);
  } else if (ino == kWide) {
    for (fuse_ino_t i = kFirstWideDir; i < kFirstWideDir + kWideDirs; ++i) entries.emplace_back(WideName(i), i);
  } else if (IsWideDir(ino) && CurrentFault() == Fault::kSlow) {
    std::ofstream(g_trigger + ".slowed") << "walking\n";
    std::this_thread::sleep_for(kSlowListing);
  }
  return entries;
}

void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const auto entries = Entries(ino);
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < entries.size(); ++i) {
    struct stat st;
    Attr(entries[i].second, &st);
    size_t n = fuse_add_direntry(req, buf.data() + used, size - used, entries[i].first.c_str(), &st,
                                 static_cast<off_t>(i + 1));
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const uint64_t begin = static_cast<uint64_t>(off);
  if (ino == kSecondConfig) {
    fuse_reply_buf(req, kConfig + std::min<uint64_t>(begin, sizeof kConfig - 1),
                   static_cast<size_t>(sizeof kConfig - 1 - std::min<uint64_t>(begin, sizeof kConfig - 1)));
    return;
  }
  if (begin >= g_data.size()) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  const uint64_t end = std::min<uint64_t>(g_data.size(), begin + size);
  if (ino == kSecondFile) {
    fuse_reply_buf(req, g_second.data() + begin, end - begin);
    return;
  }
  if (begin < kStalledEnd) {
    while (CurrentFault() == Fault::kStall) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const Fault fault = CurrentFault();
  const bool bad = fault == Fault::kBadSector || fault == Fault::kTimeout || fault == Fault::kStall;
  if (bad && begin < kBadEnd && end > kBadBegin) {
    fuse_reply_err(req, fault == Fault::kTimeout ? ETIMEDOUT : EIO);
    return;
  }
  fuse_reply_buf(req, g_data.data() + begin, end - begin);
}

void Open(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  fi->direct_io = 1;  // every read reaches us, so the fault shows at once
  fuse_reply_open(req, fi);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 5 ? argv[4] : "";
  if (argc != 4 && mode != "wide" && mode != "two" && mode != "twin") return 2;
  g_wide = mode == "wide";
  g_two = mode == "two";
  g_twin = mode == "twin";
  std::ifstream in(argv[1], std::ios::binary);
  g_data.assign(std::istreambuf_iterator<char>(in), {});
  if (g_two || g_twin) g_second = g_data;
  if (g_two) {
    for (char& c : g_second) c = static_cast<char>(~c);
  }
  g_trigger = argv[3];
  fuse_lowlevel_ops ops{};
  ops.lookup = Lookup;
  ops.getattr = GetAttr;
  ops.readdir = ReadDir;
  ops.open = Open;
  ops.read = Read;
  char arg0[] = "faultyfs", o[] = "-o", opts[] = "ro,fsname=faultyfs";
  char* fargv[] = {arg0, o, opts};
  fuse_args args = FUSE_ARGS_INIT(3, fargv);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[2]) != 0) return 1;
  fuse_loop_config* loop = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop, 8);
  int rc = fuse_session_loop_mt(se, loop);
  fuse_loop_cfg_destroy(loop);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  return rc;
}
