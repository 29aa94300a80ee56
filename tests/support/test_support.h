#pragma once
#include <filesystem>
#include <string_view>

namespace symprune::testing {

// The shared test data folder: $SYMPRUNE_DATA, else ../shared/data beside the source tree.
std::filesystem::path data_dir();
// The Python with the test helpers: $SYMPRUNE_PYTHON, else the project's .venv.
std::filesystem::path python_executable();
// A fresh empty directory under the system temp dir, removed by the caller or left for inspection.
std::filesystem::path make_temp_dir(const char* prefix);
// Writes `bytes` to `path` (replacing it) and returns `path`.
std::filesystem::path write_file(const std::filesystem::path& path, std::string_view bytes);

// While it lives, LeakSanitizer ignores what this thread allocates: for a third-party library's own leak that
// a test provokes (a suppression file would match every stack that merely passes through the library, such
// as all of ours inside an OpenMP region). Nothing without LeakSanitizer.
class ThirdPartyLeaksIgnored {
 public:
  ThirdPartyLeaksIgnored();
  ~ThirdPartyLeaksIgnored();
  ThirdPartyLeaksIgnored(const ThirdPartyLeaksIgnored&) = delete;
  ThirdPartyLeaksIgnored& operator=(const ThirdPartyLeaksIgnored&) = delete;
};

}  // namespace symprune::testing
