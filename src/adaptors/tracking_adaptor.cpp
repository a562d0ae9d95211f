#include "cuemm/adaptors/tracking_adaptor.hpp"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>

#include "cuemm/error.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "util/address_shard.hpp"
#include "util/at_exit.hpp"

namespace cuemm {

struct TrackingAdaptor::Table : AllocationObserver {
  // Keyed by (kind, address): pinned host and device addresses may coincide.
  using Key = std::pair<int, std::uintptr_t>;
  // A record and its place among its thread's allocations: starts come from
  // the coarse clock, so blocks of one tick are ordered by that instead.
  struct Entry {
    AllocationRecord record;
    std::uint64_t order_on_its_thread;
  };
  // The live allocations in shards by address, each under a lock of its own:
  // under one lock, 16 threads' pairs through the pool took 2.0-2.4 us in
  // aggregate on the H200, a tenth of one thread's throughput
  // (docs/pool-measurements.md, "Threads without the caches, and the
  // adaptors' shared counts"). Many shards (128 KiB in all), so that a
  // shard's lock is mostly taken again by the thread that took it last and
  // its line stays in that CPU's cache: with 64, every thread's blocks met
  // every shard and the lines moved at nearly every pair.
  struct alignas(64) Shard {
    mutable BlockingAwareMutex mutex;
    std::map<Key, Entry> live;
  };
  static constexpr int kShardBits = 10;
  static constexpr std::size_t kShards = std::size_t{1} << kShardBits;
  std::array<Shard, kShards> shards;
  std::ostream* report;

  explicit Table(std::ostream* report_) : report(report_) {}

  Shard& shard_of(std::uintptr_t address) noexcept { return shards[util::address_shard(address, kShardBits)]; }

  void allocated(const AllocationRecord& record) noexcept override {
    thread_local std::uint64_t allocations_on_this_thread = 0;
    try {
      Shard& shard = shard_of(record.address);
      std::lock_guard lock(shard.mutex);
      // (Not live[key] = entry: that value-initializes an entry first, with `rep stos`.)
      shard.live.insert_or_assign(Key{static_cast<int>(record.kind), record.address},
                                  Entry{record, ++allocations_on_this_thread});
    } catch (...) {
    }
  }
  // Forgotten before the upstream has it back, as the address may then be
  // another allocation's (Note [A release seen before the upstream has the block]).
  void releasing(AllocationRecord& record) noexcept override {
    Shard& shard = shard_of(record.address);
    std::lock_guard lock(shard.mutex);
    shard.live.erase({static_cast<int>(record.kind), record.address});
  }
  bool wants_releasing() const noexcept override { return true; }

  // Live allocations, oldest first (each thread's exactly; those of
  // different threads to within a tick of the coarse clock).
  std::vector<AllocationRecord> records() const {
    std::vector<Entry> entries;
    for (const Shard& shard : shards) {
      std::lock_guard lock(shard.mutex);
      for (const auto& [key, entry] : shard.live) entries.push_back(entry);
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.record.start != b.record.start ? a.record.start < b.record.start
                                              : a.order_on_its_thread < b.order_on_its_thread;
    });
    std::vector<AllocationRecord> all;
    all.reserve(entries.size());
    for (auto& entry : entries) all.push_back(std::move(entry.record));
    return all;
  }

  void clear() noexcept {
    for (Shard& shard : shards) {
      std::lock_guard lock(shard.mutex);
      shard.live.clear();
    }
  }

  // Up to kListed blocks are listed one by one. More (a program that exits
  // holding its arrays: thousands of lines at exit) are summed up by call
  // site, the most bytes first, before the oldest kListed; outstanding() has
  // every one.
  static constexpr std::size_t kListed = 32;
  static constexpr std::size_t kSitesListed = 16;

  static std::string site_of(const AllocationRecord& record) {
    return record.call_site.empty() ? std::string("(call site unknown)") : record.call_site;
  }

  std::string text() const {
    const std::vector<AllocationRecord> outstanding = records();
    if (outstanding.empty()) return "";
    std::size_t bytes = 0;
    for (const auto& record : outstanding) bytes += record.size;
    std::string out = "cuemm: " + std::to_string(outstanding.size()) + " allocation(s) outstanding, " +
                      describe_bytes(bytes) + ":\n";
    char line[160];
    if (outstanding.size() > kListed) {
      struct Held {
        std::size_t count = 0, bytes = 0;
      };
      std::map<std::string, Held> by_site;
      for (const auto& record : outstanding) {
        Held& held = by_site[site_of(record)];
        ++held.count;
        held.bytes += record.size;
      }
      std::vector<std::pair<std::string, Held>> sites(by_site.begin(), by_site.end());
      std::stable_sort(sites.begin(), sites.end(),
                       [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
      out += "  by call site, the most bytes first:\n";
      Held others;
      for (std::size_t i = 0; i < sites.size(); ++i) {
        const auto& [site, held] = sites[i];
        if (i >= kSitesListed) {
          others.count += held.count;
          others.bytes += held.bytes;
          continue;
        }
        std::snprintf(line, sizeof line, "  %10zu allocation(s), %s  ", held.count, describe_bytes(held.bytes).c_str());
        out += line + site + "\n";
      }
      if (others.count)
        out += "  and " + std::to_string(sites.size() - kSitesListed) + " other call site(s): " +
               std::to_string(others.count) + " allocation(s), " + describe_bytes(others.bytes) + "\n";
      out += "  the oldest " + std::to_string(kListed) + ":\n";
    }
    for (std::size_t i = 0; i < std::min(outstanding.size(), kListed); ++i) {
      const AllocationRecord& record = outstanding[i];
      std::snprintf(line, sizeof line, "  %-8s 0x%" PRIxPTR " %12zu bytes at %.6f s  ", to_string(record.kind),
                    record.address, record.size, record.start);
      out += line + site_of(record);
      if (record.stream) {  // a stream-ordered block: its free goes on a stream too
        std::snprintf(line, sizeof line, " (stream 0x%" PRIxPTR ")", *record.stream);
        out += line;
      }
      out += "\n";
    }
    if (outstanding.size() > kListed)
      out += "  and " + std::to_string(outstanding.size() - kListed) +
             " more (TrackingAdaptor::outstanding(), cuemm.outstanding(): every one)\n";
    return out;
  }

  void print() noexcept {
    try {
      const std::string leaks = text();
      if (leaks.empty()) return;
      if (report)
        *report << leaks << std::flush;
      else
        std::fputs(leaks.c_str(), stderr);
    } catch (...) {
    }
  }

  void reset() noexcept override {
    print();
    clear();
  }
  // A block's start and call site are all the report shows.
  bool wants_durations() const noexcept override { return false; }
};

TrackingAdaptor::TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::ostream* report)
    : TrackingAdaptor(context, std::move(upstream), std::make_shared<Table>(report)) {
  // The adaptor lives until exit with its context: the report it would give
  // when destroyed comes at exit. (To stderr only: a stream given may be gone.)
  if (context && !report) util::at_exit_while_alive<Table>(table_, [](Table& table) { table.print(); });
}

TrackingAdaptor::TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                 std::shared_ptr<Table> table)
    : ManagerAdaptor(context, std::move(upstream), table), table_(std::move(table)) {}

TrackingAdaptor::~TrackingAdaptor() {
  if (has_context()) table_->print();
  table_->clear();  // the table is kept until exit (see ~ManagerAdaptor); its records are not
}

std::vector<AllocationRecord> TrackingAdaptor::outstanding() const { return table_->records(); }

std::string TrackingAdaptor::leak_report() const { return table_->text(); }

}  // namespace cuemm
