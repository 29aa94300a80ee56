// io/atomic_file: failed writes leave nothing behind and name the file the user asked for.
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("atomic_file_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesWholeFileWithMode0644) {
  write_file_atomically(dir_ / "a.txt", "hello\n");
  std::ifstream in(dir_ / "a.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "hello\n");
  EXPECT_EQ(fs::status(dir_ / "a.txt").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, FailingBodyLeavesNoTemporaryAndKeepsOldFile) {
  write_file_atomically(dir_ / "a.txt", "old");
  EXPECT_THROW(write_file_atomically(dir_ / "a.txt",
                                     [](int fd, const fs::path& target) {
                                       write_all(fd, "new", 3, target);
                                       fail("{}: simulated failure", target.string());
                                     }),
               Error);
  std::ifstream in(dir_ / "a.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "old");
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, MissingDirectoryIsNamed) {
  try {
    write_file_atomically(dir_ / "no_such_dir" / "a.txt", "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "no_such_dir" / "a.txt").string() + ": directory " +
                                         (dir_ / "no_such_dir").string() + " does not exist");
  }
  EXPECT_TRUE(listing(dir_).empty());
}

// RLIMIT_FSIZE in a child process (it would limit the whole test binary otherwise): write() fails with
// EFBIG once SIGXFSZ is ignored, the message names the file and says why, and no temporary remains.
TEST_F(AtomicFileTest, FileSizeLimitGivesFileTooLargeAndNoTemporary) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1000, 1000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::string message = "no error";
    try {
      write_file_atomically(dir_ / "big.bin", std::string(5000, 'x'));
    } catch (const Error& e) {
      message = e.what();
    }
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(message, (dir_ / "big.bin").string() + ": write failed: " + std::strerror(EFBIG));
  EXPECT_TRUE(listing(dir_).empty());
}

TEST_F(AtomicFileTest, StagedDirectoryIsRemovedUnlessInstalled) {
  fs::path staged_path;
  {
    StagedDirectory staged(dir_ / "model", /*replace_existing=*/false);
    staged_path = staged.path();
    EXPECT_EQ(staged_path.parent_path(), dir_);
    EXPECT_TRUE(staged_path.filename().string().starts_with(".model.tmp-"));
    write_file_atomically(staged_path / "config.json", "{}");
  }
  EXPECT_FALSE(fs::exists(staged_path));
  EXPECT_TRUE(listing(dir_).empty());

  {
    StagedDirectory staged(dir_ / "model", /*replace_existing=*/false);
    write_file_atomically(staged.path() / "config.json", "{}");
    staged.install();
  }
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"config.json", "model"}));
}

TEST_F(AtomicFileTest, AsTargetNamesTheFinalPath) {
  StagedDirectory staged(dir_ / "out", /*replace_existing=*/false);
  const std::string inner = (staged.path() / "model.safetensors").string();
  EXPECT_EQ(staged.as_target(inner + ": write failed: No space left on device (" + inner + ")"),
            (dir_ / "out" / "model.safetensors").string() + ": write failed: No space left on device (" +
                (dir_ / "out" / "model.safetensors").string() + ")");
  EXPECT_EQ(staged.as_target("unrelated message"), "unrelated message");
}

}  // namespace
}  // namespace symprune::io
