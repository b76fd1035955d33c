#include "eio_responder.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ckptfs::supervisor {

namespace {

// include/uapi/linux/fuse.h
constexpr uint32_t kOpForget = 2, kOpInit = 26, kOpInterrupt = 36, kOpBatchForget = 42;
constexpr size_t kInHeaderSize = 40;  // struct fuse_in_header
// The kernel refuses (EINVAL) a read buffer that could not hold a WRITE of
// max_write bytes, which the daemon negotiated (1 MiB, or more where the
// kernel's max_pages_limit allows): start above 1 MiB, double on EINVAL.
constexpr size_t kFirstBuffer = (1 << 20) + (1 << 16), kMaxBuffer = 1 << 28;

}  // namespace

size_t AnswerQueuedWithEio(int fd) {
  std::vector<uint8_t> buf(kFirstBuffer);
  size_t answered = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && buf.size() < kMaxBuffer) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (n < static_cast<ssize_t>(kInHeaderSize)) return answered;  // EAGAIN: nothing left, or gone
    uint32_t opcode;
    uint64_t unique;
    std::memcpy(&opcode, buf.data() + 4, sizeof opcode);
    std::memcpy(&unique, buf.data() + 8, sizeof unique);
    if (opcode == kOpForget || opcode == kOpBatchForget || opcode == kOpInterrupt || opcode == kOpInit) continue;
    // struct fuse_out_header {uint32 len; int32 error; uint64 unique}
    uint8_t out[16];
    const uint32_t len = sizeof out;
    const int32_t error = -EIO;
    std::memcpy(out, &len, 4);
    std::memcpy(out + 4, &error, 4);
    std::memcpy(out + 8, &unique, 8);
    if (::write(fd, out, sizeof out) == static_cast<ssize_t>(sizeof out)) ++answered;
  }
}

}  // namespace ckptfs::supervisor
