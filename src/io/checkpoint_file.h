#pragma once
// The checkpoint file (DESIGN.md §5): one HDF5 file, format "symprune-checkpoint" version 1.
//
// Root attributes: format (string), version (int64), next_block (int64), blocks (int64), run_id (string).
// Datasets, each stored contiguous (one byte range of the file) and paired with a checksum dataset
// "<name>_crc32" (uint32 [units]): the CRC-32 of each unit of the data, a unit being one row (the first
// dimension) of a float32 dataset, or kByteUnit bytes of a uint8 dataset. The unit size is the dataset's
// attribute "crc_unit_bytes".
//   state               uint8 [bytes]  JSON: identity, fingerprints, report entries so far, mask index
//   masks               uint8 [bytes]  the bit-packed masks of all finished blocks, concatenated
//   calib_hidden        f32 [N, T, d]  the calibration hidden states for block next_block
//   eval_dense_hidden   f32 [C, T', d] with --eval: the dense evaluation stream's hidden states
//   eval_pruned_hidden  f32 [C, T', d] and the pruned one's
//
// Why the data is written with pwrite and not through HDF5: the file is created by one process (rank 0),
// with every dataset allocated at creation and never filled, and the byte offset of each dataset is taken
// from HDF5; each rank then writes its own rows of the datasets, with their checksums, at those offsets
// with plain positional writes. That lets R ranks write one file at once without MPI-IO, from a background
// thread (MPI runs with MPI_THREAD_FUNNELED and HDF5 is not thread-safe, so neither may be called off the
// main thread), while the next block computes. Readers use HDF5 (serially; every rank reads its own rows).
//
// This is the only file that includes hdf5.h (the Debian openmpi flavour, used serially here: no MPI call).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace symprune::io {

inline constexpr const char* kCheckpointFormat = "symprune-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;
inline constexpr int64_t kByteUnit = int64_t{1} << 20;  // checksum unit of uint8 datasets

enum class CheckpointType { kUint8, kFloat32 };

struct CheckpointDatasetSpec {
  std::string name;
  CheckpointType type = CheckpointType::kUint8;
  std::vector<int64_t> shape;
};

// Where a dataset and its checksums lie in the file (byte offsets), as created.
struct CheckpointDatasetPlace {
  int64_t offset = 0;      // first byte of the data
  int64_t bytes = 0;       // total data bytes
  int64_t unit_bytes = 0;  // checksum unit
  int64_t crc_offset = 0;  // first byte of the uint32 checksums (one per unit)
  int64_t units = 0;
};

struct CheckpointHeader {
  int64_t version = 0;
  int64_t next_block = 0;
  int64_t blocks = 0;
  std::string run_id;
};

// The root attributes are outside every checksum; the state dataset (JSON, checksummed) repeats next_block,
// blocks and run_id. Where they disagree (an attribute edited, or written wrong), what to say, else nullopt.
std::optional<std::string> header_disagreement(const CheckpointHeader& header, const nlohmann::json& state);

// Creates `path` (truncating it) with the root attributes and every dataset allocated, and returns each
// dataset's place. Throws symprune::Error naming the path on failure (full disk, no permission, ...).
std::map<std::string, CheckpointDatasetPlace> create_checkpoint_file(
    const std::filesystem::path& path, const CheckpointHeader& header,
    const std::vector<CheckpointDatasetSpec>& datasets);

// Writes whole checksum units of dataset `place` to the open file `fd` (of `path`, for messages): `data`
// starts at unit `first_unit` and covers whole units, except that the dataset's last unit may be short.
// The checksums of those units are written too. Thread-safe (pwrite only).
void write_checkpoint_units(int fd, const std::filesystem::path& path, const CheckpointDatasetPlace& place,
                            int64_t first_unit, std::span<const std::byte> data);

uint32_t crc32_of(std::span<const std::byte> data);

// A checkpoint opened for reading: the header is read and checked (format and version) on open. Errors
// are symprune::Error "checkpoint FILE: ..." (not HDF5, truncated, wrong format or version, checksum).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> dataset_names() const;  // data datasets (without the checksum ones), sorted
  bool has(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  int64_t unit_bytes(const std::string& name) const;
  // Reads units [first_unit, first_unit + out.size() / unit) (the last possibly short) into `out` and
  // verifies their checksums; throws naming the dataset and the unit on a mismatch.
  void read_units(const std::string& name, int64_t first_unit, std::span<std::byte> out) const;
  // Verifies every unit of `name`; returns the first bad unit's message, or nullopt.
  std::optional<std::string> verify(const std::string& name) const;

 private:
  std::filesystem::path path_;
  int64_t file_ = -1;  // hid_t
  CheckpointHeader header_;
};

// The header of `path` without checking anything else, or nullopt when it cannot be read (cheap: used to
// find a run's id before the run is planned).
std::optional<CheckpointHeader> peek_checkpoint_header(const std::filesystem::path& path);

}  // namespace symprune::io
