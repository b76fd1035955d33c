#include "ckptfs/manifest_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "atomic_file.h"
#include "ckptfs/mutex.h"
#include "ckptfs/open_beneath.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace {

constexpr const char* kLayout = "v1";

// A record's bytes are bounded by its file's size; anything much larger at a
// record's name is not one, and is not read into memory.
uint64_t MaxRecordBytes(uint64_t file_size, const std::string& rel_path) {
  return 4096 + 3 * rel_path.size() + ChunkCount(file_size) * 33;
}

// Reads the record at `rel` beneath the store's root (`path` in messages)
// without following a symlink anywhere on the way, and only when it is a
// regular file of at most `max_bytes`: a FIFO, a device or a huge file put
// there by a writer of the store is neither waited on nor read.
Result<std::string> ReadBounded(int root, const std::string& rel, const std::string& path, uint64_t max_bytes) {
  // First without opening it (O_PATH): a device node is not even opened.
  auto probe = OpenBeneath(root, rel, O_PATH, "record " + path);
  if (!probe.ok()) {
    const int err = probe.status().error_number();
    if (err == ENOENT) return Status::NotFound(path + ": no record");
    return IsEscapeErrno(err) ? Status::Corrupt(probe.status().message()) : probe.status();
  }
  struct stat first {};
  if (::fstat(probe->get(), &first) != 0) return Status::FromErrno("cannot stat record " + path, errno);
  if (!S_ISREG(first.st_mode)) return Status::Corrupt("record " + path + " is not a regular file; ignored");
  auto fd = OpenBeneath(root, rel, O_RDONLY | O_NOCTTY | O_NONBLOCK, "record " + path);
  if (!fd.ok()) return fd.status().error_number() == ENOENT ? Status::NotFound(path + ": no record") : fd.status();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return Status::FromErrno("cannot stat record " + path, errno);
  if (!S_ISREG(st.st_mode) || st.st_dev != first.st_dev || st.st_ino != first.st_ino) {
    return Status::Corrupt("record " + path + " was replaced while it was opened; ignored");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Corrupt("record " + path + " is " + std::to_string(st.st_size) +
                           " bytes, more than a record of this file can be; ignored");
  }
  // Never more than fstat said, even if the file grows meanwhile.
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd->get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read record " + path, errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// "v1/<xx>" and "<K>.rec" of a record key K.
struct RecordName {
  std::string sub;
  std::string file;
  std::string rel() const { return sub + "/" + file; }
};

}  // namespace

Result<std::unique_ptr<ManifestStore>> ManifestStore::Open(const std::string& dir, Keyring trusted,
                                                           std::optional<SigningKey> signer) {
  // The path to the store is the operator's; what lies below it is the
  // writers'. The root is opened once, and everything below it beneath it.
  UniqueFd root(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));  // search permission is enough
  if (!root.valid()) return Status::FromErrno("manifest store " + dir, errno);
  if (signer) trusted.Add(*signer);
  if (trusted.empty()) {
    return Status::Error("manifest store " + dir + ": no key to trust (give manifest_keys=FILE, or manifest_sign=KEY "
                         "whose public half is then trusted)");
  }
  return std::unique_ptr<ManifestStore>(
      new ManifestStore(dir, std::move(root), std::move(trusted), std::move(signer)));
}

namespace {

RecordName NameOf(const std::string& rel_path, const FileStamp& stamp) {
  std::string key = "ckptfs-record-key 1";
  key += '\0';
  key += rel_path;
  key += '\0';
  key += std::to_string(stamp.size);
  key += '\0';
  key += std::to_string(MtimeSeconds(stamp.mtime_ns));
  const std::string hex = ToHex(Sha256Of(key));
  return {std::string(kLayout) + "/" + hex.substr(0, 2), hex + ".rec"};
}

}  // namespace

std::string ManifestStore::RecordPath(const std::string& rel_path, const FileStamp& stamp) const {
  return dir_ + "/" + NameOf(rel_path, stamp).rel();
}

Result<ManifestRecord> ManifestStore::ReadTrusted(const std::string& rel, const std::string& path,
                                                  uint64_t max_bytes) const {
  auto bytes = ReadBounded(root_.get(), rel, path, max_bytes);
  if (!bytes.ok()) return bytes.status();
  auto parsed = ParseRecord(*bytes);
  if (!parsed.ok()) return Status::Corrupt("record " + path + " ignored: " + parsed.status().message());
  if (parsed->key_id.empty()) return Status::Corrupt("record " + path + " ignored: it is not signed");
  if (Status s = keyring_.Verify(parsed->key_id, parsed->signed_part, parsed->signature); !s.ok()) {
    return Status::Corrupt("record " + path + " ignored: " + s.message());
  }
  return std::move(parsed->record);
}

Result<FileHashes> ManifestStore::Lookup(const std::string& rel_path, const FileStamp& stamp) {
  {
    MutexLock lock(mu_);
    if (distrusted_.count({rel_path, stamp.size, stamp.mtime_ns})) {
      return Status::NotFound(rel_path + ": its record did not match the file; not trusted again");
    }
  }
  const RecordName name = NameOf(rel_path, stamp);
  const std::string path = dir_ + "/" + name.rel();
  auto record = ReadTrusted(name.rel(), path, MaxRecordBytes(stamp.size, rel_path));
  if (!record.ok()) {
    if (record.status().code() != Status::Code::kNotFound) ++ignored_;
    return record.status();
  }
  if (!record->Describes(rel_path, stamp)) {
    ++ignored_;
    return Status::Corrupt("record " + path + " ignored: it describes " + EscapeRecordPath(record->path) + " (" +
                           std::to_string(record->size) + " bytes, mtime ns " + std::to_string(record->mtime_ns) +
                           "), not " + EscapeRecordPath(rel_path) + " (" + std::to_string(stamp.size) +
                           " bytes, mtime ns " + std::to_string(stamp.mtime_ns) + ")");
  }
  ++used_;
  return std::move(record->hashes);
}

Status ManifestStore::Publish(const std::string& rel_path, const FileStamp& stamp, const FileHashes& hashes) {
  if (!signer_) return Status::Error("cannot publish the record of " + rel_path + ": no signing key (manifest_sign=)");
  const RecordName name = NameOf(rel_path, stamp);
  ManifestRecord record{rel_path, stamp.size, stamp.mtime_ns, hashes};
  if (auto there = ReadTrusted(name.rel(), dir_ + "/" + name.rel(), MaxRecordBytes(stamp.size, rel_path));
      there.ok() && there->path == rel_path && there->size == stamp.size && there->mtime_ns == stamp.mtime_ns &&
      there->hashes.sha256 == hashes.sha256 && there->hashes.chunks == hashes.chunks) {
    ++already_;
    return Status::Ok();
  }
  auto text = SignRecord(record, *signer_);
  if (!text.ok()) return text.status();
  // Each level is opened beneath the one above, following no symlink: a
  // writer of the store who turns v1/ or v1/<xx>/ into a link to /etc gets
  // a refusal, not a root-owned file there.
  auto top = MakeAndOpenDirectory(root_.get(), kLayout, dir_ + "/" + kLayout);
  if (!top.ok()) return Status::Error("cannot publish the record of " + rel_path + ": " + top.status().message());
  const std::string sub_name = name.sub.substr(name.sub.rfind('/') + 1);
  auto sub = MakeAndOpenDirectory(top->get(), sub_name, dir_ + "/" + name.sub);
  if (!sub.ok()) return Status::Error("cannot publish the record of " + rel_path + ": " + sub.status().message());
  if (Status s = WriteFileAtomically(sub->get(), dir_ + "/" + name.sub, name.file, *text, 0644); !s.ok()) {
    return Status::Error("cannot publish the record of " + rel_path + ": " + s.message());
  }
  ++published_;
  return Status::Ok();
}

void ManifestStore::Distrust(const std::string& rel_path, const FileStamp& stamp) {
  MutexLock lock(mu_);
  if (distrusted_.insert({rel_path, stamp.size, stamp.mtime_ns}).second) ++distrusted_count_;
}

ManifestStore::Stats ManifestStore::GetStats() const {
  return {used_.load(),    ignored_.load(),          published_.load(),
          already_.load(), distrusted_count_.load(), withheld_.load()};
}

}  // namespace ckptfs
