#include "ckptfs/manifest_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "atomic_file.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

namespace {

constexpr const char* kLayout = "v1";

// A record's bytes are bounded by its file's size; anything much larger at a
// record's name is not one, and is not read into memory.
uint64_t MaxRecordBytes(uint64_t file_size, const std::string& rel_path) {
  return 4096 + 3 * rel_path.size() + ChunkCount(file_size) * 33;
}

Result<std::string> ReadBounded(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::NotFound(path + ": no record");
    return Status::FromErrno("cannot open record " + path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("cannot stat record " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::Corrupt("record " + path + " is not a regular file; ignored");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Corrupt("record " + path + " is " + std::to_string(st.st_size) +
                           " bytes, more than a record of this file can be; ignored");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read record " + path, errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace

Result<std::unique_ptr<ManifestStore>> ManifestStore::Open(const std::string& dir, Keyring trusted,
                                                           std::optional<SigningKey> signer) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno("manifest store " + dir, errno);
  if (!S_ISDIR(st.st_mode)) return Status::Error("manifest store " + dir + ": Not a directory");
  if (signer) trusted.Add(*signer);
  if (trusted.empty()) {
    return Status::Error("manifest store " + dir + ": no key to trust (give manifest_keys=FILE, or manifest_sign=KEY "
                         "whose public half is then trusted)");
  }
  return std::unique_ptr<ManifestStore>(new ManifestStore(dir, std::move(trusted), std::move(signer)));
}

std::string ManifestStore::RecordPath(const std::string& rel_path, const FileStamp& stamp) const {
  std::string key = "ckptfs-record-key 1";
  key += '\0';
  key += rel_path;
  key += '\0';
  key += std::to_string(stamp.size);
  key += '\0';
  key += std::to_string(MtimeSeconds(stamp.mtime_ns));
  const std::string hex = ToHex(Sha256Of(key));
  return dir_ + "/" + kLayout + "/" + hex.substr(0, 2) + "/" + hex + ".rec";
}

Result<ManifestRecord> ManifestStore::ReadTrusted(const std::string& path, uint64_t max_bytes) const {
  auto bytes = ReadBounded(path, max_bytes);
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
    std::lock_guard lock(mu_);
    if (distrusted_.count({rel_path, stamp.size, stamp.mtime_ns})) {
      return Status::NotFound(rel_path + ": its record did not match the file; not trusted again");
    }
  }
  const std::string path = RecordPath(rel_path, stamp);
  auto record = ReadTrusted(path, MaxRecordBytes(stamp.size, rel_path));
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
  const std::string path = RecordPath(rel_path, stamp);
  ManifestRecord record{rel_path, stamp.size, stamp.mtime_ns, hashes};
  if (auto there = ReadTrusted(path, MaxRecordBytes(stamp.size, rel_path));
      there.ok() && there->path == rel_path && there->size == stamp.size && there->mtime_ns == stamp.mtime_ns &&
      there->hashes.sha256 == hashes.sha256 && there->hashes.chunks == hashes.chunks) {
    ++already_;
    return Status::Ok();
  }
  auto text = SignRecord(record, *signer_);
  if (!text.ok()) return text.status();
  const std::string top = dir_ + "/" + kLayout;
  const std::string sub = path.substr(0, path.rfind('/'));
  if (Status s = MakeDirectory(top); !s.ok()) return s;
  if (Status s = MakeDirectory(sub); !s.ok()) return s;
  if (Status s = WriteFileAtomically(sub, path.substr(path.rfind('/') + 1), *text, 0644); !s.ok()) {
    return Status::Error("cannot publish the record of " + rel_path + ": " + s.message());
  }
  ++published_;
  return Status::Ok();
}

void ManifestStore::Distrust(const std::string& rel_path, const FileStamp& stamp) {
  std::lock_guard lock(mu_);
  if (distrusted_.insert({rel_path, stamp.size, stamp.mtime_ns}).second) ++distrusted_count_;
}

ManifestStore::Stats ManifestStore::GetStats() const {
  return {used_.load(), ignored_.load(), published_.load(), already_.load(), distrusted_count_.load()};
}

}  // namespace ckptfs
