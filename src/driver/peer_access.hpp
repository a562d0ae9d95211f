// Which devices may use memory that the driver does not open to peers by
// itself: the grants of the pool's expandable arena, of memory it imports,
// and of the async manager's driver pool.
//
// Note [Peer access]
// A context that has enabled peer access (cuCtxEnablePeerAccess) may use every
// cuMemAlloc block of the peer's device. Memory mapped by cuMemMap, and memory
// of a driver pool, ignore that switch: a device reaches them only where
// cuMemSetAccess (cuMemPoolSetAccess for a pool) granted it, and a kernel of
// any other device faults on them. So that the pool's arena and the async
// manager's pool serve the programs that cuMemAlloc's memory serves, they are
// granted to every device that can access their own one (cuDeviceCanAccessPeer),
// whether or not a context enables it: no call of the program's to
// cuCtxEnablePeerAccess reaches the manager. (PyTorch grants its expandable
// segments to a peer when its own enablePeerAccess runs.) What a block's free
// waits for is work on its own device: a program whose peer still uses the
// block synchronises with the peer before it frees it, as it would before
// cuMemFree (which waits for its own device only) or under PyTorch's
// allocator.
#pragma once

#include <vector>

#include "cuemm/driver/driver.hpp"

namespace cuemm::driver {

// The devices other than `device` that can access its memory (Note [Peer
// access]). Throws CudaError when the driver cannot say.
inline std::vector<int> peers_with_access_to(int device) {
  int count = 0;
  CUEMM_CU(cuDeviceGetCount, &count);
  std::vector<int> peers;
  for (int other = 0; other < count; ++other) {
    int can = 0;
    if (other != device) CUEMM_CU(cuDeviceCanAccessPeer, &can, other, device);
    if (can) peers.push_back(other);
  }
  return peers;
}

// Read and write access for each of `devices`.
inline std::vector<cuda::CUmemAccessDesc> read_write_access(const std::vector<int>& devices) {
  std::vector<cuda::CUmemAccessDesc> access;
  for (int device : devices)
    access.push_back({{cuda::CU_MEM_LOCATION_TYPE_DEVICE, device}, cuda::CU_MEM_ACCESS_FLAGS_PROT_READWRITE});
  return access;
}

// Read and write access for `device` and every device that can access its memory.
inline std::vector<cuda::CUmemAccessDesc> read_write_access_with_peers(int device) {
  std::vector<int> devices = peers_with_access_to(device);
  devices.insert(devices.begin(), device);
  return read_write_access(devices);
}

}  // namespace cuemm::driver
