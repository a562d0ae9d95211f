// cuemm/memory/stream_ordered_allocator.hpp: device memory on a stream.
//
// An optional capability, not part of the plugin interface (Numba's has no
// stream): a manager that can allocate and free in a stream's order, as
// cudaMallocAsync and cudaFreeAsync do, RMM's device_memory_resource and
// PyTorch's raw_alloc and raw_delete. The pool and the async manager have it,
// and so does any chain of adaptors over one, which observes the calls as it
// observes memalloc's (counted, logged with their stream, tracked, limited).
//
//   if (auto* ordered = cuemm::stream_ordered_allocator(context.memory_manager())) {
//     const cuda::CUdeviceptr block = ordered->allocate(size, stream);
//     ...  // work on `stream` that uses the block
//     ordered->deallocate(block, size, stream);
//   }
#pragma once

#include <cstddef>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm {

class BaseMemoryManager;

class StreamOrderedAllocator {
 public:
  // `size` bytes of device memory, 256-byte aligned, in the manager's
  // context, ready for work on `stream` at once and for other streams once
  // they wait for it.
  virtual cuda::CUdeviceptr allocate(std::size_t size, cuda::CUstream stream) = 0;
  // Gives the block back once the work queued on `stream` so far has run.
  // `size` must be the size allocate() was asked with. A free that matches
  // no live block is refused, said on stderr, and frees nothing (each
  // manager documents what it checks).
  virtual void deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept = 0;

  // Whether the calls above work: an adaptor has them whatever it wraps,
  // and they work only where the manager at the bottom of its chain has
  // them (else allocate() throws NotSupported naming it).
  virtual bool serves_stream_ordered() const noexcept { return true; }

 protected:
  ~StreamOrderedAllocator() = default;
};

// `manager`'s stream-ordered interface, where its calls work; else null.
StreamOrderedAllocator* stream_ordered_allocator(BaseMemoryManager& manager) noexcept;

}  // namespace cuemm
