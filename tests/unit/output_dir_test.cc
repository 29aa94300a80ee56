// io/output_dir.h and the atomic install of io/atomic_file.h: what an output may not touch, the lock that
// keeps two runs apart, the clean-up after interrupted runs, and core/interrupt.h's check().
#include "io/output_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "core/interrupt.h"
#include "support/error_text.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

using test::error_of;

class OutputDir : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::canonical(testing::make_temp_dir("symprune_outdir"));
    // A Hugging Face cache: the snapshot's files are symlinks into ../../blobs.
    blobs_ = root_ / "hub" / "models--org--m" / "blobs";
    snapshot_ = root_ / "hub" / "models--org--m" / "snapshots" / "abc";
    fs::create_directories(blobs_);
    fs::create_directories(snapshot_);
    write_text(blobs_ / "1111", "{}");
    write_text(blobs_ / "2222", "weights");
    fs::create_symlink("../../blobs/1111", snapshot_ / "config.json");
    fs::create_symlink("../../blobs/2222", snapshot_ / "model.safetensors");
    inputs_.add_model_directory(snapshot_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void make_symprune_output(const fs::path& dir) {
    fs::create_directories(dir);
    write_provenance(dir, build_provenance());
    write_text(dir / "model.safetensors", "old");
  }

  fs::path root_, blobs_, snapshot_;
  InputFootprint inputs_;
};

TEST_F(OutputDir, RefusesOutputsThatWouldTouchTheInputsRealFiles) {
  // The blobs directory is where the snapshot's links point: replacing it deletes the model's weights.
  EXPECT_THAT(error_of([&] { OutputDirectory(blobs_, inputs_, true); }),
              HasSubstr("is the same as the directory holding the input model's files " + blobs_.string()));
  EXPECT_THAT(error_of([&] { OutputDirectory(blobs_ / "new", inputs_, true); }),
              HasSubstr("is inside the directory holding the input model's files"));
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / "hub", inputs_, true); }),
              HasSubstr("contains the input model directory " + snapshot_.string()));
  EXPECT_THAT(error_of([&] { OutputDirectory(snapshot_ / "out", inputs_, true); }),
              HasSubstr("is inside the input model directory"));
  // A path that reaches the model through a symlink is the model.
  fs::create_directory_symlink(snapshot_, root_ / "alias");
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / "alias", inputs_, true); }),
              HasSubstr("is the same as the input model directory"));
  EXPECT_EQ(read_text(blobs_ / "2222"), "weights");
}

TEST_F(OutputDir, ReportMayNotReplaceAnInputNorLandInsideTheOutput) {
  EXPECT_THAT(
      error_of([&] { check_output_file(snapshot_ / "x.json", inputs_, "--report"); }),
      HasSubstr("--report " + (snapshot_ / "x.json").string() + " is inside the input model directory"));
  // The snapshot's config.json is a link into the blobs: that is where a write would land.
  EXPECT_THAT(error_of([&] { check_output_file(snapshot_ / "config.json", inputs_, "--report"); }),
              HasSubstr("is inside the directory holding the input model's files " + blobs_.string()));
  EXPECT_THAT(error_of([&] { check_output_file(blobs_ / "1111", inputs_, "--report"); }),
              HasSubstr("is inside the directory holding the input model's files"));
  InputFootprint with_calib = inputs_;
  write_text(root_ / "calib.txt", "text");
  with_calib.add_file(root_ / "calib.txt");
  EXPECT_THAT(error_of([&] { check_output_file(root_ / "calib.txt", with_calib, "--report"); }),
              HasSubstr("--report " + (root_ / "calib.txt").string() + " is the input file"));
  // A tokenizer given as a directory: its files are read, so nothing may be written inside it.
  fs::create_directories(root_ / "tokenizer");
  with_calib.add_file(root_ / "tokenizer");
  EXPECT_THAT(
      error_of([&] { check_output_file(root_ / "tokenizer" / "tokenizer.json", with_calib, "--report"); }),
      HasSubstr("is inside the input directory " + (root_ / "tokenizer").string()));
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / "tokenizer" / "out", with_calib, false); }),
              HasSubstr("is inside the input directory"));
  const OutputDirectory out(root_ / "out", inputs_, false);
  EXPECT_THAT(error_of([&] { check_output_file(root_ / "out" / "r.json", inputs_, "--report", &out); }),
              HasSubstr("is inside the output directory"));
  EXPECT_THAT(error_of([&] { check_output_file(root_ / "missing" / "r.json", inputs_, "--report"); }),
              HasSubstr("does not exist"));
  check_output_file(root_ / "r.json", inputs_, "--report", &out);  // fine
}

TEST_F(OutputDir, ForceReplacesOnlyDirectoriesSymprunWrote) {
  const fs::path work = root_ / "work";
  fs::create_directories(work / "src");
  write_text(work / "src" / "main.cc", "code");
  EXPECT_THAT(error_of([&] { OutputDirectory(work, inputs_, false); }),
              HasSubstr("exists and is not empty (use --force to replace it)"));
  EXPECT_THAT(error_of([&] { OutputDirectory(work, inputs_, true); }),
              HasSubstr("was not written by symprune"));
  make_symprune_output(root_ / "previous");
  const OutputDirectory ok(root_ / "previous", inputs_, true);
  EXPECT_TRUE(ok.existed());
  EXPECT_EQ(read_text(work / "src" / "main.cc"), "code");
}

TEST_F(OutputDir, DanglingLinksAndOverlongNamesAreRefusedUpFront) {
  fs::create_symlink(root_ / "nowhere" / "target", root_ / "link");
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / "link", inputs_, false); }),
              HasSubstr("is a symbolic link to " + (root_ / "nowhere" / "target").string() +
                        ", which does not exist"));
  EXPECT_THAT(error_of([&] { check_output_file(root_ / "link", inputs_, "--report"); }),
              HasSubstr("--report " + (root_ / "link").string() + " is a symbolic link"));
  const std::string long_name(250, 'n');
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / long_name, inputs_, false); }),
              HasSubstr("the name is 250 bytes long; symprune needs 12 bytes more"));
  EXPECT_THAT(error_of([&] { check_output_file(root_ / long_name, inputs_, "--report"); }),
              HasSubstr("choose a name of at most 243 bytes"));
  const std::string fits(243, 'f');
  const OutputDirectory fine(root_ / fits, inputs_, false);
  auto staged = fine.stage();
  staged->install();
  EXPECT_TRUE(fs::is_directory(root_ / fits));
}

TEST_F(OutputDir, TwoRunsCannotHoldTheSameOutput) {
  const fs::path out = root_ / "out";
  {
    const OutputDirectory first(out, inputs_, false);
    EXPECT_TRUE(fs::exists(root_ / ".out.lock"));
    EXPECT_EQ(read_text(root_ / ".out.lock"), "pid " + std::to_string(::getpid()) + "\n");
    EXPECT_THAT(error_of([&] { OutputDirectory(out, inputs_, true); }),
                HasSubstr("--out " + out.string() + " is being written by another symprune run (pid " +
                          std::to_string(::getpid()) + ")"));
  }
  EXPECT_FALSE(fs::exists(root_ / ".out.lock"));  // released and removed
  const OutputDirectory again(out, inputs_, false);
  // A lock file left by a killed run does not block.
  write_text(root_ / ".other.lock", "pid 1\n");
  const OutputDirectory other(root_ / "other", inputs_, false);
}

TEST_F(OutputDir, InterruptedRunsAreCleanedUpUnderTheLock) {
  const fs::path out = root_ / "out";
  make_symprune_output(out);
  fs::create_directories(root_ / ".out.tmp-Ab12Cd" / "deep");  // a killed run's staging directory
  write_text(root_ / ".out.tmp-Ab12Cd" / "deep" / "shard", "partial");
  fs::create_directories(root_ / ".out.old-Zz99Yy");        // a finished replace's leftover
  fs::create_directories(root_ / ".out.tmp-x.tmp-Ab12Cd");  // another output's staging: kept
  fs::create_directories(root_ / ".outer.tmp-Ab12Cd");      // likewise
  const OutputDirectory o(out, inputs_, true);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{".out.lock", ".out.tmp-x.tmp-Ab12Cd",
                                                      ".outer.tmp-Ab12Cd", "hub", "out"}));
}

TEST_F(OutputDir, InputsNamedLikeWhatAWriterKeepsBesideItsOutputAreRefusedAndKept) {
  InputFootprint inputs = inputs_;
  for (const char* name : {".out.lock", ".out.tmp-Ab12Cd", ".out.old-Zz99Yy", "run.h5.tmp", "run.h5.done"}) {
    write_text(root_ / name, "calibration text");
    inputs.add_file(root_ / name);
  }
  // The output's lock file would be overwritten (the pid) and then removed.
  EXPECT_THAT(
      error_of([&] { OutputDirectory(root_ / "out", inputs, false); }),
      HasSubstr("--out " + (root_ / "out").string() + ": its lock file " + (root_ / ".out.lock").string() +
                " is the input file " + (root_ / ".out.lock").string()));
  // An interrupted run's leftovers are removed or restored under the lock: never an input so named.
  fs::remove(root_ / ".out.lock");
  InputFootprint temporaries = inputs_;
  temporaries.add_file(root_ / ".out.old-Zz99Yy");
  EXPECT_THAT(
      error_of([&] { OutputDirectory(root_ / "out", temporaries, false); }),
      HasSubstr(", named like the temporary directories that symprune removes beside it, is the input "
                "file " +
                (root_ / ".out.old-Zz99Yy").string()));
  // A checkpoint's companions, named or reached through a link.
  const std::vector<CompanionFile> companions = {{root_ / "run.h5.tmp", "staging file"},
                                                 {root_ / "run.h5.prev", "previous checkpoint"},
                                                 {root_ / "run.h5.done", "completion marker"}};
  EXPECT_THAT(
      error_of([&] { check_output_file(root_ / "run.h5", inputs, "--checkpoint", nullptr, companions); }),
      HasSubstr("--checkpoint " + (root_ / "run.h5").string() + ": its staging file " +
                (root_ / "run.h5.tmp").string() + " is the input file"));
  fs::remove(root_ / "run.h5.tmp");
  fs::create_symlink(root_ / "run.h5.done", root_ / "run.h5.tmp");
  InputFootprint linked = inputs_;
  linked.add_file(root_ / "run.h5.done");
  EXPECT_THAT(error_of([&] { check_not_input(root_ / "run.h5", linked, "--checkpoint", companions); }),
              HasSubstr("its staging file " + (root_ / "run.h5.tmp").string() + " is the input file " +
                        (root_ / "run.h5.done").string()));
  for (const char* name : {".out.tmp-Ab12Cd", ".out.old-Zz99Yy", "run.h5.done"})
    EXPECT_EQ(read_text(root_ / name), "calibration text") << name;
  // Companions that are no input are fine.
  check_output_file(root_ / "other.h5", inputs_, "--checkpoint", nullptr,
                    {{root_ / "other.h5.tmp", "staging file"}});
  EXPECT_EQ(lock_file_of(root_ / "out/"), root_ / ".out.lock");
  // A link where the lock goes is not followed: its target (here inside the model directory) is not created.
  fs::create_symlink(snapshot_ / "new-file", root_ / ".linked.lock");
  EXPECT_THAT(error_of([&] { OutputDirectory(root_ / "linked", inputs_, false); }),
              HasSubstr("cannot create the lock file " + (root_ / ".linked.lock").string()));
  EXPECT_FALSE(fs::exists(snapshot_ / "new-file"));
}

TEST_F(OutputDir, AReplaceCutOffMidwayIsRestoredAtTheNextStart) {
  // Killed after moving the old output aside and before moving the new one in (the two-rename fallback).
  make_symprune_output(root_ / ".out.old-Q1w2E3");
  const OutputDirectory o(root_ / "out", inputs_, true);
  EXPECT_EQ(read_text(root_ / "out" / "model.safetensors"), "old");
  EXPECT_FALSE(fs::exists(root_ / ".out.old-Q1w2E3"));
}

TEST_F(OutputDir, InstallReplacesAtomicallyAndNeverOverwritesANewcomer) {
  const fs::path out = root_ / "out";
  make_symprune_output(out);
  {
    const OutputDirectory o(out, inputs_, true);
    auto staged = o.stage();
    write_text(staged->path() / "model.safetensors", "new");
    staged->install();
  }
  EXPECT_EQ(read_text(out / "model.safetensors"), "new");
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"hub", "out"}));  // old copy, lock: gone

  // A directory that appears at the target while the run writes is not replaced.
  const fs::path fresh = root_ / "fresh";
  const OutputDirectory o(fresh, inputs_, false);
  auto staged = o.stage();
  fs::create_directory(fresh);
  write_text(fresh / "someone-elses", "x");
  EXPECT_THAT(error_of([&] { staged->install(); }), HasSubstr("appeared while this run was writing"));
  EXPECT_EQ(read_text(fresh / "someone-elses"), "x");
}

TEST(Interrupt, CheckThrowsOnceASignalArrivedAndNamesIt) {
  interrupt::check();  // nothing received
  interrupt::simulate(SIGTERM);
  try {
    interrupt::check();
    ADD_FAILURE() << "no interrupt";
  } catch (const interrupt::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
    EXPECT_EQ(e.exit_code(), 143);
    EXPECT_THAT(e.what(), HasSubstr("interrupted by SIGTERM"));
  }
  interrupt::simulate(0);
  interrupt::check();
}

}  // namespace
}  // namespace symprune::io
