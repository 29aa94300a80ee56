#pragma once
// Host-only header (no CUDA types): device memory and streams for the host code of src/core/cuda.
// Implemented with the CUDA runtime (device_memory.cc) and, for the CPU emulation of the kernels, with
// host memory (emulation/device_memory_emulated.cc). Errors throw symprune::Error. C++17, since nvcc
// compiles the kernel files that include it in that dialect.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace symprune::cuda {

// A CUDA stream as host code sees it; a null handle is the default stream. The launch_* functions of
// core/cuda/kernels take one; the host entry points above them (device_*.h, the backend) run everything,
// their scratch arrays' allocations and frees included, on the default stream.
struct DeviceStream {
  void* handle = nullptr;
};

// Bad arguments to a kernel entry point: throws symprune::Error(message) (for .cu files, which do not
// include core/error.h).
[[noreturn]] void throw_argument_error(const std::string& message);

// Allocations are ordered on `stream` (the default stream unless given), frees on the default stream (a
// pool keeps freed memory for reuse): an array used on another stream must be synchronized before it is
// freed. A device without stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported 0, as on some
// virtualized GPUs) gets cudaMalloc and cudaFree instead, counted by hand for device_pool_memory.
void* device_allocate(size_t bytes, DeviceStream stream = {});  // Error naming the size and the free memory
void device_free(void* pointer) noexcept;
// device_free with `device` current, the calling thread's device restored after: for memory whose last
// owner may be any thread (a host Mask's bits on the device), since a thread starts on device 0.
void device_free_on(int device, void* pointer) noexcept;
// The allocations from here on are plain (cudaMalloc/cudaFree), or (false) again what the device supports:
// what tests use to run the fallback on a device with pools. Earlier allocations keep their kind
// (device_free tells them apart); device_pool_memory then counts the plain ones only.
void use_plain_device_allocations(bool plain);
bool plain_device_allocations();  // whether the next allocation is plain (the emulation's always are)
// A stream whose work overlaps the default stream's (no implicit synchronization with it), and its end.
DeviceStream create_stream();
void destroy_stream(DeviceStream stream) noexcept;
// Page-locked host memory: copies from it to the device are DMA, without the driver's staging.
void* pinned_allocate(size_t bytes);
void pinned_free(void* pointer) noexcept;
// The calling thread's device (a new host thread starts on device 0) and setting it.
int current_device();
void set_current_device(int device);
void copy_to_device(void* device_destination, const void* host_source, size_t bytes,
                    DeviceStream stream = {});
void copy_to_host(void* host_destination, const void* device_source, size_t bytes, DeviceStream stream = {});
// `bytes` of device memory as a new host vector, on the default stream, through a page-locked staging
// buffer of the process (the driver's own staging of pageable memory is slower), copied into the vector as
// it is filled (not zero-filled first). One implementation (kernels/staged_download.cc) for the device and
// the emulation, on the functions above.
std::vector<uint8_t> download_bytes(const void* device_source, size_t bytes);
void zero_device(void* device_destination, size_t bytes, DeviceStream stream = {});
void copy_on_device(void* device_destination, const void* device_source, size_t bytes,
                    DeviceStream stream = {});
// Free and total bytes of the device (the emulation: the host memory this process can use).
void device_memory_info(int64_t* free_bytes, int64_t* total_bytes);
// The stream-ordered pool of device_allocate: the bytes its allocations hold now (used), the memory it holds
// for them now, in use or kept for reuse (reserved), and the most of each since the last reset (its
// high-water marks; plain allocations and the emulation count the bytes asked for, so reserved = used
// there). The reset starts the peaks again from what is held now.
struct DevicePoolMemory {
  int64_t used = 0, reserved = 0, peak_used = 0, peak_reserved = 0;
};
DevicePoolMemory device_pool_memory();
void reset_device_memory_peak();
// Waits for the stream; a fault of a kernel launched on it surfaces here as an Error.
void synchronize(DeviceStream stream = {});

// An owning device array of trivially copyable T (RAII; moves only).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  // Allocated in `stream`'s order (device_allocate).
  explicit DeviceArray(int64_t count, DeviceStream stream = {}) : count_(count) {
    if (count_ > 0) data_ = static_cast<T*>(device_allocate(bytes(), stream));
  }
  // A copy of host[0, count).
  DeviceArray(const T* host, int64_t count) : DeviceArray(count) {
    if (count_ > 0) copy_to_device(data_, host, bytes());
  }
  explicit DeviceArray(const std::vector<T>& host)
      : DeviceArray(host.data(), static_cast<int64_t>(host.size())) {}
  ~DeviceArray() { device_free(data_); }
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  // The allocation, now the caller's to free (device_free or device_free_on); the array is left empty.
  T* release() noexcept {
    count_ = 0;
    return std::exchange(data_, nullptr);
  }
  size_t bytes() const { return static_cast<size_t>(count_) * sizeof(T); }

  // Scratch kept between calls: grows (contents dropped) to at least `count` elements, never shrinks.
  void reserve(int64_t count) {
    if (count_ < count) *this = DeviceArray(count);
  }

  void zero(DeviceStream stream = {}) {
    if (count_ > 0) zero_device(data_, bytes(), stream);
  }
  // Copies size() elements from host.
  void upload(const T* host, DeviceStream stream = {}) {
    if (count_ > 0) copy_to_device(data_, host, bytes(), stream);
  }
  std::vector<T> download(DeviceStream stream = {}) const {
    std::vector<T> host(static_cast<size_t>(count_));
    if (count_ > 0) copy_to_host(host.data(), data_, bytes(), stream);
    return host;
  }

 private:
  T* data_ = nullptr;
  int64_t count_ = 0;
};

// The smallest flat index a "first index" kernel reports, or -1: `launch(int64_t* first)` queues a kernel
// on the default stream that lowers *first (set to INT64_MAX here) with atomicMin.
template <typename Launch>
int64_t first_index_on_device(Launch launch) {
  constexpr int64_t kNone = INT64_MAX;
  DeviceArray<int64_t> first(&kNone, 1);
  launch(first.data());
  const int64_t index = first.download()[0];
  return index == kNone ? -1 : index;
}

}  // namespace symprune::cuda
