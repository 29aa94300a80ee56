#include "support/test_support.h"

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

}  // namespace symprune::testing
