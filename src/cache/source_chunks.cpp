// Reading a file's chunks from its source copies (View::Node::copies), most
// trusted first, and what a copy that fails its checks leads to.
#include <cerrno>
#include <optional>
#include <span>

#include <spdlog/spdlog.h>

#include "file_filler.h"
#include "ckptfs/file_server.h"

namespace ckptfs {

namespace {

bool Refused(const RefusedFiles& refused, const View::Node& file, const SourceCopy& copy) {
  return refused.Contains(file.sha256, copy.stamp, copy.chunks.get());
}

// The node's copies; a node made without them (by hand, in a test) has the
// one its own fields name, in `own`.
std::span<const SourceCopy> CopiesOf(const View::Node& file, std::optional<SourceCopy>& own) {
  if (!file.copies.empty()) return file.copies;
  own = SourceCopy{file.source_path, file.stamp, file.chunks};
  return {&*own, 1};
}

}  // namespace

// The copy's chunk, once more after the host tier gave back descriptors when
// the daemon had none left to open the source with: descriptor pressure
// costs the tier copies, never a reader an EIO.
Status FileServer::ReadChunkOf(const SourceCopy& c, uint64_t index, uint8_t* dst, size_t len,
                   SourceReader::Io io) {
  Status s = parts_.reader->ReadChunk(c.path, c.stamp, *c.chunks, index, dst, len, io);
  const int err = s.error_number();
  if ((err != EMFILE && err != ENFILE) || parts_.files == nullptr) return s;
  constexpr size_t kShedAtOnce = 16;
  const size_t shed = parts_.files->ShedDescriptors(kShedAtOnce);
  spdlog::warn("out of descriptors reading {}; {} copies of the host tier let go of theirs", c.path, shed);
  return parts_.reader->ReadChunk(c.path, c.stamp, *c.chunks, index, dst, len, io);
}


void FileServer::ReportSourceFailure(const View::Node& file, const SourceCopy& copy, const Status& s,
                         bool served_by_another) {
  const bool changed = s.code() == Status::Code::kChanged, corrupt = s.code() == Status::Code::kCorrupt;
  if (!changed && !corrupt) {
    spdlog::error("{}: {}", file.digest, s.message());
    return;
  }
  if (corrupt) parts_.cache->CountVerificationFailure();
  if (!refused_.Add(file.sha256, copy.stamp, copy.chunks, s.message())) return;  // already reported
  const char* after = served_by_another ? "; another copy served the read" : "";
  if (corrupt) {
    spdlog::error("{}: {}; {} will be hashed again{}", file.digest, s.message(), copy.path,
                  served_by_another ? "" : " and the digest is withdrawn");
    if (reports_.corrupt_chunk) reports_.corrupt_chunk(file, copy, s, /*withdraw=*/!served_by_another);
  } else {
    spdlog::warn("{}: {}; its bytes are no longer served from there{}", file.digest, s.message(), after);
    if (reports_.source_changed) reports_.source_changed();
  }
}


const SourceCopy* FileServer::FirstUsableCopy(const View::Node& file) const {
  for (const SourceCopy& c : file.copies) {
    if (!Refused(refused_, file, c)) return &c;
  }
  return nullptr;
}

bool FileServer::AllCopiesRefused(const View::Node& file) const {
  std::optional<SourceCopy> own;
  for (const SourceCopy& c : CopiesOf(file, own)) {
    if (!Refused(refused_, file, c)) return false;
  }
  return true;
}

Status FileServer::NoCopyLeft(const View::Node& file) const {
  std::string why;
  std::optional<SourceCopy> own;
  for (const SourceCopy& c : CopiesOf(file, own)) {
    if (std::optional<std::string> w = refused_.Why(file.sha256, c.stamp, c.chunks.get())) {
      why = " (" + *w + ")";
      break;
    }
  }
  return Status::Changed(file.source_path + ": no source copy still holds the bytes indexed for " + file.digest +
                         why);
}

bool FileServer::Proves(const View::Node& file) const {
  if (options_.verify != Verify::kAuto) return options_.verify == Verify::kSha256;
  if (file.content) return false;  // the daemon's own bytes (a hub ref)
  std::optional<SourceCopy> own;
  for (const SourceCopy& c : CopiesOf(file, own)) {
    if (!Refused(refused_, file, c)) return !c.trusted;
  }
  return true;
}

bool FileServer::UntrustedCopyLeft(const View::Node& file) const {
  if (options_.verify != Verify::kAuto) return false;
  std::optional<SourceCopy> own;
  for (const SourceCopy& c : CopiesOf(file, own)) {
    if (!c.trusted && !Refused(refused_, file, c)) return true;
  }
  return false;
}

Status FileServer::ReadSourceChunk(const View::Node& file, uint64_t index, uint8_t* dst, size_t len,
                                   SourceReader::Io io, const ChunkChain* chain, bool whole_file_proven,
                                   const SourceCopy** served_by) {
  if (served_by != nullptr) *served_by = nullptr;
  // Under verify=auto, bytes nobody checks against a SHA-256 come only from
  // trusted copies (SourceCopy::trusted).
  const bool trusted_only = options_.verify == Verify::kAuto && chain == nullptr && !whole_file_proven;
  std::vector<std::pair<const SourceCopy*, Status>> failed;
  std::optional<Status> result;
  bool served = false, passed_over = false;
  std::optional<SourceCopy> own;
  for (const SourceCopy& c : CopiesOf(file, own)) {
    if (Refused(refused_, file, c)) continue;
    if (trusted_only && !c.trusted) {
      passed_over = true;
      continue;
    }
    Status s = ReadChunkOf(c, index, dst, len, io);
    if (s.ok() && chain != nullptr && !ChunkFitsChain(file.sha256, file.size, *chain, index, dst, len)) {
      s = Status::Corrupt(c.path + ": chunk " + std::to_string(index) +
                          " passes its XXH3-128 but not the file's SHA-256 (its chain)");
    }
    if (s.ok()) {
      served = true;
      result = s;
      if (served_by != nullptr && !file.copies.empty()) *served_by = &c;
      break;
    }
    failed.emplace_back(&c, s);
    result = s;
  }
  // A copy passed over may still serve the read, once proven
  // (ReadVerifiedChunk): the digest stays while it is there.
  for (const auto& [copy, why] : failed) ReportSourceFailure(file, *copy, why, served || passed_over);
  if (result) return *result;
  if (passed_over) {
    return Status::Error(file.source_path + ": the copies left of " + file.digest +
                         " may be changed by users the mount does not trust, and this read was not to be "
                         "checked against the file's SHA-256");
  }
  return NoCopyLeft(file);
}

Status FileServer::ReadVerifiedChunk(const View::NodePtr& file, uint64_t index, uint8_t* dst, size_t len,
                         bool no_proof_here) {
  if (!Proves(*file)) {
    Status s = ReadSourceChunk(*file, index, dst, len);
    // Its trusted copies failed while others are left: those serve the
    // read once proven, as any copy serves one that another failed.
    if (s.ok() || !UntrustedCopyLeft(*file)) return s;
  }
  std::shared_ptr<const ChunkChain> chain = ChainOf(*file);
  if (!chain && no_proof_here) return Status::NotFound(file->source_path + ": not proven yet");
  if (!chain && filler_ != nullptr) {
    auto made = filler_->Prove(file);
    if (!made.ok()) return made.status();
    chain = *made;
  }
  if (!chain) return Status::Error(file->source_path + ": no proven SHA-256 chain");
  return ReadSourceChunk(*file, index, dst, len, SourceReader::Io::kBuffered, chain.get());
}

void FileServer::KeepProvenChain(const View::Node& file, std::shared_ptr<const ChunkChain> chain) {
  if (parts_.proven != nullptr) parts_.proven->Put(file.sha256, chain);
  if (reports_.chain_proven) reports_.chain_proven(file, std::move(chain));
}

std::shared_ptr<const ChunkChain> FileServer::ChainOf(const View::Node& file) const {
  if (file.chain) return file.chain;
  if (ChunkCount(file.size) <= 1) {
    static const auto kNoLinks = std::make_shared<const ChunkChain>();
    return kNoLinks;
  }
  return parts_.proven != nullptr ? parts_.proven->Find(file.sha256) : nullptr;
}

}  // namespace ckptfs
