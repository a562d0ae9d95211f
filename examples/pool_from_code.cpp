// The pool chosen in code, with options and two adaptors around it, for every
// context the program makes: what CUEMM_MEMORY_MANAGER=pool
// CUEMM_POOL_INITIAL_SIZE=64M CUEMM_POOL_MAXIMUM_SIZE=1G
// CUEMM_ADAPTORS=statistics,tracking would choose from outside. Threads
// allocate arrays, a stream borrows blocks through the pool's stream-ordered
// interface (as RMM and PyTorch call theirs), and the program reads what the
// adaptors and the pool counted, finds the block it kept in the leak report,
// and checks each figure it prints (exit 1 otherwise). Runs on a GPU or,
// without one, on the simulated driver.
//
//   ./pool_from_code
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuemm/cuemm.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Where the tracking adaptor writes its leak reports (at reset, and when it goes).
std::ostringstream leak_reports;

std::unique_ptr<cuemm::BaseMemoryManager> pool_with_adaptors(cuemm::Context* context) {
  cuemm::PoolOptions options;
  options.initial_size = 64 * kMiB;    // one segment taken at initialize()
  options.maximum_size = 1024 * kMiB;  // never more than this from the driver
  std::unique_ptr<cuemm::BaseMemoryManager> manager = std::make_unique<cuemm::PoolMemoryManager>(context, options);
  manager = std::make_unique<cuemm::StatisticsAdaptor>(context, std::move(manager));  // innermost first
  return std::make_unique<cuemm::TrackingAdaptor>(context, std::move(manager), &leak_reports);
}

bool expect(bool holds, const char* what) {
  if (!holds) std::fprintf(stderr, "pool_from_code: expected %s\n", what);
  return holds;
}

}  // namespace

int main() {
  try {
    // Before the first context: every context made from now on gets this
    // manager (CUEMM_MEMORY_MANAGER, where set, would win and say so).
    cuemm::set_memory_manager(pool_with_adaptors);
    cuemm::Context& context = cuemm::current_context();
    std::printf("memory manager: %s\n", cuemm::memory_manager_name().c_str());
    auto* pool = cuemm::find_adaptor<cuemm::PoolMemoryManager>(context.memory_manager());
    if (!pool) {
      std::fprintf(stderr, "pool_from_code: CUEMM_MEMORY_MANAGER chose another manager; unset it to run this\n");
      return 1;
    }

    // Four threads, 100 arrays each, 4 KiB to 512 KiB; each thread's arrays go when it ends.
    constexpr int kThreads = 4, kArrays = 100;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&context] {
        cuemm::ScopedContext current(context);
        std::vector<std::shared_ptr<cuemm::MemoryPointer>> arrays;
        for (int i = 0; i < kArrays; ++i) arrays.push_back(context.memalloc(std::size_t{4096} << (i % 8)));
      });
    }
    for (auto& thread : threads) thread.join();

    // The raw, stream-ordered interface: a block freed on a stream serves that stream's next request at once.
    cuemm::ScopedContext current(context);
    cuemm::Stream stream = context.create_stream(/*non_blocking=*/true);
    const cuemm::cuda::CUdeviceptr first = pool->allocate(256 * 1024, stream.handle());
    pool->deallocate(first, 256 * 1024, stream.handle());
    const cuemm::cuda::CUdeviceptr again = pool->allocate(256 * 1024, stream.handle());
    pool->deallocate(again, 256 * 1024, stream.handle());
    stream.synchronize();

    // One block kept: the leak report names it, by the call site given here.
    std::shared_ptr<cuemm::MemoryPointer> kept = [&context] {
      cuemm::ScopedCallSite site("pool_from_code.cpp: the kept block");
      return context.memalloc(kMiB);
    }();

    auto& manager = context.memory_manager();
    const cuemm::MemoryStatistics counted = cuemm::find_adaptor<cuemm::StatisticsAdaptor>(manager)->statistics();
    const cuemm::AllocationCounts& device = counted.of(cuemm::MemoryKind::Device);
    const cuemm::PoolStatistics held = pool->statistics();
    std::printf("%s\n", counted.summary().c_str());
    std::printf("pool: %s reserved in %zu segment(s), %s in use, %zu driver allocation(s)\n",
                cuemm::describe_bytes(held.reserved_bytes).c_str(), held.segments,
                cuemm::describe_bytes(held.in_use_bytes).c_str(), held.driver_allocations);
    auto* tracking = cuemm::find_adaptor<cuemm::TrackingAdaptor>(manager);
    const std::string report = tracking->leak_report();
    std::printf("%s", report.c_str());

    // (The stream-ordered blocks bypass the adaptors: they are the pool's own interface.)
    bool ok = expect(device.total_count == kThreads * kArrays + 1, "every memalloc counted");
    ok &= expect(device.current_count == 1 && device.current_bytes == kMiB, "only the kept block in use");
    ok &= expect(held.reserved_bytes >= 64 * kMiB && held.reserved_bytes <= 1024 * kMiB,
                 "the pool's reserve within its initial and maximum sizes");
    ok &= expect(again == first, "the stream's freed block served its next request");
    ok &= expect(tracking->outstanding().size() == 1 && tracking->outstanding()[0].address == kept->device_pointer(),
                 "the tracking adaptor to list the kept block alone");
    ok &= expect(report.find("pool_from_code.cpp: the kept block") != std::string::npos,
                 "the leak report to name the kept block's call site");

    // The context's reset (its manager's): with nothing outstanding, no leak report.
    kept.reset();
    context.reset();
    ok &= expect(leak_reports.str().empty(), "no leak report at a reset with nothing outstanding");
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pool_from_code: %s\n", error.what());
    return 1;
  }
}
