// Test seams of the daemon, read from the environment; each does nothing
// unless its variable is set (never in production).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

namespace ckptfs::daemon {

// CKPTFS_TEST_PAUSE_BEFORE_HASH=NAME:DIR makes the indexer, before it opens
// a file named NAME, create DIR/paused and wait (60 s at most, less if
// `stop` turns true) for DIR/resume, so a test (tests/security) can change
// the tree between the walk and the open at a known moment. A DIR/resume
// that holds "once" is removed (with DIR/paused) as the file goes on, so the
// next file named NAME pauses again. Null when unset.
std::function<void(const std::string&)> PauseBeforeHashHook(const std::atomic<bool>* stop);

// CKPTFS_TEST_ENTRY_REPLY_DELAY_MS=N: each lookup's worker waits N ms after
// its reply (FsContext::entry_reply_delay), so that a test can have the
// kernel forget the entry while the worker is still in the lookup. 0 when
// unset.
std::chrono::milliseconds EntryReplyDelayForTest();

// CKPTFS_TEST_HOLD_PUBLISH=DIR: while DIR/hold exists, each publish of the
// view by the catalog watcher (with the watcher's lock held, as a slow one
// on a large tree holds it) first creates DIR/held, then waits for DIR/hold
// to go (60 s at most, less if `stop` turns true), so that a test can show
// what goes on meanwhile. Null when unset.
std::function<void()> HoldPublishHook(const std::atomic<bool>* stop);

// CKPTFS_TEST_RESERVE_AT_ONCE=1: the page reserve's thread grows it at
// once, without resting when preempted and without the quiet after it gave
// pages (PageReserve::Pace::AtOnce), so that a test on a busy machine sees
// it grown in time.
bool ReserveAtOnceForTest();

}  // namespace ckptfs::daemon
