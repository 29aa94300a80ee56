#include "cli_checks.h"

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <set>

namespace symprune::app {
namespace {

// Options where +/-inf is a meaningful value (the l-infinity norm).
const std::set<std::string> kInfinityAllowed = {"--p", "--reg-p"};

bool is_decimal_integer(const std::string& text, bool allow_sign) {
  size_t i = (allow_sign && !text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  return true;
}

CLI::Validator integer_check(bool is_unsigned) {
  return CLI::Validator(
      [is_unsigned](std::string& text) -> std::string {
        if (!is_decimal_integer(text, !is_unsigned))
          return "'" + text + "' is not " + (is_unsigned ? "a non-negative" : "an") +
                 " integer (decimal digits only)";
        const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
        const char* end = text.data() + text.size();
        std::from_chars_result parsed;
        if (is_unsigned) {
          uint64_t value = 0;
          parsed = std::from_chars(begin, end, value);
        } else {
          int64_t value = 0;
          parsed = std::from_chars(begin, end, value);
        }
        if (parsed.ec == std::errc::result_out_of_range)
          return text + " is outside the range of a 64-bit " + (is_unsigned ? "unsigned " : "") + "integer";
        // CLI11 converts in base 0: hand it the plain decimal form ("010" would be octal 8).
        const bool negative = text[0] == '-';
        std::string digits = text.substr(text[0] == '-' || text[0] == '+' ? 1 : 0);
        digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
        text = (negative && digits != "0" ? "-" : "") + digits;
        return {};
      },
      "");
}

CLI::Validator finite_check(bool allow_infinity) {
  return CLI::Validator(
      [allow_infinity](std::string& text) -> std::string {
        // CLI11 converts an empty value to 0 (--sparsity "" would prune nothing, silently).
        if (text.find_first_not_of(" \t") == std::string::npos) return "an empty value is not a number";
        // strtod also reads hexadecimal floats ("0x0.8" is 0.5): numbers here are decimal only.
        if (text.find_first_of("xXpP") != std::string::npos) return "'" + text + "' is not a decimal number";
        char* end = nullptr;
        errno = 0;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str()) return {};  // not a number at all: CLI11's own conversion reports it
        if (std::isnan(value)) return "'" + text + "' is not a number";
        if (std::isinf(value) && !allow_infinity) return "'" + text + "' is not a finite number";
        // A nonzero value too small for a double would silently become 0 (or lose its digits as a subnormal).
        if ((errno == ERANGE && !std::isinf(value)) || (value != 0.0 && std::fabs(value) < DBL_MIN))
          return "'" + text +
                 "' is too close to 0 for a double (a nonzero magnitude must be at least 2.3e-308)";
        return {};
      },
      "");
}

}  // namespace

void add_numeric_checks(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type == "INT" || type == "UINT") {
      opt->transform(integer_check(type == "UINT"));  // may rewrite to plain decimal
    } else if (type == "FLOAT") {
      bool infinity = false;
      for (const auto& name : opt->get_lnames())
        infinity = infinity || kInfinityAllowed.count("--" + name) != 0;
      opt->check(finite_check(infinity));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) add_numeric_checks(*sub);
}

CLI::Option* add_python_seed_option(CLI::App* sub, const std::string& name, uint64_t& seed,
                                    const std::string& description) {
  return sub
      ->add_option_function<std::string>(
          name,
          [&seed, name](const std::string& text) {
            if (!is_decimal_integer(text, /*allow_sign=*/true))
              throw CLI::ValidationError(name, "'" + text + "' is not an integer");
            const char* begin = text.data() + ((text[0] == '-' || text[0] == '+') ? 1 : 0);
            uint64_t magnitude = 0;
            const auto parsed = std::from_chars(begin, text.data() + text.size(), magnitude);
            if (parsed.ec == std::errc::result_out_of_range)
              throw CLI::ValidationError(name, text + ": |seed| must be less than 2^64");
            seed = magnitude;  // Python: random.seed(-S) == random.seed(S) for an int S
          },
          description)
      ->type_name("SEED");
}

}  // namespace symprune::app
