// cuemm/runtime/device_array.hpp: typed one-dimensional arrays in device memory.
//
// Memory always comes from the current context's memory manager.
//
//   std::vector<double> zeros(10, 0.0);
//   auto array = cuemm::to_device<double>(zeros);         // memalloc + copy
//   std::vector<double> back = array.copy_to_host();
//   auto empty = cuemm::device_array<float>(1 << 20);     // memalloc only
//   empty.memset(0, stream);
//
// An empty array allocates nothing (the driver refuses 0-byte allocations).
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "cuemm/error.hpp"
#include "cuemm/memory/ipc_handle.hpp"
#include "cuemm/memory/memory_pointer.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/stream.hpp"

namespace cuemm {

namespace detail {
void copy_host_to_device(const MemoryPointer& dst, const void* src, std::size_t bytes, const Stream& stream);
void copy_device_to_host(void* dst, const MemoryPointer& src, std::size_t bytes, const Stream& stream);
}  // namespace detail

template <typename T>
class DeviceArray {
  static_assert(std::is_trivially_copyable_v<T>, "device arrays hold trivially copyable values");

 public:
  DeviceArray() = default;
  // Uninitialised device memory for `count` values.
  explicit DeviceArray(std::size_t count, Context& context = current_context())
      : count_(count), gpu_data_(count ? context.memalloc(bytes_for(count)) : nullptr) {}
  // Wraps existing memory (say, an opened IPC handle); `count` must fit.
  DeviceArray(std::shared_ptr<MemoryPointer> memory, std::size_t count) : count_(count), gpu_data_(std::move(memory)) {
    if (bytes_for(count_) > (gpu_data_ ? gpu_data_->size() : 0))
      throw InvalidArgument("DeviceArray: " + std::to_string(count_) + " values do not fit in " +
                            describe_bytes(gpu_data_ ? gpu_data_->size() : 0));
  }

  std::size_t size() const noexcept { return count_; }
  std::size_t nbytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }
  cuda::CUdeviceptr device_pointer() const { return gpu_data_ ? gpu_data_->device_pointer() : 0; }
  const std::shared_ptr<MemoryPointer>& gpu_data() const noexcept { return gpu_data_; }

  void copy_to_device(std::span<const T> host, const Stream& stream = Stream()) {
    check_size(host.size(), "copy_to_device");
    if (count_) detail::copy_host_to_device(*gpu_data_, host.data(), nbytes(), stream);
  }
  void copy_to_host(std::span<T> host, const Stream& stream = Stream()) const {
    check_size(host.size(), "copy_to_host");
    if (count_) detail::copy_device_to_host(host.data(), *gpu_data_, nbytes(), stream);
  }
  std::vector<T> copy_to_host() const {
    std::vector<T> host(count_);
    copy_to_host(host);
    return host;
  }
  // Sets every byte to `value`.
  void memset(unsigned char value, const Stream& stream = Stream()) {
    if (count_) gpu_data_->memset(value, nbytes(), &stream);
  }

 private:
  // `count` values' bytes; a count whose bytes would pass 2^64 is refused
  // rather than wrapped to a small allocation.
  static std::size_t bytes_for(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw InvalidArgument("DeviceArray: " + std::to_string(count) + " values of " + std::to_string(sizeof(T)) +
                            " bytes are more bytes than a size_t counts");
    return count * sizeof(T);
  }
  void check_size(std::size_t host_count, const char* what) const {
    if (host_count != count_)
      throw InvalidArgument(std::string(what) + ": host buffer has " + std::to_string(host_count) +
                            " values, the device array " + std::to_string(count_));
  }

  std::size_t count_ = 0;
  std::shared_ptr<MemoryPointer> gpu_data_;
};

// Opens a handle from another process as an array of `count` values (the
// handle must hold at least that many bytes); close the handle when done.
template <typename T>
DeviceArray<T> open_array(IpcHandle& handle, Context& context, std::size_t count) {
  return DeviceArray<T>(handle.open(context), count);
}

template <typename T>
DeviceArray<T> device_array(std::size_t count, Context& context = current_context()) {
  return DeviceArray<T>(count, context);
}

template <typename T>
DeviceArray<T> to_device(std::span<const T> host, const Stream& stream = Stream(),
                         Context& context = current_context()) {
  DeviceArray<T> array(host.size(), context);
  array.copy_to_device(host, stream);
  return array;
}

template <typename T>
DeviceArray<T> to_device(const std::vector<T>& host, const Stream& stream = Stream(),
                         Context& context = current_context()) {
  return to_device(std::span<const T>(host), stream, context);
}

}  // namespace cuemm
