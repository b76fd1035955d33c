// The size a *.safetensors member is served with under stamp_headers,
// computed from the source at indexing so that stat never has to read (and
// parse) a header, which may be 100 MB. Only the chunks that hold the header
// are read, each checked against the file's XXH3-128s and its SHA-256 chain:
// the size is stored per SHA-256 and served for every copy of those bytes,
// so it must come from the bytes hashed, not from whatever a user who may
// write the copy read here put behind its stamp.
#pragma once

#include <cstdint>
#include <string>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/status.h"

namespace ckptfs {

// The stamped size of the file at `path` (as hashed under `stamp`, into
// `hashes`), or its own size when its header breaks a format rule and it is
// served unstamped. Fails when a chunk cannot be read or does not match, and
// (kNotFound) when `hashes` has no chain: the size is then not stored, and
// stat reads the header through the mount's checks.
Result<uint64_t> ServedStampedSize(SourceReader& reader, const std::string& path, const FileStamp& stamp,
                                   const FileHashes& hashes);

}  // namespace ckptfs
