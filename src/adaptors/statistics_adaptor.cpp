#include "cuemm/adaptors/statistics_adaptor.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <vector>

#include "cuemm/error.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

namespace {
void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Written by one thread only: a plain load and store, no locked instruction.
void add_own(std::atomic<std::size_t>& counter, std::size_t value) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + value, std::memory_order_relaxed);
}

std::atomic<std::uint64_t> next_counters_id{1};
}  // namespace

// Current and peak values are global atomics, so that peaks are exact; totals,
// the histogram and failures are kept per thread (a Shard) and summed when
// read, so that threads allocating at once do not share their cache lines.
struct StatisticsAdaptor::Counters : AllocationObserver, std::enable_shared_from_this<Counters> {
  struct alignas(64) Current {
    std::atomic<std::size_t> bytes{0}, peak_bytes{0}, count{0}, peak_count{0};
  };
  struct Shard {
    std::array<std::atomic<std::size_t>, 4> total_bytes{}, total_count{};
    std::array<std::atomic<std::size_t>, 64> histogram{};
    std::atomic<std::size_t> failed{0};

    void clear() noexcept {
      for (int k = 0; k < 4; ++k) total_bytes[k] = total_count[k] = 0;
      for (auto& bucket : histogram) bucket = 0;
      failed = 0;
    }
    void add_to(MemoryStatistics& out) const noexcept {
      for (int k = 0; k < 4; ++k) {
        out.kinds[k].total_bytes += total_bytes[k].load(std::memory_order_relaxed);
        out.kinds[k].total_count += total_count[k].load(std::memory_order_relaxed);
      }
      for (int i = 0; i < 64; ++i) out.device_size_histogram[i] += histogram[i].load(std::memory_order_relaxed);
      out.failed_allocations += failed.load(std::memory_order_relaxed);
    }
  };

  const std::uint64_t id = next_counters_id.fetch_add(1);
  std::array<Current, 4> current;
  mutable BlockingAwareMutex mutex;             // shards, spares and `retired`
  std::vector<std::unique_ptr<Shard>> shards;   // of living threads
  std::vector<std::unique_ptr<Shard>> spares;   // of finished threads, folded into `retired`, zeroed
  MemoryStatistics retired;                     // finished threads' totals

  Shard& shard_of_this_thread();
  // A finished thread's shard: its totals are kept, the shard is reused.
  void retire(Shard* shard) noexcept {
    std::lock_guard lock(mutex);
    auto it = std::find_if(shards.begin(), shards.end(), [&](const auto& owned) { return owned.get() == shard; });
    if (it == shards.end()) return;
    try {
      spares.push_back(std::move(*it));
    } catch (...) {
      return;  // no room to keep it spare: it stays with the living ones, still counted there
    }
    shards.erase(it);
    shard->add_to(retired);
    shard->clear();
  }

  void allocation_failed(MemoryKind, std::size_t) noexcept override {
    try {
      add_own(shard_of_this_thread().failed, 1);
    } catch (...) {
    }
  }
  void allocated(const AllocationRecord& record) noexcept override {
    const int k = static_cast<int>(record.kind);
    Current& now = current[k];
    raise_peak(now.peak_bytes, now.bytes.fetch_add(record.size, std::memory_order_relaxed) + record.size);
    raise_peak(now.peak_count, now.count.fetch_add(1, std::memory_order_relaxed) + 1);
    try {
      Shard& shard = shard_of_this_thread();
      add_own(shard.total_bytes[k], record.size);
      add_own(shard.total_count[k], 1);
      if (record.kind == MemoryKind::Device) add_own(shard.histogram[std::bit_width(record.size) - 1], 1);
    } catch (...) {  // no memory for a new thread's shard: its totals go uncounted
    }
  }
  void released(const AllocationRecord& record) noexcept override {
    Current& now = current[static_cast<int>(record.kind)];
    now.bytes.fetch_sub(record.size, std::memory_order_relaxed);
    now.count.fetch_sub(1, std::memory_order_relaxed);
  }
  bool wants_times_and_call_sites() const noexcept override { return false; }
  void reset() noexcept override {
    for (Current& now : current) {
      now.bytes = 0;
      now.count = 0;
    }
  }

  MemoryStatistics read() const {
    MemoryStatistics out;
    std::lock_guard lock(mutex);
    out = retired;
    for (const auto& shard : shards) shard->add_to(out);
    for (int k = 0; k < 4; ++k) {
      out.kinds[k].current_bytes = current[k].bytes.load(std::memory_order_relaxed);
      out.kinds[k].peak_bytes = current[k].peak_bytes.load(std::memory_order_relaxed);
      out.kinds[k].current_count = current[k].count.load(std::memory_order_relaxed);
      out.kinds[k].peak_count = current[k].peak_count.load(std::memory_order_relaxed);
    }
    return out;
  }
};

namespace {
// This thread's shards, one per Counters it has counted for. At thread exit
// each goes back to its Counters, if that still exists.
struct ShardDirectory {
  std::vector<std::pair<std::weak_ptr<StatisticsAdaptor::Counters>, StatisticsAdaptor::Counters::Shard*>> entries;
  ~ShardDirectory();
};

// The shard this thread used last, for the hot path: trivial and initial-exec,
// so reading it is one load (see the pool's LastCache). Counters ids are
// never reused, so a stale entry never matches.
struct LastShard {
  std::uint64_t counters_id;
  StatisticsAdaptor::Counters::Shard* shard;
};
[[gnu::tls_model("initial-exec")]] thread_local LastShard last_shard{0, nullptr};
[[gnu::tls_model("initial-exec")]] thread_local bool shards_gone = false;

ShardDirectory::~ShardDirectory() {
  last_shard = {0, nullptr};
  shards_gone = true;
  for (auto& [counters, shard] : entries)
    if (auto alive = counters.lock()) alive->retire(shard);
}

ShardDirectory& shard_directory() {
  thread_local ShardDirectory directory;
  return directory;
}
}  // namespace

StatisticsAdaptor::Counters::Shard& StatisticsAdaptor::Counters::shard_of_this_thread() {
  if (last_shard.counters_id == id) [[likely]]
    return *last_shard.shard;
  // A thread past its directory's end counts into a shard that is never retired.
  ShardDirectory* directory = shards_gone ? nullptr : &shard_directory();
  Shard* found = nullptr;
  if (directory) {
    for (auto it = directory->entries.begin(); it != directory->entries.end();) {
      const auto counters = it->first.lock();
      if (!counters) {
        it = directory->entries.erase(it);  // its Counters is gone
        continue;
      }
      if (counters.get() == this) found = it->second;
      ++it;
    }
  }
  if (!found) {
    std::lock_guard lock(mutex);
    if (!spares.empty()) {
      shards.push_back(std::move(spares.back()));
      spares.pop_back();
    } else {
      shards.push_back(std::make_unique<Shard>());
    }
    found = shards.back().get();
    if (directory) directory->entries.emplace_back(weak_from_this(), found);
  }
  if (directory) last_shard = {id, found};
  return *found;
}

StatisticsAdaptor::StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream)
    : StatisticsAdaptor(context, std::move(upstream), std::make_shared<Counters>()) {}

StatisticsAdaptor::StatisticsAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                     std::shared_ptr<Counters> counters)
    : ManagerAdaptor(context, std::move(upstream), counters), counters_(std::move(counters)) {}

MemoryStatistics StatisticsAdaptor::statistics() const {
  MemoryStatistics out = counters_->read();
  if (auto* pool = find_adaptor<PoolMemoryManager>(upstream()))
    out.reserved_bytes = pool->statistics().reserved_bytes;
  else
    out.reserved_bytes = out.of(MemoryKind::Device).current_bytes + out.of(MemoryKind::Managed).current_bytes;
  return out;
}

void StatisticsAdaptor::reset_peaks() {
  for (auto& now : counters_->current) {
    now.peak_bytes = now.bytes.load();
    now.peak_count = now.count.load();
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
