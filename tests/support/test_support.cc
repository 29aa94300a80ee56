#include "support/test_support.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SYMPRUNE_TEST_LSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SYMPRUNE_TEST_LSAN 1
#endif
#ifdef SYMPRUNE_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace symprune::testing {

std::filesystem::path data_dir() {
  if (const char* env = std::getenv("SYMPRUNE_DATA")) return env;
  return SYMPRUNE_DEFAULT_DATA_DIR;
}

std::filesystem::path python_executable() {
  if (const char* env = std::getenv("SYMPRUNE_PYTHON")) return env;
  return SYMPRUNE_DEFAULT_PYTHON;
}

std::filesystem::path make_temp_dir(const char* prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (std::string(prefix) + "XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

std::filesystem::path write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
  return path;
}

#ifdef SYMPRUNE_TEST_LSAN
ThirdPartyLeaksIgnored::ThirdPartyLeaksIgnored() {
  __lsan_disable();
}
ThirdPartyLeaksIgnored::~ThirdPartyLeaksIgnored() {
  __lsan_enable();
}
#else
ThirdPartyLeaksIgnored::ThirdPartyLeaksIgnored() = default;
ThirdPartyLeaksIgnored::~ThirdPartyLeaksIgnored() = default;
#endif

}  // namespace symprune::testing
