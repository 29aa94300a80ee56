#pragma once
// The message of the symprune::Error a callable throws, for tests that compare error texts. Header-only:
// the kernel tests link no test support library.
#include <string>

#include "core/error.h"

namespace symprune::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no symprune::Error thrown)";
}

}  // namespace symprune::test
