#include "ckptfs/systemd_job.h"

#include <systemd/sd-bus.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace ckptfs::supervisor {

namespace {

constexpr const char* kManager = "org.freedesktop.systemd1";
constexpr const char* kManagerPath = "/org/freedesktop/systemd1";
constexpr const char* kPrivateBus = "unix:path=/run/systemd/private";
constexpr uint64_t kCallTimeoutUsec = 5'000'000;

struct BusUnref {
  void operator()(sd_bus* b) const { sd_bus_flush_close_unref(b); }
};
struct MessageUnref {
  void operator()(sd_bus_message* m) const { sd_bus_message_unref(m); }
};
using Bus = std::unique_ptr<sd_bus, BusUnref>;
using Message = std::unique_ptr<sd_bus_message, MessageUnref>;

// Owns what sd-bus fills in on failure.
struct BusError {
  sd_bus_error e{};  // SD_BUS_ERROR_NULL, without its C99 compound literal
  ~BusError() { sd_bus_error_free(&e); }
  std::string Describe(int rc) const {
    return e.message != nullptr ? std::string(e.message) : std::string(std::strerror(-rc));
  }
};

Result<Bus> Connect() {
  const char* env = std::getenv("DBUS_SYSTEM_BUS_ADDRESS");
  const std::string address = env != nullptr && env[0] != '\0' ? env : kPrivateBus;
  sd_bus* raw = nullptr;
  int rc = sd_bus_new(&raw);
  Bus bus(raw);
  if (rc >= 0) rc = sd_bus_set_address(raw, address.c_str());
  // systemd's private socket speaks peer-to-peer: no Hello, no bus names.
  if (rc >= 0) rc = sd_bus_set_bus_client(raw, address != kPrivateBus);
  // systemd is waiting for this process to exit, not blocked: it answers at
  // once. The bound keeps a wedged bus from eating the stop timeout.
  if (rc >= 0) rc = sd_bus_set_method_call_timeout(raw, kCallTimeoutUsec);
  if (rc >= 0) rc = sd_bus_start(raw);
  if (rc < 0) return Status::FromErrno("connecting to systemd at " + address, -rc);
  return bus;
}

// The object path of the unit this process belongs to.
Result<std::string> OwnUnitPath(sd_bus* bus) {
  BusError error;
  sd_bus_message* raw = nullptr;
  const int rc = sd_bus_call_method(bus, kManager, kManagerPath, "org.freedesktop.systemd1.Manager",
                                    "GetUnitByPID", &error.e, &raw, "u", static_cast<uint32_t>(::getpid()));
  Message reply(raw);
  if (rc < 0) return Status::Error("systemd GetUnitByPID(" + std::to_string(::getpid()) + "): " + error.Describe(rc));
  const char* path = nullptr;
  if (sd_bus_message_read(raw, "o", &path) < 0 || path == nullptr) {
    return Status::Error("systemd GetUnitByPID: a reply without a unit path");
  }
  return std::string(path);
}

// The unit's Job property, (job id, job path); id 0 is no job.
Result<std::string> JobPath(sd_bus* bus, const std::string& unit) {
  BusError error;
  sd_bus_message* raw = nullptr;
  const int rc = sd_bus_get_property(bus, kManager, unit.c_str(), "org.freedesktop.systemd1.Unit", "Job",
                                     &error.e, &raw, "(uo)");
  Message reply(raw);
  if (rc < 0) return Status::Error("systemd " + unit + " Job: " + error.Describe(rc));
  uint32_t id = 0;
  const char* path = nullptr;
  if (sd_bus_message_read(raw, "(uo)", &id, &path) < 0) return Status::Error("systemd " + unit + " Job: malformed");
  return id == 0 || path == nullptr ? std::string() : std::string(path);
}

}  // namespace

Result<std::string> OwnUnitJobType() {
  auto bus = Connect();
  if (!bus.ok()) return bus.status();
  auto unit = OwnUnitPath(bus->get());
  if (!unit.ok()) return unit.status();
  auto job = JobPath(bus->get(), *unit);
  if (!job.ok() || job->empty()) return job;
  BusError error;
  char* type = nullptr;
  const int rc = sd_bus_get_property_string(bus->get(), kManager, job->c_str(), "org.freedesktop.systemd1.Job",
                                            "JobType", &error.e, &type);
  if (rc < 0) return Status::Error("systemd " + *job + " JobType: " + error.Describe(rc));
  std::string out = type;
  std::free(type);
  return out;
}

bool StoppingForRestart(std::string* why) {
  const Result<std::string> type = OwnUnitJobType();
  if (!type.ok()) {
    *why = type.status().message();
    return false;
  }
  *why = type->empty() ? "no systemd job for this unit" : "systemd job " + *type;
  return *type == "restart";
}

}  // namespace ckptfs::supervisor
