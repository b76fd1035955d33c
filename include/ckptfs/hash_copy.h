// HashCopy: a copy of a file that the indexer fills with the very bytes it
// hashes (fill_on_index), so that a new checkpoint is resident in the host
// tier when its digest appears, from one read of the disk.
//
// The copy is verified by construction: the hasher reads each chunk straight
// into the copy and hashes it there (WritableAt), or writes it from the
// buffer it hashes (Write), which nothing changes between the read and
// SHA-256. It is made resident only by Publish,
// once the file's SHA-256 is final and its stamp held through the read;
// destroyed unpublished (the file changed, a read failed, hashing was
// cancelled) it is given up and nothing of it is ever served.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/status.h"

namespace ckptfs {

class HashCopy {
 public:
  virtual ~HashCopy() = default;
  // Where the bytes at [offset, offset + len) go, for the reader to put them
  // there itself; null when the copy is written with Write.
  virtual uint8_t* WritableAt(uint64_t offset, size_t len) = 0;
  // Called by the reader just before it reads into WritableAt(offset, len)
  // (from the hasher's I/O threads): the copy may place its pages for that
  // range first (HostTierFill: from the page reserve).
  virtual void PreparePages(uint64_t /*offset*/, size_t /*len*/) {}
  // Called from the hasher's I/O threads, several at once for distinct
  // ranges, so that copying overlaps SHA-256.
  virtual Status Write(uint64_t offset, const uint8_t* data, size_t len) = 0;
  // The hashes are final and the stamp held: seal the copy and make it
  // resident under the file's SHA-256.
  virtual void Publish(const FileHashes& hashes) = 0;
};

// Makes a copy for a file about to be hashed, or null when there is none to
// make (no room, the policy says not to). Called from the indexer's workers.
class HashCopyMaker {
 public:
  virtual ~HashCopyMaker() = default;
  // `rel_path`: the file's path in its checkpoint (what it is served as).
  virtual std::unique_ptr<HashCopy> Begin(const std::string& rel_path, const FileStamp& stamp) = 0;
};

}  // namespace ckptfs
