// Mapping physical memory into a reserved address range, for the two places
// that do it: the expandable arena (memory it created) and IPC (memory
// imported from another process).
#pragma once

#include <cstddef>
#include <vector>

#include "cuemm/driver/driver.hpp"
#include "driver/peer_access.hpp"

namespace cuemm::driver {

struct MappingResult {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  const char* call = nullptr;  // the call that failed
  explicit operator bool() const noexcept { return result == cuda::CUDA_SUCCESS; }
};

// Maps `bytes` of `handle` at `address`, not yet accessible; `handle` stays the caller's.
inline MappingResult map_without_access(cuda::CUdeviceptr address, std::size_t bytes,
                                        cuda::CUmemGenericAllocationHandle handle) noexcept {
  if (const cuda::CUresult mapped = CUEMM_CU_RESULT(cuMemMap, address, bytes, 0, handle, 0);
      mapped != cuda::CUDA_SUCCESS)
    return {mapped, "cuMemMap"};
  return {};
}

// Grants `access` (read_write_access_with_peers()) to [address, address +
// bytes), which may span several mappings side by side: pages mapped with
// map_without_access() get one cuMemSetAccess, not one a page. On failure
// the caller unmaps them.
inline MappingResult grant_read_write(cuda::CUdeviceptr address, std::size_t bytes,
                                      const std::vector<cuda::CUmemAccessDesc>& access) noexcept {
  if (const cuda::CUresult allowed = CUEMM_CU_RESULT(cuMemSetAccess, address, bytes, access.data(), access.size());
      allowed != cuda::CUDA_SUCCESS)
    return {allowed, "cuMemSetAccess"};
  return {};
}

// Both for one mapping. On failure nothing is left mapped; `handle` stays
// the caller's either way.
inline MappingResult map_read_write(cuda::CUdeviceptr address, std::size_t bytes,
                                    cuda::CUmemGenericAllocationHandle handle,
                                    const std::vector<cuda::CUmemAccessDesc>& access) noexcept {
  if (const MappingResult mapped = map_without_access(address, bytes, handle); !mapped) return mapped;
  if (const MappingResult granted = grant_read_write(address, bytes, access); !granted) {
    CUEMM_CU_RESULT(cuMemUnmap, address, bytes);
    return granted;
  }
  return {};
}

}  // namespace cuemm::driver
