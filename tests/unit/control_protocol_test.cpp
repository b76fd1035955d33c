// The control protocol (control_protocol.h) and the command table
// (command_table.h), through a real ControlServer on a Unix socket: every
// command ckptfsctl can send arrives at its row intact; unknown, malformed
// and oversized requests get an error line; owner-only commands are refused
// to everyone else, before their handler runs.
#include "ckptfs/catalog_watcher.h"
#include "ckptfs/command_table.h"
#include "ckptfs/control_protocol.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "control_flood.h"
#include "test_tree.h"

namespace ckptfs {
namespace {

using Json = nlohmann::json;

// Each command's request as ckptfsctl builds it.
Json ClientRequest(std::string_view name) {
  if (name == protocol::kPreload) return protocol::PreloadRequest("sha256-ab/model.safetensors", "host", true);
  if (name == protocol::kUnpin || name == protocol::kEvict) return protocol::PathRequest(name, "by-name/run7");
  return protocol::Request(name);
}

// A table with one row per protocol command, flagged as the protocol says;
// each handler echoes what it was given and counts its calls.
class CommandTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<ControlCommand> rows;
    for (const auto& c : protocol::kCommands) {
      const std::string name(c.name);
      rows.push_back({name, c.needs_owner, [this, name](const ControlServer::Request& r) {
                        std::lock_guard lock(mu_);  // handlers run on the server's threads
                        ++calls_[name];
                        return Json{{protocol::kOk, true}, {"row", name}, {"body", r.body}};
                      }});
    }
    table_ = std::make_unique<CommandTable>(std::move(rows));
    server_ = std::make_unique<ControlServer>(socket_, table_->AsHandler());
    ::chmod(tmp_.path().c_str(), 0755);  // so that uid 65534 reaches the socket
    ASSERT_TRUE(server_->Start().ok());
  }

  // Sends raw bytes and returns the first line of the answer.
  Json SendRaw(const std::string& bytes) {
    UniqueFd fd(testing::ConnectUnix(testing::UnixAddress(socket_)));
    EXPECT_TRUE(fd.valid());
    ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd.get(), SHUT_WR);
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(n));
    return Json::parse(got.substr(0, got.find('\n')), nullptr, false);
  }

  ControlServer::Request AsCaller(const Json& body, bool privileged) {
    ControlServer::Request r;
    r.body = body;
    r.peer_uid = privileged ? 0 : 65534;
    r.privileged = privileged;
    r.stopping = &stopping_;
    return r;
  }

  testing::TempDir tmp_{"ckptfs-protocol"};
  std::string socket_ = tmp_ / "control.sock";
  std::atomic<bool> stopping_{false};
  int Calls(std::string_view name) {
    std::lock_guard lock(mu_);
    return calls_[std::string(name)];
  }
  int AllCalls() {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& [name, count] : calls_) n += count;
    return n;
  }

  std::mutex mu_;
  std::map<std::string, int> calls_;
  std::unique_ptr<CommandTable> table_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(CommandTableTest, EveryCommandRoundTripsToItsRow) {
  for (const auto& c : protocol::kCommands) {
    const Json sent = ClientRequest(c.name);
    auto reply = ControlCall(socket_, sent);
    ASSERT_TRUE(reply.ok()) << c.name << ": " << reply.status().message();
    EXPECT_EQ(reply->value(protocol::kOk, false), true) << reply->dump();
    EXPECT_EQ(reply->value("row", std::string()), c.name);
    EXPECT_EQ((*reply)["body"], sent) << c.name;
    EXPECT_EQ(Calls(c.name), 1) << c.name;
  }
}

TEST_F(CommandTableTest, AnUnknownCommandIsAnErrorNamingIt) {
  auto reply = ControlCall(socket_, protocol::Request("format-disk"));
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->value(protocol::kOk, true), false);
  EXPECT_EQ(reply->value(protocol::kError, std::string()), "unknown command: format-disk");
}

TEST_F(CommandTableTest, MalformedRequestsAreErrorsAndNoHandlerRuns) {
  for (const std::string bad : {"not json\n", "[1,2]\n", "{\"cmd\": 7}\n", "{\"path\": \"x\"}\n", "{\"cmd\":\n"}) {
    const Json reply = SendRaw(bad);
    EXPECT_EQ(reply.value(protocol::kOk, true), false) << bad;
    EXPECT_NE(reply.value(protocol::kError, std::string()).find("malformed request"), std::string::npos)
        << bad << " -> " << reply.dump();
  }
  EXPECT_EQ(AllCalls(), 0);
}

TEST_F(CommandTableTest, AnOversizedRequestIsRefusedAndNoHandlerRuns) {
  Json big = protocol::PathRequest(protocol::kEvict, std::string(ControlLimits{}.max_request + 1, 'x'));
  const Json reply = SendRaw(big.dump() + "\n");
  EXPECT_EQ(reply.value(protocol::kOk, true), false);
  EXPECT_NE(reply.value(protocol::kError, std::string()).find("longer than"), std::string::npos) << reply.dump();
  EXPECT_EQ(AllCalls(), 0);
}

TEST_F(CommandTableTest, OwnerOnlyCommandsAreRefusedToOthersBeforeTheirHandler) {
  for (const auto& c : protocol::kCommands) {
    const Json reply = table_->Dispatch(AsCaller(ClientRequest(c.name), /*privileged=*/false));
    if (c.needs_owner) {
      EXPECT_EQ(reply.value(protocol::kOk, true), false) << c.name;
      EXPECT_EQ(reply.value(protocol::kError, std::string()).find(std::string(c.name) +
                                                                   " is for root or the mount's owner"),
                0u)
          << reply.dump();
      EXPECT_EQ(Calls(c.name), 0) << c.name << " ran for an unprivileged caller";
    } else {
      EXPECT_EQ(reply.value(protocol::kOk, false), true) << c.name;
    }
    EXPECT_EQ(table_->Dispatch(AsCaller(ClientRequest(c.name), true)).value(protocol::kOk, false), true) << c.name;
  }
  // The changes are exactly these; a new command must choose.
  for (std::string_view change : {protocol::kPreload, protocol::kUnpin, protocol::kEvict, protocol::kRescan}) {
    EXPECT_TRUE(protocol::NeedsOwner(change)) << change;
  }
  EXPECT_TRUE(protocol::NeedsOwner("no-such-command"));
}

// Through the socket, "privileged" comes from the peer's credentials.
TEST_F(CommandTableTest, AnotherUidIsRefusedOverTheSocket) {
  // Only async-signal-safe calls in the child: this process has threads.
  const std::string request = protocol::Request(protocol::kRescan).dump() + "\n";
  const sockaddr_un addr = testing::UnixAddress(socket_);
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    testing::BecomeInChild(65534);
    const int fd = testing::ConnectUnix(addr);
    if (fd < 0 || ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) ::_exit(122);
    char line[4096];
    for (ssize_t n; (n = ::recv(fd, line, sizeof line, 0)) > 0;) {
      if (::write(out[1], line, static_cast<size_t>(n)) < 0) ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::string got;
  char buf[1024];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const Json reply = Json::parse(got.substr(0, got.find('\n')), nullptr, false);
  EXPECT_EQ(reply.value(protocol::kOk, true), false) << got;
  EXPECT_NE(reply.value(protocol::kError, std::string()).find("you are uid 65534"), std::string::npos) << got;
  EXPECT_EQ(Calls(protocol::kRescan), 0);
}

// ckptfsctl status compares a row's "state" with the protocol's words and
// reads "counts" by them; the daemon writes the watcher's PhaseName().
TEST(ControlProtocolTest, CheckpointStatesAreTheWatchersPhaseNames) {
  EXPECT_STREQ(PhaseName(CheckpointState::Phase::kExposed), protocol::kStateExposed);
  EXPECT_STREQ(PhaseName(CheckpointState::Phase::kIndexing), protocol::kStateIndexing);
  EXPECT_STREQ(PhaseName(CheckpointState::Phase::kPending), protocol::kStatePending);
  EXPECT_STREQ(PhaseName(CheckpointState::Phase::kInvalid), protocol::kStateInvalid);
}

}  // namespace
}  // namespace ckptfs
