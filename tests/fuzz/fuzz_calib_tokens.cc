// Calibration token files: uint16 (flag bit 0 clear, by the .bin name) or uint32 (bit 0 set) ids.
#include "calibration_fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool u32 = size >= 4 && (data[3] & 1) != 0;
  return symprune::fuzz::run_expecting_only_errors(
      [&] { symprune::fuzz::run_calibration(data, size, "calib.bin", u32 ? "tokens-u32" : "auto"); });
}
