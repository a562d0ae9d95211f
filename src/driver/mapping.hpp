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

// Maps `bytes` of `handle` at `address` with `access` (read_write_access_with_peers()).
// On failure nothing is left mapped; `handle` stays the caller's either way.
// (Pages mapped side by side may instead be mapped with map_without_access()
// and granted in one grant_read_write(): one cuMemSetAccess, not one a page.)
inline MappingResult map_read_write(cuda::CUdeviceptr address, std::size_t bytes,
                                    cuda::CUmemGenericAllocationHandle handle,
                                    const std::vector<cuda::CUmemAccessDesc>& access) noexcept {
  if (const cuda::CUresult mapped = CUEMM_CU_RESULT(cuMemMap, address, bytes, 0, handle, 0);
      mapped != cuda::CUDA_SUCCESS)
    return {mapped, "cuMemMap"};
  if (const cuda::CUresult allowed = CUEMM_CU_RESULT(cuMemSetAccess, address, bytes, access.data(), access.size());
      allowed != cuda::CUDA_SUCCESS) {
    CUEMM_CU_RESULT(cuMemUnmap, address, bytes);
    return {allowed, "cuMemSetAccess"};
  }
  return {};
}

// Maps `bytes` of `handle` at `address`, not yet accessible; `handle` stays the caller's.
inline MappingResult map_without_access(cuda::CUdeviceptr address, std::size_t bytes,
                                        cuda::CUmemGenericAllocationHandle handle) noexcept {
  if (const cuda::CUresult mapped = CUEMM_CU_RESULT(cuMemMap, address, bytes, 0, handle, 0);
      mapped != cuda::CUDA_SUCCESS)
    return {mapped, "cuMemMap"};
  return {};
}

// Grants `access` to [address, address + bytes), which may span several
// mappings side by side. On failure the caller unmaps them.
inline MappingResult grant_read_write(cuda::CUdeviceptr address, std::size_t bytes,
                                      const std::vector<cuda::CUmemAccessDesc>& access) noexcept {
  if (const cuda::CUresult allowed = CUEMM_CU_RESULT(cuMemSetAccess, address, bytes, access.data(), access.size());
      allowed != cuda::CUDA_SUCCESS)
    return {allowed, "cuMemSetAccess"};
  return {};
}

}  // namespace cuemm::driver
