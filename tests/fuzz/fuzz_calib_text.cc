// Calibration plain text (or gzip-compressed text): the reader and the stream sampler.
#include "calibration_fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors(
      [&] { symprune::fuzz::run_calibration(data, size, "calib.txt", "auto"); });
}
