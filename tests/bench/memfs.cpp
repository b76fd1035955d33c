// ckptfs-bench-memfs FILE MOUNTPOINT [READAHEAD_KB]: the fastest FUSE read
// this machine allows, as a ceiling for the benchmarks. Loads FILE into
// memory and serves it as MOUNTPOINT/data with the same kernel settings as
// ckptfs (keep_cache, max_readahead, the BDI's read_ahead_kb, a
// multithreaded loop), and nothing else: no checks, no cache logic.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::vector<char> g_data;
unsigned g_readahead = 4u << 20;

void Init(void*, fuse_conn_info* conn) { conn->max_readahead = g_readahead; }

void Attr(fuse_ino_t ino, struct stat* st) {
  std::memset(st, 0, sizeof *st);
  st->st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(g_data.size());
  }
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent != FUSE_ROOT_ID || std::strcmp(name, "data") != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = 2;
  e.attr_timeout = e.entry_timeout = 86400;
  Attr(2, &e.attr);
  fuse_reply_entry(req, &e);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  Attr(ino, &st);
  fuse_reply_attr(req, &st, 86400);
}

void Open(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*) {
  if (static_cast<size_t>(off) >= g_data.size()) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  fuse_reply_buf(req, g_data.data() + off, std::min(size, g_data.size() - static_cast<size_t>(off)));
}

void SetBdi(const std::string& mnt, unsigned kb) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ifstream info("/proc/self/mountinfo");
  std::string line, dev;
  while (std::getline(info, line)) {
    std::istringstream ss(line);
    std::string id, parent, d, root, point;
    ss >> id >> parent >> d >> root >> point;
    if (point == mnt) dev = d;
  }
  std::ofstream("/sys/class/bdi/" + dev + "/read_ahead_kb") << kb;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ckptfs-bench-memfs FILE MOUNTPOINT [READAHEAD_KB]\n");
    return 2;
  }
  if (argc > 3) g_readahead = static_cast<unsigned>(std::stoul(argv[3])) * 1024;
  std::ifstream in(argv[1], std::ios::binary);
  g_data.assign(std::istreambuf_iterator<char>(in), {});
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.getattr = GetAttr;
  ops.open = Open;
  ops.read = Read;
  char arg0[] = "memfs", o[] = "-o", opts[] = "ro,fsname=memfs";
  char* fargv[] = {arg0, o, opts};
  fuse_args args = FUSE_ARGS_INIT(3, fargv);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[2]) != 0) return 1;
  fuse_daemonize(0);
  std::thread([mnt = std::string(argv[2])] { SetBdi(mnt, g_readahead / 1024); }).detach();
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(cfg, 1);
  fuse_loop_cfg_set_max_threads(cfg, 8);
  int rc = fuse_session_loop_mt(se, cfg);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  return rc;
}
