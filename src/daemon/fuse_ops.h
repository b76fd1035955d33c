// The FUSE low-level operations over a View. Reads go straight to the source
// file and are checked against the stamp the content was indexed under: a
// file that changed since returns EIO, never the new bytes under the old name.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <functional>

#include "ckptfs/view.h"

namespace ckptfs::daemon {

struct FsContext {
  View* view = nullptr;
  uint64_t readahead = 4ull << 20;
  // Kernel cache lifetimes: digest directories never change; the root and
  // by-name/ change when the source does.
  double immutable_timeout_s = 86400;
  double mutable_timeout_s = 1;
  // Called when a read finds a source file changed (so the catalog rescans).
  std::function<void()> on_source_changed;
  // Set once the kernel's INIT has been answered; the BDI read-ahead can only
  // be raised after that (the kernel lowers it to the INIT reply's value).
  std::function<void()> on_init;
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> stale_reads{0};
};

fuse_lowlevel_ops MakeOperations();

}  // namespace ckptfs::daemon
