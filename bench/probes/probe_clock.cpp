// probe_clock.cpp: what reading the time costs on this host, from one thread
// and from many at once: the precise monotonic clock (std::chrono's
// steady_clock, which the adaptors' records used) against the coarse one
// (the kernel's last tick, read from the vDSO without the clock source).
// A virtual machine whose clock source is not the TSC may answer the precise
// clock through the hypervisor.
//
//   g++ -O2 -std=c++20 -pthread bench/probes/probe_clock.cpp -o /tmp/probe_clock && /tmp/probe_clock
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// ns per read, wall time over all reads of all threads, for `threads` threads reading `clock` at once.
double ns_per_read(clockid_t clock, int threads) {
  constexpr int kReads = 2'000'000;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::atomic<long> sink{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      long sum = 0;
      timespec now;
      for (int i = 0; i < kReads; ++i) {
        clock_gettime(clock, &now);
        sum += now.tv_nsec;
      }
      sink.fetch_add(sum);
    });
  }
  while (ready.load() < threads) {
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& thread : pool) thread.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds * 1e9 / (static_cast<double>(kReads) * threads);
}

}  // namespace

int main() {
  std::string source = "unknown";
  std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
  timespec resolution;
  clock_getres(CLOCK_MONOTONIC_COARSE, &resolution);
  std::printf("clock source %s; the coarse clock's resolution %.3f ms\n", source.c_str(), resolution.tv_nsec / 1e6);
  const int most = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {1, most}) {
    std::printf("%2d thread(s): CLOCK_MONOTONIC %.1f ns a read, CLOCK_MONOTONIC_COARSE %.1f ns (wall time over all reads)\n",
                threads, ns_per_read(CLOCK_MONOTONIC, threads), ns_per_read(CLOCK_MONOTONIC_COARSE, threads));
  }
}
