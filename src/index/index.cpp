#include "ckptfs/index.h"
#include "ckptfs/mutex.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace ckptfs {

namespace {

// "ckpt" in ASCII: marks the file as ours, so a foreign SQLite database at
// the same path is recognised and set aside instead of being written into.
constexpr int kApplicationId = 0x636b7074;
// 2: rows carry row_sum. An index of version 1 is set aside and rebuilt
// rather than migrated: its rows have no sum to prove them. The files
// table's `chain` and `chain_sum` columns (the file's ChunkChain, and its
// sum with the row's) came within version 2: an index without them gets
// them on open, NULL in its rows (the chain unknown until the file is
// hashed again), so an upgrade hashes nothing; and row_sum stays what it
// was, so a daemon from before the chain reads these rows as its own
// (ignoring the chain) rather than hashing their files again.
constexpr int kSchemaVersion = 2;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS files(
  dev INTEGER NOT NULL, ino INTEGER NOT NULL,
  size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
  sha256 BLOB NOT NULL, chunk_size INTEGER NOT NULL, chunks BLOB NOT NULL,
  path TEXT NOT NULL, indexed_at INTEGER NOT NULL, row_sum BLOB NOT NULL, chain BLOB, chain_sum BLOB,
  PRIMARY KEY (dev, ino)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS files_by_sha256 ON files(sha256);
CREATE TABLE IF NOT EXISTS checkpoints(
  name TEXT PRIMARY KEY, manifest TEXT NOT NULL,
  total_size INTEGER NOT NULL, file_count INTEGER NOT NULL, indexed_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stamped_sizes(
  sha256 BLOB PRIMARY KEY, size INTEGER NOT NULL, row_sum BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sources(
  root TEXT NOT NULL, rel_path TEXT NOT NULL, name TEXT NOT NULL, seen_at INTEGER NOT NULL,
  PRIMARY KEY (root, rel_path));
)sql";

// RAII prepared statement: its own, or one of the index's cached statements
// (borrowed: reset, not finalized, when done).
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  explicit Stmt(sqlite3_stmt* borrowed) : s_(borrowed), rc_(borrowed != nullptr ? SQLITE_OK : SQLITE_ERROR),
                                          borrowed_(true) {}
  ~Stmt() {
    if (!borrowed_) sqlite3_finalize(s_);
    else if (s_ != nullptr) Reset();
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return s_; }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void Bind(int i, uint64_t v) { sqlite3_bind_int64(s_, i, static_cast<int64_t>(v)); }
  void Bind(int i, const std::string& v) { sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT); }
  // A zero-length blob stays a blob (sqlite would bind a null pointer as NULL,
  // which the NOT NULL columns refuse: an empty member file has no chunks).
  void BindBlob(int i, const void* p, size_t n) {
    if (n == 0) sqlite3_bind_zeroblob(s_, i, 0);
    else sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_TRANSIENT);
  }
  int Step() { return sqlite3_step(s_); }
  void Reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  int64_t Int(int col) { return sqlite3_column_int64(s_, col); }
  std::string Text(int col) {
    auto p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, col))) : std::string();
  }
  std::string Blob(int col) {
    auto p = static_cast<const char*>(sqlite3_column_blob(s_, col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, col))) : std::string();
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_;
  bool borrowed_ = false;
};

// The first column of the statement's row as text; nullopt when there is no
// row; `error()` when the step fails.
template <typename Error>
Result<std::optional<std::string>> TextOrAbsent(Stmt& s, Error error) {
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) return error();
  return std::optional<std::string>(s.Text(0));
}

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// The SHA-256 of every field a files row is trusted for, so that a row
// damaged on disk or edited by hand (sha256 set to zeroes) is detected and
// its file hashed again instead of being served under a wrong digest. It
// guards against damage, not against someone who can write the index (the
// state directory is the daemon's own, mode 0700).
Sha256Digest RowSum(const FileStamp& stamp, const std::string& sha, int64_t chunk_size, const std::string& chunks,
                    const std::string& path) {
  Sha256 h;
  const std::string fields = "ckptfs-row-v2/" + std::to_string(stamp.dev) + "/" + std::to_string(stamp.ino) + "/" +
                             std::to_string(stamp.size) + "/" + std::to_string(stamp.mtime_ns) + "/" +
                             std::to_string(stamp.ctime_ns) + "/" + std::to_string(chunk_size) + "/" +
                             std::to_string(sha.size()) + "/" + std::to_string(chunks.size()) + "/" +
                             std::to_string(path.size()) + "/";
  h.Update(fields.data(), fields.size());
  h.Update(sha.data(), sha.size());
  h.Update(chunks.data(), chunks.size());
  h.Update(path.data(), path.size());
  return h.Finish();
}

// The chain's sum, bound to its row's (so that a chain cannot move to a
// row of other bytes unnoticed).
Sha256Digest ChainSum(const Sha256Digest& row_sum, const std::string& chain) {
  Sha256 h;
  const std::string fields = "ckptfs-chain-v1/" + std::to_string(chain.size()) + "/";
  h.Update(fields.data(), fields.size());
  h.Update(row_sum.data(), row_sum.size());
  h.Update(chain.data(), chain.size());
  return h.Finish();
}

bool SameBytes(const std::string& blob, const Sha256Digest& digest) {
  return blob.size() == digest.size() && std::memcmp(blob.data(), digest.data(), digest.size()) == 0;
}

// The same for a stamped_sizes row. (The table came after schema 2 and is
// created in place on open: it only adds what can be recomputed.)
Sha256Digest StampedSizeRowSum(const Sha256Digest& file, uint64_t size) {
  const std::string fields = "ckptfs-stamped-size-v1/" + ToHex(file) + "/" + std::to_string(size);
  return Sha256Of(fields);
}

// Decodes a stored row into FileHashes, refusing anything malformed.
std::optional<FileHashes> DecodeHashes(uint64_t size, const std::string& sha, int64_t chunk_size,
                                       const std::string& chunks, const std::optional<std::string>& chain) {
  const uint64_t links = size > 0 ? ChunkCount(size) - 1 : 0;
  if (sha.size() != 32 || chunk_size != static_cast<int64_t>(kChunkSize) ||
      chunks.size() != ChunkCount(size) * sizeof(ChunkHash) ||
      (chain && chain->size() != links * sizeof(Sha256State))) {
    return std::nullopt;
  }
  FileHashes h;
  h.size = size;
  std::memcpy(h.sha256.data(), sha.data(), 32);
  h.chunks.resize(ChunkCount(size));
  if (!chunks.empty()) std::memcpy(h.chunks.data(), chunks.data(), chunks.size());
  if (chain) {
    h.chain.emplace(links);
    if (links > 0) std::memcpy(h.chain->data(), chain->data(), chain->size());
  }
  return h;
}

// A BLOB column that may be NULL (an absent chain).
std::optional<std::string> OptionalBlob(sqlite3_stmt* s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL) return std::nullopt;
  auto p = static_cast<const char*>(sqlite3_column_blob(s, col));
  return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s, col))) : std::string();
}

Status MakeDirsImpl(const std::string& dir) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno("cannot create state directory " + partial, errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno("state directory " + dir, errno);
  if (!S_ISDIR(st.st_mode)) return Status::Error("state directory " + dir + ": Not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return Status::FromErrno("state directory " + dir, errno);
  return Status::Ok();
}

// Checks that an open database is an intact ckptfs index (or empty), and
// returns why not otherwise.
std::optional<std::string> Inspect(sqlite3* db) {
  int app_id = -1, version = -1, tables = -1;
  {
    Stmt s(db, "PRAGMA quick_check");
    if (!s.ok()) return std::string(sqlite3_errmsg(db));
    int rc = s.Step();
    if (rc != SQLITE_ROW) return std::string(sqlite3_errmsg(db));
    std::string verdict = s.Text(0);
    if (verdict != "ok") return "integrity check failed: " + verdict;
  }
  {
    Stmt s(db, "PRAGMA application_id");
    if (!s.ok() || s.Step() != SQLITE_ROW) return std::string(sqlite3_errmsg(db));
    app_id = static_cast<int>(s.Int(0));
  }
  {
    Stmt s(db, "PRAGMA user_version");
    if (!s.ok() || s.Step() != SQLITE_ROW) return std::string(sqlite3_errmsg(db));
    version = static_cast<int>(s.Int(0));
  }
  {
    Stmt s(db, "SELECT count(*) FROM sqlite_schema");
    if (!s.ok() || s.Step() != SQLITE_ROW) return std::string(sqlite3_errmsg(db));
    tables = static_cast<int>(s.Int(0));
  }
  if (app_id == 0 && tables == 0) return std::nullopt;  // a new, empty file
  if (app_id != kApplicationId) return "not a ckptfs index (a foreign SQLite database)";
  if (version != kSchemaVersion) {
    return "index schema version " + std::to_string(version) + ", this ckptfs uses " +
           std::to_string(kSchemaVersion);
  }
  return std::nullopt;
}

std::string Timestamp() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  struct tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

// Renames the index and its WAL files aside; returns the new name of the index.
Result<std::string> SetAside(const std::string& path) {
  const std::string aside = path + ".bad-" + Timestamp() + "-" + std::to_string(::getpid());
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    return Status::FromErrno("cannot move damaged index " + path + " aside", errno);
  }
  for (const char* suffix : {"-wal", "-shm"}) {
    std::string from = path + suffix;
    std::string to = aside + suffix;
    if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT) {
      ::unlink(from.c_str());
    }
  }
  return aside;
}

Result<sqlite3*> OpenDb(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return Status::Error("cannot open index " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 10000);
  return db;
}

}  // namespace

Status PrepareStateDir(const std::string& dir) { return MakeDirsImpl(dir); }

std::string DefaultStateDir() {
  if (::geteuid() == 0) return "/var/lib/ckptfs";
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/ckptfs";
  }
  const char* home = std::getenv("HOME");
  std::string h = home ? home : "";
  if (h.empty()) {
    if (passwd* pw = ::getpwuid(::geteuid())) h = pw->pw_dir;
  }
  return h + "/.local/state/ckptfs";
}

Result<std::unique_ptr<Index>> Index::Open(const std::string& state_dir, std::vector<std::string>* warnings) {
  if (Status s = PrepareStateDir(state_dir); !s.ok()) return s;
  const std::string path = state_dir + "/" + kFileName;

  for (int attempt = 0; attempt < 2; ++attempt) {
    auto db = OpenDb(path);
    if (!db.ok()) return db.status();
    std::optional<std::string> problem = Inspect(*db);
    if (!problem) {
      std::unique_ptr<Index> index(new Index(*db, path));
      // A checkpoint of the WAL into the database syncs both files; every 8,192
      // pages (32 MiB) rather than SQLite's 1,000: a first index of 20,000
      // small files then costs a few syncs, not 30 (each one a round trip
      // to the disk). Commits stay atomic whatever the interval.
      for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA wal_autocheckpoint=8192",
                              kSchema}) {
        if (Status s = index->Exec(sql); !s.ok()) return s;
      }
      if (Status s = index->AddChainColumns(); !s.ok()) return s;
      if (Status s = index->Exec(("PRAGMA application_id=" + std::to_string(kApplicationId)).c_str()); !s.ok()) {
        return s;
      }
      if (Status s = index->Exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str()); !s.ok()) {
        return s;
      }
      return index;
    }
    sqlite3_close(*db);
    auto aside = SetAside(path);
    if (!aside.ok()) return aside.status();
    if (warnings) {
      warnings->push_back("index " + path + " is unusable (" + *problem + "); moved it aside to " + *aside +
                          " and rebuilding");
    }
  }
  return Status::Error("index " + path + " is still unusable after being rebuilt");
}

Index::~Index() {
  for (auto& [sql, stmt] : cached_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

sqlite3_stmt* Index::Cached(const char* sql) {
  sqlite3_stmt*& stmt = cached_[sql];
  if (stmt == nullptr && sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    stmt = nullptr;
    cached_.erase(sql);
    return nullptr;
  }
  return stmt;
}

Result<int> Index::ChainColumns() {
  Stmt s(db_, "SELECT count(*) FROM pragma_table_info('files') WHERE name IN ('chain', 'chain_sum')");
  if (!s.ok() || s.Step() != SQLITE_ROW) return SqlError("cannot read the files table's columns");
  return static_cast<int>(s.Int(0));
}

Status Index::AddChainColumns() {
  auto found = ChainColumns();
  if (!found.ok() || *found == 2) return found.status();
  // Looked at again and added in one transaction: a daemon and ckptfsctl
  // opening the same index at once must not both add them (the second
  // would fail on a duplicate column).
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  Status failed;
  for (const char* column : {"chain", "chain_sum"}) {
    Stmt has(db_, "SELECT count(*) FROM pragma_table_info('files') WHERE name=?1");
    has.Bind(1, std::string(column));
    if (!has.ok() || has.Step() != SQLITE_ROW) {
      failed = SqlError("cannot read the files table's columns");
      break;
    }
    if (has.Int(0) > 0) continue;
    if (failed = Exec(("ALTER TABLE files ADD COLUMN " + std::string(column) + " BLOB").c_str()); !failed.ok()) break;
  }
  if (failed.ok()) return Exec("COMMIT");
  (void)Exec("ROLLBACK");
  return failed;
}

Status Index::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return Status::Error("index " + path_ + ": " + msg);
  }
  return Status::Ok();
}

Status Index::SqlError(const std::string& what) const {
  return Status::Error("index " + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
}

Result<std::optional<FileHashes>> Index::LookupFile(const FileStamp& stamp) {
  auto stored = LookupInode(stamp.dev, stamp.ino);
  if (!stored.ok()) return stored.status();
  if (!*stored || (*stored)->stamp != stamp) return std::optional<FileHashes>();
  return std::optional<FileHashes>(std::move((*stored)->hashes));
}

namespace {

constexpr const char* kSelectFile =
    "SELECT size, mtime_ns, ctime_ns, sha256, chunk_size, chunks, path, row_sum, chain, chain_sum FROM files WHERE "
    "dev=?1 AND ino=?2";

// The row of (dev, ino) through `s` (kSelectFile), checked against its sum;
// nullopt when absent or damaged. `error` makes the Status of a failed step.
template <typename Error>
Result<std::optional<Index::StoredFile>> ReadFileRow(Stmt& s, uint64_t dev, uint64_t ino, Error error) {
  s.Reset();
  s.Bind(1, dev);
  s.Bind(2, ino);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return std::optional<Index::StoredFile>();
  if (rc != SQLITE_ROW) return error();
  Index::StoredFile f;
  f.stamp = {dev, ino, static_cast<uint64_t>(s.Int(0)), s.Int(1), s.Int(2)};
  const std::string sha = s.Blob(3), chunks = s.Blob(5), path = s.Text(6), sum = s.Blob(7);
  const std::optional<std::string> chain = OptionalBlob(s.get(), 8);
  const Sha256Digest expect = RowSum(f.stamp, sha, s.Int(4), chunks, path);
  if (!SameBytes(sum, expect) || (chain && !SameBytes(s.Blob(9), ChainSum(expect, *chain)))) {
    return std::optional<Index::StoredFile>();  // damaged row: absent; the file is hashed again and the row rewritten
  }
  auto hashes = DecodeHashes(f.stamp.size, sha, s.Int(4), chunks, chain);
  if (!hashes) return std::optional<Index::StoredFile>();  // malformed row: absent, it will be rewritten
  f.hashes = std::move(*hashes);
  f.path = path;
  return std::optional<Index::StoredFile>(std::move(f));
}

}  // namespace

Result<std::optional<Index::StoredFile>> Index::LookupInode(uint64_t dev, uint64_t ino) {
  MutexLock lock(mu_);
  Stmt s(Cached(kSelectFile));
  if (!s.ok()) return SqlError("cannot look up a file");
  return ReadFileRow(s, dev, ino, [&] { return SqlError("cannot look up a file"); });
}

Result<std::vector<std::optional<FileHashes>>> Index::LookupFiles(const std::vector<FileStamp>& stamps) {
  std::vector<std::optional<FileHashes>> out;
  out.reserve(stamps.size());
  MutexLock lock(mu_);
  // One read transaction and one statement for them all.
  if (Status s = Exec("BEGIN"); !s.ok()) return s;
  Stmt s(Cached(kSelectFile));
  Status failed = s.ok() ? Status::Ok() : SqlError("cannot look up files");
  for (size_t i = 0; failed.ok() && i < stamps.size(); ++i) {
    auto row = ReadFileRow(s, stamps[i].dev, stamps[i].ino, [&] { return SqlError("cannot look up a file"); });
    if (!row.ok()) {
      failed = row.status();
      break;
    }
    if (*row && (*row)->stamp == stamps[i]) out.push_back(std::move((*row)->hashes));
    else out.push_back(std::nullopt);
  }
  // A read transaction ends either way; one left open would make the next
  // BEGIN fail, so a failed COMMIT is an error too.
  if (Status committed = Exec("COMMIT"); failed.ok()) failed = committed;
  if (!failed.ok()) return failed;
  return out;
}

Status Index::PutFile(const FileStamp& stamp, const std::string& path, const FileHashes& hashes) {
  MutexLock lock(mu_);
  return PutFileLocked(stamp, path, hashes);
}

Status Index::AddChain(const FileStamp& stamp, const Sha256Digest& sha256, const ChunkChain& chain) {
  if (stamp.size == 0 || chain.size() + 1 != ChunkCount(stamp.size)) {
    return Status::Error("index " + path_ + ": a chain of " + std::to_string(chain.size()) + " states for a file of " +
                         std::to_string(stamp.size) + " bytes");
  }
  MutexLock lock(mu_);
  Stmt s(Cached(kSelectFile));
  if (!s.ok()) return SqlError("cannot look up a file");
  auto row = ReadFileRow(s, stamp.dev, stamp.ino, [&] { return SqlError("cannot look up a file"); });
  if (!row.ok()) return row.status();
  if (!*row || (*row)->stamp != stamp || (*row)->hashes.sha256 != sha256 || (*row)->hashes.chain) return Status::Ok();
  FileHashes with = std::move((*row)->hashes);
  with.chain = chain;
  return PutFileLocked(stamp, (*row)->path, with);
}

Status Index::PutBatch(const std::vector<FileRow>& files, const std::vector<CheckpointRow>& checkpoints) {
  if (files.empty() && checkpoints.empty()) return Status::Ok();
  MutexLock lock(mu_);
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  Status failed;
  for (const auto& f : files) {
    if (failed = PutFileLocked(f.stamp, f.path, f.hashes); !failed.ok()) break;
  }
  for (const auto& c : checkpoints) {
    if (!failed.ok()) break;
    failed = PutCheckpointLocked(c.name, c.manifest, c.total_size, c.file_count);
    if (failed.ok()) failed = PutSourceLocked(c.real_root, c.rel_path, c.name);
  }
  if (failed.ok()) failed = Exec("COMMIT");
  if (!failed.ok()) {  // nothing of the batch stays; its files are hashed again
    if (Status undone = Exec("ROLLBACK"); !undone.ok()) {
      return Status::Error(failed.message() + "; and then " + undone.message());
    }
  }
  return failed;
}

Status Index::PutFileLocked(const FileStamp& stamp, const std::string& path, const FileHashes& hashes) {
  Stmt s(
      Cached("INSERT OR REPLACE INTO files(dev, ino, size, mtime_ns, ctime_ns, sha256, chunk_size, chunks, path, "
             "indexed_at, row_sum, chain, chain_sum) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"));
  if (!s.ok()) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  s.Bind(1, stamp.dev);
  s.Bind(2, stamp.ino);
  s.Bind(3, stamp.size);
  s.Bind(4, stamp.mtime_ns);
  s.Bind(5, stamp.ctime_ns);
  s.BindBlob(6, hashes.sha256.data(), hashes.sha256.size());
  s.Bind(7, kChunkSize);
  s.BindBlob(8, hashes.chunks.data(), hashes.chunks.size() * sizeof(ChunkHash));
  s.Bind(9, path);
  s.Bind(10, Now());
  const std::string sha(reinterpret_cast<const char*>(hashes.sha256.data()), hashes.sha256.size());
  const std::string chunks(reinterpret_cast<const char*>(hashes.chunks.data()),
                           hashes.chunks.size() * sizeof(ChunkHash));
  const Sha256Digest sum = RowSum(stamp, sha, static_cast<int64_t>(kChunkSize), chunks, path);
  s.BindBlob(11, sum.data(), sum.size());
  if (hashes.chain) {  // else both NULL, as bindings start
    const std::string chain(reinterpret_cast<const char*>(hashes.chain->data()),
                            hashes.chain->size() * sizeof(Sha256State));
    s.BindBlob(12, chain.data(), chain.size());
    const Sha256Digest chain_sum = ChainSum(sum, chain);
    s.BindBlob(13, chain_sum.data(), chain_sum.size());
  }
  if (s.Step() != SQLITE_DONE) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Status Index::ForgetFile(uint64_t dev, uint64_t ino) {
  MutexLock lock(mu_);
  Stmt s(db_, "DELETE FROM files WHERE dev=?1 AND ino=?2");
  if (!s.ok()) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  s.Bind(1, dev);
  s.Bind(2, ino);
  if (s.Step() != SQLITE_DONE) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Result<std::optional<uint64_t>> Index::LookupStampedSize(const Sha256Digest& file) {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT size, row_sum FROM stamped_sizes WHERE sha256=?1");
  if (!s.ok()) return SqlError("cannot look up a stamped size");
  s.BindBlob(1, file.data(), file.size());
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return std::optional<uint64_t>();
  if (rc != SQLITE_ROW) return SqlError("cannot look up a stamped size");
  const uint64_t size = static_cast<uint64_t>(s.Int(0));
  const std::string sum = s.Blob(1);
  const Sha256Digest expect = StampedSizeRowSum(file, size);
  if (!SameBytes(sum, expect)) {
    return std::optional<uint64_t>();  // damaged row: the header is read again and the row rewritten
  }
  return std::optional<uint64_t>(size);
}

Status Index::PutStampedSize(const Sha256Digest& file, uint64_t size) {
  MutexLock lock(mu_);
  Stmt s(db_, "INSERT OR REPLACE INTO stamped_sizes(sha256, size, row_sum) VALUES (?1, ?2, ?3)");
  if (!s.ok()) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  s.BindBlob(1, file.data(), file.size());
  s.Bind(2, size);
  const Sha256Digest sum = StampedSizeRowSum(file, size);
  s.BindBlob(3, sum.data(), sum.size());
  if (s.Step() != SQLITE_DONE) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Status Index::PutCheckpoint(const std::string& name, const std::string& manifest, uint64_t total_size,
                            uint64_t file_count) {
  MutexLock lock(mu_);
  return PutCheckpointLocked(name, manifest, total_size, file_count);
}

Status Index::PutCheckpointLocked(const std::string& name, const std::string& manifest, uint64_t total_size,
                                  uint64_t file_count) {
  Stmt s(Cached(
         "INSERT INTO checkpoints(name, manifest, total_size, file_count, indexed_at) VALUES (?1, ?2, ?3, ?4, ?5) "
         "ON CONFLICT(name) DO NOTHING"));
  if (!s.ok()) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  s.Bind(1, name);
  s.Bind(2, manifest);
  s.Bind(3, total_size);
  s.Bind(4, file_count);
  s.Bind(5, Now());
  if (s.Step() != SQLITE_DONE) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Status Index::PutSource(const std::string& real_root, const std::string& rel_path, const std::string& name) {
  MutexLock lock(mu_);
  return PutSourceLocked(real_root, rel_path, name);
}

Status Index::PutSourceLocked(const std::string& real_root, const std::string& rel_path, const std::string& name) {
  Stmt s(Cached("INSERT OR REPLACE INTO sources(root, rel_path, name, seen_at) VALUES (?1, ?2, ?3, ?4)"));
  if (!s.ok()) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  s.Bind(1, real_root);
  s.Bind(2, rel_path);
  s.Bind(3, name);
  s.Bind(4, Now());
  if (s.Step() != SQLITE_DONE) return Status::Error("index " + path_ + ": " + sqlite3_errmsg(db_));
  return Status::Ok();
}

Result<std::optional<std::string>> Index::LookupSource(const std::string& real_root, const std::string& rel_path) {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT name FROM sources WHERE root=?1 AND rel_path=?2");
  if (!s.ok()) return SqlError("cannot look up a source");
  s.Bind(1, real_root);
  s.Bind(2, rel_path);
  return TextOrAbsent(s, [&] { return SqlError("cannot look up a source"); });
}

Result<std::optional<std::string>> Index::LookupManifest(const std::string& name) {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT manifest FROM checkpoints WHERE name=?1");
  if (!s.ok()) return SqlError("cannot look up a manifest");
  s.Bind(1, name);
  return TextOrAbsent(s, [&] { return SqlError("cannot look up a manifest"); });
}

std::optional<int64_t> Index::CheckpointIndexedAt(const std::string& name) {
  MutexLock lock(mu_);
  Stmt s(db_, "SELECT indexed_at FROM checkpoints WHERE name=?1");
  if (!s.ok()) return std::nullopt;
  s.Bind(1, name);
  if (s.Step() != SQLITE_ROW) return std::nullopt;
  return s.Int(0);
}

}  // namespace ckptfs
