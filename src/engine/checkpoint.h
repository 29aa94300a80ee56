#pragma once
// Restartable runs (DESIGN.md §5): the pipeline's state between two blocks, saved to and restored from an
// HDF5 checkpoint (io/checkpoint_file.h), with any number of ranks on either side.
//
// What a checkpoint holds, for "next_block" b: the calibration hidden states entering block b (the global
// [N, T, d], each rank's windows at their global rows), with --eval the dense and the pruned evaluation
// streams' hidden states ([C, T', d], each rank's chunks), the bit-packed masks of blocks < b (each rank
// writes those it keeps, ModelMasks, in a segment of its own; the index gives every mask's place), and a JSON
// state: the run's identity (run_identity below), its id, the report entries of blocks < b and the
// timings and traffic so far. The weights of blocks < b are not saved: the masks and the input model give
// them back, and the writer reads the input model anyway.
//
// Files, for --checkpoint FILE: FILE is the newest complete checkpoint, FILE.prev the one before it (kept
// until a newer one is whole, so there is always one to fall back on), FILE.tmp the one being written,
// FILE.done the marker of a finished run (FILE and FILE.prev are then removed), .FILE.lock the lock that
// keeps a second run off the same checkpoint (io::PathLock; a killed run's lock file does not block).
//
// Writing (Checkpointer): at a block boundary every rank copies its rows (the snapshot), rank 0 creates
// FILE.tmp with every dataset allocated, and each rank writes its rows with their checksums from a
// background thread while the next block computes. Between that block's stages the ranks ask whether every
// part is written; once it is (at the next boundary or a stop at the latest, which wait for it), the ranks
// agree that every write succeeded, and rank 0 renames FILE to FILE.prev and FILE.tmp to FILE. A run killed
// at any moment therefore leaves FILE or FILE.prev whole.
//
// Resuming (load_resume_point): FILE, else FILE.prev; a checkpoint that fails its checksums or cannot be
// read is skipped with a warning; one made with a different configuration or inputs is refused, naming
// the field and both values.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/interrupt.h"
#include "dist/communicator.h"
#include "engine/pruned_model_writer.h"
#include "io/checkpoint_file.h"

namespace symprune::engine {

// The exit code of a run stopped by SIGTERM/SIGUSR1 after writing its checkpoint: EX_TEMPFAIL, "try
// again", which a batch script turns into a requeue (docs/errors.md).
inline constexpr int kCheckpointedExitCode = 75;

std::filesystem::path previous_checkpoint(const std::filesystem::path& file);  // FILE.prev
std::filesystem::path checkpoint_marker(const std::filesystem::path& file);    // FILE.done
std::filesystem::path checkpoint_staging(const std::filesystem::path& file);   // FILE.tmp

// What must be equal for a checkpoint to continue this run: the resolved configuration without what may
// change between attempts (ranks, communicator, threads, paths of outputs, --force, the model's and
// data's paths, which their fingerprints replace), plus the fingerprints.
nlohmann::json run_identity(const nlohmann::json& resolved_config, const nlohmann::json& fingerprints);

// Every field (dotted path) where `saved` and `current` differ, as "FIELD: the checkpoint has X, this run
// has Y" (the sides' names), joined by "; ", or nullopt when equal.
std::optional<std::string> identity_difference(const nlohmann::json& saved, const nlohmann::json& current,
                                               std::string_view saved_name = "the checkpoint",
                                               std::string_view current_name = "this run");

// One rank's rows of a [rows, ...] float dataset.
struct CheckpointSlab {
  std::string name;
  std::vector<int64_t> global_shape;  // [rows, ...]
  int64_t first_row = 0;
  std::vector<float> data;  // this rank's rows, row-major
};

class Checkpointer {
 public:
  // Collective. `run_id` is the same on every rank.
  Checkpointer(dist::Communicator& comm, std::filesystem::path file, int64_t every, int64_t blocks,
               std::string run_id);
  ~Checkpointer();  // waits for a write in flight; an uninstalled FILE.tmp is removed
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Whether the state entering `next_block` is due for a checkpoint (every K blocks, and after the last).
  bool due(int64_t next_block) const;
  // next_block of the newest installed (or in-flight) checkpoint of this run, -1 if none.
  int64_t latest() const { return latest_; }

  // Collective: starts writing the state entering `next_block`. `state` matters on rank 0 (it is what is
  // saved); each rank writes the bits of the masks it keeps (read in the background: `masks` must outlive
  // the write, and may grow meanwhile); `slabs` are this rank's rows (moved in: the snapshot). Waits for
  // the previous write first. Returns at once; the data is written in the background.
  void start(int64_t next_block, const nlohmann::json& state, const ModelMasks& masks,
             std::vector<CheckpointSlab> slabs);
  // Collective: waits for the write in flight, if any, and installs it as FILE (every rank's write must have
  // succeeded, else every rank throws the lowest failing rank's error). Returns seconds spent waiting.
  double finish();
  // Collective: installs the write in flight as finish() does if every rank has written its part by now, and
  // otherwise leaves it (one all-reduce of a flag, no waiting). The pipeline calls it between the stages of
  // the next block, so that a checkpoint does not wait for that block's end to become FILE. Returns the
  // seconds of the install (not of the all-reduce).
  double install_if_written();

  // Rank 0, after the run's outputs are complete: writes FILE.done (marker) and removes FILE and FILE.prev.
  // A marker that cannot be written is a warning, and FILE and FILE.prev stay: the run has finished.
  void mark_complete(const nlohmann::json& marker);

  double write_seconds() const { return write_seconds_; }   // background writing, summed
  int64_t bytes_written() const { return bytes_written_; }  // this rank's

 private:
  dist::Communicator& comm_;
  std::filesystem::path file_;
  int64_t every_, blocks_;
  std::string run_id_;
  int64_t latest_ = -1, in_flight_ = -1;
  std::thread writer_;
  std::atomic<bool> writer_done_{false};  // set by the writer thread as it ends
  std::string writer_error_;
  double write_seconds_ = 0.0, writer_last_seconds_ = 0.0;
  int64_t bytes_written_ = 0;
  std::unique_ptr<interrupt::CleanupOnStop> cleanup_;  // FILE.tmp, while written (rank 0)
};

// A checkpoint chosen to resume from, its state read and verified.
struct ResumePoint {
  std::filesystem::path file;
  io::CheckpointHeader header;
  nlohmann::json state;
};

// Collective. `resume` is "auto" or a checkpoint path; `checkpoint` is --checkpoint (may be empty with an
// explicit path). Tries FILE then FILE.prev: each one's state is read and verified, its identity compared
// with `identity` (a difference throws at once), then every mask's shape and the bits of those this rank
// keeps are read into `masks` (verified) and `restore(reader)` reads this rank's rows; a failure there on
// any rank moves on to the next candidate (`masks` is changed only by the one chosen). Returns nullopt for
// "auto" when no checkpoint exists; throws when checkpoints exist but none is usable, or an explicit one is
// missing.
std::optional<ResumePoint> load_resume_point(dist::Communicator& comm, const std::string& resume,
                                             const std::filesystem::path& checkpoint,
                                             const nlohmann::json& identity, ModelMasks& masks,
                                             const std::function<void(const io::CheckpointReader&)>& restore);

// Reads rows [first_row, first_row + rows) of float dataset `name`, checking its shape against
// `global_shape`. Throws naming the dataset.
std::vector<float> read_checkpoint_rows(const io::CheckpointReader& reader, const std::string& name,
                                        const std::vector<int64_t>& global_shape, int64_t first_row,
                                        int64_t rows);

}  // namespace symprune::engine
