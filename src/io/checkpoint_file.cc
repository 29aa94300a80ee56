#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kCrcSuffix = "_crc32";

// HDF5 prints its error stack to stderr by default; symprune reports errors itself.
void quiet_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

herr_t innermost_error(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

// The deepest description on HDF5's error stack ("truncated file: eof = ...").
std::string hdf5_error() {
  std::string what;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, innermost_error, &what);
  H5Eclear2(H5E_DEFAULT);
  return what.empty() ? "unknown HDF5 error" : what;
}

// An HDF5 id closed by its kind's function (H5Oclose only handles objects); negative ids are failures.
template <herr_t (*close)(hid_t)>
struct Handle {
  explicit Handle(hid_t handle) : id(handle) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t id;
};
using Space = Handle<H5Sclose>;
using Plist = Handle<H5Pclose>;
using Type = Handle<H5Tclose>;
using Dataset = Handle<H5Dclose>;
using Attribute = Handle<H5Aclose>;

int64_t element_bytes(CheckpointType t) {
  return t == CheckpointType::kFloat32 ? 4 : 1;
}

void write_int_attribute(hid_t object, const char* name, int64_t value, const fs::path& path) {
  Space space{H5Screate(H5S_SCALAR)};
  Attribute a{H5Acreate2(object, name, H5T_STD_I64LE, space.id, H5P_DEFAULT, H5P_DEFAULT)};
  SYMPRUNE_CHECK(a.id >= 0 && H5Awrite(a.id, H5T_NATIVE_INT64, &value) >= 0,
                 "checkpoint {}: cannot write attribute {}: {}", path.string(), name, hdf5_error());
}

void write_string_attribute(hid_t object, const char* name, const std::string& value, const fs::path& path) {
  Space space{H5Screate(H5S_SCALAR)};
  Type type{H5Tcopy(H5T_C_S1)};
  H5Tset_size(type.id, std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.id, H5T_STR_NULLPAD);
  Attribute a{H5Acreate2(object, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT)};
  std::string padded = value;
  padded.resize(std::max<size_t>(1, value.size()), '\0');
  SYMPRUNE_CHECK(a.id >= 0 && H5Awrite(a.id, type.id, padded.data()) >= 0,
                 "checkpoint {}: cannot write attribute {}: {}", path.string(), name, hdf5_error());
}

std::optional<int64_t> read_int_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Attribute a{H5Aopen(object, name, H5P_DEFAULT)};
  int64_t value = 0;
  if (a.id < 0 || H5Aread(a.id, H5T_NATIVE_INT64, &value) < 0) return std::nullopt;
  return value;
}

std::optional<std::string> read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Attribute a{H5Aopen(object, name, H5P_DEFAULT)};
  if (a.id < 0) return std::nullopt;
  Type type{H5Aget_type(a.id)};
  if (type.id < 0 || H5Tget_class(type.id) != H5T_STRING || H5Tis_variable_str(type.id) > 0)
    return std::nullopt;
  const size_t size = H5Tget_size(type.id);
  if (size == 0 || size > (size_t{1} << 20)) return std::nullopt;
  std::string value(size, '\0');
  if (H5Aread(a.id, type.id, value.data()) < 0) return std::nullopt;
  value.resize(std::strlen(value.c_str()));
  return value;
}

void pwrite_all(int fd, const void* data, size_t size, int64_t offset, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    SYMPRUNE_CHECK(n > 0, "checkpoint {}: write failed: {}", path.string(),
                   n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
}

// HDF5 1.10 crashes at exit after an H5Fclose that failed to write (the file stays in its id table;
// HDFGroup/hdf5#2291), which is what running out of space or past `ulimit -f` does to a new checkpoint. So
// its final size is claimed first, and such a failure is a plain error before HDF5 has the file. (Where
// the file system cannot preallocate, the check is skipped.)
void reserve_file_space(const fs::path& path, int64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask
  SYMPRUNE_CHECK(fd >= 0, "checkpoint {}: cannot create the file: {}", path.string(), std::strerror(errno));
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  ::close(fd);
  if (err == 0 || err == EOPNOTSUPP || err == EINVAL) return;
  ::unlink(path.c_str());
  fail("checkpoint {}: cannot write its {} bytes: {}", path.string(), bytes, std::strerror(err));
}

hid_t open_file(const fs::path& path, std::string* why) {
  quiet_hdf5();
  Plist fapl{H5Pcreate(H5P_FILE_ACCESS)};
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id);
  if (file < 0 && why) *why = hdf5_error();
  return file;
}

}  // namespace

uint32_t crc32_of(std::span<const std::byte> data) {
  return static_cast<uint32_t>(
      crc32_z(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<z_size_t>(data.size())));
}

std::map<std::string, CheckpointDatasetPlace> create_checkpoint_file(
    const fs::path& path, const CheckpointHeader& header,
    const std::vector<CheckpointDatasetSpec>& datasets) {
  quiet_hdf5();
  // Each dataset's size and checksum units; the offsets come when HDF5 allocates them.
  std::map<std::string, CheckpointDatasetPlace> places;
  int64_t file_bytes = 64 * 1024;  // superblock, attributes and object headers: a few KiB in practice
  for (const auto& spec : datasets) {
    CheckpointDatasetPlace p;
    int64_t elements = 1;
    for (int64_t s : spec.shape) elements *= s;
    p.bytes = elements * element_bytes(spec.type);
    if (spec.type == CheckpointType::kFloat32) {
      SYMPRUNE_ASSERT(!spec.shape.empty() && spec.shape[0] > 0, "dataset {} needs rows", spec.name);
      p.unit_bytes = p.bytes / spec.shape[0];
    } else {
      SYMPRUNE_ASSERT(spec.shape.size() == 1, "byte dataset {} must be one-dimensional", spec.name);
      p.unit_bytes = kByteUnit;
    }
    p.units = p.unit_bytes > 0 ? (p.bytes + p.unit_bytes - 1) / p.unit_bytes : 0;
    places[spec.name] = p;
    file_bytes += p.bytes + p.units * 4 + 4096;
  }
  reserve_file_space(path, file_bytes);
  // The latest format: object headers and the superblock carry checksums of their own, so a flipped bit
  // in the metadata is an HDF5 error on open rather than a silently wrong attribute.
  Plist fapl{H5Pcreate(H5P_FILE_ACCESS)};
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  const hid_t file_id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id);
  SYMPRUNE_CHECK(file_id >= 0, "checkpoint {}: cannot create the file: {}", path.string(), hdf5_error());
  try {
    write_string_attribute(file_id, "format", kCheckpointFormat, path);
    write_int_attribute(file_id, "version", header.version, path);
    write_int_attribute(file_id, "next_block", header.next_block, path);
    write_int_attribute(file_id, "blocks", header.blocks, path);
    write_string_attribute(file_id, "run_id", header.run_id, path);
    Plist dcpl{H5Pcreate(H5P_DATASET_CREATE)};
    H5Pset_layout(dcpl.id, H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl.id, H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl.id, H5D_FILL_TIME_NEVER);
    // Creates one dataset; returns its data offset (0 for an empty one).
    auto create = [&](const std::string& name, hid_t type, const std::vector<int64_t>& shape,
                      int64_t unit_bytes) -> int64_t {
      std::vector<hsize_t> dims(shape.begin(), shape.end());
      Space space{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)};
      Dataset d{H5Dcreate2(file_id, name.c_str(), type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT)};
      SYMPRUNE_CHECK(d.id >= 0, "checkpoint {}: cannot create dataset {}: {}", path.string(), name,
                     hdf5_error());
      if (unit_bytes > 0) write_int_attribute(d.id, "crc_unit_bytes", unit_bytes, path);
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      if (n == 0) return 0;
      const haddr_t offset = H5Dget_offset(d.id);
      SYMPRUNE_CHECK(offset != HADDR_UNDEF, "checkpoint {}: dataset {} has no storage: {}", path.string(),
                     name, hdf5_error());
      return static_cast<int64_t>(offset);
    };
    for (const auto& spec : datasets) {
      CheckpointDatasetPlace& p = places.at(spec.name);
      p.offset = create(spec.name, spec.type == CheckpointType::kFloat32 ? H5T_IEEE_F32LE : H5T_STD_U8LE,
                        spec.shape, p.unit_bytes);
      p.crc_offset = create(spec.name + kCrcSuffix, H5T_STD_U32LE, {p.units}, 0);
    }
  } catch (...) {
    H5Fclose(file_id);
    throw;
  }
  SYMPRUNE_CHECK(H5Fclose(file_id) >= 0, "checkpoint {}: cannot finish the file: {}", path.string(),
                 hdf5_error());
  return places;
}

void write_checkpoint_units(int fd, const fs::path& path, const CheckpointDatasetPlace& place,
                            int64_t first_unit, std::span<const std::byte> data) {
  if (data.empty()) return;
  const int64_t begin = first_unit * place.unit_bytes;
  SYMPRUNE_ASSERT(begin + static_cast<int64_t>(data.size()) <= place.bytes, "write past the dataset's end");
  pwrite_all(fd, data.data(), data.size(), place.offset + begin, path);
  std::vector<uint32_t> crcs;
  for (size_t at = 0; at < data.size(); at += static_cast<size_t>(place.unit_bytes))
    crcs.push_back(
        crc32_of(data.subspan(at, std::min(data.size() - at, static_cast<size_t>(place.unit_bytes)))));
  pwrite_all(fd, crcs.data(), crcs.size() * sizeof(uint32_t),
             place.crc_offset + first_unit * static_cast<int64_t>(sizeof(uint32_t)), path);
}

CheckpointReader::CheckpointReader(const fs::path& path) : path_(path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  SYMPRUNE_CHECK(fs::exists(status), "checkpoint {}: no such file", path.string());
  SYMPRUNE_CHECK(fs::is_regular_file(status), "checkpoint {}: not a regular file (a {}{})", path.string(),
                 fs::is_directory(status) ? "directory"
                 : fs::is_fifo(status)    ? "FIFO"
                                          : "device or socket",
                 fs::is_symlink(fs::symlink_status(path, ec)) ? ", through a symbolic link" : "");
  std::string why;
  const hid_t file = open_file(path, &why);
  SYMPRUNE_CHECK(file >= 0, "checkpoint {}: not a readable HDF5 file (truncated or corrupt?): {}",
                 path.string(), why);
  file_ = file;
  const auto format = read_string_attribute(file, "format");
  const auto version = read_int_attribute(file, "version");
  const auto next_block = read_int_attribute(file, "next_block");
  const auto blocks = read_int_attribute(file, "blocks");
  const auto run_id = read_string_attribute(file, "run_id");
  if (!format || *format != kCheckpointFormat) {
    H5Fclose(file);
    fail("checkpoint {}: not a symprune checkpoint (attribute format is {})", path.string(),
         format ? "'" + *format + "'" : std::string("missing"));
  }
  if (!version || *version != kCheckpointVersion || !next_block || !blocks || !run_id) {
    H5Fclose(file);
    if (version && *version != kCheckpointVersion)
      fail("checkpoint {}: format version {}, but this symprune reads version {}", path.string(), *version,
           kCheckpointVersion);
    fail("checkpoint {}: the header attributes (version, next_block, blocks, run_id) are incomplete",
         path.string());
  }
  header_ = {*version, *next_block, *blocks, *run_id};
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(file_);
}

std::vector<std::string> CheckpointReader::dataset_names() const {
  std::vector<std::string> names;
  H5Literate(
      file_, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        const std::string n = name;
        if (!(n.size() > 6 && n.ends_with(kCrcSuffix)))
          static_cast<std::vector<std::string>*>(out)->push_back(n);
        return 0;
      },
      &names);
  std::sort(names.begin(), names.end());
  return names;
}

bool CheckpointReader::has(const std::string& name) const {
  return H5Lexists(file_, name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<int64_t> CheckpointReader::shape(const std::string& name) const {
  Dataset d{H5Dopen2(file_, name.c_str(), H5P_DEFAULT)};
  SYMPRUNE_CHECK(d.id >= 0, "checkpoint {}: dataset {} is missing or unreadable: {}", path_.string(), name,
                 hdf5_error());
  Space space{H5Dget_space(d.id)};
  const int rank = H5Sget_simple_extent_ndims(space.id);
  SYMPRUNE_CHECK(rank >= 1 && rank <= 8, "checkpoint {}: dataset {} has rank {}", path_.string(), name, rank);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

int64_t CheckpointReader::unit_bytes(const std::string& name) const {
  Dataset d{H5Dopen2(file_, name.c_str(), H5P_DEFAULT)};
  SYMPRUNE_CHECK(d.id >= 0, "checkpoint {}: dataset {} is missing or unreadable: {}", path_.string(), name,
                 hdf5_error());
  const auto unit = read_int_attribute(d.id, "crc_unit_bytes");
  SYMPRUNE_CHECK(unit && *unit > 0, "checkpoint {}: dataset {} has no checksum unit", path_.string(), name);
  return *unit;
}

void CheckpointReader::read_units(const std::string& name, int64_t first_unit,
                                  std::span<std::byte> out) const {
  if (out.empty()) return;
  const std::vector<int64_t> dims = shape(name);
  const int64_t unit = unit_bytes(name);
  Dataset d{H5Dopen2(file_, name.c_str(), H5P_DEFAULT)};
  Type type{H5Dget_type(d.id)};
  const int64_t element = static_cast<int64_t>(H5Tget_size(type.id));
  SYMPRUNE_CHECK(element == 1 || element == 4, "checkpoint {}: dataset {} has {}-byte elements",
                 path_.string(), name, element);
  int64_t inner = 1;  // elements per index of the first dimension
  for (size_t i = 1; i < dims.size(); ++i) inner *= dims[i];
  const int64_t first_element = first_unit * unit / element;
  const int64_t elements = static_cast<int64_t>(out.size()) / element;
  SYMPRUNE_CHECK(
      first_element % inner == 0 && elements % inner == 0 && first_element + elements <= dims[0] * inner,
      "checkpoint {}: dataset {} has shape [{}], too small for the requested rows", path_.string(), name,
      fmt::join(dims, ", "));
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = static_cast<hsize_t>(first_element / inner);
  count[0] = static_cast<hsize_t>(elements / inner);
  Space file_space{H5Dget_space(d.id)};
  H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  const hsize_t mem_elements = static_cast<hsize_t>(elements);
  Space mem_space{H5Screate_simple(1, &mem_elements, nullptr)};
  const hid_t mem_type = element == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8;
  SYMPRUNE_CHECK(H5Dread(d.id, mem_type, mem_space.id, file_space.id, H5P_DEFAULT, out.data()) >= 0,
                 "checkpoint {}: cannot read dataset {} (truncated?): {}", path_.string(), name,
                 hdf5_error());
  // Checksums of the units read.
  const int64_t units = (static_cast<int64_t>(out.size()) + unit - 1) / unit;
  std::vector<uint32_t> stored(static_cast<size_t>(units));
  Dataset c{H5Dopen2(file_, (name + kCrcSuffix).c_str(), H5P_DEFAULT)};
  SYMPRUNE_CHECK(c.id >= 0, "checkpoint {}: the checksums of dataset {} are missing: {}", path_.string(),
                 name, hdf5_error());
  Space crc_space{H5Dget_space(c.id)};
  const hsize_t crc_start = static_cast<hsize_t>(first_unit), crc_count = static_cast<hsize_t>(units);
  H5Sselect_hyperslab(crc_space.id, H5S_SELECT_SET, &crc_start, nullptr, &crc_count, nullptr);
  Space crc_mem{H5Screate_simple(1, &crc_count, nullptr)};
  SYMPRUNE_CHECK(H5Dread(c.id, H5T_NATIVE_UINT32, crc_mem.id, crc_space.id, H5P_DEFAULT, stored.data()) >= 0,
                 "checkpoint {}: cannot read the checksums of dataset {}: {}", path_.string(), name,
                 hdf5_error());
  for (int64_t u = 0; u < units; ++u) {
    const size_t at = static_cast<size_t>(u * unit);
    const uint32_t crc = crc32_of(out.subspan(at, std::min(out.size() - at, static_cast<size_t>(unit))));
    SYMPRUNE_CHECK(crc == stored[static_cast<size_t>(u)],
                   "checkpoint {}: dataset {} is corrupt: checksum mismatch in unit {} (of {} bytes; stored "
                   "{:08x}, computed {:08x})",
                   path_.string(), name, first_unit + u, unit, stored[static_cast<size_t>(u)], crc);
  }
}

std::optional<std::string> CheckpointReader::verify(const std::string& name) const {
  try {
    const std::vector<int64_t> dims = shape(name);
    const int64_t unit = unit_bytes(name);
    Dataset d{H5Dopen2(file_, name.c_str(), H5P_DEFAULT)};
    Type type{H5Dget_type(d.id)};
    int64_t bytes = static_cast<int64_t>(H5Tget_size(type.id));
    for (int64_t s : dims) bytes *= s;
    const int64_t units = (bytes + unit - 1) / unit;
    const int64_t per_read = std::max<int64_t>(1, (int64_t{64} << 20) / unit);
    std::vector<std::byte> buffer;
    for (int64_t u = 0; u < units; u += per_read) {
      const int64_t n = std::min(per_read, units - u);
      buffer.resize(static_cast<size_t>(std::min(n * unit, bytes - u * unit)));
      read_units(name, u, buffer);
    }
    return std::nullopt;
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

std::optional<CheckpointHeader> peek_checkpoint_header(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  try {
    CheckpointReader reader(path);
    return reader.header();
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<std::string> header_disagreement(const CheckpointHeader& header, const nlohmann::json& state) {
  const auto field = [&](const char* key) {
    return state.is_object() ? state.value(key, nlohmann::json()) : nlohmann::json();
  };
  if (field("next_block") == header.next_block && field("blocks") == header.blocks &&
      field("run_id") == header.run_id)
    return std::nullopt;
  return fmt::format(
      "its header (blocks 1..{} of {} done, run {}) disagrees with its checksummed state (next_block {}, "
      "blocks {}, run {}): edited or written wrong",
      header.next_block, header.blocks, header.run_id, field("next_block").dump(), field("blocks").dump(),
      field("run_id").dump());
}

}  // namespace symprune::io
