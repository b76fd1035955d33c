// The control server under abuse (issue 11): floods of idle connections,
// silent and oversized clients, long commands, handlers that throw, replies
// that are not UTF-8. It must keep answering everyone else, with a bounded
// number of threads and descriptors, and never let an exception out.
#include "ckptfs/control.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "control_flood.h"
#include "mounted_ckptfs.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

// Everything read from `fd` (a socket or a pipe) until it closes, or `timeout` passes.
std::string ReadToEnd(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return out;  // closed, or reset because our request went unread
    out.append(buf, static_cast<size_t>(n));
  }
}

// Sends `request` as `uid` from a child process: the server's whole answer,
// or a note with the child's exit status when none came within `timeout`.
std::string AskAs(const std::string& socket, uid_t uid, const std::string& request, std::chrono::seconds timeout) {
  const sockaddr_un addr = testing::UnixAddress(socket);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  const pid_t pid = ::fork();
  if (pid == 0) {
    testing::BecomeInChild(uid);
    const int fd = testing::ConnectUnix(addr);
    if (fd < 0 || ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) ::_exit(122);
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, static_cast<int>(timeout.count() * 1000)) == 1) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0 || ::write(out[1], buf, static_cast<size_t>(n)) != n) break;
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::string got = ReadToEnd(out[0], timeout + 5s);
  ::close(out[0]);
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (got.empty()) got = "(no answer; child status " + std::to_string(st) + ")";
  return got;
}

// Whether a client of `uid` gets any answer line within `timeout`; asked
// from a child process, so that the parent needs no descriptor for it.
bool AnswersWithinAs(const std::string& socket, uid_t uid, std::chrono::seconds timeout) {
  const sockaddr_un addr = testing::UnixAddress(socket);
  const pid_t pid = ::fork();
  if (pid == 0) {
    testing::BecomeInChild(uid);
    const int fd = testing::ConnectUnix(addr);
    static const char kStatus[] = "{\"cmd\":\"status\"}\n";
    if (fd < 0) ::_exit(2);
    // A refusing server may have closed already: its line is still there to read.
    (void)::send(fd, kStatus, sizeof kStatus - 1, MSG_NOSIGNAL);
    char buf[512];
    pollfd p{fd, POLLIN, 0};
    const bool line = ::poll(&p, 1, static_cast<int>(timeout.count() * 1000)) == 1 && ::recv(fd, buf, sizeof buf, 0) > 0;
    ::_exit(line ? 0 : 1);
  }
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

Json FirstLine(const std::string& text) {
  Json j = Json::parse(text.substr(0, text.find('\n')), nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : Json::object();
}

// ControlLimits' defaults, spelled out so that this test also builds against
// the server before it had limits (to see it fail there).
constexpr size_t kPerUid = 16;
constexpr size_t kMaxRequest = 64 * 1024;
constexpr int kLongThreads = 2;

class ControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::chmod(tmp_.path().c_str(), 0755);  // so that uid 65534 reaches the socket
    server_ = std::make_unique<ControlServer>(socket_, [this](const ControlServer::Request& r) { return Handle(r); });
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    release_ = true;
    server_.reset();
  }

  Json Handle(const ControlServer::Request& r) {
    const std::string cmd = r.body["cmd"];
    if (cmd == "status") return {{"ok", true}, {"uid", r.peer_uid}};
    if (cmd == "throw") throw std::runtime_error("the handler failed");
    if (cmd == "throw-int") throw 42;
    if (cmd == "bad-key") return {{"ok", true}, {std::string("caf\xe9"), 1}};
    if (cmd == "latin1") return {{"ok", true}, {"path", std::string("/srv/caf\xe9")}};
    if (cmd == "echo") return {{"ok", true}, {"path", r.body["path"]}};
    if (cmd == "hold") {  // a query that takes its thread until released
      ++holding_;
      while (!release_ && !r.stopping->load()) std::this_thread::sleep_for(10ms);
      --holding_;
      return {{"ok", true}};
    }
    if (cmd == "preload") {
      ++long_running_;
      while (!release_ && !r.stopping->load()) std::this_thread::sleep_for(10ms);
      --long_running_;
      return {{"ok", true}};
    }
    return {{"ok", false}, {"error", "unknown command"}};
  }

  Json Call(const Json& request) {
    auto r = ControlCall(socket_, request);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : Json();
  }
  bool StatusAnswers() {
    auto r = ControlCall(socket_, {{"cmd", "status"}});
    return r.ok() && r->value("ok", false);
  }

  testing::TempDir tmp_{"ckptfs-control"};
  std::string socket_ = tmp_ / "control.sock";
  std::atomic<bool> release_{false};
  std::atomic<int> long_running_{0};
  std::atomic<int> holding_{0};
  std::unique_ptr<ControlServer> server_;
};

// A mount right after an unmount of the same mount point: the daemon that is
// unmounting still answers on the socket for a moment, and the new one
// waits for it to let go instead of coming up unreachable. One that stays
// is another live mount's, and is left alone.
TEST_F(ControlServerTest, ANewServerWaitsForAnUnmountingOneToLetGoOfTheSocket) {
  ControlServer next(socket_, [](const ControlServer::Request&) { return Json{{"ok", true}, {"next", true}}; });
  auto started = std::async(std::launch::async, [&] { return next.Start(); });
  std::this_thread::sleep_for(300ms);
  server_.reset();  // the old daemon exits
  const Status s = started.get();
  ASSERT_TRUE(s.ok()) << s.message();
  const std::string answer = AskAs(socket_, 65534, R"({"cmd":"status"})" "\n", 5s);
  EXPECT_TRUE(FirstLine(answer).value("next", false)) << answer;

  ControlServer third(socket_, [](const ControlServer::Request&) { return Json{{"ok", true}}; });
  EXPECT_FALSE(third.Start().ok()) << "a live server's socket was taken";
}

TEST_F(ControlServerTest, FloodFromOneUidLeavesOthersServedWithBoundedThreadsAndFds) {
  const size_t threads_before = testing::CountEntries("/proc/self/task");
  const size_t fds_before = testing::CountEntries("/proc/self/fd");
  testing::IdleConnectionFlood flood(socket_, 0, 2000);
  ASSERT_GT(flood.opened(), 1000);
  size_t threads = 0, fds = 0;
  for (int i = 0; i < 10; ++i) {
    threads = std::max(threads, testing::CountEntries("/proc/self/task"));
    fds = std::max(fds, testing::CountEntries("/proc/self/fd"));
    std::this_thread::sleep_for(50ms);
  }
  const std::string answer = AskAs(socket_, 65534, R"({"cmd":"status"})" "\n", 5s);
  const Json reply = FirstLine(answer);
  EXPECT_EQ(reply.value("ok", false), true) << answer;
  EXPECT_EQ(reply.value("uid", -1), 65534) << answer;
  EXPECT_LE(threads, threads_before + 4) << "threads grew with idle connections";
  EXPECT_LE(fds, fds_before + 64) << "descriptors grew with idle connections";
}

// Issue 21 item 3: one uid's slow queries take at most its share (2) of the
// 4 query threads; another uid and root are answered meanwhile.
TEST_F(ControlServerTest, OneUidHoldsAtMostItsShareOfTheQueryThreads) {
  testing::SlowReaderFlood holders(socket_, 65534, 8, R"({"cmd":"hold"})" "\n", 4096, 1000);
  ASSERT_EQ(holders.opened(), 8);
  EXPECT_TRUE(testing::WaitFor([&] { return holding_ >= 2; }, 10s));
  EXPECT_TRUE(AnswersWithinAs(socket_, 65533, 20s)) << "another uid waited behind one uid's requests";
  EXPECT_TRUE(AnswersWithinAs(socket_, 0, 20s)) << "root waited behind one uid's requests";
  EXPECT_LE(holding_.load(), 2) << "one uid held more than its share of the query threads";
}

TEST_F(ControlServerTest, OutOfDescriptorsClientsAreToldAndNoCoreSpins) {
  timespec cpu_before{}, cpu_after{};
  {
    testing::SoftFdLimit limit(testing::CountEntries("/proc/self/fd") + 8);
    testing::IdleConnectionFlood flood(socket_, 65534, 16);  // all within the per-uid limit
    ASSERT_GT(flood.opened(), 8);
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_before);
    std::this_thread::sleep_for(2s);
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_after);
    EXPECT_TRUE(AnswersWithinAs(socket_, 65533, 5s)) << "a client was left waiting without a word";
  }
  const double cpu_s = static_cast<double>(cpu_after.tv_sec - cpu_before.tv_sec) +
                       static_cast<double>(cpu_after.tv_nsec - cpu_before.tv_nsec) / 1e9;
  EXPECT_LT(cpu_s, 1.0) << "the accept loop spins when descriptors run out";
  EXPECT_TRUE(testing::WaitFor([&] { return StatusAnswers(); }, 10s));
}

TEST_F(ControlServerTest, AConnectionOverTheUidLimitIsToldWhyAndClosed) {
  const sockaddr_un addr = testing::UnixAddress(socket_);
  std::vector<UniqueFd> idle;
  for (size_t i = 0; i < kPerUid; ++i) idle.emplace_back(testing::ConnectUnix(addr));
  Json refused = Call({{"cmd", "status"}});
  EXPECT_EQ(refused.value("ok", true), false) << refused.dump();
  EXPECT_NE(refused.value("error", "").find("too many control connections from uid 0"), std::string::npos)
      << refused.dump();
  idle.clear();
  EXPECT_TRUE(testing::WaitFor([&] { return StatusAnswers(); }, 5s));
}

TEST_F(ControlServerTest, ASilentClientIsToldAndDropped) {
  UniqueFd fd(testing::ConnectUnix(testing::UnixAddress(socket_)));
  const std::string got = ReadToEnd(fd.get(), 30s);
  EXPECT_EQ(FirstLine(got).value("ok", true), false) << got;
  EXPECT_TRUE(StatusAnswers());
}

TEST_F(ControlServerTest, AnOversizedRequestIsRefused) {
  UniqueFd fd(testing::ConnectUnix(testing::UnixAddress(socket_)));
  const std::string big(kMaxRequest + 4096, 'x');
  ASSERT_EQ(::send(fd.get(), big.data(), big.size(), MSG_NOSIGNAL), static_cast<ssize_t>(big.size()));
  const std::string got = ReadToEnd(fd.get(), 30s);
  EXPECT_EQ(FirstLine(got).value("ok", true), false) << got.substr(0, 200);
  EXPECT_TRUE(StatusAnswers());
}

TEST_F(ControlServerTest, LongCommandsAreCappedAndDoNotHoldUpQueries) {
  std::atomic<int> done{0};
  std::vector<std::thread> preloads;
  for (int i = 0; i < 6; ++i) {
    preloads.emplace_back([&] {
      auto r = ControlCall(socket_, {{"cmd", "preload"}});
      done += r.ok() && r->value("ok", false);
    });
  }
  EXPECT_TRUE(testing::WaitFor([&] { return long_running_ >= 2; }, 10s));
  auto status = std::async(std::launch::async, [&] { return StatusAnswers(); });
  const bool answered = status.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(answered) << "status waited behind long commands";
  EXPECT_LE(long_running_.load(), kLongThreads);
  release_ = true;
  for (auto& t : preloads) t.join();
  EXPECT_TRUE(status.get());
  EXPECT_EQ(done.load(), 6);
}

TEST_F(ControlServerTest, HandlerExceptionsAndUnsendableRepliesBecomeErrorReplies) {
  for (const char* cmd : {"throw", "throw-int", "bad-key"}) {
    Json reply = Call({{"cmd", cmd}});
    EXPECT_EQ(reply.value("ok", true), false) << cmd << ": " << reply.dump();
    EXPECT_FALSE(reply.value("error", "").empty()) << cmd;
  }
  EXPECT_NE(Call({{"cmd", "throw"}}).value("error", "").find("the handler failed"), std::string::npos);
  EXPECT_TRUE(StatusAnswers());
}

TEST_F(ControlServerTest, PathsTravelAsExactBytesBothWays) {
  Json reply = Call({{"cmd", "latin1"}});
  EXPECT_EQ(reply["path"], "/srv/caf\\xe9");
  EXPECT_EQ(reply["path_b64"], "L3Nydi9jYWbp");  // base64 of /srv/caf\xe9
  Json echo = Call({{"cmd", "echo"}, {"path", std::string("tok\xe9/x")}});
  EXPECT_EQ(echo["path_b64"], "dG9r6S94");  // base64 of tok\xe9/x
  EXPECT_TRUE(StatusAnswers());
}

}  // namespace
}  // namespace ckptfs
