// cuemm: the command-line tool.
//
//   cuemm info                               version, driver, devices, managers, settings
//                                            (info_command.cpp)
//   cuemm settings                           every CUEMM_* variable: what it sets, whose
//                                            option it is, its value here (info_command.cpp)
//   cuemm --version                          the library's version
//   cuemm replay LOG.csv [--manager NAME]    replays an allocation log (the CSV of
//                                            LoggingAdaptor, or of RMM's
//                                            logging_resource_adaptor) against a manager
//                                            (bundled, or a plugin library's: NAME a path);
//                                            a log of several devices, each device's rows
//                                            against a manager of its own on that device
//                                            (replay_command.cpp, as random and plot)
//   cuemm random [--manager NAME] [--max-size BYTES] [--operations N] [--seed S]
//                [--threads T]               a random mix of allocations and frees
//                                            (from T threads side by side, each its own)
//   cuemm random --pattern training [--layers L] [--steps N] [--shapes varied|same|per-layer] ...
//                                            a training-like workload: sizes that change
//                                            between phases (bench/random_workload.hpp);
//                                            same: every step repeats the first one's sizes;
//                                            per-layer: each layer keeps sizes of its own,
//                                            any byte count (--same-shapes: --shapes same)
//   cuemm random --pattern temporaries|inference [--operations N] ...
//                                            long-lived small blocks beside large
//                                            temporaries of varying sizes (N steps);
//                                            inference requests of random batch sizes
//                                            (N requests)
//   cuemm random --pattern queue [--max-size BYTES] [--depth D] [--operations N] ...
//                                            a queue of D buffers of random sizes, the
//                                            oldest freed as each new one comes (N steps)
//   (either with --trace-growth: a line whenever the pool reserves more, with
//   where its bytes were: in use, waiting for the GPU, in thread caches, free;
//   with threads, from whichever thread saw it, all threads' bytes; with
//   --stream-ordered, the pool's or the async manager's device blocks through
//   allocate(size, stream) on each thread's per-thread stream, as RMM and
//   PyTorch call it, and through the adaptors CUEMM_ADAPTORS names)
//   (either with --segments: the pool's segments right after it reached its
//   peak, by kind, and those with the most free bytes: where the peak's free
//   space lay, segments new since the previous peak marked; every pattern
//   takes --trace-growth and --segments)
//   (either with --compare: every bundled manager and the pool's options that
//   trade time for memory, one after another, as one table)
//   (either with --pace N|log: the pool's seals go by a clock that moves N ns
//   an operation, or by the log's own times, rather than the host's: the
//   same operations then seal at the same points in every run, see
//   cuemm/managers/detail/replay_clock.hpp)
//   cuemm plot LOG.csv OUT.svg               live memory over time, as SVG (replay_command.cpp)
//   cuemm bench [--managers ...] [--sizes ...] [--threads ...]
//                                            ns per allocate+free pair (bench_command.cpp)
//
// replay and random report the time, peak live bytes, peak reserved bytes (what
// the manager holds from the driver: the pool's segments, the async manager's
// driver pool's reserved bytes, else the driver's used memory since the start)
// and their ratio, the fragmentation overhead.
// `--manager best-fit` reports, for reference, what an ideal best fit would
// reserve (best_fit_reference.hpp).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bench_command.hpp"
#include "cuemm/cuemm.hpp"
#include "info_command.hpp"
#include "replay_command.hpp"
#include "tool_options.hpp"

namespace {

using namespace cuemm;

// To stderr with status 2 after a mistake; to stdout with status 0 when asked for (--help).
int usage(bool asked = false) {
  std::fprintf(asked ? stdout : stderr,
               "usage: cuemm info\n"
               "       cuemm settings\n"
               "       cuemm --version\n"
               "       cuemm replay LOG.csv [--manager pool|async|default|best-fit|PLUGIN.so] [--trace-growth]\n"
               "                    [--stream-ordered] [--segments] [--plot OUT.svg] [--pace host|log|NS]\n"
               "       cuemm replay LOG.csv --compare     (every bundled manager and the pool's options, as a table;\n"
               "                                           random takes --compare too)\n"
               "       cuemm random [--manager NAME] [--max-size 64M] [--live 1G] [--operations 100000] [--seed 1]\n"
               "                    [--threads 1] [--trace-growth] [--stream-ordered] [--segments] [--plot OUT.svg]\n"
               "                    [--pace host|NS]   (every pattern: the pool's seals by a clock of NS an operation)\n"
               "       cuemm random --pattern training [--manager NAME] [--layers 60] [--steps 30] [--seed 1]\n"
               "                    [--shapes varied|same|per-layer]\n"
               "                    [--threads 1] [--trace-growth]\n"
               "       cuemm random --pattern temporaries|inference [--manager NAME] [--operations 10000|300]\n"
               "                    [--seed 1] [--threads 1] [--trace-growth]\n"
               "       cuemm random --pattern queue [--manager NAME] [--max-size 1M] [--depth 200] [--operations 20000]\n"
               "                    [--seed 1] [--threads 1] [--trace-growth] [--stream-ordered]\n"
               "       cuemm plot LOG.csv OUT.svg\n"
               "%s",
               tool::kBenchUsage);
  return asked ? 0 : 2;
}

int run(std::vector<std::string> args) {
  if (args.empty()) return usage();
  if (std::find(args.begin(), args.end(), "--help") != args.end() || args[0] == "-h" || args[0] == "help")
    return usage(true);
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "--version") {
    tool::refuse_leftovers(args, "--version");
    std::printf("cuemm %s\n", version());
    return 0;
  }
  if (command == "info") return tool::info_command(args);
  if (command == "settings") return tool::settings_command(args);
  if (command == "replay" || command == "random") return tool::replay_command(command, std::move(args));
  if (command == "bench") return tool::bench_command(std::move(args));
  if (command == "plot") return tool::plot_command(args);
  std::fprintf(stderr, "cuemm: unknown command '%s'\n", command.c_str());
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuemm: %s\n", error.what());
    return 1;
  }
}
