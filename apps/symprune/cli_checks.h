#pragma once
// Checks that CLI11 2.1.2 does not make on numbers: it reads integers with strtoll/strtoull in base 0,
// so "010" is 8, "0x10" is 16, "-1" wraps to 2^64-1 for unsigned options and out-of-range values are
// clamped silently; and it accepts "nan" for floating-point options. Also the calibration seed with
// Python's random.seed semantics.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace symprune::app {

// Adds to every INT, UINT and FLOAT option of `app` and its subcommands (recursively): decimal integers
// only, within the 64-bit range of their sign (narrower types are range-checked by CLI11 itself), and
// finite floating-point values except for the options named in allow_infinity (e.g. "--p").
void add_numeric_checks(CLI::App& app);

// `--seed S`: any decimal integer with Python's random.seed(S) semantics for ints, which seed with |S|
// (random.seed(-1) equals random.seed(1)); |S| must fit in 64 bits.
CLI::Option* add_python_seed_option(CLI::App* sub, const std::string& name, uint64_t& seed,
                                    const std::string& description);

}  // namespace symprune::app
