// The words of an option whose value is one of a few (fill=, verify=, ...):
// one table per type, next to the type, that the mount options are parsed
// with and `ckptfsctl status`/`stats` print them from, so that the word read
// and the word shown cannot drift apart, and nothing after the parser
// compares the word again.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ckptfs {

template <class T>
struct OptionWord {
  T value;
  const char* word;
};

template <class T, size_t N>
std::optional<T> ValueOfWord(const OptionWord<T> (&words)[N], std::string_view word) {
  for (const auto& w : words) {
    if (word == w.word) return w.value;
  }
  return std::nullopt;
}

// Every value of the type has a row; a value without one is a bug, shown as
// "?" rather than crashing a status reply.
template <class T, size_t N>
const char* WordOf(const OptionWord<T> (&words)[N], T value) {
  for (const auto& w : words) {
    if (w.value == value) return w.word;
  }
  return "?";
}

// "a, b or c", in the table's order: what an error says was expected.
template <class T, size_t N>
std::string WordChoices(const OptionWord<T> (&words)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += words[i].word;
  }
  return out;
}

}  // namespace ckptfs
