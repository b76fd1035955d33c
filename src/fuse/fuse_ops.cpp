#include "ckptfs/fuse_ops.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <sys/uio.h>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include <exception>

#include "ckptfs/mutex.h"
#include "ckptfs/unique_fd.h"
#include "connection_io.h"
#include "open_handles.h"
#include "passthrough_shim.h"
#include "reply_errno.h"
#include "request_caller.h"

namespace ckptfs::fuse {

namespace {

FsContext& Ctx(fuse_req_t req) { return *static_cast<FsContext*>(fuse_req_userdata(req)); }

struct stat ToStat(const View::Node& n) {
  struct stat st {};
  st.st_ino = n.ino;
  st.st_uid = n.owner.uid;
  st.st_gid = n.owner.gid;
  st.st_size = static_cast<off_t>(n.size);
  st.st_blksize = 4096;
  st.st_blocks = static_cast<blkcnt_t>((n.size + 511) / 512);
  st.st_mtim = st.st_ctim = st.st_atim = n.mtime;
  switch (n.kind) {
    case View::Kind::kDir:
      st.st_mode = S_IFDIR | n.owner.mode;
      st.st_nlink = 2;
      break;
    case View::Kind::kFile:
      st.st_mode = S_IFREG | n.owner.mode;
      st.st_nlink = 1;
      break;
    case View::Kind::kSymlink:
      st.st_mode = S_IFLNK | 0777;
      st.st_nlink = 1;
      break;
  }
  return st;
}

// The node `ino`, or null after replying ENOENT (the kernel asked about a
// node this daemon no longer holds).
View::NodePtr NodeOrReply(fuse_req_t req, fuse_ino_t ino) {
  auto n = Ctx(req).view->Get(ino);
  if (!n) fuse_reply_err(req, ENOENT);
  return n;
}

int UseWant(const View::Node& n) { return n.kind == View::Kind::kDir ? kWantRead | kWantSearch : kWantRead; }

// How long the kernel may keep an entry and its attributes. A node that not
// every user may use gets none: the kernel's caches are shared by all users,
// so each path walk must come back here to be checked against its caller.
double Timeout(const FsContext& ctx, const View::Node& n) {
  if (!OpenToEveryone(n.access, UseWant(n))) return 0;
  return n.immutable ? ctx.immutable_timeout_s : ctx.mutable_timeout_s;
}

// The access rule for this request's caller; replies EACCES and returns
// false when it refuses. `want` 0 asks only whether the node is reachable.
bool Allowed(fuse_req_t req, const View::Node& n, int want) {
  if (n.access.empty()) return true;
  Caller caller = CallerOf(req);
  if (MayAccess(n.access, caller, want)) return true;
  fuse_reply_err(req, EACCES);
  return false;
}

// What a caller must be able to do to some source copy for an entry of the
// root or by-name to be there for them at all. A digest directory's name is
// drawn from every byte below it: it is shown only to whoever could enter a
// copy (search on the checkpoint directory itself), not to whoever could
// merely stat one, as a 0700 checkpoint directory in a 0755 parent lets
// everyone do. (A by-name link asks the same through its access path:
// ViewBuilder::ReachOf.)
int WantToSee(fuse_ino_t parent, const View::Node& n) {
  return parent == kRootInode && n.kind == View::Kind::kDir ? kWantSearch : 0;
}

constexpr std::string_view kSourcesXattr = "user.ckptfs.sources";

// The most an extended attribute may hold (XATTR_SIZE_MAX): a longer one
// fails every getxattr of it with E2BIG, for everyone.
constexpr size_t kXattrSizeMax = 65536;
// Room kept at the end of a capped user.ckptfs.sources for its last line.
constexpr size_t kNotListedLine = 128;

// user.ckptfs.sources as this caller may read it: only the copies whose
// path they could learn in SRC (ckptfsctl ls filters the same way), in the
// order stored. Capped below XATTR_SIZE_MAX: one writer's thousands of hard
// links to a public model made the attribute of root's checkpoint fail for
// everyone (found attacking the daemon). Then the copies of root and of the
// caller come first, others as room remains, and a last line counts those
// left out.
std::string SourcesFor(fuse_req_t req, const View::Node& n, const std::string& stored) {
  Caller caller = CallerOf(req);
  struct Line {
    size_t pos, len;
    bool first;  // root's or the caller's copy
  };
  std::vector<Line> known;
  size_t bytes = 0;
  for (size_t line = 0, pos = 0; pos < stored.size(); ++line) {
    size_t end = stored.find('\n', pos);
    if (end == std::string::npos) end = stored.size();
    if (line < n.source_access.size() && MayKnowCopy(n.source_access[line], caller)) {
      const uid_t owner = n.source_access[line].self.uid;
      known.push_back({pos, end - pos, owner == 0 || owner == caller.uid()});
      bytes += end - pos + 1;
    }
    pos = end + 1;
  }
  std::vector<bool> listed(known.size(), true);
  size_t left_out = 0;
  if (bytes > kXattrSizeMax) {
    size_t room = kXattrSizeMax - kNotListedLine;
    for (const bool first : {true, false}) {
      for (size_t i = 0; i < known.size(); ++i) {
        if (known[i].first != first) continue;
        listed[i] = known[i].len + 1 <= room;
        if (listed[i]) room -= known[i].len + 1;
        else ++left_out;
      }
    }
  }
  std::string out;
  for (size_t i = 0; i < known.size(); ++i) {
    if (listed[i]) out.append(stored, known[i].pos, known[i].len).push_back('\n');
  }
  if (left_out > 0) out += "(" + std::to_string(left_out) + " more copies not listed: the list is capped at 64 KiB)\n";
  return out;
}

// The node's attributes, with its size as served (stamp_headers).
Result<struct stat> AttrOf(FsContext& ctx, const View::NodePtr& n) {
  struct stat st = ToStat(*n);
  if (n->kind != View::Kind::kFile || ctx.server == nullptr) return st;
  auto size = ctx.server->ServedSize(n);
  if (!size.ok()) return size.status();
  st.st_size = static_cast<off_t>(*size);
  return st;
}

void ReplyEntry(fuse_req_t req, const View::NodePtr& n) {
  auto attr = AttrOf(Ctx(req), n);
  if (!attr.ok()) {
    fuse_reply_err(req, ReplyErrno(attr.status()));
    return;
  }
  fuse_entry_param e{};
  e.ino = n->ino;
  e.generation = n->generation;
  e.attr = *attr;
  e.attr_timeout = e.entry_timeout = Timeout(Ctx(req), *n);
  // Counted before the reply, as passthrough_hp does: once the kernel has
  // the entry it may FORGET it at once, on another thread, and a count
  // taken after that would never be given back (the node would be held for
  // ever). A reply the kernel did not take (the request was interrupted)
  // gives the count back. (The reply frees `req`: take the view first.)
  View* view = Ctx(req).view;
  const auto delay = Ctx(req).entry_reply_delay;
  view->Remember(n);
  if (fuse_reply_entry(req, &e) != 0) view->Forget(n->ino, 1);
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
}

void Init(void* userdata, fuse_conn_info* conn) {
  auto& ctx = *static_cast<FsContext*>(userdata);
  conn->max_readahead = static_cast<unsigned>(ctx.readahead);
  if (ctx.max_background > 0) {
    conn->max_background = ctx.max_background;
    // Past this many the kernel stops reading ahead: kept at its default's
    // proportion (3/4).
    conn->congestion_threshold = ctx.max_background * 3 / 4;
  }
  // Content never changes under a name, so the kernel may keep it cached.
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_AUTO_INVAL_DATA);
  // Passthrough excludes the writeback cache; a read-only view never wants it.
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_WRITEBACK_CACHE);
  if (ctx.passthrough) ctx.passthrough->OnInit(conn);
  if (ctx.on_init) ctx.on_init();
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto& ctx = Ctx(req);
  auto n = ctx.view->Lookup(parent, name);
  auto p = n ? nullptr : ctx.view->Get(parent);
  if (!n && p && p->immutable) {
    // A digest directory's names never change: a negative entry cached as
    // long as the directory's own.
    fuse_entry_param e{};
    e.entry_timeout = ctx.immutable_timeout_s;
    fuse_reply_entry(req, &e);
    return;
  }
  // A digest that no copy lets the caller reach does not exist for them:
  // ENOENT, as for a digest nobody holds, so that knowing a digest tells no
  // one that a private copy of it exists (the root's listing hides it too).
  // The same for by-name: which of a user's links lead to another's
  // private checkpoints, and what they hold, is not theirs to learn.
  // An unknown name in the root or by-name gets the same reply, one the
  // kernel does not cache: a cached negative entry for unknown names only
  // would answer them faster than hidden ones, and that difference in time
  // would tell which guesses exist. (The kernel's cache is shared by all
  // users, so hidden names cannot be the ones cached instead.)
  auto hidden = [&] {
    Caller caller = CallerOf(req);
    return (parent == kRootInode || !n->immutable) && !n->access.empty() &&
           !MayAccess(n->access, caller, WantToSee(parent, *n));
  };
  if (!n || hidden()) {
    ctx.lookups_not_found.fetch_add(1, std::memory_order_relaxed);
    fuse_reply_err(req, ENOENT);
    return;
  }
  if (!Allowed(req, *n, 0)) return;
  ReplyEntry(req, n);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  auto n = NodeOrReply(req, ino);
  if (!n) return;
  // As for its lookup: a descriptor of a digest directory taken before its
  // checkpoint directory was closed to the caller stats it no more.
  if (!Allowed(req, *n, WantToSee(n->parent, *n))) return;
  auto attr = AttrOf(Ctx(req), n);
  if (!attr.ok()) {
    fuse_reply_err(req, ReplyErrno(attr.status()));
    return;
  }
  fuse_reply_attr(req, &*attr, Timeout(Ctx(req), *n));
}

void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Ctx(req).view->Forget(ino, nlookup);
  fuse_reply_none(req);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Ctx(req).view->Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void ReadLink(fuse_req_t req, fuse_ino_t ino) {
  auto n = Ctx(req).view->Get(ino);
  if (!n || n->kind != View::Kind::kSymlink) {
    fuse_reply_err(req, n ? EINVAL : ENOENT);
    return;
  }
  if (!Allowed(req, *n, 0)) return;
  // The kernel takes a target of at most a page less its NUL; a longer
  // reply it refuses (EINVAL on the device), and the reader would hang on.
  if (n->link_target.size() >= 4096) {
    fuse_reply_err(req, ENAMETOOLONG);
    return;
  }
  fuse_reply_readlink(req, n->link_target.c_str());
}

// Directory `ino` opened for this request's caller, or null after replying
// with why not.
std::shared_ptr<DirHandle> ListDir(fuse_req_t req, fuse_ino_t ino) {
  auto& ctx = Ctx(req);
  auto n = NodeOrReply(req, ino);
  if (!n) return nullptr;
  if (n->kind != View::Kind::kDir) {
    fuse_reply_err(req, ENOTDIR);
    return nullptr;
  }
  if (!Allowed(req, *n, kWantRead)) return nullptr;
  auto h = std::make_shared<DirHandle>();
  h->dir = n;
  // ".." as the directory that lists this one; the mount root's parent lies
  // outside the filesystem, so its ".." is itself, as in every FUSE root.
  h->parent = ctx.view->Get(n->parent);
  if (!h->parent) h->parent = ctx.view->Get(kRootInode);
  if (!h->parent) h->parent = n;
  // The root lists every digest and by-name every checkpoint path: show
  // each caller only those it may reach (a link of theirs to another's
  // private checkpoint included). A digest directory lists like its source
  // (reading one copy of it is enough).
  h->filtered = !n->immutable;
  return h;
}

void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  auto h = ListDir(req, ino);
  if (!h) return;
  const View::Node& n = *h->dir;
  fi->fh = ctx.handles->AddDir(h);
  fi->cache_readdir = n.immutable && OpenToEveryone(n.access, kWantRead | kWantSearch);
  fi->keep_cache = n.immutable;
  if (fuse_reply_open(req, fi) == -ENOENT) ctx.handles->RemoveDir(fi->fh);  // interrupted: no release comes
}

void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  auto h = ctx.handles->Dir(fi->fh);
  if (!h) {  // opened by the daemon this one took over from: list it again
    h = ListDir(req, ino);
    if (!h) return;
    ctx.handles->AdoptDir(fi->fh, h);
  }
  std::vector<char> buf(size);
  size_t used = 0;
  // Adds the entry at index `i`; false when the reply has no room for it.
  auto add = [&](const std::string& name, const View::Node& node, off_t i) {
    const struct stat st = ToStat(node);
    const size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, i + 1);
    if (need > size - used) return false;
    used += need;
    return true;
  };
  off_t i = std::max<off_t>(off, 0);
  if (i == 0 && add(".", *h->dir, 0)) i = 1;
  if (i == 1 && add("..", *h->parent, 1)) i = 2;
  if (i >= 2) {
    std::optional<Caller> caller;
    if (h->filtered) caller.emplace(CallerOf(req));
    const fuse_ctx* asking = fuse_req_ctx(req);
    const std::pair<uid_t, gid_t> who = caller ? std::pair{asking->uid, asking->gid} : std::pair<uid_t, gid_t>{};
    // A child as the view has it now: by the inode it had at the open, or
    // by its name where a publish since gave it another (a by-name link
    // moved to a new digest is never missing from a listing in progress).
    bool withdrawn = false;
    auto shown = [&](const std::pair<const std::string, InodeId>& child) -> View::NodePtr {
      View::NodePtr c = ctx.view->Get(child.second);
      if (!c) c = ctx.view->Lookup(h->dir->ino, child.first);
      if (!c) withdrawn = true;
      if (!c || (caller && !MayAccess(c->access, *caller, WantToSee(h->dir->ino, *c)))) return nullptr;
      return c;
    };
    const auto& children = h->dir->children;
    MutexLock lock(h->mu);
    auto it = children.begin();
    off_t at = 2;  // the offset of *it
    if (h->next_offset == i && h->counted_for == who) {
      it = h->next;
      at = i;
    } else if (!h->filtered) {  // a seekdir: every child has its place
      const auto k = std::min<uint64_t>(static_cast<uint64_t>(i - 2), children.size());
      std::advance(it, k);
      at = 2 + static_cast<off_t>(k);
    } else {  // in a filtered directory, the places are the caller's own: count them
      for (; it != children.end() && at < i; ++it) {
        if (shown(*it)) ++at;
      }
    }
    h->next_offset = at;
    h->next = it;
    h->counted_for = who;
    for (; it != children.end(); ++it) {
      View::NodePtr c = shown(*it);
      if (withdrawn && h->dir->immutable) break;
      if (c) {
        if (!add(it->first, *c, at)) break;
        h->next_offset = at + 1;
        h->next = std::next(it);
      }
      if (c || !h->filtered) ++at;
    }
    // A directory inside a digest lists the same entries for as long as it
    // lives. Its digest was withdrawn since the open (its members are gone
    // from the view): an error, not a listing with holes that the kernel
    // would keep for the digest if it came back.
    if (withdrawn && h->dir->immutable) {
      fuse_reply_err(req, ENOENT);
      return;
    }
  }
  fuse_reply_buf(req, buf.data(), used);
}

void ReleaseDir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Ctx(req).handles->RemoveDir(fi->fh);  // unknown (a predecessor's): nothing to free
  fuse_reply_err(req, 0);
}

// The first open of an inode chooses: passthrough when the file is resident
// and the kernel gives backing files, else the chunk path (see OpenModes).
OpenModes::Choice ChooseMode(FsContext& ctx, fuse_req_t req, const FileKey& key) {
  OpenModes::Choice c;
  c.copy = ctx.server->Resident(key);
  if (!c.copy) {
    c.why = "not resident";
    return c;
  }
  if (!ctx.passthrough || ctx.passthrough->mode() == KernelPassthrough::Mode::kOff) {
    c.why = "passthrough off";
    return c;
  }
  if (c.copy->in_memory()) {  // a small file: served by the daemon from its memory
    c.why = "held in memory";
    return c;
  }
  // One backing id per copy, kept while the copy lives: every inode that
  // holds the file shares it.
  c.backing = c.copy->Attachment([&](int fd) -> std::shared_ptr<CopyAttachment> {
    auto b = ctx.passthrough->OpenBacking(req, fd);
    if (!b.ok()) spdlog::warn("{}: {}", c.copy->name(), b.status().message());
    return b.ok() ? *b : nullptr;
  });
  if (!c.backing) {
    c.why = "backing file refused";
    return c;
  }
  c.passthrough = true;
  return c;
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  auto n = NodeOrReply(req, ino);
  if (!n) return;
  if (n->kind != View::Kind::kFile) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
    fuse_reply_err(req, EROFS);
    return;
  }
  if (!Allowed(req, *n, kWantRead)) return;
  auto served = ctx.server->Open(n, fi->flags, ctx.open_modes.IsOpen(ino), fuse_req_ctx(req)->pid);
  if (!served.ok()) {
    fuse_reply_err(req, ReplyErrno(served.status()));
    return;
  }
  auto f = std::make_shared<OpenFile>();
  f->served = *served;
  ServedFile& file = *f->served;
  ctx.server->Opened(file);
  int sent;
  if (n->content) {  // a file the daemon holds itself (a hub ref): no source, no copy, no mode
    fi->fh = ctx.handles->AddFile(f);
    fi->keep_cache = 1;
    fi->noflush = 1;
    if (fuse_reply_open(req, fi) == -ENOENT && ctx.handles->TakeFile(fi->fh)) ctx.server->Closed(file);
    return;
  }
  // An inode open already is served the way its first open chose.
  const OpenModes::Choice choice = ctx.open_modes.Open(
      ino, [&] { return ChooseMode(ctx, req, file.key); }, [&] { return ctx.server->Resident(file.key, /*use=*/false); });
  file.copy = choice.copy;
  fi->fh = ctx.handles->AddFile(f);
  if (choice.passthrough) {
    ctx.opens.Count("passthrough");
    sent = ctx.passthrough->ReplyOpen(req, fi, *choice.backing);
  } else {
    ctx.opens.Count(std::string("chunk path: ") + choice.why);
    fi->keep_cache = 1;  // the bytes behind this name can never change
    fi->noflush = 1;
    sent = fuse_reply_open(req, fi);
    ctx.server->OpenedOnChunkPath(file);
  }
  if (sent == -ENOENT) {  // the open was interrupted: no release will come
    ctx.open_modes.Release(ino);
    ctx.handles->TakeFile(fi->fh);
    ctx.server->Closed(file);
  }
}

// The open file `fh`. One opened by the daemon this one took over from is
// rebuilt from its inode, which names the file (inode numbers are derived
// from what a node is), and served by the chunk path: passthrough opens
// never send reads. Null after replying EIO (a node no longer in the view).
std::shared_ptr<OpenFile> FileOrAdopt(fuse_req_t req, fuse_ino_t ino, uint64_t fh) {
  auto& ctx = Ctx(req);
  if (auto f = ctx.handles->File(fh)) return f;
  auto n = ctx.view->Get(ino);
  Result<std::shared_ptr<ServedFile>> served = Status::Error("not a file");
  if (n && n->kind == View::Kind::kFile) served = ctx.server->Adopt(n);
  if (!served.ok()) {
    ctx.server->CountFailedRead();
    fuse_reply_err(req, EIO);
    return nullptr;
  }
  auto f = std::make_shared<OpenFile>();
  f->served = *served;
  f->inherited = ctx.open_modes.HasInherited(ino);  // already counted
  if (ctx.handles->AdoptFile(fh, f) && !f->inherited) {
    ctx.server->Opened(*f->served);
    // The kernel holds this inode in page-cache mode: opens that join it
    // must take the chunk path too until the last one is released.
    ctx.open_modes.Open(
        ino, [] { return OpenModes::Choice{false, nullptr, nullptr, "opened before a restart"}; },
        [] { return FileCache::CopyPtr(); });
  }
  return f;
}

void ReplyRead(FsContext& ctx, fuse_req_t req, const OpenFile& f, off_t off, size_t size) {
  // The bytes stay referenced until the reply has been written.
  auto bytes = ctx.server->Read(*f.served, static_cast<uint64_t>(off), size);
  if (!bytes.ok()) {
    fuse_reply_err(req, ReplyErrno(bytes.status()));
    return;
  }
  fuse_reply_iov(req, bytes->iov.data(), static_cast<int>(bytes->iov.size()));
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  auto f = FileOrAdopt(req, ino, fi->fh);
  if (!f) return;
  if (off < 0) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  FairPool* pool = nullptr;
  if (ctx.proving_reads != nullptr && ctx.server->MayWaitForAProof(*f->served)) {
    pool = ctx.proving_reads;
  } else if (ctx.source_reads != nullptr && ctx.server->MayReadTheSource(*f->served)) {
    pool = ctx.source_reads;
  }
  if (pool != nullptr) {
    // Answered from the pool's thread; the handle stays with the task. (The
    // pool would swallow an exception, and the reader would wait for ever.)
    pool->Submit(fuse_req_ctx(req)->uid, [&ctx, req, f, off, size, channel = ConnectionIo::ChannelOfThisThread()] {
      // A reader killed while its read waited here (a read handed over is
      // sent, as the kernel sees it: only the reply lets it go).
      if (fuse_req_interrupted(req)) {
        fuse_reply_err(req, EINTR);
        return;
      }
      ConnectionIo::ReplyVia via(channel);
      try {
        ReplyRead(ctx, req, *f, off, size);
      } catch (const std::exception& e) {
        spdlog::error("a read of {} failed: {}", f->served->node->source_path, e.what());
        fuse_reply_err(req, EIO);
      } catch (...) {
        spdlog::error("a read of {} failed", f->served->node->source_path);
        fuse_reply_err(req, EIO);
      }
    });
    return;
  }
  ReplyRead(ctx, req, *f, off, size);
}

void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto& ctx = Ctx(req);
  auto f = ctx.handles->TakeFile(fi->fh);
  fuse_reply_err(req, 0);
  if (!f || f->inherited) {  // opened by a daemon this one took over from
    ctx.open_modes.ReleaseInherited(ino);
    return;
  }
  uint64_t opens_since_idle = 0;
  const bool last_on_chunk_path = ctx.open_modes.Release(ino, &opens_since_idle);
  // Alone on its inode from open to release: its close may tell of a
  // header scan (FileServer::Closed).
  const bool resident = ctx.server->Closed(*f->served, /*alone=*/opens_since_idle == 1);
  // The last chunk-path reader of a file that is resident now: the next open
  // passes through, and the kernel drops an inode's page cache at every open
  // without keep_cache (passthrough forbids it), on the opener's time; do it
  // now, off this thread (a notification from a request handler could wait
  // on the kernel).
  if (last_on_chunk_path && resident && ctx.drop_page_cache && ctx.background != nullptr) {
    ctx.background->Submit([&ctx, ino] { ctx.drop_page_cache(ino); });
  }
}

void GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  auto n = NodeOrReply(req, ino);
  if (!n) return;
  if (!Allowed(req, *n, kWantRead)) return;
  for (const auto& [key, stored] : n->xattrs) {
    if (key != name) continue;
    const std::string value = key == kSourcesXattr ? SourcesFor(req, *n, stored) : stored;
    if (size == 0) fuse_reply_xattr(req, value.size());
    else if (size < value.size()) fuse_reply_err(req, ERANGE);
    else fuse_reply_buf(req, value.data(), value.size());
    return;
  }
  fuse_reply_err(req, ENODATA);
}

void ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto n = NodeOrReply(req, ino);
  if (!n) return;
  if (!Allowed(req, *n, kWantRead)) return;
  std::string names;
  for (const auto& [key, value] : n->xattrs) names += key + '\0';
  if (size == 0) fuse_reply_xattr(req, names.size());
  else if (size < names.size()) fuse_reply_err(req, ERANGE);
  else fuse_reply_buf(req, names.data(), names.size());
}

// access(2), chdir(2) and friends: without default_permissions the kernel
// asks us.
void Access(fuse_req_t req, fuse_ino_t ino, int mask) {
  auto n = NodeOrReply(req, ino);
  if (!n) return;
  if (mask & W_OK) {
    fuse_reply_err(req, EROFS);
    return;
  }
  int want = 0;
  if (mask & R_OK) want |= kWantRead;
  if (mask & X_OK) want |= kWantSearch;
  want |= WantToSee(n->parent, *n);  // as for its lookup
  if (n->kind == View::Kind::kFile && (mask & X_OK) && !(n->owner.mode & 0111)) {
    fuse_reply_err(req, EACCES);
    return;
  }
  if (!Allowed(req, *n, want)) return;
  fuse_reply_err(req, 0);
}

void StatFs(fuse_req_t req, fuse_ino_t) {
  struct statvfs sv {};
  sv.f_bsize = sv.f_frsize = 4096;
  sv.f_namemax = 255;
  sv.f_flag = ST_RDONLY;
  fuse_reply_statfs(req, &sv);
}

// Everything that would change the tree: the view is read-only.
void RoSetAttr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) { fuse_reply_err(req, EROFS); }
void RoMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { fuse_reply_err(req, EROFS); }
void RoMkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { fuse_reply_err(req, EROFS); }
void RoUnlink(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void RoSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void RoRename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) { fuse_reply_err(req, EROFS); }
void RoLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void RoCreate(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) { fuse_reply_err(req, EROFS); }
void RoSetXattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) { fuse_reply_err(req, EROFS); }
void RoRemoveXattr(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, EROFS); }
void RoWrite(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) { fuse_reply_err(req, EROFS); }

}  // namespace

void OpenCounts::Count(const std::string& how) {
  MutexLock lock(mu_);
  ++counts_[how];
}

std::map<std::string, uint64_t> OpenCounts::Get() const {
  MutexLock lock(mu_);
  return counts_;
}

fuse_lowlevel_ops MakeOperations() {
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.getattr = GetAttr;
  ops.forget = Forget;
  ops.forget_multi = ForgetMulti;
  ops.readlink = ReadLink;
  ops.opendir = OpenDir;
  ops.readdir = ReadDir;
  ops.releasedir = ReleaseDir;
  ops.open = Open;
  ops.read = Read;
  ops.release = Release;
  ops.getxattr = GetXattr;
  ops.listxattr = ListXattr;
  ops.statfs = StatFs;
  ops.access = Access;
  ops.setattr = RoSetAttr;
  ops.mknod = RoMknod;
  ops.mkdir = RoMkdir;
  ops.unlink = RoUnlink;
  ops.rmdir = RoUnlink;
  ops.symlink = RoSymlink;
  ops.rename = RoRename;
  ops.link = RoLink;
  ops.create = RoCreate;
  ops.setxattr = RoSetXattr;
  ops.removexattr = RoRemoveXattr;
  ops.write = RoWrite;
  return ops;
}

}  // namespace ckptfs::fuse
