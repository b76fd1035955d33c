// HeaderScans: which opens belong to a loader reading every shard's header
// before its tensors (and so need not wait for their copies), with the
// clock given by the test.
#include "header_scans.h"

#include <gtest/gtest.h>

namespace ckptfs {
namespace {

using Clock = HeaderScans::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kModel = "sha256-" + std::string(64, 'a');
const std::string kOther = "sha256-" + std::string(64, 'b');

// fastsafetensors: shard 1 opened (it waits), its header read, closed at
// once; from then on each other shard's first open is part of the scan, and
// a second open of a shard is not.
TEST(HeaderScansTest, AShortOpenMakesTheOpenersFirstOpenOfEachOtherFileAScan) {
  HeaderScans scans;
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 1, t0)) << "nothing is known of the opener yet";
  scans.Closed(100, kModel, 1, milliseconds(2), t0 + milliseconds(2));
  EXPECT_TRUE(scans.OpenIsScan(100, kModel, 2, t0 + milliseconds(3)));  // on trial
  scans.Closed(100, kModel, 2, milliseconds(1), t0 + milliseconds(4));  // confirmed
  EXPECT_TRUE(scans.OpenIsScan(100, kModel, 3, t0 + milliseconds(5)));
  EXPECT_TRUE(scans.OpenIsScan(100, kModel, 5, t0 + milliseconds(5))) << "a confirmed scan needs no close between";
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 2, t0 + milliseconds(6))) << "a second open of shard 2";
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 1, t0 + milliseconds(7))) << "a second open of shard 1";
  EXPECT_FALSE(scans.OpenIsScan(200, kModel, 4, t0 + milliseconds(8))) << "another opener";
  EXPECT_FALSE(scans.OpenIsScan(100, kOther, 4, t0 + milliseconds(9))) << "another checkpoint";
  EXPECT_EQ(scans.scan_opens(), 3u);
}

// A loader that opens a shard, maps it and closes it at once looks like a
// header read at its first shard; its second, opened on trial, stays open
// (a chunk-path map holds it) and is never closed short, so every later
// open waits.
TEST(HeaderScansTest, AnUnconfirmedTrialLetsNoOtherOpenGoWithoutWaiting) {
  HeaderScans scans;
  const Clock::time_point t0 = Clock::now();
  scans.Closed(100, kModel, 1, milliseconds(1), t0);
  EXPECT_TRUE(scans.OpenIsScan(100, kModel, 2, t0 + milliseconds(1)));
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 3, t0 + milliseconds(2)));
  scans.Closed(100, kModel, 2, seconds(3), t0 + seconds(3));  // held for the load
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 4, t0 + seconds(3)));
  scans.Closed(100, kModel, 3, milliseconds(1), t0 + seconds(4));  // a short close of another file
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 5, t0 + seconds(4))) << "only the trial's close confirms";
  EXPECT_EQ(scans.scan_opens(), 1u);
}

// A loader that holds each shard for its load (a map) never scans; a scan
// ends kWindow after its last short open.
TEST(HeaderScansTest, ALongOpenOrAnOldScanMakesNoScan) {
  HeaderScans scans;
  const Clock::time_point t0 = Clock::now();
  scans.Closed(100, kModel, 1, HeaderScans::kShortOpen + milliseconds(1), t0);
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 2, t0 + milliseconds(1)));
  scans.Closed(100, kModel, 1, milliseconds(1), t0 + milliseconds(2));
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 2, t0 + milliseconds(3) + HeaderScans::kWindow));
  // A new scan after the window forgets what the old one opened.
  scans.Closed(100, kModel, 3, milliseconds(1), t0 + 2 * HeaderScans::kWindow);
  EXPECT_TRUE(scans.OpenIsScan(100, kModel, 2, t0 + 2 * HeaderScans::kWindow + milliseconds(1)));
  scans.Closed(100, kModel, 2, milliseconds(1), t0 + 2 * HeaderScans::kWindow + milliseconds(2));
  EXPECT_FALSE(scans.OpenIsScan(100, kModel, 2, t0 + 2 * HeaderScans::kWindow + milliseconds(3)));
  EXPECT_EQ(scans.scan_opens(), 1u);
  // A file outside any checkpoint (no digest) is never part of a scan, nor
  // is an opener the daemon cannot see (FUSE says pid 0).
  scans.Closed(300, "", 1, milliseconds(1), t0);
  EXPECT_FALSE(scans.OpenIsScan(300, "", 2, t0 + milliseconds(1)));
  scans.Closed(0, kModel, 1, milliseconds(1), t0);
  EXPECT_FALSE(scans.OpenIsScan(0, kModel, 2, t0 + milliseconds(1)));
}

// The table is bounded: openers past kMaxOpeners push out the least
// recently seen, which then waits as if never seen; the files an opener
// may open without waiting are bounded too.
TEST(HeaderScansTest, TheTableIsBounded) {
  HeaderScans scans;
  const Clock::time_point t0 = Clock::now();
  for (pid_t p = 1; p <= static_cast<pid_t>(HeaderScans::kMaxOpeners) + 1; ++p) {
    scans.Closed(p, kModel, 1, milliseconds(1), t0);
  }
  EXPECT_FALSE(scans.OpenIsScan(1, kModel, 2, t0)) << "the oldest opener stayed in a full table";
  EXPECT_TRUE(scans.OpenIsScan(2, kModel, 2, t0));
  EXPECT_TRUE(scans.OpenIsScan(3, kModel, 9, t0));
  scans.Closed(3, kModel, 9, milliseconds(1), t0);  // confirmed
  uint64_t let_go = 0;
  for (uint64_t file = 10; file < 10 + 2 * HeaderScans::kMaxFilesPerOpener; ++file) {
    let_go += scans.OpenIsScan(3, kModel, file, t0) ? 1 : 0;
  }
  EXPECT_EQ(let_go, HeaderScans::kMaxFilesPerOpener - 2);  // files 1 and 9 are in its set already
}

}  // namespace
}  // namespace ckptfs
