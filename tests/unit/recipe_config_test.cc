// `--recipe FILE` (apps/symprune/recipe_config.h): TOML and YAML recipes fill a subcommand's options, the
// command line wins, and every bad recipe is an error naming the file, the line and the key.
#include "symprune/recipe_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::app {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The prune options that matter for recipes: strings, numbers, a flag, an exclusive pair, a list, a required
// one.
struct PruneOptions {
  std::string model;
  std::string method;
  std::optional<double> sparsity;
  std::string nm;
  std::string group;
  int nsamples = 128;
  int seqlen = 2048;
  int eval_seqlen = 0;
  bool force = false;
  std::vector<std::string> layers;
  bool ran = false;
};

class RecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = symprune::testing::make_temp_dir("recipe_config_test");
    app_.require_subcommand(1);
    CLI::App* sub = app_.add_subcommand("prune", "prune a model");
    sub->add_option("--model", o_.model)->required();
    sub->add_option("--method", o_.method)->required();
    CLI::Option* sparsity = sub->add_option("--sparsity", o_.sparsity);
    CLI::Option* nm = sub->add_option("--nm", o_.nm);
    sparsity->excludes(nm);
    nm->excludes(sub->add_option("--group", o_.group));
    sub->add_option("--nsamples", o_.nsamples);
    sub->add_option("--seqlen", o_.seqlen);
    sub->add_option("--eval-seqlen", o_.eval_seqlen);
    sub->add_flag("--force", o_.force);
    sub->add_option("--layers", o_.layers);
    add_recipe_option(sub);
    sub->callback([this] { o_.ran = true; });
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }
  void parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prune");
    std::reverse(args.begin(), args.end());  // CLI11's vector overload takes the arguments reversed
    app_.parse(args);
  }
  // The symprune::Error message a parse throws ("" when it succeeds or throws something else).
  std::string parse_error(std::vector<std::string> args) {
    try {
      parse(std::move(args));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  CLI::App app_{"test"};
  PruneOptions o_;
};

TEST_F(RecipeTest, TomlRecipeSetsOptions) {
  std::string recipe = write("wanda.toml",
                             "# wanda at 50%\n"
                             "model = \"/models/llama\"\n"
                             "method = 'wanda'   # comment after a value\n"
                             "sparsity = 0.5\n"
                             "nsamples = 1_024\n"
                             "eval_seqlen = 512\n"
                             "force = true\n"
                             "layers = [\n  \"q_proj\", # first\n  \"k_proj\",\n]\n");
  parse({"--recipe", recipe});
  EXPECT_TRUE(o_.ran);
  EXPECT_EQ(o_.model, "/models/llama");
  EXPECT_EQ(o_.method, "wanda");
  ASSERT_TRUE(o_.sparsity.has_value());
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.5);
  EXPECT_EQ(o_.nsamples, 1024);
  EXPECT_EQ(o_.eval_seqlen, 512);
  EXPECT_EQ(o_.seqlen, 2048);  // not in the recipe: default kept
  EXPECT_TRUE(o_.force);
  EXPECT_EQ(o_.layers, (std::vector<std::string>{"q_proj", "k_proj"}));
}

TEST_F(RecipeTest, YamlRecipeSetsOptions) {
  std::string recipe = write("wanda.yaml",
                             "# wanda at 2:4\n"
                             "model: /models/llama\n"
                             "method: \"wanda\"\n"
                             "nm: 2:4\n"
                             "nsamples: 64\n"
                             "eval-seqlen: 256\n"
                             "force: yes\n"
                             "layers: [q_proj, v_proj]\n");
  parse({"--recipe", recipe});
  EXPECT_EQ(o_.model, "/models/llama");
  EXPECT_EQ(o_.method, "wanda");
  EXPECT_EQ(o_.nm, "2:4");  // kept as written, not YAML 1.1 base-60
  EXPECT_FALSE(o_.sparsity.has_value());
  EXPECT_EQ(o_.nsamples, 64);
  EXPECT_EQ(o_.eval_seqlen, 256);
  EXPECT_TRUE(o_.force);
  EXPECT_EQ(o_.layers, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST_F(RecipeTest, YamlBlockListAndFalseFlag) {
  std::string recipe =
      write("r.yml", "model: m\nmethod: magnitude\nsparsity: 0.25\nforce: false\nlayers:\n  - a\n  - b\n");
  parse({"--recipe", recipe});
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.25);
  EXPECT_FALSE(o_.force);
  EXPECT_EQ(o_.layers, (std::vector<std::string>{"a", "b"}));
}

TEST_F(RecipeTest, FormatDetectedFromContentWithoutKnownExtension) {
  EXPECT_EQ(detect_recipe_format("r.txt", "# c\n\nmethod = \"wanda\"\n"), RecipeFormat::kToml);
  EXPECT_EQ(detect_recipe_format("r.txt", "method: wanda\nsparsity = 1\n"), RecipeFormat::kYaml);
  EXPECT_EQ(detect_recipe_format("r", "[prune]\n"), RecipeFormat::kToml);
  EXPECT_EQ(detect_recipe_format("r", "---\nmethod: wanda\n"), RecipeFormat::kYaml);
  EXPECT_EQ(detect_recipe_format("r.TOML", "method: wanda\n"), RecipeFormat::kToml);  // extension wins
  EXPECT_EQ(detect_recipe_format("r.yml", "method = wanda\n"), RecipeFormat::kYaml);

  std::string yaml = write("recipe", "model: m\nmethod: ria\nsparsity: 0.5\n");
  parse({"--recipe", yaml});
  EXPECT_EQ(o_.method, "ria");
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.5);
}

TEST_F(RecipeTest, TomlWithoutExtensionDetectedFromContent) {
  std::string toml = write("recipe.conf", "model = \"m\"\nmethod = \"ria\"\nnm = \"4:8\"\n");
  parse({"--recipe", toml});
  EXPECT_EQ(o_.method, "ria");
  EXPECT_EQ(o_.nm, "4:8");
}

TEST_F(RecipeTest, CommandLineOverridesRecipe) {
  std::string recipe = write("r.toml",
                             "model = \"m\"\nmethod = \"wanda\"\nsparsity = 0.5\nnsamples = 64\n"
                             "layers = [\"a\", \"b\"]\nforce = false\n");
  // Options before and after --recipe on the command line both win.
  parse({"--nsamples", "8", "--recipe", recipe, "--method", "magnitude", "--layers", "c", "--force"});
  EXPECT_EQ(o_.nsamples, 8);
  EXPECT_EQ(o_.method, "magnitude");
  EXPECT_EQ(o_.layers, (std::vector<std::string>{"c"}));
  EXPECT_TRUE(o_.force);
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.5);  // not on the command line: from the recipe
  EXPECT_EQ(o_.model, "m");
}

TEST_F(RecipeTest, CommandLineReplacesExcludedRecipeOption) {
  // --nm on the command line replaces the recipe's sparsity instead of clashing with it.
  std::string recipe = write("r.yaml", "model: m\nmethod: wanda\nsparsity: 0.5\n");
  parse({"--recipe", recipe, "--nm", "2:4"});
  EXPECT_EQ(o_.nm, "2:4");
  EXPECT_FALSE(o_.sparsity.has_value());
}

TEST_F(RecipeTest, RecipeSuppliesRequiredOptionsOnly) {
  std::string recipe = write("r.toml", "method = \"wanda\"\n");
  EXPECT_THROW(parse({"--recipe", recipe}), CLI::RequiredError);  // --model is neither on the CLI nor in it
}

TEST_F(RecipeTest, UnderscoresAndDashesAreTheSameKey) {
  std::string recipe = write("r.toml", "model = \"m\"\nmethod = \"wanda\"\neval-seqlen = 100\n");
  parse({"--recipe", recipe});
  EXPECT_EQ(o_.eval_seqlen, 100);
  std::string both = write("both.yaml", "model: m\nmethod: wanda\neval-seqlen: 100\neval_seqlen: 200\n");
  EXPECT_EQ(parse_error({"--recipe", both}),
            "recipe " + both +
                ", line 4: 'eval_seqlen' sets --eval-seqlen again (already set by 'eval-seqlen' on line 3)");
}

TEST_F(RecipeTest, UnknownKeyNamesKeyFileAndLine) {
  std::string recipe = write("r.toml", "model = \"m\"\nmethod = \"wanda\"\nsparsty = 0.5\n");
  EXPECT_EQ(parse_error({"--recipe", recipe}),
            "recipe " + recipe +
                ", line 3: unknown option 'sparsty' for 'prune' (recipe keys: eval-seqlen, force, group, "
                "layers, method, model, nm, nsamples, seqlen, sparsity)");
}

TEST_F(RecipeTest, RecipeCannotNameRecipeOrHelp) {
  std::string nested = write("r.yaml", "recipe: other.yaml\n");
  EXPECT_THAT(parse_error({"--recipe", nested}),
              HasSubstr("recipe " + nested + ", line 1: 'recipe' cannot be set in a recipe"));
  std::string help = write("h.yaml", "help: true\n");
  EXPECT_THAT(parse_error({"--recipe", help}),
              HasSubstr("recipe " + help + ", line 1: 'help' cannot be set in a recipe"));
}

TEST_F(RecipeTest, MissingFileAndDirectory) {
  std::string missing = (dir_ / "missing.toml").string();
  EXPECT_EQ(parse_error({"--recipe", missing}), missing + ": recipe (--recipe) not found");
  EXPECT_EQ(parse_error({"--recipe", dir_.string()}),
            dir_.string() + ": recipe (--recipe) is a directory, not a file");
  EXPECT_EQ(parse_error({"--recipe", "/dev/zero"}), "/dev/zero: recipe (--recipe) is a character device");
}

TEST_F(RecipeTest, MalformedTomlErrorsNameFileAndLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"model = \"m\"\nmethod = wanda\n",
       "TOML line 2: invalid value 'wanda' for 'method' (TOML strings need quotes: method = \"wanda\")"},
      {"model \"m\"\n", "TOML line 1: expected '=' after key 'model'"},
      {"\n\nmodel = \"m\n", "TOML line 3: unterminated string in the value of 'model'"},
      {"layers = [\"a\", \"b\"\nmodel = \"m\"\n",
       "TOML line 2: expected ',' or ']' in the array for 'layers'"},
      {"layers = [\"a\",\n", "TOML line 2: unterminated array for 'layers'"},
      {"layers = []\n", "TOML line 1: empty array for 'layers'"},
      {"sparsity = 0.5 0.6\n", "TOML line 1: unexpected text after the value of 'sparsity'"},
      {"model = \"m\"\nmodel = \"n\"\n", "TOML line 2: key 'model' is given twice (first on line 1)"},
      {"[prune]\nmodel = \"m\"\n",
       "TOML line 1: table header [prune] is not supported: recipe options are top-level `key = value` "
       "lines"},
      {"prune.model = \"m\"\n",
       "TOML line 1: dotted key 'prune.…' is not supported: recipe options are flat"},
      {"model = { a = 1 }\n",
       "TOML line 1: inline table for 'model' is not supported: recipe options are flat"},
      {"model =\n", "TOML line 1: missing value for 'model'"},
      {"= 3\n", "TOML line 1: expected `key = value`, found '= 3'"},
  };
  for (const Case& c : cases) {
    std::string recipe = write("bad.toml", c.text);
    EXPECT_EQ(parse_error({"--recipe", recipe}), "recipe " + recipe + ": " + c.message) << c.text;
  }
}

TEST_F(RecipeTest, MalformedYamlErrorsNameFileAndLine) {
  std::string recipe = write("bad.yaml", "model: m\nmethod: [wanda\n");
  EXPECT_EQ(parse_error({"--recipe", recipe}),
            "recipe " + recipe + ": YAML line 3, column 1: end of sequence flow not found");

  std::string stray = write("s.yaml", "model: m\n- x\n");
  EXPECT_EQ(parse_error({"--recipe", stray}),
            "recipe " + stray + ": YAML line 2, column 1: end of map not found");

  std::string indented = write("i.yaml", "model: m\n  method: w\n");
  EXPECT_EQ(parse_error({"--recipe", indented}),
            "recipe " + indented + ": YAML line 2, column 9: illegal map value");

  std::string nested = write("n.yaml", "prune:\n  model: m\n");
  EXPECT_EQ(parse_error({"--recipe", nested}),
            "recipe " + nested +
                ": YAML line 1: nested mapping under 'prune' is not supported: recipe options are top-level "
                "`option: value` lines");

  std::string empty_value = write("e.yaml", "model: m\nmethod:\n");
  EXPECT_EQ(parse_error({"--recipe", empty_value}),
            "recipe " + empty_value + ": YAML line 2: 'method' has no value");

  std::string list_root = write("l.yaml", "- model\n- m\n");
  EXPECT_EQ(parse_error({"--recipe", list_root}),
            "recipe " + list_root + ": YAML line 1: expected a mapping of `option: value` lines");

  // yaml-cpp stops at 500 levels of nesting with only "bad file"; the error says what it is.
  std::string deep = write("deep.yaml", "model: " + std::string(50000, '['));
  EXPECT_EQ(parse_error({"--recipe", deep}),
            "recipe " + deep +
                ": YAML nested 500 levels deep, deeper than yaml-cpp reads (a "
                "recipe is flat `option: value` lines)");

  std::string dup = write("d.yaml", "model: m\nmodel: n\n");
  EXPECT_EQ(parse_error({"--recipe", dup}),
            "recipe " + dup + ": YAML line 2: key 'model' is given twice (first on line 1)");
}

TEST_F(RecipeTest, BadValuesNameKeyAndFile) {
  std::string list_for_scalar = write("l.yaml", "model: m\nmethod: wanda\nsparsity: [0.5, 0.6]\n");
  EXPECT_EQ(parse_error({"--recipe", list_for_scalar}),
            "recipe " + list_for_scalar + ", line 3: 'sparsity' takes one value, got a list of 2");

  std::string list_for_flag = write("f.toml", "force = [true, false]\n");
  EXPECT_EQ(parse_error({"--recipe", list_for_flag}),
            "recipe " + list_for_flag + ", line 1: 'force' is a flag: give true or false, not a list");

  std::string not_a_number = write("n.yaml", "model: m\nmethod: wanda\nnsamples: many\n");
  EXPECT_THAT(parse_error({"--recipe", not_a_number}),
              HasSubstr("recipe " + not_a_number + ", line 3: invalid value for 'nsamples': "));

  std::string bad_flag = write("b.yaml", "force: maybe\n");
  EXPECT_THAT(parse_error({"--recipe", bad_flag}),
              HasSubstr("recipe " + bad_flag + ", line 1: invalid value for 'force': "));
}

TEST_F(RecipeTest, ExclusiveKeysInOneRecipe) {
  std::string recipe = write("r.toml", "model = \"m\"\nmethod = \"wanda\"\nsparsity = 0.5\nnm = \"2:4\"\n");
  EXPECT_EQ(parse_error({"--recipe", recipe}),
            "recipe " + recipe + ": 'sparsity' (line 3) and 'nm' (line 4) exclude each other; keep one");
  // The command line settles it: --nm given there replaces the recipe's sparsity, and the recipe's nm too.
  parse({"--recipe", recipe, "--nm", "4:8"});
  EXPECT_EQ(o_.nm, "4:8");
  EXPECT_FALSE(o_.sparsity.has_value());
}

TEST_F(RecipeTest, GroupOnTheCommandLineDoesNotReplaceTheRecipesNmMask) {
  // --group qualifies a --sparsity mask: against the recipe's nm it is a conflict, not a replacement (the
  // run would otherwise find no mask at all and say so without naming the recipe).
  std::string nm_recipe = write("nm.toml", "model = \"m\"\nmethod = \"wanda\"\nnm = \"2:4\"\n");
  EXPECT_EQ(
      parse_error({"--recipe", nm_recipe, "--group", "layer"}),
      "recipe " + nm_recipe +
          ", line 3: 'nm' and --group on the command line exclude each other (--group is for --sparsity "
          "masks): give --sparsity too, to replace the recipe's mask, or leave out --group");
  // With --sparsity beside it, --group is part of the mask that replaces the recipe's.
  parse({"--recipe", nm_recipe, "--sparsity", "0.5", "--group", "layer"});
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.5);
  EXPECT_EQ(o_.nm, "");
  EXPECT_EQ(o_.group, "layer");
  o_ = PruneOptions{};
  // --nm on the command line still replaces a recipe's sparsity mask, group and all.
  std::string row_recipe =
      write("row.toml", "model = \"m\"\nmethod = \"wanda\"\nsparsity = 0.5\ngroup = \"layer\"\n");
  parse({"--recipe", row_recipe, "--nm", "2:4"});
  EXPECT_EQ(o_.nm, "2:4");
  EXPECT_FALSE(o_.sparsity.has_value());
}

TEST_F(RecipeTest, YamlRecipeIsOneDocument) {
  // yaml-cpp's Load stops at `---` or `...`: what follows was dropped unread, unknown keys and all.
  std::string two = write("two.yaml", "model: m\nmethod: wanda\nsparsity: 0.5\n---\nsparsity: 0.7\n");
  EXPECT_EQ(parse_error({"--recipe", two}),
            "recipe " + two +
                ": YAML line 5: a second document (after `---` or `...`); a recipe is one document of "
                "`option: value` lines");
  std::string ended = write("ended.yaml", "model: m\nmethod: wanda\n...\nbogus: 1\n");
  EXPECT_THAT(parse_error({"--recipe", ended}), HasSubstr(": a second document (after `---` or `...`)"));
  // yaml-cpp 0.7's LoadAll never returns on this input (found by fuzz_recipe_yaml); the second document is
  // looked at by hand instead, and this one ends at once (its first document has no --model).
  std::string looping = write("loop.yaml",
                              "---\n,# wanda501yaml\x0bmodel\xfd ,lh\nfowanda502yaml\x0bmodel: ,lh\n"
                              "force: tr(rce: tr(ue\n");
  EXPECT_THROW(parse({"--recipe", looping}), CLI::RequiredError);
  // Document markers around the one document, and an empty document after it, are fine.
  std::string marked = write("marked.yaml", "---\nmodel: m\nmethod: wanda\nsparsity: 0.5\n...\n---\n# end\n");
  parse({"--recipe", marked});
  EXPECT_DOUBLE_EQ(*o_.sparsity, 0.5);
}

TEST_F(RecipeTest, EmptyRecipeSetsNothing) {
  std::string toml = write("empty.toml", "# nothing\n\n");
  parse({"--recipe", toml, "--model", "m", "--method", "wanda"});
  EXPECT_EQ(o_.nsamples, 128);
  EXPECT_TRUE(read_recipe(write("empty.yaml", "")).empty());
}

TEST_F(RecipeTest, ReadRecipeKeepsKeysValuesAndLines) {
  auto entries =
      read_recipe(write("r.toml", "\n# c\nnm = \"2:4\"\nalpha = -1.5e-3\nlayers = ['x', \"y\\\"z\"]\n"));
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].key, "nm");
  EXPECT_EQ(entries[0].values, (std::vector<std::string>{"2:4"}));
  EXPECT_EQ(entries[0].line, 3);
  EXPECT_EQ(entries[1].values, (std::vector<std::string>{"-1.5e-3"}));
  EXPECT_EQ(entries[2].values, (std::vector<std::string>{"x", "y\"z"}));
  EXPECT_EQ(entries[2].line, 5);
}

}  // namespace
}  // namespace symprune::app
