#pragma once
// Helpers shared by the mask and refinement unit tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/masks.h"

namespace symprune::testing {

// Runs body and expects a symprune::Error whose message contains `part`.
template <typename F>
void expect_error(F body, const std::string& part) {
  try {
    body();
    ADD_FAILURE() << "expected symprune::Error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what();
  }
}

// A [rows, cols] mask pruning pruned[r] in row r.
inline Mask mask_from(int64_t rows, int64_t cols, const std::vector<std::vector<int>>& pruned) {
  Mask mask(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int c : pruned[static_cast<size_t>(r)]) mask.set(r, c, true);
  return mask;
}

// The pruned columns of row r, ascending.
inline std::vector<int> pruned_columns(const Mask& mask, int64_t r) {
  std::vector<int> out;
  for (int64_t c = 0; c < mask.cols(); ++c)
    if (mask.pruned(r, c)) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace symprune::testing
