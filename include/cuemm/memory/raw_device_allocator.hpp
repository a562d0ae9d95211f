// cuemm/memory/raw_device_allocator.hpp: device memory without a pointer object.
//
// An optional capability, not part of the plugin interface: a manager that
// can hand out device memory as a bare address (the pool) lets an adaptor
// that wraps it make one pointer object per allocation, its own, rather
// than its own around the manager's (see ManagerAdaptor::memalloc).
//
//   if (auto* raw = dynamic_cast<cuemm::RawDeviceAllocator*>(&manager)) {
//     const auto [address, releaser] = raw->allocate_raw(size);
//     releaser.release(releaser.state, address, size);
//   }
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuemm {

class RawDeviceAllocator {
 public:
  // Gives back memory from allocate_raw() with the size it was asked with.
  // Valid until the process exits, as pointers may outlive their manager;
  // after the manager is gone or reset it gives nothing back.
  struct Releaser {
    void (*release)(void* state, std::uintptr_t address, std::size_t size) noexcept;
    void* state;
  };
  struct Allocation {
    std::uintptr_t address;
    Releaser releaser;  // this allocation's (a reset may change the manager's)
  };

  // `size` bytes of device memory, 256-byte aligned, in the manager's
  // context, on the same terms as its memalloc (errors, out-of-memory retries).
  virtual Allocation allocate_raw(std::size_t size) = 0;

 protected:
  ~RawDeviceAllocator() = default;
};

}  // namespace cuemm
