// `cuemm bench`: ns per allocate+free pair through the chosen managers, sizes
// and thread counts, on whichever driver is loaded; the pairs table of
// bench/RESULTS.md for the managers at hand, without Google Benchmark.
//
// Each cell starts its threads, lets them run pairs untimed for a warm-up
// (for a pool, until a warm-up's length went by without it buying a block:
// it lengthens a loop's rotation only as the loop's seals pay for a block,
// over up to a few million pairs), then reads the pairs they finished over a
// few windows of fixed wall time and reports the median window. Timing by
// the clock rather than by a count of pairs lets one table hold a 20 ns pool
// pair and a 200 us cuMemAlloc without either taking minutes.
#include "bench_command.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "cuemm/cuemm.hpp"
#include "cuemm/driver/driver.hpp"
#include "tool_options.hpp"
#include "util/byte_size.hpp"

namespace cuemm::tool {

const char* const kBenchUsage =
    "       cuemm bench [--managers cuMemAlloc,default,pool,async] [--sizes 256,64K,1M,4M,64M]\n"
    "                   [--threads 1,4,16] [--seconds 0.05] [--repeats 3] [--warm-up 0.2] [--stream-ordered]\n";

namespace {

// One allocate+free pair of `size` bytes on the calling thread.
using Pair = std::function<void(std::size_t)>;
// The driver allocations a manager has made so far (empty: not known).
using Purchases = std::function<std::size_t()>;

// The longest warm-up that waits for a pool to stop buying blocks.
constexpr std::chrono::seconds kLongestWarmUp{10};

// Pairs one worker finished, on a cache line of its own (a shared counter
// would make the threads wait on each other and time that).
struct alignas(64) PairCount {
  std::atomic<std::size_t> value{0};
};

// Wall ns per pair of all `threads` threads together, in `repeats` windows of
// `seconds` each after `warm_up` seconds, from the same threads; nullopt when
// an allocation ran out of memory. Other errors propagate. The warm-up lasts
// until every thread has finished a pair, and, with `purchases`, until
// `warm_up` more seconds bought nothing (at most kLongestWarmUp); a window
// lasts until the threads have finished one pair each more than before it
// (a driver's first calls can take milliseconds).
std::optional<std::vector<double>> ns_per_pair(const Pair& pair, const Purchases& purchases, Context& context,
                                               std::size_t size, std::size_t threads, double warm_up,
                                               double seconds, std::size_t repeats) {
  std::atomic<bool> stop{false}, out_of_memory{false}, failed{false};
  std::exception_ptr error;
  std::vector<PairCount> done(threads);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ScopedContext scope(context);
      try {
        for (std::size_t n = 1; !stop.load(std::memory_order_relaxed); ++n) {
          pair(size);
          done[t].value.store(n, std::memory_order_relaxed);
        }
      } catch (const OutOfMemory&) {
        out_of_memory = true;
        stop = true;
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
        stop = true;
      }
    });
  }
  using Clock = std::chrono::steady_clock;
  const auto total = [&] {
    std::size_t sum = 0;
    for (const auto& count : done) sum += count.value.load(std::memory_order_relaxed);
    return sum;
  };
  const auto all_started = [&] {
    return std::all_of(done.begin(), done.end(), [](const PairCount& c) { return c.value.load() > 0; });
  };
  // Sleeps for `at_least` seconds and until `enough()` (or a worker stopped), at most a minute.
  const auto wait = [&](double at_least, auto&& enough) {
    const auto began = Clock::now();
    const auto until = began + std::chrono::duration<double>(at_least);
    while (!stop.load() && (Clock::now() < until || !enough()) && Clock::now() - began < std::chrono::minutes(1))
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  std::vector<double> windows;
  const auto warm_up_began = Clock::now();
  wait(warm_up, all_started);
  if (purchases) {
    for (std::size_t before = purchases(); !stop.load() && Clock::now() - warm_up_began < kLongestWarmUp;) {
      wait(warm_up, [] { return true; });
      const std::size_t now = purchases();
      if (now == before) break;
      before = now;
    }
  }
  for (std::size_t r = 0; r < repeats && !stop.load(); ++r) {
    const std::size_t before = total();
    const auto began = Clock::now();
    wait(seconds, [&] { return total() >= before + threads; });
    const std::size_t pairs = total() - before;
    const double elapsed = std::chrono::duration<double, std::nano>(Clock::now() - began).count();
    if (pairs == 0) break;
    windows.push_back(elapsed / static_cast<double>(pairs));
  }
  stop = true;
  for (auto& worker : workers) worker.join();
  if (error) std::rethrow_exception(error);
  if (out_of_memory) return std::nullopt;
  if (windows.size() < repeats) throw StateError("bench: no pair finished within a minute");
  return windows;
}

// "64 KiB", "1.5 MiB": a column's heading.
std::string size_label(std::size_t bytes) {
  const util::ScaledBytes scaled = util::scale_byte_size(bytes);
  char text[32];
  std::snprintf(text, sizeof text, scaled.value == static_cast<double>(static_cast<std::size_t>(scaled.value))
                                       ? "%.0f %s" : "%.1f %s",
                scaled.value, scaled.unit);
  return text;
}

std::string cell(std::optional<double> ns) {
  if (!ns) return "OOM";
  char text[32];
  std::snprintf(text, sizeof text, *ns >= 100 ? "%.0f" : "%.1f", *ns);
  return text;
}

// A row of the table: a bundled manager or a plugin library's (under the
// adaptors CUEMM_ADAPTORS names), or the driver's own cuMemAlloc/cuMemFree.
struct Subject {
  std::string name;
  std::shared_ptr<BaseMemoryManager> manager;  // null for cuMemAlloc
  Pair pair;
  Purchases purchases;  // for the pool
};

// With `stream_ordered`, the pairs are allocate(size, stream) and
// deallocate() on the thread's per-thread stream (StreamOrderedAllocator,
// through the adaptors), as RMM and PyTorch call their allocators.
Subject make_subject(const std::string& name, Context& context, const std::string& adaptors, bool stream_ordered) {
  if (name == "cuMemAlloc" && stream_ordered)
    throw InvalidArgument("--stream-ordered: cuMemAlloc has no stream (leave it out of --managers)");
  if (name == "cuMemAlloc") {
    return {name, nullptr, [](std::size_t size) {
              cuda::CUdeviceptr pointer = 0;
              CUEMM_CU_ALLOC(size, cuMemAlloc, &pointer, size);
              CUEMM_CU(cuMemFree, pointer);
            }};
  }
  const auto bundled = bundled_memory_managers();
  if (!names_a_plugin_library(name) && std::find(bundled.begin(), bundled.end(), name) == bundled.end()) {
    std::string known = "cuMemAlloc";
    for (const auto& other : bundled) known += ", " + other;
    throw InvalidArgument("--managers: no manager is called '" + name + "' (there are: " + known +
                          "; or give the path of a plugin library)");
  }
  std::shared_ptr<BaseMemoryManager> manager =
      wrap_with_adaptors(&context, make_memory_manager(name, &context), adaptors);
  manager->initialize();
  BaseMemoryManager* raw = manager.get();
  Purchases purchases;
  if (auto* pool = find_adaptor<PoolMemoryManager>(*manager))
    purchases = [pool] { return pool->statistics().driver_allocations; };
  if (!stream_ordered) return {name, manager, [raw](std::size_t size) { raw->memalloc(size); }, purchases};
  StreamOrderedAllocator* ordered = stream_ordered_allocator(*manager);
  if (!ordered)
    throw InvalidArgument("--stream-ordered: manager '" + name + "' has no allocate(size, stream) (the pool and "
                          "the async manager have it)");
  return {name, manager,
          [ordered](std::size_t size) {
            ordered->deallocate(ordered->allocate(size, cuda::CU_STREAM_PER_THREAD), size, cuda::CU_STREAM_PER_THREAD);
          },
          purchases};
}

}  // namespace

int bench_command(std::vector<std::string> args) {
  const bool stream_ordered = flag(args, "--stream-ordered");
  const auto managers = list_option(args, "--managers", stream_ordered ? "pool,async" : "cuMemAlloc,default,pool,async");
  std::vector<std::size_t> sizes, thread_counts;
  for (const auto& text : list_option(args, "--sizes", "256,64K,1M,4M,64M")) {
    sizes.push_back(parse_bytes("--sizes", text));
    if (sizes.back() == 0) throw InvalidArgument("--sizes must be at least 1 byte each (got '" + text + "')");
  }
  for (const auto& text : list_option(args, "--threads", "1,4,16")) {
    thread_counts.push_back(parse_count("--threads", text));
    if (thread_counts.back() == 0 || thread_counts.back() > 1024)
      throw InvalidArgument("--threads must be between 1 and 1024 each (got '" + text + "')");
  }
  const double seconds = seconds_option(args, "--seconds", "0.05");
  const double warm_up = seconds_option(args, "--warm-up", "0.2");
  const std::size_t repeats = positive_count_option(args, "--repeats", "3");
  if (!args.empty()) throw InvalidArgument("bench: unexpected argument '" + args[0] + "'");

  Context& context = current_context();
  ScopedContext scope(context);
  const std::string adaptors = adaptors_from_environment();
  std::vector<Subject> subjects;
  for (const auto& name : managers) subjects.push_back(make_subject(name, context, adaptors, stream_ordered));

  std::printf("ns per allocate+free pair (%s), median of %zu windows of %g s "
              "after %g s of warm-up (for the pool, until it bought no block for that long),\nfrom the same "
              "threads; with several threads, wall time over the pairs of all threads. Driver: %s; adaptors: %s.\n",
              stream_ordered ? "allocate(size, stream) and deallocate() on each thread's per-thread stream"
                             : "memalloc, then its pointer released",
              repeats, seconds, warm_up, simulation::active() ? "simulated" : "cuda",
              adaptors.empty() ? "none" : adaptors.c_str());
  std::size_t width = 10;
  for (const auto& subject : subjects) width = std::max(width, subject.name.size() + 2);
  // results[subject][threads][size]
  std::vector<std::vector<std::vector<std::optional<double>>>> results(
      subjects.size(), std::vector<std::vector<std::optional<double>>>(thread_counts.size()));
  for (std::size_t t = 0; t < thread_counts.size(); ++t) {
    std::printf("\n%zu thread(s)\n%-*s", thread_counts[t], static_cast<int>(width), "manager");
    for (std::size_t size : sizes) std::printf("%12s", size_label(size).c_str());
    std::printf("\n");
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      std::printf("%-*s", static_cast<int>(width), subjects[s].name.c_str());
      for (std::size_t size : sizes) {
        std::optional<double> median;
        if (auto runs = ns_per_pair(subjects[s].pair, subjects[s].purchases, context, size, thread_counts[t], warm_up,
                                    seconds, repeats)) {
          std::sort(runs->begin(), runs->end());
          median = (*runs)[runs->size() / 2];
        }
        results[s][t].push_back(median);
        std::printf("%12s", cell(median).c_str());
        std::fflush(stdout);
      }
      std::printf("\n");
      // What a manager keeps after its row (a pool's rotations of 16 threads
      // may hold the whole device) goes back, so that the next row starts
      // with the device's memory free, whichever manager came before.
      if (subjects[s].manager) subjects[s].manager->reset();
    }
  }
  // Scaling: the most threads over one, in aggregate throughput.
  const auto one = std::find(thread_counts.begin(), thread_counts.end(), std::size_t{1});
  const auto most = std::max_element(thread_counts.begin(), thread_counts.end());
  if (one != thread_counts.end() && *most > 1) {
    std::printf("\n%zu threads over 1, aggregate throughput:\n", *most);
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      std::printf("%-*s", static_cast<int>(width), subjects[s].name.c_str());
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto& single = results[s][one - thread_counts.begin()][i];
        const auto& many = results[s][most - thread_counts.begin()][i];
        char text[32] = "-";
        if (single && many) std::snprintf(text, sizeof text, "%.1fx", *single / *many);
        std::printf("%12s", text);
      }
      std::printf("\n");
    }
  }
  return 0;  // (each manager was reset after its last row)
}

}  // namespace cuemm::tool
