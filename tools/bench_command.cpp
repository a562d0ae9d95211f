// `cuemm bench`: ns per allocate+free pair through the chosen managers, sizes
// and thread counts, on whichever driver is loaded; the pairs table of
// bench/RESULTS.md for the managers at hand, without Google Benchmark.
//
// Each measurement runs every thread's loop for a warm-up (untimed: a pool
// grows its rotations in the first thousands of pairs), then for a fixed
// wall time, and divides that time by the pairs all threads finished; the
// median of several measurements is reported. Timing by the clock rather than
// by a count of pairs lets one table hold a 20 ns pool pair and a 200 us
// cuMemAlloc without either taking minutes.
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

namespace cuemm::tool {

const char* const kBenchUsage =
    "       cuemm bench [--managers cuMemAlloc,default,pool,async] [--sizes 256,64K,1M,4M,64M]\n"
    "                   [--threads 1,4,16] [--seconds 0.05] [--repeats 3]\n";

namespace {

// One allocate+free pair of `size` bytes on the calling thread.
using Pair = std::function<void(std::size_t)>;

enum class Phase { kWarmUp, kTimed, kStop };

// Wall ns per pair of all `threads` threads together, or nullopt when an
// allocation ran out of memory. Other errors propagate.
std::optional<double> ns_per_pair(const Pair& pair, Context& context, std::size_t size, std::size_t threads,
                                  double seconds) {
  std::atomic<Phase> phase{Phase::kWarmUp};
  std::atomic<std::size_t> timed_pairs{0};
  std::atomic<bool> out_of_memory{false};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      ScopedContext scope(context);
      std::size_t mine = 0;
      try {
        for (Phase now; (now = phase.load(std::memory_order_relaxed)) != Phase::kStop;) {
          pair(size);
          if (now == Phase::kTimed) ++mine;
        }
      } catch (const OutOfMemory&) {
        out_of_memory = true;
        phase = Phase::kStop;
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
        phase = Phase::kStop;
      }
      timed_pairs += mine;
    });
  }
  using Clock = std::chrono::steady_clock;
  const auto sleep_unless_stopped = [&](double for_seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(for_seconds);
    while (Clock::now() < until && phase.load() != Phase::kStop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  sleep_unless_stopped(seconds / 4);
  Phase expected = Phase::kWarmUp;
  phase.compare_exchange_strong(expected, Phase::kTimed);
  const auto began = Clock::now();
  sleep_unless_stopped(seconds);
  phase = Phase::kStop;
  const double elapsed = std::chrono::duration<double, std::nano>(Clock::now() - began).count();
  for (auto& worker : workers) worker.join();
  if (error) std::rethrow_exception(error);
  if (out_of_memory || timed_pairs == 0) return std::nullopt;
  return elapsed / static_cast<double>(timed_pairs.load());
}

std::string size_label(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, value == static_cast<double>(static_cast<std::size_t>(value)) ? "%.0f %s" : "%.1f %s",
                value, units[unit]);
  return text;
}

std::string cell(std::optional<double> ns) {
  if (!ns) return "OOM";
  char text[32];
  std::snprintf(text, sizeof text, *ns >= 100 ? "%.0f" : "%.1f", *ns);
  return text;
}

// A row of the table: a bundled manager (under the adaptors CUEMM_ADAPTORS
// names), or the driver's own cuMemAlloc/cuMemFree.
struct Subject {
  std::string name;
  std::shared_ptr<BaseMemoryManager> manager;  // null for cuMemAlloc
  Pair pair;
};

Subject make_subject(const std::string& name, Context& context) {
  if (name == "cuMemAlloc") {
    return {name, nullptr, [](std::size_t size) {
              cuda::CUdeviceptr pointer = 0;
              CUEMM_CU_ALLOC(size, cuMemAlloc, &pointer, size);
              CUEMM_CU(cuMemFree, pointer);
            }};
  }
  const auto bundled = bundled_memory_managers();
  if (std::find(bundled.begin(), bundled.end(), name) == bundled.end()) {
    std::string known = "cuMemAlloc";
    for (const auto& other : bundled) known += ", " + other;
    throw InvalidArgument("--managers: no manager is called '" + name + "' (there are: " + known + ")");
  }
  std::shared_ptr<BaseMemoryManager> manager =
      wrap_with_adaptors(&context, make_bundled_memory_manager(name, &context), adaptors_from_environment());
  manager->initialize();
  BaseMemoryManager* raw = manager.get();
  return {name, manager, [raw](std::size_t size) { raw->memalloc(size); }};
}

}  // namespace

int bench_command(std::vector<std::string> args) {
  const auto managers = list_option(args, "--managers", "cuMemAlloc,default,pool,async");
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
  const std::string seconds_text = option(args, "--seconds", "0.05");
  char* end = nullptr;
  const double seconds = std::strtod(seconds_text.c_str(), &end);
  if (end == seconds_text.c_str() || *end || !(seconds > 0) || seconds > 60)
    throw InvalidArgument("--seconds must be a time above 0 and at most 60 (got '" + seconds_text + "')");
  const std::size_t repeats = count_option(args, "--repeats", "3");
  if (repeats == 0) throw InvalidArgument("--repeats must be at least 1 (got 0)");
  if (!args.empty()) throw InvalidArgument("bench: unexpected argument '" + args[0] + "'");

  Context& context = current_context();
  ScopedContext scope(context);
  std::vector<Subject> subjects;
  for (const auto& name : managers) subjects.push_back(make_subject(name, context));

  std::printf("ns per allocate+free pair (memalloc, then its pointer released), median of %zu runs of %g s after "
              "%g s of warm-up;\nwith several threads, wall time over the pairs of all threads. Driver: %s; "
              "adaptors: %s.\n",
              repeats, seconds, seconds / 4, simulation::active() ? "simulated" : "cuda",
              adaptors_from_environment().empty() ? "none" : adaptors_from_environment().c_str());
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
        std::vector<double> runs;
        for (std::size_t r = 0; r < repeats; ++r) {
          const auto ns = ns_per_pair(subjects[s].pair, context, size, thread_counts[t], seconds);
          if (!ns) break;
          runs.push_back(*ns);
        }
        std::optional<double> median;
        if (runs.size() == repeats) {
          std::sort(runs.begin(), runs.end());
          median = runs[runs.size() / 2];
        }
        results[s][t].push_back(median);
        std::printf("%12s", cell(median).c_str());
        std::fflush(stdout);
      }
      std::printf("\n");
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
  for (auto& subject : subjects)
    if (subject.manager) subject.manager->reset();
  return 0;
}

}  // namespace cuemm::tool
