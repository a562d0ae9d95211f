#include "threading/owner_biased_lock.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace cuemm::detail {

[[gnu::visibility("hidden")]] std::atomic<int> process_barrier_state{0};

namespace {
#if defined(__linux__) && defined(__NR_membarrier)
long membarrier(int command) noexcept { return syscall(__NR_membarrier, command, 0, 0); }

bool register_membarrier() noexcept {
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  return supported >= 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
         membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}
#else
long membarrier(int) noexcept { return -1; }
bool register_membarrier() noexcept { return false; }
constexpr int MEMBARRIER_CMD_PRIVATE_EXPEDITED = 0;
#endif
}  // namespace

bool probe_process_barrier() noexcept {
  // Several threads may probe at once: registering twice is harmless.
  const int state = register_membarrier() ? 1 : 2;
  process_barrier_state.store(state, std::memory_order_relaxed);
  return state == 1;
}

void process_barrier() noexcept {
  if (!process_barrier_available()) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // owners fence fully themselves
    return;
  }
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) [[likely]]
    return;
  // The registration is inherited across fork and lasts until exec, so this
  // should not happen; register again rather than leave owners unfenced.
  if (register_membarrier() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // Owners fence fully from now on; one already past its compiler-only fence
  // has its flag in its store buffer, which drains within microseconds.
  std::fprintf(stderr, "cuemm: membarrier failed after it had worked; using full fences from now on\n");
  process_barrier_state.store(2, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace cuemm::detail
