// While the serving daemon cannot start (a crash loop), the supervisor
// answers the mount's requests itself, each with EIO, so that readers fail
// rather than hang. It looks at nothing but the request header: no FUSE
// logic that could crash on what it reads.
#pragma once

#include <cstddef>

namespace ckptfs::supervisor {

// Answers every request queued on the non-blocking /dev/fuse descriptor
// `fd` with EIO (forgets, which take no answer, are dropped); returns how
// many were answered.
size_t AnswerQueuedWithEio(int fd);

}  // namespace ckptfs::supervisor
