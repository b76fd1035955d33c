// What systemd as PID 1 gives a Type=notify service with
// FileDescriptorStoreMax=, for tests on machines without it: a
// notification socket that keeps FDSTORE=1 descriptors by name (and drops
// them on FDSTOREREMOVE=1), the stored descriptors passed to the next
// process started (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID, from descriptor
// 3 on), and a bus that answers what systemd's answers about the service's
// own unit: GetUnitByPID, the unit's Job and the job's JobType. The
// processes, mounts and descriptors are real; only the manager is not.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ckptfs::testing {

class FakeServiceManager {
 public:
  // Binds DIR/notify and DIR/bus; serves the bus on a thread of its own.
  explicit FakeServiceManager(const std::string& dir);
  ~FakeServiceManager();
  FakeServiceManager(const FakeServiceManager&) = delete;
  FakeServiceManager& operator=(const FakeServiceManager&) = delete;

  // The job the bus reports for the unit: "restart", "stop", or "" for none.
  void SetJobType(const std::string& type);
  // Starts `argv` (argv[0] an absolute path) as the service's main process,
  // with NOTIFY_SOCKET, DBUS_SYSTEM_BUS_ADDRESS and the stored descriptors;
  // its standard output and error appended to `log_path`.
  pid_t Start(const std::vector<std::string>& argv, const std::string& log_path);
  // The FDNAME of each stored descriptor, after reading every notification sent so far.
  std::vector<std::string> StoredNames();
  // READY=1 notifications seen so far.
  int ReadyCount();

 private:
  struct BusServer;
  void ReadNotifications();

  std::string notify_path_;
  int notify_fd_ = -1;
  std::mutex mu_;
  std::vector<std::pair<std::string, int>> store_;  // (name, descriptor), in the order stored
  int ready_ = 0;
  std::unique_ptr<BusServer> bus_;
};

}  // namespace ckptfs::testing
