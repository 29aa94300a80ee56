#pragma once
// Errors: bad input throws symprune::Error with a message naming the file and the problem;
// broken internal invariants abort via SYMPRUNE_ASSERT (DESIGN.md §7.3).
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace symprune {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void assertion_failed(const char* expression, const char* file, int line, const std::string& message);

}  // namespace symprune

// Throws symprune::Error(fmt::format(...)) when the condition is false: for bad user input.
#define SYMPRUNE_CHECK(condition, ...)          \
  do {                                          \
    if (!(condition)) ::symprune::fail(__VA_ARGS__); \
  } while (0)

// Aborts with expression and file:line: for invariants that only a bug can break.
#define SYMPRUNE_ASSERT(condition, ...)                                                   \
  do {                                                                                    \
    if (!(condition))                                                                     \
      ::symprune::assertion_failed(#condition, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
