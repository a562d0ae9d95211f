// cuemm/adaptors/limiting_adaptor.hpp: a cap on device memory.
//
// Device and managed allocations beyond `limit` bytes in use are refused with
// OutOfMemory naming the request, the bytes in use and the cap; host memory
// is not counted. CUEMM_LIMIT sets the cap for CUEMM_ADAPTORS=limit.
// Memory info is the cap's view, as programs that size their work by it
// need: the total at most the cap, free at most what the cap leaves.
#pragma once

#include "cuemm/adaptors/manager_adaptor.hpp"

namespace cuemm {

class LimitingAdaptor : public ManagerAdaptor {
 public:
  LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::size_t limit);
  std::size_t limit() const noexcept;
  std::size_t in_use() const noexcept;
  MemoryInfo get_memory_info() override;

 private:
  struct Cap;
  LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::shared_ptr<Cap> cap);
  std::shared_ptr<Cap> cap_;
};

}  // namespace cuemm
