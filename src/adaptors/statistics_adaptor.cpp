#include "cuemm/adaptors/statistics_adaptor.hpp"

#include <bit>
#include <cstdio>

#include "cuemm/error.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"

namespace cuemm {

namespace {
void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

struct StatisticsAdaptor::Counters : AllocationObserver {
  struct Kind {
    std::atomic<std::size_t> current_bytes{0}, peak_bytes{0}, total_bytes{0};
    std::atomic<std::size_t> current_count{0}, peak_count{0}, total_count{0};
  };
  std::array<Kind, 4> kinds;
  std::array<std::atomic<std::size_t>, 64> histogram{};
  std::atomic<std::size_t> failed{0};

  void allocation_failed(MemoryKind, std::size_t) noexcept override { failed.fetch_add(1, std::memory_order_relaxed); }
  void allocated(const AllocationRecord& record) noexcept override {
    Kind& kind = kinds[static_cast<int>(record.kind)];
    raise_peak(kind.peak_bytes, kind.current_bytes.fetch_add(record.size, std::memory_order_relaxed) + record.size);
    raise_peak(kind.peak_count, kind.current_count.fetch_add(1, std::memory_order_relaxed) + 1);
    kind.total_bytes.fetch_add(record.size, std::memory_order_relaxed);
    kind.total_count.fetch_add(1, std::memory_order_relaxed);
    if (record.kind == MemoryKind::Device)
      histogram[std::bit_width(record.size) - 1].fetch_add(1, std::memory_order_relaxed);
  }
  void released(const AllocationRecord& record) noexcept override {
    Kind& kind = kinds[static_cast<int>(record.kind)];
    kind.current_bytes.fetch_sub(record.size, std::memory_order_relaxed);
    kind.current_count.fetch_sub(1, std::memory_order_relaxed);
  }
  bool wants_times_and_call_sites() const noexcept override { return false; }
  void reset() noexcept override {
    for (Kind& kind : kinds) {
      kind.current_bytes = 0;
      kind.current_count = 0;
    }
  }
};

StatisticsAdaptor::StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream)
    : StatisticsAdaptor(context, std::move(upstream), std::make_shared<Counters>()) {}

StatisticsAdaptor::StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                     std::shared_ptr<Counters> counters)
    : ManagerAdaptor(context, std::move(upstream), counters), counters_(std::move(counters)) {}

MemoryStatistics StatisticsAdaptor::statistics() const {
  MemoryStatistics out;
  for (int k = 0; k < 4; ++k) {
    const Counters::Kind& from = counters_->kinds[k];
    AllocationCounts& to = out.kinds[k];
    to.current_bytes = from.current_bytes.load(std::memory_order_relaxed);
    to.peak_bytes = from.peak_bytes.load(std::memory_order_relaxed);
    to.total_bytes = from.total_bytes.load(std::memory_order_relaxed);
    to.current_count = from.current_count.load(std::memory_order_relaxed);
    to.peak_count = from.peak_count.load(std::memory_order_relaxed);
    to.total_count = from.total_count.load(std::memory_order_relaxed);
  }
  for (int i = 0; i < 64; ++i) out.device_size_histogram[i] = counters_->histogram[i].load(std::memory_order_relaxed);
  out.failed_allocations = counters_->failed.load(std::memory_order_relaxed);
  if (auto* pool = find_adaptor<PoolMemoryManager>(upstream()))
    out.reserved_bytes = pool->statistics().reserved_bytes;
  else
    out.reserved_bytes = out.of(MemoryKind::Device).current_bytes + out.of(MemoryKind::Managed).current_bytes;
  return out;
}

void StatisticsAdaptor::reset_peaks() {
  for (auto& kind : counters_->kinds) {
    kind.peak_bytes = kind.current_bytes.load();
    kind.peak_count = kind.current_count.load();
  }
}

std::string MemoryStatistics::summary() const {
  std::string text;
  for (MemoryKind kind : {MemoryKind::Device, MemoryKind::Managed, MemoryKind::Pinned, MemoryKind::Mapped}) {
    const AllocationCounts& counts = of(kind);
    if (counts.total_count == 0) continue;
    char line[256];
    std::snprintf(line, sizeof line, "%-8s in use %s in %zu block(s); peak %s; %zu allocation(s), %s in total\n",
                  to_string(kind), describe_bytes(counts.current_bytes).c_str(), counts.current_count,
                  describe_bytes(counts.peak_bytes).c_str(), counts.total_count,
                  describe_bytes(counts.total_bytes).c_str());
    text += line;
  }
  text += "reserved " + describe_bytes(reserved_bytes) + "; failed allocations " + std::to_string(failed_allocations) +
          "\n";
  return text;
}

}  // namespace cuemm
