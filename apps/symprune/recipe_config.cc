#include "recipe_config.h"

#include <fmt/ranges.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "io/text_file.h"

namespace symprune::app {
namespace {

std::string read_text(const std::filesystem::path& path) {
  // As every input file: missing, a directory, a device, unreadable, each named. The parsers name what is not
  // a recipe's text themselves, by line.
  std::string text = io::read_input_file(path, "recipe (--recipe)");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // UTF-8 byte order mark
  return text;
}

bool is_bare_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
}

// The flat subset of TOML a recipe needs: `key = value` with strings, numbers, booleans and (possibly
// multi-line) arrays of those. Tables, dotted keys and inline tables are rejected, since options are flat.
class TomlReader {
 public:
  TomlReader(const std::filesystem::path& path, const std::string& text)
      : path_(path.string()), text_(text) {}

  std::vector<RecipeEntry> read() {
    std::vector<RecipeEntry> entries;
    std::map<std::string, int> seen;
    while (true) {
      skip_blank_lines();
      if (at_end()) break;
      const int key_line = line_;
      if (peek() == '[') {
        std::size_t end = text_.find('\n', pos_);
        std::string header = text_.substr(pos_, end == std::string::npos ? std::string::npos : end - pos_);
        error("table header {} is not supported: recipe options are top-level `key = value` lines",
              trim(header));
      }
      std::string key = read_key();
      skip_spaces();
      if (peek() == '.') error("dotted key '{}.…' is not supported: recipe options are flat", key);
      if (peek() != '=') error("expected '=' after key '{}'", key);
      ++pos_;
      skip_spaces();
      RecipeEntry entry{key, {}, key_line};
      if (peek() == '[') {
        read_array(key, entry.values);
      } else {
        entry.values.push_back(read_scalar(key));
      }
      end_of_line(key);
      auto [it, inserted] = seen.emplace(key, key_line);
      if (!inserted) error_at(key_line, "key '{}' is given twice (first on line {})", key, it->second);
      entries.push_back(std::move(entry));
    }
    return entries;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error_at(int line, fmt::format_string<Args...> format, Args&&... args) const {
    fail("recipe {}: TOML line {}: {}", path_, line, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    error_at(line_, format, std::forward<Args>(args)...);
  }

  static std::string trim(const std::string& s) {
    std::size_t b = s.find_first_not_of(" \t\r");
    std::size_t e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  void skip_spaces() {
    while (!at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;
  }
  void skip_comment() {
    if (peek() == '#')
      while (!at_end() && peek() != '\n') ++pos_;
  }
  bool at_newline() const {
    return peek() == '\n' || (peek() == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n');
  }
  void take_newline() {
    if (peek() == '\r') ++pos_;
    ++pos_;
    ++line_;
  }
  // Skips whitespace, comments and newlines (between entries and inside arrays).
  void skip_blank_lines() {
    while (true) {
      skip_spaces();
      skip_comment();
      if (at_end() || !at_newline()) return;
      take_newline();
    }
  }
  void end_of_line(const std::string& key) {
    skip_spaces();
    skip_comment();
    if (at_end()) return;
    if (!at_newline()) error("unexpected text after the value of '{}'", key);
    take_newline();
  }

  std::string read_key() {
    if (peek() == '"' || peek() == '\'') return read_string("a key");
    std::size_t start = pos_;
    while (!at_end() && is_bare_key_char(peek())) ++pos_;
    if (pos_ == start) error("expected `key = value`, found '{}'", rest_of_line());
    return text_.substr(start, pos_ - start);
  }

  std::string rest_of_line() const {
    std::size_t end = text_.find('\n', pos_);
    return trim(text_.substr(pos_, end == std::string::npos ? std::string::npos : end - pos_));
  }

  std::string read_string(const char* what) {
    const char quote = peek();
    if (text_.compare(pos_, 3, std::string(3, quote)) == 0)
      error("multi-line strings are not supported in {}", what);
    ++pos_;
    std::string out;
    while (true) {
      if (at_end() || peek() == '\n') error("unterminated string in {}", what);
      char c = text_[pos_++];
      if (c == quote) return out;
      if (c == '\\' && quote == '"') {
        if (at_end()) error("unterminated string in {}", what);
        char e = text_[pos_++];
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          default:
            error("unsupported escape '\\{}' in {}", e, what);
        }
      } else {
        out += c;
      }
    }
  }

  std::string read_scalar(const std::string& key) {
    const char c = peek();
    if (c == '"' || c == '\'') return read_string(fmt::format("the value of '{}'", key).c_str());
    if (c == '{') error("inline table for '{}' is not supported: recipe options are flat", key);
    if (c == '[') error("nested array in the value of '{}' is not supported", key);
    std::size_t start = pos_;
    while (!at_end() && peek() != ' ' && peek() != '\t' && peek() != ',' && peek() != ']' && peek() != '#' &&
           !at_newline())
      ++pos_;
    std::string token = text_.substr(start, pos_ - start);
    if (token.empty()) error("missing value for '{}'", key);
    if (token == "true" || token == "false") return token;
    // TOML numbers: digits with optional sign, '_' separators, fraction, exponent; inf/nan.
    std::string number;
    bool digit = false;
    bool ok = true;
    for (std::size_t i = 0; i < token.size(); ++i) {
      char t = token[i];
      if (std::isdigit(static_cast<unsigned char>(t))) {
        digit = true;
        number += t;
      } else if (t == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(token[i - 1])) &&
                 i + 1 < token.size() && std::isdigit(static_cast<unsigned char>(token[i + 1]))) {
        // separator: dropped
      } else if (t == '+' || t == '-' || t == '.' || t == 'e' || t == 'E') {
        number += t;
      } else {
        ok = false;
        break;
      }
    }
    std::string unsigned_token = (token[0] == '+' || token[0] == '-') ? token.substr(1) : token;
    if (unsigned_token == "inf" || unsigned_token == "nan") return token;
    if (!ok || !digit) {
      error("invalid value '{}' for '{}' (TOML strings need quotes: {} = \"{}\")", token, key, key, token);
    }
    return number;
  }

  void read_array(const std::string& key, std::vector<std::string>& values) {
    ++pos_;  // '['
    while (true) {
      skip_blank_lines();
      if (at_end()) error("unterminated array for '{}'", key);
      if (peek() == ']') {
        ++pos_;
        break;
      }
      values.push_back(read_scalar(key));
      skip_blank_lines();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ']') {
        error("expected ',' or ']' in the array for '{}'", key);
      }
    }
    if (values.empty()) error("empty array for '{}'", key);
  }

  std::string path_;
  const std::string& text_;
  std::size_t pos_ = 0;
  int line_ = 1;
};

// Where the first node of a YAML document is, if it has one (an empty document, or one of comments only,
// has none).
class FirstNodeOfDocument : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> mark;

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& at, YAML::anchor_t) override { seen(at); }
  void OnScalar(const YAML::Mark& at, const std::string&, YAML::anchor_t, const std::string&) override {
    seen(at);
  }
  void OnSequenceStart(const YAML::Mark& at, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    seen(at);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& at, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    seen(at);
  }
  void OnMapEnd() override {}

 private:
  void seen(const YAML::Mark& at) {
    if (!mark) mark = at;
  }
};

// YAML::Load reads the first document and stops at a `---` or `...`: what follows would be dropped unread.
// The second document is looked at by hand, since yaml-cpp 0.7's LoadAll can loop forever on some malformed
// input (found by fuzz_recipe_yaml).
void check_one_document(const std::filesystem::path& path, const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  FirstNodeOfDocument first, second;
  if (!parser.HandleNextDocument(first) || !parser.HandleNextDocument(second) || !second.mark) return;
  fail(
      "recipe {}: YAML line {}: a second document (after `---` or `...`); a recipe is one document of "
      "`option: value` lines",
      path.string(), second.mark->line + 1);
}

std::vector<RecipeEntry> read_yaml(const std::filesystem::path& path, const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
    check_one_document(path, text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for its nesting limit is only "bad file", at a mark that need not be the place.
    fail(
        "recipe {}: YAML nested {} levels deep, deeper than yaml-cpp reads (a recipe is flat `option: value` "
        "lines)",
        path.string(), e.depth());
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) fail("recipe {}: YAML: {}", path.string(), e.msg);
    fail("recipe {}: YAML line {}, column {}: {}", path.string(), e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  std::vector<RecipeEntry> entries;
  if (!root || root.IsNull()) return entries;  // empty file: nothing to set
  SYMPRUNE_CHECK(root.IsMap(), "recipe {}: YAML line {}: expected a mapping of `option: value` lines",
                 path.string(), root.Mark().line + 1);
  std::map<std::string, int> seen;
  for (const auto& pair : root) {
    const YAML::Node& key_node = pair.first;
    const YAML::Node& value = pair.second;
    const int line = key_node.Mark().line + 1;
    SYMPRUNE_CHECK(key_node.IsScalar(), "recipe {}: YAML line {}: keys must be option names", path.string(),
                   line);
    RecipeEntry entry{key_node.Scalar(), {}, line};
    const std::string& key = entry.key;
    auto [it, inserted] = seen.emplace(key, line);
    SYMPRUNE_CHECK(inserted, "recipe {}: YAML line {}: key '{}' is given twice (first on line {})",
                   path.string(), line, key, it->second);
    if (value.IsScalar()) {
      entry.values.push_back(value.Scalar());
    } else if (value.IsSequence()) {
      for (const auto& item : value) {
        SYMPRUNE_CHECK(item.IsScalar(), "recipe {}: YAML line {}: the list for '{}' must hold plain values",
                       path.string(), item.Mark().line + 1, key);
        entry.values.push_back(item.Scalar());
      }
      SYMPRUNE_CHECK(!entry.values.empty(), "recipe {}: YAML line {}: empty list for '{}'", path.string(),
                     line, key);
    } else if (value.IsMap()) {
      fail(
          "recipe {}: YAML line {}: nested mapping under '{}' is not supported: recipe options are top-level "
          "`option: value` lines",
          path.string(), line, key);
    } else {
      fail("recipe {}: YAML line {}: '{}' has no value", path.string(), line, key);
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string normalize_key(const std::string& key) {
  std::string name = key;
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

RecipeFormat detect_recipe_format(const std::filesystem::path& path, const std::string& text) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".toml") return RecipeFormat::kToml;
  if (ext == ".yaml" || ext == ".yml") return RecipeFormat::kYaml;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    if (line[start] == '[') return RecipeFormat::kToml;
    std::size_t eq = line.find('=');
    std::size_t colon = line.find(':');
    return eq != std::string::npos && (colon == std::string::npos || eq < colon) ? RecipeFormat::kToml
                                                                                 : RecipeFormat::kYaml;
  }
  return RecipeFormat::kToml;  // no entries: either parser yields an empty recipe
}

std::vector<RecipeEntry> read_recipe(const std::filesystem::path& path) {
  std::string text = read_text(path);
  if (detect_recipe_format(path, text) == RecipeFormat::kYaml) return read_yaml(path, text);
  return TomlReader(path, text).read();
}

void apply_recipe(CLI::App& subcommand, const std::filesystem::path& path) {
  const std::string file = path.string();
  const std::vector<RecipeEntry> entries = read_recipe(path);

  // What the command line set, before the recipe adds anything: those options (and the options they exclude,
  // e.g. --nm on the command line replaces `sparsity` in the recipe) keep their command-line meaning.
  std::set<const CLI::Option*> from_cli;
  for (const CLI::Option* opt : subcommand.get_options())
    if (opt->count() > 0) from_cli.insert(opt);

  struct Planned {
    const RecipeEntry* entry;
    CLI::Option* option;
  };
  std::vector<Planned> planned;
  std::map<CLI::Option*, const RecipeEntry*> by_option;
  for (const RecipeEntry& entry : entries) {
    const std::string name = normalize_key(entry.key);
    CLI::Option* opt = nullptr;
    if (!name.empty() && name[0] != '-' && std::all_of(name.begin(), name.end(), is_bare_key_char))
      opt = subcommand.get_option_no_throw("--" + name);
    if (opt == nullptr || opt == subcommand.get_help_ptr() || opt == subcommand.get_help_all_ptr() ||
        !opt->get_configurable()) {
      std::vector<std::string> known;
      for (const CLI::Option* o : subcommand.get_options()) {
        if (o == subcommand.get_help_ptr() || o == subcommand.get_help_all_ptr() || !o->get_configurable())
          continue;
        if (!o->get_lnames().empty()) known.push_back(o->get_lnames().front());
      }
      std::sort(known.begin(), known.end());
      if (opt != nullptr)
        fail("recipe {}, line {}: '{}' cannot be set in a recipe", file, entry.line, entry.key);
      fail("recipe {}, line {}: unknown option '{}' for '{}' (recipe keys: {})", file, entry.line, entry.key,
           subcommand.get_name(), fmt::join(known, ", "));
    }
    auto [it, inserted] = by_option.emplace(opt, &entry);
    SYMPRUNE_CHECK(inserted, "recipe {}, line {}: '{}' sets --{} again (already set by '{}' on line {})",
                   file, entry.line, entry.key, name, it->second->key, it->second->line);
    if (from_cli.count(opt) != 0) continue;
    const auto excludes = opt->get_excludes();
    const auto on_cli = [&](CLI::Option* ex) { return from_cli.count(ex) != 0; };
    if (std::any_of(excludes.begin(), excludes.end(), on_cli)) {
      // --sparsity or --nm on the command line replaces the recipe's mask (a switch, its opposite); --group
      // alone qualifies a --sparsity mask and cannot stand in for the recipe's N:M one.
      const bool replaced = std::any_of(excludes.begin(), excludes.end(), [&](CLI::Option* ex) {
        return on_cli(ex) && ex->get_name() != "--group";
      });
      SYMPRUNE_CHECK(
          replaced,
          "recipe {}, line {}: '{}' and --group on the command line exclude each other (--group is "
          "for --sparsity masks): give --sparsity too, to replace the recipe's mask, or leave out "
          "--group",
          file, entry.line, entry.key);
      continue;
    }
    planned.push_back({&entry, opt});
  }

  // Two recipe keys that exclude each other (sparsity and nm) are the recipe's own mistake: say so by name,
  // rather than leaving CLI11's "--sparsity excludes --nm" that does not mention the file.
  for (std::size_t i = 0; i < planned.size(); ++i) {
    for (std::size_t j = i + 1; j < planned.size(); ++j) {
      const auto excludes = planned[i].option->get_excludes();
      if (excludes.count(planned[j].option) != 0) {
        fail("recipe {}: '{}' (line {}) and '{}' (line {}) exclude each other; keep one", file,
             planned[i].entry->key, planned[i].entry->line, planned[j].entry->key, planned[j].entry->line);
      }
    }
  }

  for (const Planned& p : planned) {
    const RecipeEntry& entry = *p.entry;
    CLI::Option* opt = p.option;
    const bool is_flag = opt->get_expected_min() == 0;
    if (is_flag) {
      SYMPRUNE_CHECK(entry.values.size() == 1,
                     "recipe {}, line {}: '{}' is a flag: give true or false, not a list", file, entry.line,
                     entry.key);
    } else if (static_cast<int>(entry.values.size()) > std::max(opt->get_items_expected_max(), 1)) {
      fail("recipe {}, line {}: '{}' takes one value, got a list of {}", file, entry.line, entry.key,
           entry.values.size());
    }
    try {
      if (is_flag) {
        opt->add_result(opt->get_flag_value(normalize_key(entry.key), entry.values.front()));
      } else {
        opt->add_result(entry.values);
      }
      opt->run_callback();
    } catch (const std::exception& e) {
      fail("recipe {}, line {}: invalid value for '{}': {}", file, entry.line, entry.key, e.what());
    }
  }
}

CLI::Option* add_recipe_option(CLI::App* subcommand) {
  return subcommand
      ->add_option_function<std::string>(
          "--recipe", [subcommand](const std::string& file) { apply_recipe(*subcommand, file); },
          "TOML or YAML file with prune options (flat `key = value` / `key: value`); CLI flags override it")
      ->type_name("FILE")
      ->configurable(false);
}

}  // namespace symprune::app
