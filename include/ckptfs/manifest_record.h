// ManifestRecord: what one node learned by hashing one source file, in the
// form it is shared with other nodes through a manifest store.
//
// A record is a small text file, signed with Ed25519:
//
//   ckptfs-record 1
//   path <path relative to SRC, bytes outside '!'..'~' and '%' as %XX>
//   size <bytes>
//   mtime <seconds>.<9 digits of nanoseconds>
//   sha256 <64 hex>
//   chunks <count>
//   <32 hex of XXH3-128>          one line per 4 MiB chunk, in order
//   key <64 hex: the signer's raw Ed25519 public key>
//   sig <128 hex: Ed25519 signature of every byte above, key line included>
//
// Only size and mtime identify the file's version. Both are attributes the
// file server stores and every client is given unchanged (NFS, CephFS,
// Lustre, GlusterFS, SMB, sshfs), and both survive a copy with `cp -p`,
// rsync -a or a restore. The others in the local stamp do not: the device
// number is each client's own; inode numbers are synthesised per mount by
// many FUSE filesystems (sshfs, s3fs, JuiceFS without its inode option)
// and differ between ceph-fuse and the kernel client; ctime is the time
// of the last change on the host that made it, cannot be carried by a copy,
// and is absent from SFTP (sshfs reports the mtime in its place). Some
// protocols keep whole seconds only (SFTP version 3), so a record matches a
// file whose mtime has the same seconds when either side has no
// nanoseconds. What that leaves open (a rewrite of the same size within the
// same second) cannot give wrong bytes: every chunk read is checked against
// the record's chunk table, and a mismatch is EIO, a report and a re-hash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/manifest_keys.h"
#include "ckptfs/status.h"

namespace ckptfs {

struct ManifestRecord {
  std::string path;  // relative to SRC, components joined by '/'
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  FileHashes hashes;  // hashes.size == size

  // True when this record describes the file at `path` with local stamp
  // `stamp` (size, and mtime under the whole-seconds rule above).
  bool Describes(const std::string& rel_path, const FileStamp& stamp) const;
};

// The whole seconds of an mtime in nanoseconds (rounded down).
inline int64_t MtimeSeconds(int64_t ns) { return ns / 1'000'000'000 - (ns % 1'000'000'000 < 0 ? 1 : 0); }

// The record's text up to its signature (the "key" line included), which is
// what gets signed.
std::string RecordSignedPart(const ManifestRecord& record, const std::string& key_id);
// The whole record file, signed by `key`.
Result<std::string> SignRecord(const ManifestRecord& record, const SigningKey& key);

struct ParsedRecord {
  ManifestRecord record;
  std::string key_id;         // empty: unsigned
  std::string signed_part;    // the bytes the signature covers
  std::string signature;      // 64 raw bytes
};

// Parses a record file strictly: anything else (a torn write, another
// program's file, trailing bytes, a chunk count that does not fit the size)
// is kCorrupt with the line at fault. A record without "key"/"sig" lines
// parses with an empty key_id.
Result<ParsedRecord> ParseRecord(std::string_view text);

// "a%0Ab" for the bytes 'a' '\n' 'b'; the inverse fails on a bad escape.
std::string EscapeRecordPath(std::string_view path);
Result<std::string> UnescapeRecordPath(std::string_view text);

}  // namespace ckptfs
