#include "cuemm/memory/memory_manager.hpp"

#include <typeinfo>

#include "cuemm/error.hpp"
#include "cuemm/memory/stream_ordered_allocator.hpp"

namespace cuemm {

void throw_zero_allocation_size(const char* call) {
  throw InvalidArgument(std::string(call) + ": size must be at least 1 byte (got 0)");
}

std::shared_ptr<MemoryPointer> BaseMemoryManager::memallocmanaged(std::size_t size, bool) {
  throw Error("this memory manager does not provide managed memory (memallocmanaged of " +
              std::to_string(size) + " bytes)");
}

Context& BaseMemoryManager::context() const {
  if (!context_) throw StateError("this memory manager instance has no context (it was made to read its version)");
  return *context_;
}

StreamOrderedAllocator* stream_ordered_allocator(BaseMemoryManager& manager) noexcept {
  auto* ordered = dynamic_cast<StreamOrderedAllocator*>(&manager);
  return ordered && ordered->serves_stream_ordered() ? ordered : nullptr;
}

}  // namespace cuemm
