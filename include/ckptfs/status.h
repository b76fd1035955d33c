// Errors as values, in the LevelDB manner: a Status says whether an operation
// worked and, if not, why (the message names the path and the cause).
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace ckptfs {

// [[nodiscard]]: a Status or Result dropped on the floor is an error
// ignored; the compiler says so. Where ignoring one is right, say why and
// cast it to void.
class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk,
    kError,     // a failure the caller reports
    kChanged,   // the input changed underneath us; the caller should retry
    kNotFound,  // an expected thing is absent
    kCorrupt,   // content does not match what the index recorded for it
    kNeedMore,  // a parser needs more input bytes than it was given
    kFull,      // a bounded resource (a cache tier) has no room now
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(Code::kError, std::move(message)); }
  static Status Changed(std::string message) { return Status(Code::kChanged, std::move(message)); }
  static Status NotFound(std::string message) { return Status(Code::kNotFound, std::move(message)); }
  static Status Corrupt(std::string message) { return Status(Code::kCorrupt, std::move(message)); }
  static Status NeedMore(std::string message) { return Status(Code::kNeedMore, std::move(message)); }
  static Status Full(std::string message) { return Status(Code::kFull, std::move(message)); }
  // "PATH: strerror(err)" in the style of coreutils; keeps `err` so that a
  // FUSE reply can pass the real cause on instead of a generic EIO.
  static Status FromErrno(const std::string& what, int err);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  bool is_changed() const { return code_ == Code::kChanged; }
  const std::string& message() const { return message_; }
  // The errno behind a FromErrno status; 0 for every other status.
  int error_number() const { return errno_; }

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
  int errno_ = 0;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ckptfs
