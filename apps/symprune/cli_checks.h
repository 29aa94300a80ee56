#pragma once
// Checks that CLI11 2.1.2 does not make on numbers: it reads integers with strtoll/strtoull in base 0,
// so "010" is 8, "0x10" is 16, "-1" wraps to 2^64-1 for unsigned options and out-of-range values are
// clamped silently; and it accepts "nan" for floating-point options. Also the calibration seed with
// Python's random.seed semantics.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

namespace symprune::app {

// Adds to every option of `app` and its subcommands (recursively) that takes a value: no empty value (but
// for `tokenize --text`); and to the INT, UINT and FLOAT ones: decimal integers only, within the 64-bit
// range of their sign (narrower types are range-checked by CLI11 itself), and finite floating-point values
// except for "--p" and "--reg-p" (the l-infinity norm).
void add_value_checks(CLI::App& app);

// `--seed S`: any decimal integer with Python's random.seed(S) semantics for ints, which seed with |S|
// (random.seed(-1) equals random.seed(1)); |S| must fit in 64 bits.
CLI::Option* add_python_seed_option(CLI::App* sub, const std::string& name, uint64_t& seed,
                                    const std::string& description);

// CLI11 2.1.2 misleads on a misspelled word: an unknown subcommand gives "A subcommand is required", and an
// unknown option or argument is reported only after every required option is present (`prune --modle M`
// says "--model is required"). Checked before CLI11 parses argv[1..argc): the first word that is neither a
// subcommand of `app`, nor an option of the (sub)command it follows or of a command above it, nor an
// option's value, nor an argument of a command that takes positional ones, gives a message that names the
// closest known word when one is near, or what lists them; so does a missing subcommand. nullopt when
// every word is known, after `--`, and when --help/-h or --version is given (CLI11 answers those).
std::optional<std::string> unknown_command_line_word(const CLI::App& app, int argc, const char* const* argv);

}  // namespace symprune::app
