#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace symprune {

void assertion_failed(const char* expression, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "symprune: internal error: assertion `%s` failed at %s:%d%s%s\n", expression, file, line,
               message.empty() ? "" : ": ", message.c_str());
  std::abort();
}

}  // namespace symprune
