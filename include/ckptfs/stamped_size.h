// The size a *.safetensors member is served with under stamp_headers,
// computed from the source at indexing so that stat never has to read (and
// parse) a header, which may be 100 MB. Only the chunks that hold the header
// are read, each checked against the chunk table like any chunk served.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/source_reader.h"
#include "ckptfs/status.h"

namespace ckptfs {

// The stamped size of the file at `path` (as hashed under `stamp`, with
// `chunks`), or its own size when its header breaks a format rule and it is
// served unstamped. Fails when a chunk cannot be read or does not match.
Result<uint64_t> ServedStampedSize(SourceReader& reader, const std::string& path, const FileStamp& stamp,
                                   const std::vector<ChunkHash>& chunks);

}  // namespace ckptfs
