// Calibration JSONL (C4 style, plain or gzip): the reader and the reference document sampler.
#include "calibration_fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors(
      [&] { symprune::fuzz::run_calibration(data, size, "calib.jsonl", "auto"); });
}
