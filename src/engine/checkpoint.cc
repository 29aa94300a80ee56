#include "engine/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "engine/collective_errors.h"
#include "io/atomic_file.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

fs::path with_suffix(const fs::path& file, const char* suffix) {
  return fs::path(file.string() + suffix);
}

// Bytes of a JSON value, for the "state" dataset.
std::vector<std::byte> json_bytes(const nlohmann::json& j) {
  const std::string text = j.dump();
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// Where each mask lies in the masks dataset: the masks each rank keeps, in name order, one segment per rank
// in rank order, and every non-empty segment but the first starting on a checksum unit (kByteUnit), so that
// each rank writes whole units of its own. With one rank: the masks concatenated in name order. A reader
// takes each mask's offset from the index, so a checkpoint resumes with any number of ranks.
struct MaskLayout {
  nlohmann::json index = nlohmann::json::array();  // {name, rows, cols, offset}, in name order
  int64_t bytes = 0;                               // the dataset's
  int64_t first_byte = 0;                          // this rank's segment
  std::vector<std::span<const std::byte>> pieces;  // its masks' bits, in order (views of `masks`)
};

MaskLayout mask_layout(const ModelMasks& masks) {
  std::vector<int64_t> segment(static_cast<size_t>(masks.ranks()), 0);
  for (const auto& [name, shape] : masks.shapes())
    segment[static_cast<size_t>(masks.keeper(name))] += shape.bytes();
  std::vector<int64_t> start(segment.size(), 0);
  MaskLayout layout;
  int64_t at = 0;
  for (size_t r = 0; r < segment.size(); ++r) {
    if (segment[r] > 0 && at > 0) at = (at + io::kByteUnit - 1) / io::kByteUnit * io::kByteUnit;
    start[r] = at;
    at += segment[r];
  }
  layout.bytes = at;
  layout.first_byte = start[static_cast<size_t>(masks.rank())];
  for (const auto& [name, shape] : masks.shapes()) {
    int64_t& next = start[static_cast<size_t>(masks.keeper(name))];
    layout.index.push_back({{"name", name}, {"rows", shape.rows}, {"cols", shape.cols}, {"offset", next}});
    next += shape.bytes();
    if (masks.keeps(name) && shape.bytes() > 0)
      layout.pieces.push_back(std::as_bytes(std::span(masks.kept().at(name).bits)));
  }
  return layout;
}

// Writes `pieces`, one run of a dataset's bytes from unit `first_unit` on, as whole units with their
// checksums: a run ending inside a unit before the dataset's end is padded with zeros to the unit's end.
// Pieces that start on a unit are written in place; the rest pass through one unit's buffer.
void write_run(int fd, const fs::path& path, const io::CheckpointDatasetPlace& place, int64_t first_unit,
               std::span<const std::span<const std::byte>> pieces) {
  const size_t unit = static_cast<size_t>(place.unit_bytes);
  std::vector<std::byte> buffer;
  int64_t next_unit = first_unit;
  for (std::span<const std::byte> piece : pieces) {
    while (!piece.empty()) {
      if (buffer.empty() && piece.size() >= unit) {
        const size_t whole = piece.size() / unit * unit;
        io::write_checkpoint_units(fd, path, place, next_unit, piece.first(whole));
        next_unit += static_cast<int64_t>(whole / unit);
        piece = piece.subspan(whole);
        continue;
      }
      const size_t take = std::min(unit - buffer.size(), piece.size());
      buffer.insert(buffer.end(), piece.begin(), piece.begin() + static_cast<std::ptrdiff_t>(take));
      piece = piece.subspan(take);
      if (buffer.size() == unit) {
        io::write_checkpoint_units(fd, path, place, next_unit++, buffer);
        buffer.clear();
      }
    }
  }
  if (buffer.empty()) return;
  const int64_t rest = place.bytes - next_unit * place.unit_bytes;  // the dataset's bytes from this unit on
  SYMPRUNE_ASSERT(static_cast<int64_t>(buffer.size()) <= rest, "checkpoint run past its dataset's end");
  buffer.resize(static_cast<size_t>(std::min(rest, place.unit_bytes)), std::byte{0});
  io::write_checkpoint_units(fd, path, place, next_unit, buffer);
}

// Keys of the resolved configuration that may change between attempts of one run. "mask" is only the
// display of sparsity, group, nm and compat, which are compared: its wording may change between versions.
const char* const kVolatileKeys[] = {"model",     "model_dir",  "model_source",     "out",    "force",
                                     "threads",   "ranks",      "communicator",     "calib",  "eval",
                                     "tokenizer", "checkpoint", "checkpoint_every", "resume", "mask"};

struct Sides {
  std::string_view a, b;  // what holds each value: "the checkpoint", "this run"
};

void differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& path,
                 const Sides& sides, std::vector<std::string>* out) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string sub = path.empty() ? key : path + "." + key;
      if (!b.contains(key)) {
        out->push_back(fmt::format("{}: {} has {}, {} has none", sub, sides.a, value.dump(), sides.b));
      } else {
        differences(value, b.at(key), sub, sides, out);
      }
    }
    for (const auto& [key, value] : b.items())
      if (!a.contains(key))
        out->push_back(fmt::format("{}: {} has none, {} has {}", path.empty() ? key : path + "." + key,
                                   sides.a, sides.b, value.dump()));
    return;
  }
  if (a != b)
    out->push_back(fmt::format("{}: {} has {}, {} has {}", path, sides.a, a.dump(), sides.b, b.dump()));
}

}  // namespace

fs::path previous_checkpoint(const fs::path& file) {
  return with_suffix(file, ".prev");
}
fs::path checkpoint_marker(const fs::path& file) {
  return with_suffix(file, ".done");
}
fs::path checkpoint_staging(const fs::path& file) {
  return with_suffix(file, ".tmp");
}

nlohmann::json run_identity(const nlohmann::json& resolved_config, const nlohmann::json& fingerprints) {
  nlohmann::json config = resolved_config;
  for (const char* key : kVolatileKeys) config.erase(key);
  return {{"config", config}, {"fingerprints", fingerprints}};
}

std::optional<std::string> identity_difference(const nlohmann::json& saved, const nlohmann::json& current,
                                               std::string_view saved_name, std::string_view current_name) {
  std::vector<std::string> all;
  differences(saved, current, "", {saved_name, current_name}, &all);
  if (all.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(all, "; "));
}

Checkpointer::Checkpointer(dist::Communicator& comm, fs::path file, int64_t every, int64_t blocks,
                           std::string run_id)
    : comm_(comm), file_(std::move(file)), every_(every), blocks_(blocks), run_id_(std::move(run_id)) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  if (comm_.rank() == 0 && in_flight_ >= 0) {
    std::error_code ignored;
    fs::remove(checkpoint_staging(file_), ignored);
  }
}

bool Checkpointer::due(int64_t next_block) const {
  return next_block > 0 && (next_block % every_ == 0 || next_block == blocks_);
}

void Checkpointer::start(int64_t next_block, const nlohmann::json& state, const ModelMasks& masks,
                         std::vector<CheckpointSlab> slabs) {
  finish();
  const fs::path staging = checkpoint_staging(file_);
  // Rank 0's dataset: the state; everyone's: the masks it keeps (its segment) and the slabs (the same names
  // and shapes on every rank, each with its own rows).
  SYMPRUNE_ASSERT(masks.rank() == comm_.rank() && masks.ranks() == comm_.size(),
                  "masks kept for rank {} of {}, saved by rank {} of {}", masks.rank(), masks.ranks(),
                  comm_.rank(), comm_.size());
  MaskLayout layout = mask_layout(masks);
  std::vector<std::byte> state_bytes;
  std::vector<io::CheckpointDatasetSpec> specs;
  if (comm_.rank() == 0) {
    nlohmann::json saved = state;
    saved["masks"] = std::move(layout.index);
    saved["run_id"] = run_id_;
    // The header's attributes again, inside the checksummed state: an attribute edited (or written wrong)
    // no longer passes for a valid checkpoint (read_point compares them).
    saved["next_block"] = next_block;
    saved["blocks"] = blocks_;
    state_bytes = json_bytes(saved);
  }
  int64_t sizes[2] = {static_cast<int64_t>(state_bytes.size()), layout.bytes};
  comm_.broadcast(std::as_writable_bytes(std::span<int64_t>(sizes)), 0);
  SYMPRUNE_ASSERT(sizes[1] == layout.bytes, "rank {} lays out {} bytes of masks, rank 0 {}", comm_.rank(),
                  layout.bytes, sizes[1]);
  specs.push_back({"state", io::CheckpointType::kUint8, {sizes[0]}});
  specs.push_back({"masks", io::CheckpointType::kUint8, {sizes[1]}});
  for (const auto& slab : slabs)
    specs.push_back({slab.name, io::CheckpointType::kFloat32, slab.global_shape});

  // Rank 0 creates the file with every dataset allocated; all ranks learn where each dataset lies.
  std::vector<int64_t> places_flat(specs.size() * 5, 0);
  agree_on_errors(comm_, [&] {
    if (comm_.rank() != 0) return;
    cleanup_ = std::make_unique<interrupt::CleanupOnStop>(staging);
    const auto places =
        io::create_checkpoint_file(staging, {io::kCheckpointVersion, next_block, blocks_, run_id_}, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& p = places.at(specs[i].name);
      const int64_t values[5] = {p.offset, p.bytes, p.unit_bytes, p.crc_offset, p.units};
      std::copy(values, values + 5, places_flat.begin() + static_cast<std::ptrdiff_t>(i * 5));
    }
  });
  comm_.broadcast(std::as_writable_bytes(std::span<int64_t>(places_flat)), 0);
  auto place = [&](size_t i) {
    const int64_t* v = places_flat.data() + i * 5;
    return io::CheckpointDatasetPlace{v[0], v[1], v[2], v[3], v[4]};
  };
  // What the writer thread owns: the snapshot itself (no second copy), and views of the masks' bits, which
  // never change once added (ModelMasks).
  struct Job {
    io::CheckpointDatasetPlace place;
    int64_t first_unit;
    std::vector<std::byte> bytes;
    std::vector<float> floats;
    std::vector<std::span<const std::byte>> views;
    std::vector<std::span<const std::byte>> data() const {
      if (!floats.empty()) return {std::as_bytes(std::span<const float>(floats))};
      if (!bytes.empty()) return {std::span<const std::byte>(bytes)};
      return views;
    }
    int64_t size() const {
      int64_t total = 0;
      for (const auto& piece : data()) total += static_cast<int64_t>(piece.size());
      return total;
    }
  };
  std::vector<Job> jobs;
  if (comm_.rank() == 0) jobs.push_back({place(0), 0, std::move(state_bytes), {}, {}});
  if (!layout.pieces.empty()) {
    SYMPRUNE_ASSERT(layout.first_byte % io::kByteUnit == 0, "a segment of masks starts inside a unit");
    jobs.push_back({place(1), layout.first_byte / io::kByteUnit, {}, {}, std::move(layout.pieces)});
  }
  for (size_t i = 0; i < slabs.size(); ++i)
    jobs.push_back({place(2 + i), slabs[i].first_row, {}, std::move(slabs[i].data), {}});
  writer_error_.clear();
  writer_done_.store(false, std::memory_order_relaxed);
  in_flight_ = next_block;
  latest_ = next_block;
  writer_ = std::thread([this, staging, jobs = std::move(jobs), rank = comm_.rank(), next_block] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const int fd = ::open(staging.c_str(), O_WRONLY | O_CLOEXEC);
      SYMPRUNE_CHECK(fd >= 0, "checkpoint {}: cannot open for writing: {}", staging.string(),
                     std::strerror(errno));
      try {
        for (const auto& job : jobs) {
          write_run(fd, staging, job.place, job.first_unit, job.data());
          bytes_written_ += job.size();
          fault::at("checkpoint_write:" + std::to_string(next_block),
                    rank);  // tests: a kill in the middle of a checkpoint's writing
        }
        SYMPRUNE_CHECK(::fdatasync(fd) == 0, "checkpoint {}: fdatasync failed: {}", staging.string(),
                       std::strerror(errno));
      } catch (...) {
        ::close(fd);
        throw;
      }
      SYMPRUNE_CHECK(::close(fd) == 0, "checkpoint {}: close failed: {}", staging.string(),
                     std::strerror(errno));
    } catch (const std::exception& e) {
      writer_error_ = e.what();
    }
    writer_last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    writer_done_.store(true, std::memory_order_release);
  });
}

double Checkpointer::install_if_written() {
  if (in_flight_ < 0) return 0.0;  // the same on every rank: start and finish are collective
  int64_t pending = writer_done_.load(std::memory_order_acquire) ? 0 : 1;
  // The all-reduce's own time is the ranks waiting for each other's stage, not checkpoint time.
  comm_.all_reduce_sum(std::span<int64_t>(&pending, 1));
  return pending == 0 ? finish() : 0.0;
}

double Checkpointer::finish() {
  if (in_flight_ < 0) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  writer_.join();
  write_seconds_ += writer_last_seconds_;
  const int64_t next_block = in_flight_;
  in_flight_ = -1;
  try {
    agree_on_errors(comm_, [&] {
      if (!writer_error_.empty()) fail("{}", writer_error_);
    });
  } catch (...) {
    // Whichever rank's part failed, the staging file is incomplete: rank 0 removes it.
    if (comm_.rank() == 0) {
      std::error_code ignored;
      fs::remove(checkpoint_staging(file_), ignored);
      if (cleanup_) cleanup_->release();
      cleanup_.reset();
    }
    throw;
  }
  agree_on_errors(comm_, [&] {
    if (comm_.rank() != 0) return;
    const fs::path staging = checkpoint_staging(file_);
    // With the clean-up list locked (start() registered FILE.tmp on rank 0): a second signal between the two
    // renames would otherwise remove the complete FILE.tmp after FILE became FILE.prev, losing this
    // checkpoint.
    cleanup_->release_after([&] {
      std::error_code ec;
      if (fs::exists(file_, ec)) {
        fs::rename(file_, previous_checkpoint(file_), ec);
        SYMPRUNE_CHECK(!ec, "checkpoint {}: cannot keep the previous checkpoint as {}: {}", file_.string(),
                       previous_checkpoint(file_).string(), ec.message());
      }
      fs::rename(staging, file_, ec);
      SYMPRUNE_CHECK(!ec, "checkpoint {}: cannot install it: {}", file_.string(), ec.message());
      return true;
    });
    cleanup_.reset();
    io::sync_directory(file_.parent_path().empty() ? fs::path(".") : file_.parent_path());
    log::info("checkpoint {}: blocks 1..{} of {} saved", file_.string(), next_block, blocks_);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Checkpointer::mark_complete(const nlohmann::json& marker) {
  if (comm_.rank() != 0) return;
  // One that cannot be written (a full disk) leaves a finished run: its outputs are complete and stay, and
  // so do its checkpoints, from which the same command writes them again instead of doing nothing.
  try {
    fault::at("marker");
    io::write_file_atomically(checkpoint_marker(file_), marker.dump(2) + "\n");
  } catch (const Error& e) {
    log::warn(
        "the run is complete, but its completion marker could not be written ({}): the outputs are kept, and "
        "so is checkpoint {}, from which the same command with --resume auto writes them again (with the "
        "marker it would do nothing)",
        e.what(), file_.string());
    return;
  }
  fault::at("marker_written");
  std::error_code ignored;
  fs::remove(file_, ignored);
  fs::remove(previous_checkpoint(file_), ignored);
  fs::remove(checkpoint_staging(file_), ignored);  // left by an earlier attempt that was killed mid-write
  io::sync_directory(file_.parent_path().empty() ? fs::path(".") : file_.parent_path());
  log::info("checkpoint {}: run complete, marker {} written, checkpoints removed", file_.string(),
            checkpoint_marker(file_).string());
}

std::vector<float> read_checkpoint_rows(const io::CheckpointReader& reader, const std::string& name,
                                        const std::vector<int64_t>& global_shape, int64_t first_row,
                                        int64_t rows) {
  SYMPRUNE_CHECK(reader.has(name), "checkpoint {}: dataset {} is missing", reader.path().string(), name);
  const auto shape = reader.shape(name);
  SYMPRUNE_CHECK(shape == global_shape, "checkpoint {}: dataset {} has shape [{}], this run needs [{}]",
                 reader.path().string(), name, fmt::join(shape, ", "), fmt::join(global_shape, ", "));
  int64_t row_values = 1;
  for (size_t i = 1; i < shape.size(); ++i) row_values *= shape[i];
  std::vector<float> out(static_cast<size_t>(rows * row_values));
  reader.read_units(name, first_row, std::as_writable_bytes(std::span<float>(out)));
  return out;
}

namespace {

// Reads and verifies the state (every rank).
ResumePoint read_point(const fs::path& file) {
  ResumePoint point;
  point.file = file;
  io::CheckpointReader reader(file);
  point.header = reader.header();
  const auto state_shape = reader.shape("state");
  std::vector<std::byte> state(static_cast<size_t>(state_shape.at(0)));
  reader.read_units("state", 0, state);
  try {
    point.state =
        nlohmann::json::parse(std::string(reinterpret_cast<const char*>(state.data()), state.size()));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint {}: its state is not valid JSON: {}", file.string(), e.what());
  }
  if (const auto disagreement = io::header_disagreement(point.header, point.state))
    fail("checkpoint {}: {}", file.string(), *disagreement);
  return point;
}

// Units of the masks dataset read at once on resume (64 MiB).
constexpr int64_t kMaskReadUnits = 64;

// Reads the masks of the state's index into `masks`: every one's shape, and the bits of those this rank
// keeps (their units' checksums verified), read in runs of masks that lie back to back.
void read_masks(const io::CheckpointReader& reader, const nlohmann::json& state, ModelMasks& masks) {
  const std::string file = reader.path().string();
  const int64_t dataset_bytes = reader.shape("masks").at(0);
  const int64_t unit = reader.unit_bytes("masks");
  struct Kept {
    std::string name;
    PackedMask mask;
    int64_t offset;
  };
  std::vector<Kept> kept;
  try {
    for (const auto& entry : state.at("masks")) {
      const auto name = entry.at("name").get<std::string>();
      const ModelMasks::Shape shape{entry.at("rows").get<int64_t>(), entry.at("cols").get<int64_t>()};
      const auto offset = entry.at("offset").get<int64_t>();
      SYMPRUNE_CHECK(
          shape.rows > 0 && shape.cols > 0 && offset >= 0 && offset + shape.bytes() <= dataset_bytes,
          "checkpoint {}: mask {} lies outside the masks dataset", file, name);
      // Checked here, under the ranks' agreement (a bad index falls back to FILE.prev on every rank), and
      // not only by the one rank that keeps the mask.
      SYMPRUNE_CHECK(masks.is_tensor(name),
                     "checkpoint {}: its mask index names '{}', not a tensor of this model", file, name);
      SYMPRUNE_CHECK(masks.fits(name, shape),
                     "checkpoint {}: its mask of '{}' is [{}, {}], not the tensor's shape", file, name,
                     shape.rows, shape.cols);
      SYMPRUNE_CHECK(masks.shapes().count(name) == 0, "checkpoint {}: its mask index names '{}' twice", file,
                     name);
      masks.add_shape(name, shape);
      if (masks.keeps(name)) kept.push_back({name, {shape.rows, shape.cols, {}}, offset});
    }
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint {}: its mask index is malformed: {}", file, e.what());
  }
  std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.offset < b.offset; });
  const auto bytes_of = [](const PackedMask& m) { return ModelMasks::Shape{m.rows, m.cols}.bytes(); };
  for (Kept& k : kept) k.mask.bits.resize(static_cast<size_t>(bytes_of(k.mask)));
  // Each run of back-to-back masks is read once, at most kMaskReadUnits units at a time (a bounded buffer
  // beside the bits, which the host plan counts).
  std::vector<std::byte> chunk;
  for (size_t first = 0, last = 0; first < kept.size(); first = last) {
    int64_t end = kept[first].offset;
    for (last = first; last < kept.size() && kept[last].offset == end; ++last)
      end += bytes_of(kept[last].mask);
    const int64_t run_end = std::min((end + unit - 1) / unit * unit, dataset_bytes);
    for (int64_t at_unit = kept[first].offset / unit; at_unit * unit < end; at_unit += kMaskReadUnits) {
      const int64_t from = at_unit * unit, to = std::min((at_unit + kMaskReadUnits) * unit, run_end);
      chunk.resize(static_cast<size_t>(to - from));
      reader.read_units("masks", at_unit, chunk);
      for (size_t i = first; i < last; ++i) {
        const int64_t begin = std::max(kept[i].offset, from);
        const int64_t stop = std::min(kept[i].offset + bytes_of(kept[i].mask), to);
        if (begin < stop)
          std::memcpy(kept[i].mask.bits.data() + (begin - kept[i].offset), chunk.data() + (begin - from),
                      static_cast<size_t>(stop - begin));
      }
    }
  }
  for (Kept& k : kept) masks.add(k.name, std::move(k.mask));
}

// A checkpoint this process may not read is not a corrupt one: skipping it would resume from FILE.prev and
// the next save would then replace it, losing its blocks. Refused instead, for its permissions to be fixed.
void check_permission_to_read(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  const int error = errno;
  if (error == EACCES || error == EPERM)
    fail(
        "checkpoint {}: cannot be read: {}. It was not used, and nothing was removed: give this user read "
        "access to it and resume again",
        file.string(), std::strerror(error));
}

}  // namespace

std::optional<ResumePoint> load_resume_point(
    dist::Communicator& comm, const std::string& resume, const fs::path& checkpoint,
    const nlohmann::json& identity, ModelMasks& masks,
    const std::function<void(const io::CheckpointReader&)>& restore) {
  const bool automatic = resume == "auto";
  const fs::path newest = automatic ? checkpoint : fs::path(resume);
  std::vector<fs::path> candidates;
  std::error_code ec;
  // Collective: every rank reads the same files, so each must see them (else the ranks would go on to
  // different collectives).
  for (const auto& f : {newest, previous_checkpoint(newest)})
    if (every_rank_sees(comm, fs::exists(f, ec), "checkpoint " + f.string())) candidates.push_back(f);
  // The errors below are every rank's (they read the same files): agreed, so that every rank ends with one
  // message instead of an abort per rank.
  if (candidates.empty()) {
    agree_on_errors(comm, [&] {
      SYMPRUNE_CHECK(automatic, "--resume {}: no such checkpoint (nor {})", resume,
                     previous_checkpoint(newest).string());
    });
    log::info("--resume auto: no checkpoint at {}: starting from the first block", checkpoint.string());
    return std::nullopt;
  }
  std::vector<std::string> problems;
  for (const auto& file : candidates) {
    const char* next = &file != &candidates.back() ? "; trying the previous checkpoint" : "";
    std::optional<ResumePoint> point;
    agree_on_errors(comm, [&] { check_permission_to_read(file); });
    try {
      agree_on_errors(comm, [&] { point = read_point(file); });
    } catch (const interrupt::Interrupted&) {
      throw;
    } catch (const Error& e) {  // CollectiveError with ranks > 1
      problems.push_back(e.what());
      log::warn_on_root("{}{}", e.what(), next);  // every rank has the agreed error
      continue;
    }
    // A checkpoint of another run is an error, not something to skip: its previous one is of that run too.
    const nlohmann::json saved = point->state.value("identity", nlohmann::json());
    agree_on_errors(comm, [&] {
      if (const auto diff = identity_difference(saved, identity))
        fail("checkpoint {} was made by a different run and cannot continue this one: {}", file.string(),
             *diff);
    });
    ModelMasks read = masks;  // masks stays as it was when this candidate fails
    try {
      agree_on_errors(comm, [&] {
        const io::CheckpointReader reader(file);
        read_masks(reader, point->state, read);
        restore(reader);
      });
    } catch (const interrupt::Interrupted&) {
      throw;
    } catch (const Error& e) {
      problems.push_back(e.what());
      log::warn_on_root("{}{}", e.what(), next);  // every rank has the agreed error
      continue;
    }
    log::info("resuming from checkpoint {}: blocks 1..{} of {} were done", file.string(),
              point->header.next_block, point->header.blocks);
    masks = std::move(read);
    return point;
  }
  agree_on_errors(comm, [&] { fail("no usable checkpoint to resume from: {}", fmt::join(problems, "; ")); });
  return std::nullopt;  // not reached: agree_on_errors threw
}

}  // namespace symprune::engine
