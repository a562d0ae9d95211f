// cuemm/adaptors/statistics_adaptor.hpp: counts of what a manager hands out.
//
// Current, peak and total bytes and counts per kind of memory, and a size
// histogram of device allocations (power-of-two buckets). Each thread counts
// on its own cache line, with no lock and no shared write on the hot path, so
// it can stay on in production and threads still scale. Peaks are exact when
// one thread allocates; with several, a peak may be short by up to 4 MiB (or
// two of its latest blocks, if larger) and 64 blocks per other thread (Note
// [Counting without a shared cache line]).
//
//   auto* stats = cuemm::find_adaptor<cuemm::StatisticsAdaptor>(context.memory_manager());
//   std::printf("%zu bytes in use\n", stats->statistics().of(cuemm::MemoryKind::Device).current_bytes);
#pragma once

#include <array>
#include <string>

#include "cuemm/adaptors/manager_adaptor.hpp"

namespace cuemm {

struct AllocationCounts {
  std::size_t current_bytes = 0, peak_bytes = 0, total_bytes = 0;
  std::size_t current_count = 0, peak_count = 0, total_count = 0;
};

struct MemoryStatistics {
  std::array<AllocationCounts, 4> kinds;  // indexed by MemoryKind
  // Device allocations of size in [2^i, 2^(i+1)) bytes.
  std::array<std::size_t, 64> device_size_histogram{};
  std::size_t failed_allocations = 0;
  // Bytes the upstream holds from the driver: the pool's segments or the
  // async manager's driver pool, with managed memory in use (else in use).
  std::size_t reserved_bytes = 0;

  const AllocationCounts& of(MemoryKind kind) const { return kinds[static_cast<int>(kind)]; }
  // A few lines for people.
  std::string summary() const;
};

class StatisticsAdaptor : public ManagerAdaptor {
 public:
  StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream);
  MemoryStatistics statistics() const;
  // Peaks start again from the current values.
  void reset_peaks();

  struct Counters;  // implementation, shared with the threads' shards; see the .cpp

 private:
  StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::shared_ptr<Counters> counters);
  std::shared_ptr<Counters> counters_;
};

}  // namespace cuemm
