#include "cli_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace symprune::app {
namespace {

// Options where +/-inf is a meaningful value (the l-infinity norm).
const std::set<std::string> kInfinityAllowed = {"--p", "--reg-p"};
// Options where an empty value means something ("<command> --<name>"): the text to tokenize.
const std::set<std::string> kEmptyAllowed = {"tokenize --text"};

// Whether `option` of `command` takes "" (kEmptyAllowed).
bool option_allows_empty(const CLI::App& command, const CLI::Option& option) {
  const auto& names = option.get_lnames();
  return std::any_of(names.begin(), names.end(), [&](const std::string& l) {
    return kEmptyAllowed.count(command.get_name() + " --" + l) != 0;
  });
}

// E-OPT-EMPTY's text after "--name: ", with `alternative` (", or leave the option out"; empty for a required
// option) after "give one".
std::string empty_value_message(std::string_view alternative) {
  return fmt::format("an empty value (an unset variable in a script?): give one{}", alternative);
}

// An option given "" is almost always an unset variable in a script (`--checkpoint "$CKPT"`): refused, where
// it used to mean "not given" for paths (a run without its checkpoint, report or evaluation) and a confusing
// message for the rest.
CLI::Validator non_empty_check(bool required) {
  return CLI::Validator(
      [required](std::string& text) -> std::string {
        return text.empty() ? empty_value_message(required ? "" : ", or leave the option out")
                            : std::string();
      },
      "");
}

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

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours cost 1
// ("modle" is 1 from "model").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The known words near `word`: those it begins (3 characters at least), else those at the smallest edit
// distance when that is small for its length. Empty when none is near.
std::vector<std::string> near_words(const std::string& word, const std::vector<std::string>& known) {
  std::vector<std::string> begun;
  if (word.size() >= 3)
    for (const auto& k : known)
      if (k.size() > word.size() && k.compare(0, word.size(), word) == 0) begun.push_back(k);
  if (!begun.empty()) return begun;
  // Short words are near too many others: a word of 2 characters gets no guess, one of 3 or 4 one edit.
  const size_t reach = word.size() <= 2 ? 0 : word.size() <= 4 ? 1 : std::max<size_t>(2, word.size() / 3);
  size_t best = reach + 1;
  std::vector<std::string> nearest;
  for (const auto& k : known) {
    const size_t distance = edit_distance(word, k);
    if (distance < best) {
      best = distance;
      nearest.clear();
    }
    if (distance == best && distance <= reach) nearest.push_back(k);
  }
  return nearest;
}

// " (did you mean 'prune'?)": each near word between `before` and `after`.
std::string did_you_mean(const std::vector<std::string>& near, const char* before, const char* after) {
  if (near.empty()) return {};
  std::vector<std::string> quoted;
  for (const auto& n : near) quoted.push_back(before + n + after);
  return fmt::format(" (did you mean {}?)", fmt::join(quoted, " or "));
}

// The command's full name as a user types it ("symprune prune").
std::string command_path(const CLI::App& app) {
  std::string path = app.get_name();
  for (const CLI::App* up = app.get_parent(); up != nullptr; up = up->get_parent())
    path = up->get_name() + " " + path;
  return path;
}

// The option named by `word` ("--name", "--name=value", "-n") in `app` or a command above it (their
// options may follow a subcommand: fallthrough), or null.
const CLI::Option* find_option(const CLI::App& app, const std::string& word) {
  const bool is_long = word.rfind("--", 0) == 0;
  const std::string name = word.substr(is_long ? 2 : 1, is_long ? word.find('=') - 2 : 1);
  for (const CLI::App* scope = &app; scope != nullptr; scope = scope->get_parent())
    for (const CLI::Option* option : scope->get_options()) {
      const auto& names = is_long ? option->get_lnames() : option->get_snames();
      if (std::find(names.begin(), names.end(), name) != names.end()) return option;
    }
  return nullptr;
}

// The names of `app`'s subcommands, sorted.
std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  std::sort(names.begin(), names.end());
  return names;
}

bool looks_like_option(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  return word[1] == '-' ? word.size() > 2 : std::isalpha(static_cast<unsigned char>(word[1])) != 0;
}

}  // namespace

std::optional<std::string> unknown_command_line_word(const CLI::App& app, int argc, const char* const* argv) {
  const std::vector<std::string> words(argv + std::min(argc, 1), argv + argc);
  for (const auto& word : words) {
    if (word == "--") break;
    if (word == "--help" || word == "-h" || word == "--version") return std::nullopt;
  }
  const CLI::App* command = &app;
  const auto subcommands = [](const CLI::App& a) {
    return a.get_subcommands([](const CLI::App*) { return true; });
  };
  const auto takes_positionals = [](const CLI::App& a) {
    const auto options = a.get_options();
    return std::any_of(options.begin(), options.end(),
                       [](const CLI::Option* o) { return o->get_positional(); });
  };
  const auto unexpected = [&](const std::string& word) {
    return fmt::format(
        "{0}: unexpected argument '{1}': '{0}' takes options only (a value whose option name is missing or "
        "misspelled? '{0} --help' lists the options)",
        command_path(*command), word);
  };
  // The values of each single-value option given so far: CLI11 says "--out: At Most 1 required but received
  // 2" for a repeated one.
  std::map<const CLI::Option*, std::vector<std::string>> single_values;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word == "--") {  // what follows is positional
      if (i + 1 < words.size() && subcommands(*command).empty() && !takes_positionals(*command))
        return unexpected(words[i + 1]);
      break;
    }
    if (looks_like_option(word)) {
      const CLI::Option* option = find_option(*command, word);
      if (option == nullptr) {
        // "-model" is named whole, and compared with the long names.
        const bool is_long = word[1] == '-';
        const std::string name = is_long ? word.substr(0, word.find('=')) : word;
        const std::string bare = name.substr(is_long ? 2 : 1);
        std::vector<std::string> known;
        for (const CLI::App* scope = command; scope != nullptr; scope = scope->get_parent())
          for (const CLI::Option* o : scope->get_options())
            for (const auto& l : o->get_lnames()) known.push_back(l);
        std::sort(known.begin(), known.end());
        const std::string hint = did_you_mean(near_words(bare, known), "--", "");
        return fmt::format(
            "{}: unknown option {}{}", command_path(*command), name,
            hint.empty() ? fmt::format(" ('{} --help' lists the options)", command_path(*command)) : hint);
      }
      // CLI11 reads "--report=" as "--report" and takes the next word as its value ("--report=$R --force"
      // with R unset would write the report to a file named --force): refused as the empty value it is.
      const size_t equals = word.find('=');
      if (equals == word.size() - 1 && option->get_items_expected_max() > 0) {
        const std::string name = word.substr(0, equals);
        return fmt::format("{}: {}", name,
                           empty_value_message(option->get_required() ? ""
                                               : option_allows_empty(*command, *option)
                                                   ? fmt::format(", or write {} \"\" for an empty one", name)
                                                   : ", or leave the option out"));
      }
      const bool single = option->get_items_expected_max() == 1 &&
                          option->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw;
      if (single) {
        std::vector<std::string>& values = single_values[option];
        values.push_back(equals != std::string::npos ? word.substr(equals + 1)
                         : i + 1 < words.size()      ? words[i + 1]
                                                     : "");
        if (values.size() == 2)
          return fmt::format("{}: --{} is given twice ('{}', then '{}'): give it once",
                             command_path(*command),
                             option->get_lnames().empty() ? option->get_name() : option->get_lnames().front(),
                             values[0], values[1]);
      }
      // Its values are words too: skip them (none given as --name=value). CLI11 takes the values an option
      // requires whatever they look like (--text -Hello), and further ones while they look like no option.
      if (equals == std::string::npos) {
        const int required = option->get_items_expected_min(), most = option->get_items_expected_max();
        int taken = 0;
        for (; taken < required && i + 1 < words.size(); ++taken) ++i;
        for (;
             taken < most && i + 1 < words.size() && !looks_like_option(words[i + 1]) && words[i + 1] != "--";
             ++taken)
          ++i;
      }
      continue;
    }
    const auto below = subcommands(*command);
    if (below.empty()) {
      if (takes_positionals(*command)) continue;  // a positional argument of the command
      return unexpected(word);
    }
    const auto found =
        std::find_if(below.begin(), below.end(), [&](const CLI::App* sub) { return sub->check_name(word); });
    if (found != below.end()) {
      command = *found;
      continue;
    }
    const std::vector<std::string> names = command_names(*command);
    return fmt::format("{}: unknown command '{}'{}; the commands are: {}", command_path(*command), word,
                       did_you_mean(near_words(word, names), "'", "'"), fmt::join(names, ", "));
  }
  if (command == &app && !subcommands(app).empty() && app.get_require_subcommand_min() > 0) {
    return fmt::format("{}: a command is required: {} ('{} --help' describes them)", app.get_name(),
                       fmt::join(command_names(app), ", "), app.get_name());
  }
  return std::nullopt;
}

void add_value_checks(CLI::App& app) {
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
    // Added last as a transform, so it runs first.
    if (opt->get_items_expected_max() > 0 && !option_allows_empty(app, *opt))
      opt->transform(non_empty_check(opt->get_required()));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) add_value_checks(*sub);
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
