// replay_command.cpp: `cuemm replay` and `cuemm random` (a log's or a generated
// workload's allocations and frees replayed against a manager, from one thread
// or several, and reported as peak live and peak reserved bytes), their
// `--compare` table, and `cuemm plot`. The commands and their options are
// listed in cuemm_tool.cpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "replay_command.hpp"
#include "best_fit_reference.hpp"
#include "cuemm/cuemm.hpp"
#include "cuemm/managers/detail/replay_clock.hpp"
#include "random_workload.hpp"
#include "tool_options.hpp"
#include "util/atomic_max.hpp"
#include "util/byte_size.hpp"

namespace {

using namespace cuemm;
using tool::bytes_option;
using tool::count_option;
using tool::positive_bytes_option;
using tool::positive_count_option;
using tool::option;

struct Operation {
  bool allocate;
  std::uint64_t id;  // pairs an allocation with its free
  std::size_t size;
  double time;       // seconds, from the log (0 for generated workloads)
  bool device;       // device memory (else host, replayed as pinned memory)
  int ordinal = 0;   // the device it was made on
};

// The log's events; says where it does not hold together (MemoryLogGaps).
std::vector<LoggedEvent> read_log_events(const std::string& path, MemoryLogGaps* gaps_out = nullptr) {
  std::error_code not_a_folder;
  if (std::filesystem::is_directory(path, not_a_folder))
    throw InvalidArgument("'" + path + "' is a folder, not a cuemm CSV log");
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read the log '" + path + "'");
  MemoryLogGaps gaps;
  std::vector<LoggedEvent> events = read_memory_log(in, path, &gaps);
  if (gaps_out) *gaps_out = gaps;
  if (gaps.unfinished_last_row) {
    std::printf("the log: its last row is unfinished (no newline, and it does not read), skipped: "
                "was the process stopped while writing it?\n");
  }
  if (gaps.frees_of_unknown_addresses) {
    std::printf("the log: %zu free(s) of addresses it never allocated, skipped (did it begin mid-run?)\n",
                gaps.frees_of_unknown_addresses);
  }
  if (gaps.rows_of_other_types) {
    std::printf("the log: %zu row(s) of event types that are not allocations or frees, skipped (the first: '%s')\n",
                gaps.rows_of_other_types, gaps.first_other_type.c_str());
  }
  if (gaps.failed_allocations) {
    std::printf("the log: %zu allocation(s) that failed when it was written (RMM's 'allocate failure'), "
                "not replayed: they held nothing\n", gaps.failed_allocations);
  }
  if (gaps.zero_byte_allocations) {
    std::printf("the log: %zu allocation(s) of 0 bytes, left out with their frees (they hold no memory)\n",
                gaps.zero_byte_allocations);
  }
  if (gaps.rows_without_time && !gaps.untimed) {
    std::printf("the log: %zu row(s) with an empty time, replayed in their place (a picture draws each at "
                "the time of the row above)\n", gaps.rows_without_time);
  }
  if (gaps.frees_inferred) {
    std::printf("the log: %zu address(es) allocated again while live, so freed before without a row: "
                "the frees are replayed there\n", gaps.frees_inferred);
  }
  return events;
}

// The log's Alloc/Free rows as operations (managed memory is replayed as device memory).
std::vector<Operation> read_log(const std::string& path, MemoryLogGaps* gaps = nullptr) {
  std::vector<Operation> operations;
  for (const LoggedEvent& event : read_log_events(path, gaps))
    operations.push_back({event.allocate, event.id, event.size, event.time, event.kind != LoggedKind::Host, event.device});
  return operations;
}

// The training-like workload's --shapes by name; nullopt for another name.
std::optional<workload::TrainingShapes> training_shapes(const std::string& name) {
  if (name == "varied") return workload::TrainingShapes::varied;
  if (name == "same") return workload::TrainingShapes::same;
  if (name == "per-layer") return workload::TrainingShapes::per_layer;
  return std::nullopt;
}

// A generated workload (bench/random_workload.hpp: RMM's random one, or the
// training-like one), as device allocations.
std::vector<Operation> device_operations(const std::vector<workload::RandomOperation>& generated) {
  std::vector<Operation> operations;
  for (const auto& operation : generated) operations.push_back({operation.allocate, operation.id, operation.size, 0, true});
  return operations;
}

struct ReplayReport {
  double seconds = 0;
  std::size_t operations = 0, peak_live = 0, peak_reserved = 0, failed = 0;
  std::string first_failure;           // what the manager said of the first allocation that failed
  std::optional<PoolStatistics> pool;  // at the end, for a pool: its seals and driver calls
  bool reference = false;              // the ideal best fit's footprint, not a manager's (no time)
  // For a manager: the ideal best fit's peaks on the same operations, to
  // tell what the workload costs any placement from what the manager adds.
  std::size_t best_fit_live = 0, best_fit_reserved = 0;
  std::string adaptors;                // the CUEMM_ADAPTORS the manager ran under ("" for none)
  std::size_t threads = 1;             // the lists run side by side
  bool stream_ordered = false;         // through allocate(size, stream)
  std::string pace;                    // with --pace: what the pool's seals went by ("" for the host's clock)
  // With --segments: the pool's segments when it first reserved its peak.
  struct PeakSegments {
    std::size_t operation = 0, reserved = 0, live = 0;
    std::vector<PoolSegment> segments;
    // The addresses of the segments at the previous peak (sorted): the
    // others are new since, among them what the growth to this peak added,
    // whose free rest no request missed.
    std::vector<std::uintptr_t> before;
  };
  std::optional<PeakSegments> peak_segments;
  // With --plot: the live bytes and the manager's reserved bytes after each operation.
  std::vector<PlotSeries> plot;
};

// `--manager best-fit`: not a manager, the footprint of an ideal best fit
// (best_fit_reference.hpp) on the same device operations. Lists that ran on
// threads side by side take turns, an operation each.
constexpr const char* kBestFit = "best-fit";

// An operation of lists[list][index], in the order the operations ran; or,
// with index kLeftLive, the free of block `id` that the list left live.
struct Ran {
  static constexpr std::size_t kLeftLive = SIZE_MAX;
  std::size_t list, index;
  std::uint64_t id = 0;
};

// With `order` (a manager's run: the operations that changed its live
// bytes, in the order they did, so no allocation it could not make), those;
// without (null), the lists' operations, the lists taking turns, where an
// allocation fails that would take the range past `capacity` bytes (the
// device's memory).
ReplayReport best_fit_reference(const std::vector<std::vector<Operation>>& lists,
                                const std::vector<Ran>* order = nullptr, std::size_t capacity = 0) {
  tool::BestFitReference reference(capacity);
  ReplayReport report;
  report.reference = true;
  auto run = [&](std::size_t list, std::size_t index, std::uint64_t left_live = 0) {
    if (index == Ran::kLeftLive) {
      reference.free(left_live * lists.size() + list);
      return;
    }
    const Operation& operation = lists[list][index];
    ++report.operations;
    if (!operation.device) return;
    // One id space for all lists: each list's ids apart from the others'.
    const std::uint64_t id = operation.id * lists.size() + list;
    if (operation.allocate) {
      if (!reference.allocate(id, operation.size)) ++report.failed;
    } else {
      reference.free(id);
    }
    report.peak_live = std::max(report.peak_live, reference.live_bytes());
  };
  if (order) {
    for (const Ran& ran : *order) run(ran.list, ran.index, ran.id);
  } else {
    for (std::size_t step = 0;; ++step) {
      bool any = false;
      for (std::size_t list = 0; list < lists.size(); ++list) {
        if (step >= lists[list].size()) continue;
        any = true;
        run(list, step);
      }
      if (!any) break;
    }
  }
  report.peak_reserved = reference.peak_reserved();
  return report;
}

// Where a pool's bytes were when it reserved more, after `operation` operations.
void trace_growth(std::size_t operation, std::size_t request, std::size_t live_bytes, const PoolStatistics& pool) {
  const std::size_t accounted = pool.in_use_bytes + pool.quarantined_bytes + pool.cached_bytes;
  std::printf("grew at operation %zu (%s) to %s: live %s, in blocks %s, waiting for the GPU %s, in thread caches %s, "
              "free %s in %zu block(s)\n",
              operation, request ? ("an allocation of " + describe_bytes(request)).c_str() : "a free",
              describe_bytes(pool.reserved_bytes).c_str(), describe_bytes(live_bytes).c_str(),
              describe_bytes(pool.in_use_bytes).c_str(), describe_bytes(pool.quarantined_bytes).c_str(),
              describe_bytes(pool.cached_bytes).c_str(),
              describe_bytes(pool.reserved_bytes > accounted ? pool.reserved_bytes - accounted : 0).c_str(),
              pool.free_blocks);
}

// --pace: the clock the pool's seals go by during a replay. The host's
// (steady_clock) by default; else one that moves `step` a thread's
// operation, or to each operation's time in the log, so that one thread's
// replay seals at the same operations in every run, whatever the host's
// speed (exactly on the simulated driver, whose seals complete at once).
struct Pace {
  enum class By { host, step, log } by = By::host;
  std::chrono::nanoseconds step{0};
};

// The pace from --pace's text: host, log or a whole number of nanoseconds.
Pace pace_option(std::vector<std::string>& args) {
  const std::string text = option(args, "--pace", "host");
  if (text == "host") return {};
  if (text == "log") return {Pace::By::log};
  const auto nanoseconds = util::parse_whole_number(text.ends_with("ns") ? text.substr(0, text.size() - 2) : text);
  if (!nanoseconds || *nanoseconds < 1 || *nanoseconds > 1'000'000'000'000)
    throw InvalidArgument("--pace must be host, log, or the nanoseconds an operation takes, 1 to 10^12 (got '" +
                          text + "')");
  return {Pace::By::step, std::chrono::nanoseconds(static_cast<std::int64_t>(*nanoseconds))};
}

// As the report names it: "" for the host's clock.
std::string describe(const Pace& pace) {
  if (pace.by == Pace::By::log) return "the log's times";
  if (pace.by == Pace::By::step) return std::to_string(pace.step.count()) + " ns an operation";
  return "";
}

// Installs a paced clock as the pool's replay clock for its lifetime (made
// before the manager, so that every seal of the manager goes by it).
class PacedClock {
 public:
  explicit PacedClock(const Pace& pace) : pace_(pace), origin_(std::chrono::steady_clock::now().time_since_epoch()) {
    ticks_.store(origin_.count(), std::memory_order_relaxed);
    if (pace_.by != Pace::By::host) detail::replay_clock.store(&ticks_, std::memory_order_release);
  }
  ~PacedClock() {
    if (pace_.by != Pace::By::host) detail::replay_clock.store(nullptr, std::memory_order_release);
  }
  PacedClock(const PacedClock&) = delete;
  PacedClock& operator=(const PacedClock&) = delete;

  // Before operation `position` of a list, at `seconds` in the log: threads
  // side by side keep one pace each, and the clock is the furthest of them.
  void advance(std::size_t position, double seconds) noexcept {
    using Ticks = std::chrono::steady_clock::duration;
    Ticks at{};
    if (pace_.by == Pace::By::step) at = std::chrono::duration_cast<Ticks>(pace_.step * (position + 1));
    else if (pace_.by == Pace::By::log) at = std::chrono::duration_cast<Ticks>(std::chrono::duration<double>(seconds));
    else return;
    util::raise_to(ticks_, (origin_ + at).count());
  }

 private:
  Pace pace_;
  std::chrono::steady_clock::duration origin_;
  std::atomic<std::int64_t> ticks_{0};
};

// How a replay runs: --pace, --trace-growth, and --stream-ordered (the manager's
// allocate(size, stream) and deallocate(..., stream), StreamOrderedAllocator,
// on the calling thread's per-thread stream, as RMM and PyTorch call it,
// rather than memalloc).
struct ReplayOptions {
  Pace pace;
  bool trace_growth = false;
  bool stream_ordered = false;
  bool segments = false;  // the pool's segments at its peak (--segments)
  std::string plot_path;  // --plot OUT.svg: ReplayReport::plot, written there; empty for none
  // Makes the manager (--compare's candidates); else the manager is the bundled one or plugin library named.
  std::function<std::unique_ptr<BaseMemoryManager>(Context*)> make;
};

// Replays each list of operations on a thread of its own, side by side (one
// list: on this thread); live bytes are those of all lists together.
ReplayReport replay(const std::vector<std::vector<Operation>>& lists, Context& context, const std::string& manager_name,
                    const ReplayOptions& options) {
  if (manager_name == kBestFit) return best_fit_reference(lists, nullptr, driver_memory_info(context).total);
  PacedClock clock(options.pace);
  // A bundled manager or a plugin library's, under the adaptors CUEMM_ADAPTORS names (as `cuemm bench`).
  const std::string adaptors = adaptors_from_environment();
  auto manager = wrap_with_adaptors(
      &context, options.make ? options.make(&context) : make_memory_manager(manager_name, &context), adaptors);
  manager->initialize();
  auto* pool = find_adaptor<PoolMemoryManager>(*manager);
  // --stream-ordered's calls, on the calling thread's per-thread stream,
  // through the adaptors (which observe them) to the manager's.
  StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager);
  if (options.stream_ordered && !ordered)
    throw InvalidArgument("--stream-ordered replays through allocate(size, stream), which the pool and the async "
                          "manager have and manager '" + manager_name + "' does not");
  auto allocate_ordered = [&](std::size_t size) { return ordered->allocate(size, cuda::CU_STREAM_PER_THREAD); };
  auto deallocate_ordered = [&](cuda::CUdeviceptr pointer, std::size_t size) {
    ordered->deallocate(pointer, size, cuda::CU_STREAM_PER_THREAD);
  };
  if (options.segments && !pool)
    throw InvalidArgument("--segments lists the pool's segments, which manager '" + manager_name + "' does not have");
  // The pool and the driver's stream-ordered pool count their own reserved
  // bytes, which other processes on the device leave alone; any other
  // manager's are what the device's free memory lost since the start.
  const MemoryInfo start = driver_memory_info(context);
  auto reserved_now = [&] {
    if (const std::optional<std::size_t> pooled = reserved_device_bytes(*manager)) return *pooled;
    const MemoryInfo now = driver_memory_info(context);
    return start.free > now.free ? start.free - now.free : std::size_t{0};
  };
  std::atomic<std::size_t> live_bytes{0}, peak_live{0}, peak_reserved{0}, failed{0}, done{0};
  std::mutex failure_mutex;
  std::string first_failure;  // under failure_mutex
  auto count_failure = [&](const OutOfMemory& error) {
    if (failed.fetch_add(1) > 0) return;
    std::lock_guard lock(failure_mutex);
    first_failure = error.what();
  };
  struct Sample {
    std::size_t operation, live, reserved;
  };
  std::mutex samples_mutex;
  std::vector<Sample> samples;  // with options.plot_path
  std::mutex peak_segments_mutex;
  std::optional<ReplayReport::PeakSegments> peak_segments;  // with options.segments
  std::vector<double> sampling(lists.size());  // each list's untimed seconds: sampling, and its final frees
  // The order in which the device operations changed the live bytes (a
  // ticket each), in which the best fit's reference then runs them: the
  // live bytes the manager had at each step (where threads taking turns made
  // others), and none of the allocations that failed.
  std::mutex order_mutex;
  std::uint64_t tickets = 0;  // under order_mutex, with threads
  std::vector<std::vector<std::pair<std::uint64_t, Ran>>> completed(lists.size());
  auto run_list = [&](std::size_t index) {
    ScopedContext scope(context);
    std::unordered_map<std::uint64_t, std::shared_ptr<MemoryPointer>> live;
    std::unordered_map<std::uint64_t, std::pair<cuda::CUdeviceptr, std::size_t>> ordered;  // with stream_ordered
    completed[index].reserve(lists[index].size());
    // The live bytes after a device block of `size` came or went at
    // operation `position`; with threads, that change and its ticket under
    // one lock, so that the tickets' order is the order of the changes.
    auto change_live = [&](std::size_t size, bool came, std::size_t position, std::uint64_t id = 0) {
      std::unique_lock lock(order_mutex, std::defer_lock);
      if (lists.size() > 1) lock.lock();
      const std::size_t after = came ? live_bytes.fetch_add(size) + size : live_bytes.fetch_sub(size) - size;
      completed[index].push_back({tickets++, Ran{index, position, id}});
      return after;
    };
    for (std::size_t position = 0; position < lists[index].size(); ++position) {
      const Operation& operation = lists[index][position];
      clock.advance(position, operation.time);
      // A block is live from when its allocation returns until its free
      // returns: while a free waits (for the pool's lock, say), the manager
      // still holds the block. (Counting it out before the free ran left up
      // to a block a thread out of the live bytes: with 8 threads of blocks
      // up to 64 MiB, 200 MiB at the pool's growths.)
      std::size_t now = live_bytes.load(std::memory_order_relaxed);
      if (options.stream_ordered && operation.device) {
        if (operation.allocate) {
          try {
            ordered.emplace(operation.id, std::make_pair(allocate_ordered(operation.size), operation.size));
            now = change_live(operation.size, true, position);
          } catch (const OutOfMemory& error) {
            count_failure(error);
          }
        } else if (auto it = ordered.find(operation.id); it != ordered.end()) {
          const std::size_t size = it->second.second;
          deallocate_ordered(it->second.first, size);
          ordered.erase(it);
          now = change_live(size, false, position);
        }
      } else if (operation.allocate) {
        try {
          auto memory = operation.device ? manager->memalloc(operation.size)
                                         : manager->memhostalloc(operation.size, false, false, false);
          live.emplace(operation.id, std::move(memory));
          if (operation.device) now = change_live(operation.size, true, position);
        } catch (const OutOfMemory& error) {
          count_failure(error);
        }
      } else if (auto it = live.find(operation.id); it != live.end()) {
        const bool device = it->second->kind() == MemoryKind::Device;
        const std::size_t size = it->second->size();
        live.erase(it);
        if (device) now = change_live(size, false, position);
      }
      const std::size_t operations = done.fetch_add(1) + 1;
      // Sampling the reserved bytes is not part of the timed work.
      const auto paused = std::chrono::steady_clock::now();
      util::raise_to(peak_live, now);
      const std::size_t reserved = reserved_now();
      const bool pool_grew_past_peak = pool && reserved > peak_reserved.load();
      if (options.trace_growth && pool_grew_past_peak)
        trace_growth(operations, operation.allocate ? operation.size : 0, now, pool->statistics());
      if (options.segments && pool_grew_past_peak) {
        std::vector<PoolSegment> segments = pool->segments();
        std::lock_guard lock(peak_segments_mutex);  // (threads: the largest wins)
        if (!peak_segments || reserved > peak_segments->reserved) {
          std::vector<std::uintptr_t> before;
          if (peak_segments) {
            for (const PoolSegment& segment : peak_segments->segments) before.push_back(segment.address);
          }
          peak_segments = ReplayReport::PeakSegments{operations, reserved, now, std::move(segments), std::move(before)};
        }
      }
      util::raise_to(peak_reserved, reserved);
      if (!options.plot_path.empty()) {
        std::unique_lock lock(samples_mutex, std::defer_lock);
        if (lists.size() > 1) lock.lock();
        samples.push_back({operations, now, reserved});
      }
      sampling[index] += std::chrono::duration<double>(std::chrono::steady_clock::now() - paused).count();
    }
    // What the list leaves live goes now, while other lists may still run
    // (untimed, as the sampling: it is no operation of the workload).
    const auto paused = std::chrono::steady_clock::now();
    for (auto it = live.begin(); it != live.end();) {
      const bool device = it->second->kind() == MemoryKind::Device;
      const std::size_t size = it->second->size();
      const std::uint64_t id = it->first;
      it = live.erase(it);
      if (device) change_live(size, false, Ran::kLeftLive, id);
    }
    for (const auto& [id, block] : ordered) {
      deallocate_ordered(block.first, block.second);
      change_live(block.second, false, Ran::kLeftLive, id);
    }
    sampling[index] += std::chrono::duration<double>(std::chrono::steady_clock::now() - paused).count();
  };
  const auto began = std::chrono::steady_clock::now();
  if (lists.size() == 1) {
    run_list(0);
  } else {
    std::vector<std::thread> threads;
    for (std::size_t index = 0; index < lists.size(); ++index) threads.emplace_back(run_list, index);
    for (auto& thread : threads) thread.join();
  }
  ReplayReport report;
  // (With several threads, their mean untimed seconds.)
  double sampled = 0;
  for (double seconds : sampling) sampled += seconds / static_cast<double>(lists.size());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() - sampled;
  report.operations = done.load();
  report.threads = lists.size();
  report.peak_live = peak_live.load();
  report.peak_reserved = peak_reserved.load();
  report.failed = failed.load();
  report.first_failure = first_failure;
  if (pool) report.pool = pool->statistics();
  std::vector<std::pair<std::uint64_t, Ran>> ranked;
  for (const auto& list : completed) ranked.insert(ranked.end(), list.begin(), list.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Ran> order;
  for (const auto& ranked_one : ranked) order.push_back(ranked_one.second);
  const ReplayReport best_fit = best_fit_reference(lists, &order);
  report.best_fit_live = best_fit.peak_live;
  report.best_fit_reserved = best_fit.peak_reserved;
  report.adaptors = adaptors;
  report.stream_ordered = options.stream_ordered;
  report.pace = describe(options.pace);
  report.peak_segments = std::move(peak_segments);
  if (!options.plot_path.empty()) {
    // (Threads pushed their samples in turn, not always in their operations' order.)
    std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.operation < b.operation; });
    PlotSeries live{"live bytes", {{0.0, 0}}, "#1f77b4"};
    PlotSeries held{"reserved by " + manager_name, {{0.0, 0}}, "#d62728"};
    for (const Sample& sample : samples) {
      live.points.emplace_back(static_cast<double>(sample.operation), sample.live);
      held.points.emplace_back(static_cast<double>(sample.operation), sample.reserved);
    }
    report.plot = {std::move(held), std::move(live)};
  }
  return report;
}

// --segments: where the pool's bytes lay when it reached its peak, by kind
// of segment, then the segments with the most free bytes (the holes that
// requests did not fit).
void print_peak_segments(const ReplayReport::PeakSegments& peak, const std::string& prefix) {
  constexpr std::size_t kMostFree = 16;
  // "5.12 MiB": describe_bytes() without its exact count, for a table.
  auto bytes = [](std::size_t count) {
    const std::string described = describe_bytes(count);
    return described.substr(0, described.find(" ("));
  };
  // (The arena's free blocks may lie over pages given back: its addresses and its memory apart.)
  auto extent = [&](const PoolSegment& segment) {
    return segment.mapped_bytes == segment.size
               ? bytes(segment.size)
               : bytes(segment.size) + " of addresses, " + bytes(segment.mapped_bytes) + " mapped";
  };
  std::printf("%ssegments at the peak (after operation %zu): reserved %s, live %s\n", prefix.c_str(), peak.operation,
              describe_bytes(peak.reserved).c_str(), describe_bytes(peak.live).c_str());
  std::map<std::string, PoolSegment> kinds;  // totals by kind, in PoolSegment's fields (largest: the largest hole)
  std::map<std::string, std::size_t> counts;
  for (const PoolSegment& segment : peak.segments) {
    PoolSegment& total = kinds[to_string(segment.kind)];
    ++counts[to_string(segment.kind)];
    total.size += segment.size;
    total.mapped_bytes += segment.mapped_bytes;
    total.free_bytes += segment.free_bytes;
    total.free_blocks += segment.free_blocks;
    total.largest_free_block = std::max(total.largest_free_block, segment.largest_free_block);
  }
  for (const auto& [kind, total] : kinds) {
    std::printf("%s  %-12s %5zu segment(s) of %s, free %s in %zu block(s), the largest %s\n", prefix.c_str(),
                kind.c_str(), counts[kind], extent(total).c_str(), bytes(total.free_bytes).c_str(),
                total.free_blocks, bytes(total.largest_free_block).c_str());
  }
  std::vector<PoolSegment> most_free;
  for (const PoolSegment& segment : peak.segments)
    if (segment.free_bytes > 0) most_free.push_back(segment);
  std::sort(most_free.begin(), most_free.end(),
            [](const PoolSegment& a, const PoolSegment& b) { return a.free_bytes > b.free_bytes; });
  if (most_free.size() > kMostFree) most_free.resize(kMostFree);
  if (!most_free.empty()) std::printf("%s  the segments with the most free bytes:\n", prefix.c_str());
  for (const PoolSegment& segment : most_free) {
    const bool added = !std::binary_search(peak.before.begin(), peak.before.end(), segment.address);
    std::printf("%s    0x%llx %s of %s: free %s in %zu block(s), the largest %s%s\n", prefix.c_str(),
                static_cast<unsigned long long>(segment.address), to_string(segment.kind),
                extent(segment).c_str(), bytes(segment.free_bytes).c_str(), segment.free_blocks,
                bytes(segment.largest_free_block).c_str(), added ? " (new since the previous peak)" : "");
  }
}

// `prefix` begins each line (which device, for a log of several).
void print(const ReplayReport& report, const std::string& name, const std::string& prefix = "") {
  std::printf("%s", prefix.c_str());
  std::string manager = report.adaptors.empty() ? name : name + " under " + report.adaptors;
  if (report.stream_ordered) manager += ", stream-ordered";
  if (report.operations == 0) {
    std::printf("manager %s: 0 operations (the log holds no allocation or free it can replay)", manager.c_str());
  } else if (report.reference) {
    std::printf("manager %s: %zu operations, a reference: an ideal best fit in one range that grows at its end "
                "(no device memory; see best_fit_reference.hpp)", manager.c_str(), report.operations);
    if (report.failed)
      std::printf("; %zu allocation(s) failed, larger than the device's memory", report.failed);
  } else {
    std::printf("manager %s: %zu operations in %.3f s (%.0f ns each); %zu allocation(s) failed", manager.c_str(),
                report.operations, report.seconds, 1e9 * report.seconds / report.operations, report.failed);
    if (!report.first_failure.empty()) std::printf(" (the first: %s)", report.first_failure.c_str());
  }
  if (report.pool) {
    std::printf("; %zu seal(s), %zu driver allocation(s), %zu driver free(s)", report.pool->seals,
                report.pool->driver_allocations, report.pool->driver_frees);
    if (report.pool->spares_taken_over) std::printf(", %zu spare(s) taken over", report.pool->spares_taken_over);
    if (report.pool->blocks_assembled) std::printf(", %zu block(s) assembled", report.pool->blocks_assembled);
    if (report.pool->gpu_waits_avoided)
      std::printf(", %zu wait(s) for the GPU avoided", report.pool->gpu_waits_avoided);
    if (!report.pace.empty()) std::printf("; seals paced by %s", report.pace.c_str());
  }
  std::printf("\n%speak live %s, peak reserved %s: reserved/live %.3f\n", prefix.c_str(),
              describe_bytes(report.peak_live).c_str(),
              describe_bytes(report.peak_reserved).c_str(),
              report.peak_live ? static_cast<double>(report.peak_reserved) / report.peak_live : 0.0);
  if (report.threads > 1 && !report.reference)
    std::printf("%s(with %zu threads a block counts as live until its free returns, so the live bytes may "
                "hold, for a moment, up to a block a thread that its manager already had back)\n",
                prefix.c_str(), report.threads);
  // (Worded without "reserved/live": scripts read that figure, the manager's, from the peak line.)
  if (report.best_fit_live)
    std::printf("%san ideal best fit of the same operations reserves %s at its peak: %.3f of its peak live "
                "(--manager best-fit)\n",
                prefix.c_str(), describe_bytes(report.best_fit_reserved).c_str(),
                static_cast<double>(report.best_fit_reserved) / report.best_fit_live);
  if (report.peak_segments) print_peak_segments(*report.peak_segments, prefix);
}

// The report, and with --plot OUT.svg the replay's live and reserved bytes, operation by operation.
void print_and_plot(const ReplayReport& report, const std::string& name, const ReplayOptions& options) {
  print(report, name);
  if (options.plot_path.empty()) return;
  std::ofstream out(options.plot_path);
  if (!(out << plot_series_svg(report.plot, "operation")))
    throw InvalidArgument("cannot write '" + options.plot_path + "'");
  std::printf("wrote %s (live and reserved bytes after each operation)\n", options.plot_path.c_str());
}

// --compare: the same operations against each bundled manager and the
// pool's options that trade time for memory, one after another, each on a
// new manager, as one table beside the ideal best fit's footprint: which
// manager a program's log wants. (The pool's other options come from the
// environment, as for --manager pool.)
struct Candidate {
  std::string name;
  std::function<std::unique_ptr<BaseMemoryManager>(Context*)> make;
  bool stream_ordered = false;
};

std::vector<Candidate> comparison_candidates() {
  auto pool_with = [](std::function<void(PoolOptions&)> change) {
    return [change](Context* context) -> std::unique_ptr<BaseMemoryManager> {
      PoolOptions options = PoolOptions::from_environment();
      change(options);
      return std::make_unique<PoolMemoryManager>(context, options);
    };
  };
  auto bundled = [](std::string name) {
    return [name](Context* context) { return make_memory_manager(name, context); };
  };
  return {{"pool", pool_with([](PoolOptions&) {})},
          {"pool, stream-ordered (allocate(size, stream))", pool_with([](PoolOptions&) {}), true},
          {"pool, no thread caches", pool_with([](PoolOptions& o) { o.thread_cache_size = 0; })},
          {"pool, expandable", pool_with([](PoolOptions& o) { o.expandable = true; })},
          {"pool, expandable, assembled blocks",
           pool_with([](PoolOptions& o) { o.expandable = o.assemble_blocks = true; })},
          // (The least memory the pool's options reach: no thread's rings keep freed blocks apart.)
          {"pool, expandable, assembled blocks, no caches", pool_with([](PoolOptions& o) {
             o.expandable = o.assemble_blocks = true;
             o.thread_cache_size = 0;
           })},
          {"async", bundled("async")},
          {"default", bundled("default")}};
}

void compare(const std::vector<std::vector<Operation>>& lists, Context& context, const Pace& pace) {
  auto mib = [](std::size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return std::string(text);
  };
  // The simulated driver's stream-ordered pool is a model that places no
  // blocks: a floor, not a figure to choose by.
  const bool modelled_async = simulation::active();
  if (const std::string paced = describe(pace); !paced.empty())
    std::printf("the pool's seals paced by %s\n", paced.c_str());
  std::printf("%-46s %12s %14s %14s %13s\n", "manager", "ns/operation", "peak reserved", "reserved/live",
              "driver calls");
  std::optional<ReplayReport> best_fit;
  std::string least_memory, fastest;
  double least_ratio = 0, least_ns = 0;
  for (const Candidate& candidate : comparison_candidates()) {
    ReplayOptions options;
    options.pace = pace;
    options.make = candidate.make;
    options.stream_ordered = candidate.stream_ordered;
    try {
      const ReplayReport report = replay(lists, context, candidate.name, options);
      if (!best_fit) best_fit = report;
      const double ratio = report.peak_live ? static_cast<double>(report.peak_reserved) / report.peak_live : 0;
      const double ns = report.operations ? 1e9 * report.seconds / report.operations : 0;
      const std::string calls =
          report.pool ? std::to_string(report.pool->driver_allocations + report.pool->driver_frees) : "-";
      const bool modelled = modelled_async && candidate.name == "async";
      std::string note;
      if (report.failed) note = " (" + std::to_string(report.failed) + " allocation(s) failed)";
      if (modelled) note += " (simulated driver: a model of its pool, which places no blocks)";
      std::printf("%-46s %12.0f %14s %14.3f %13s%s\n", candidate.name.c_str(), ns, mib(report.peak_reserved).c_str(),
                  ratio, calls.c_str(), note.c_str());
      // (Not in the summary: a run that did not hold the workload, or a modelled footprint.)
      if (report.failed || modelled) continue;
      if (least_memory.empty() || ratio < least_ratio) least_memory = candidate.name, least_ratio = ratio;
      if (fastest.empty() || ns < least_ns) fastest = candidate.name, least_ns = ns;
    } catch (const Error& error) {
      // (A device without virtual memory management refuses the expandable pool, say.)
      std::printf("%-46s not run: %s\n", candidate.name.c_str(), error.what());
    }
  }
  if (best_fit && best_fit->best_fit_live)
    std::printf("%-46s %12s %14s %14.3f %13s\n", "an ideal best fit (reference)", "-",
                mib(best_fit->best_fit_reserved).c_str(),
                static_cast<double>(best_fit->best_fit_reserved) / best_fit->best_fit_live, "-");
  if (!least_memory.empty())
    std::printf("least memory: %s (%.3f of peak live); fastest: %s (%.0f ns an operation)\n", least_memory.c_str(),
                least_ratio, fastest.c_str(), least_ns);
}

// A log's rows by the device they were made on.
std::map<int, std::vector<Operation>> rows_by_device(const std::vector<Operation>& operations) {
  std::map<int, std::vector<Operation>> by_device;
  for (const Operation& operation : operations) by_device[operation.ordinal].push_back(operation);
  return by_device;
}

// Replays a log's rows; a log of several devices, each device's rows against
// a manager of its own on that device, one device after another. (A log of one
// device replays on the current one, whichever device it was.) Rows of a device
// the driver lacks replay on device ordinal % count, which is free again by
// then: a log of eight GPUs still replays on a machine of one.
void replay_by_device(const std::vector<Operation>& operations, const std::string& manager,
                      const ReplayOptions& options) {
  const std::map<int, std::vector<Operation>> by_device = rows_by_device(operations);
  if (by_device.size() <= 1) {
    print_and_plot(replay({operations}, current_context(), manager, options), manager, options);
    return;
  }
  if (!options.plot_path.empty())
    throw InvalidArgument("--plot draws the replay of one device; this log has rows of " +
                          std::to_string(by_device.size()) + " devices");
  const int count = Device::count();
  if (count == 0) throw InvalidArgument("the log has rows of " + std::to_string(by_device.size()) +
                                        " devices, but the driver has no device to replay them on");
  if (by_device.rbegin()->first >= count) {
    std::printf("the log has rows of %zu devices, up to device %d; the driver has %d device(s), so the rows of "
                "device N replay on device N %% %d\n",
                by_device.size(), by_device.rbegin()->first, count, count);
  }
  for (const auto& [ordinal, rows] : by_device) {
    const int on = ordinal % count;
    std::string prefix = "device " + std::to_string(ordinal);
    if (on != ordinal) prefix += " (on device " + std::to_string(on) + ")";
    print(replay({rows}, Device::get(on).primary_context(), manager, options), manager, prefix + ": ");
  }
}

}  // namespace

namespace cuemm::tool {

int replay_command(const std::string& command, std::vector<std::string> args) {
  const bool comparing = tool::flag(args, "--compare");
  if (comparing && std::find(args.begin(), args.end(), "--manager") != args.end())
    throw InvalidArgument("--compare runs every bundled manager: leave out --manager");
  const std::string manager = option(args, "--manager", "pool");
  ReplayOptions options;
  options.trace_growth = tool::flag(args, "--trace-growth");
  options.stream_ordered = tool::flag(args, "--stream-ordered");
  options.segments = tool::flag(args, "--segments");
  options.pace = pace_option(args);
  const bool plotting = std::find(args.begin(), args.end(), "--plot") != args.end();
  options.plot_path = option(args, "--plot", "");
  if (plotting && options.plot_path.empty()) throw InvalidArgument("--plot needs the name of the picture to write");
  // (Refused now, not after a replay that may take minutes.)
  if (plotting && !std::ofstream(options.plot_path))
    throw InvalidArgument("cannot write '" + options.plot_path + "'");
  if (comparing && (options.trace_growth || options.stream_ordered || options.segments || plotting))
    throw InvalidArgument("--compare takes none of --trace-growth, --stream-ordered, --segments and --plot (it has a "
                          "stream-ordered row)");
  if (plotting && manager == kBestFit)
    throw InvalidArgument("--plot draws a manager's reserved bytes; the best fit (a reference) has only its peak");
  std::vector<Operation> operations;
  if (command == "replay") {
    if (args.empty()) throw InvalidArgument("replay needs a log: cuemm replay LOG.csv");
    tool::refuse_leftovers({args.begin() + 1, args.end()}, "replay " + args[0]);
    MemoryLogGaps gaps;
    operations = read_log(args[0], &gaps);
    if (options.pace.by == Pace::By::log && gaps.untimed)
      throw InvalidArgument("--pace log goes by the log's times, and '" + args[0] +
                            "' has none: give --pace with the nanoseconds an operation takes");
  } else {
    if (options.pace.by == Pace::By::log)
      throw InvalidArgument("--pace log goes by a log's times, which random's operations do not have: give "
                            "--pace with the nanoseconds an operation takes");
    const std::string pattern = option(args, "--pattern", "rmm");
    const unsigned seed = static_cast<unsigned>(count_option(args, "--seed", "1"));
    const std::size_t threads = count_option(args, "--threads", "1");
    if (threads == 0 || threads > 1024) throw InvalidArgument("--threads must be between 1 and 1024");
    // Each thread its own workload (seeds seed, seed + 1, ...).
    std::vector<std::vector<Operation>> lists;
    // Once the pattern's options are read: `generate(thread_seed)` for each thread.
    const auto for_each_thread = [&](auto&& generate) {
      tool::refuse_leftovers(args, "random");
      for (std::size_t t = 0; t < threads; ++t) lists.push_back(device_operations(generate(seed + static_cast<unsigned>(t))));
    };
    if (pattern == "training") {
      const std::size_t layers = positive_count_option(args, "--layers", std::to_string(workload::kTrainingLayers));
      const std::size_t steps = positive_count_option(args, "--steps", std::to_string(workload::kTrainingSteps));
      std::string shapes_name = option(args, "--shapes", "varied");
      if (tool::flag(args, "--same-shapes")) shapes_name = "same";  // (the older spelling)
      const std::optional<workload::TrainingShapes> shapes = training_shapes(shapes_name);
      if (!shapes) throw InvalidArgument("--shapes must be varied, same or per-layer (got '" + shapes_name + "')");
      for_each_thread([&](unsigned thread_seed) {
        return workload::training_operations(layers, steps, thread_seed, *shapes);
      });
    } else if (pattern == "temporaries" || pattern == "inference") {
      // (Steps of small blocks and temporaries; requests of 30 layers.)
      const std::size_t count = positive_count_option(args, "--operations", pattern == "temporaries" ? "10000" : "300");
      for_each_thread([&](unsigned thread_seed) {
        return pattern == "temporaries" ? workload::temporaries_operations(count, thread_seed)
                                        : workload::inference_operations(count, thread_seed);
      });
    } else if (pattern == "queue") {
      const std::size_t max_size = positive_bytes_option(args, "--max-size", "1M");
      const std::size_t depth = positive_count_option(args, "--depth", "200");
      const std::size_t count = positive_count_option(args, "--operations", "20000");
      for_each_thread([&](unsigned thread_seed) { return workload::queue_operations(max_size, depth, count, thread_seed); });
    } else if (pattern == "rmm") {
      const std::size_t max_size = positive_bytes_option(args, "--max-size", "64M");
      const std::size_t live = positive_bytes_option(args, "--live", "1G");
      const std::size_t count = positive_count_option(args, "--operations", "100000");
      // (Under an equal share of the live cap.)
      for_each_thread([&](unsigned thread_seed) {
        return workload::random_operations(max_size, count, live / threads, thread_seed);
      });
    } else {
      throw InvalidArgument("--pattern must be rmm, training, temporaries, inference or queue (got '" + pattern + "')");
    }
    if (comparing) {
      compare(lists, current_context(), options.pace);
    } else {
      print_and_plot(replay(lists, current_context(), manager, options), manager, options);
    }
    return 0;
  }
  if (comparing) {
    if (const std::size_t devices = rows_by_device(operations).size(); devices > 1)
      throw InvalidArgument("--compare replays the rows of one device; this log has rows of " +
                            std::to_string(devices) + " devices (replay it with --manager NAME instead)");
    compare({operations}, current_context(), options.pace);
    return 0;
  }
  replay_by_device(operations, manager, options);
  return 0;
}

int plot_command(const std::vector<std::string>& args) {
  if (args.size() < 2) throw InvalidArgument("plot needs a log and a picture to write: cuemm plot LOG.csv OUT.svg");
  tool::refuse_leftovers({args.begin() + 2, args.end()}, "plot");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_log_events(args[0], &gaps);
  if (events.empty()) std::printf("the log holds no allocation or free: the picture is empty\n");
  else if (gaps.untimed) std::printf("the log has no times: the picture's axis counts rows\n");
  const std::string svg = memory_plot_svg(events, gaps.untimed);
  std::ofstream out(args[1]);
  if (!(out << svg)) throw InvalidArgument("cannot write '" + args[1] + "'");
  std::printf("wrote %s\n", args[1].c_str());
  return 0;
}

}  // namespace cuemm::tool
