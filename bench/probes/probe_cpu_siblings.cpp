// Which of a host's CPUs share a core (simultaneous multithreading), when
// the machine does not say (a virtual machine's lscpu reads one thread per
// core). A loop of independent additions, which keeps a core's execution
// units busy, runs on CPU 0 alone, then beside the same loop on each other
// CPU in turn: a CPU that shares CPU 0's core takes about half of its
// throughput. Then all CPUs at once, with that loop and with one chain of
// dependent additions (which leaves most of a core idle, as bench_allocators'
// ThreadPrivateLoop does): what 16 threads over one can reach on this host
// for code that keeps a core busy, and for code that does not.
//
//   g++ -O2 -pthread bench/probes/probe_cpu_siblings.cpp -o probe_cpu_siblings && ./probe_cpu_siblings
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr auto kWindow = std::chrono::milliseconds(200);

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// Iterations of eight independent chains of additions (busy core) or of one
// dependent chain (idle units) until `stop`.
std::uint64_t spin(const std::atomic<bool>& stop, bool busy) {
  std::uint64_t a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8, iterations = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 1024; ++i) {
      if (busy) {
        a += i; b += a; c += i; d += c; e += i; f += e; g += i; h += g;
        asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g), "+r"(h));
      } else {
        a = a * 3 + 1;
        asm volatile("" : "+r"(a));
      }
    }
    iterations += 1024;
  }
  return iterations + (a + b + c + d + e + f + g + h) % 2;
}

// Each listed CPU's iterations in one window, all running at once.
std::vector<double> run_on(const std::vector<int>& cpus, bool busy) {
  std::atomic<bool> stop{false};
  std::vector<std::uint64_t> counts(cpus.size());
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < cpus.size(); ++t) {
    threads.emplace_back([&, t] {
      pin_to(cpus[t]);
      counts[t] = spin(stop, busy);
    });
  }
  std::this_thread::sleep_for(kWindow);
  stop = true;
  for (auto& thread : threads) thread.join();
  return {counts.begin(), counts.end()};
}

double median_of_three(auto&& measure) {
  double x = measure(), y = measure(), z = measure();
  return std::max(std::min(x, y), std::min(std::max(x, y), z));
}

}  // namespace

int main() {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const double alone = median_of_three([] { return run_on({0}, true)[0]; });
  std::printf("CPU 0 alone: %.0f M iterations a window\n", alone / 1e6);
  std::printf("CPU 0's throughput beside the same loop on CPU j:\n");
  for (int j = 1; j < cpus; ++j) {
    const double beside = median_of_three([j] { return run_on({0, j}, true)[0]; });
    std::printf("  j=%2d: %.2f%s\n", j, beside / alone, beside / alone < 0.8 ? "  (shares CPU 0's core)" : "");
  }
  std::vector<int> all;
  for (int j = 0; j < cpus; ++j) all.push_back(j);
  for (const bool busy : {true, false}) {
    const double one = median_of_three([busy] { return run_on({0}, busy)[0]; });
    const double together = median_of_three([&] {
      double sum = 0;
      for (double count : run_on(all, busy)) sum += count;
      return sum;
    });
    std::printf("%d CPUs at once over CPU 0 alone, %s: %.1fx\n", cpus, busy ? "busy core (8 chains)" : "one dependent chain",
                together / one);
  }
}
