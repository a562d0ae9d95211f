#include "cuemm/memory/settings.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>

extern char** environ;

namespace cuemm {
namespace {

constexpr std::array kSettings{
    Setting{"CUEMM_DRIVER", "auto, cuda or sim: which driver runs"},
    Setting{"CUEMM_MEMORY_MANAGER", "the manager of new contexts: a bundled name or a plugin library's path"},
    Setting{"CUEMM_ADAPTORS", "adaptors around it: statistics, log, tracking, limit"},
    Setting{"CUEMM_LIMIT", "the limit adaptor's byte cap"},
    Setting{"CUEMM_LOG_FILE", "the log adaptor's CSV file (adds the adaptor)"},
    Setting{"CUEMM_LOG_MEMORY_INFO", "1: the log's lines carry the manager's memory info"},
    Setting{"CUEMM_LOG", "1: the Numba bridge keeps a log in memory"},
    Setting{"CUEMM_MAX_PENDING_DEALLOCS_COUNT",
            "deferred frees flushed past this many (the default manager's; any one's host and managed)"},
    Setting{"CUEMM_MAX_PENDING_DEALLOCS_RATIO", "... or past this fraction of the device's memory"},
    Setting{"CUEMM_POOL_INITIAL_SIZE", "the pool's first segment, made at initialize()", "pool"},
    Setting{"CUEMM_POOL_MAXIMUM_SIZE", "the most the pool takes from the driver", "pool"},
    Setting{"CUEMM_POOL_THREAD_CACHE_SIZE", "what a thread's cache may keep; 0 turns the caches off", "pool"},
    Setting{"CUEMM_POOL_DEDICATED_SIZE", "blocks this large get segments of their own", "pool"},
    Setting{"CUEMM_POOL_SMALL_BLOCKS_APART", "0: small blocks share the large blocks' segments", "pool"},
    Setting{"CUEMM_POOL_EXPANDABLE", "1: one range of addresses, mapped page by page", "pool"},
    Setting{"CUEMM_POOL_ASSEMBLE_BLOCKS", "1: near the peak, blocks made of mapped pages' free ends", "pool"},
    Setting{"CUEMM_POOL_SPLIT_SPARES", "1: spares carved for large sizes that recur", "pool"},
    Setting{"CUEMM_POOL_CHECK_FREES", "1: the raw interface refuses bad frees", "pool"},
    Setting{"CUEMM_POOL_BUSY_OVERSHOOT", "how far past its peak the pool grows rather than wait for the GPU", "pool"},
    Setting{"CUEMM_PINNED_HOST_POOL", "0: pinned and mapped host memory straight from the driver", "pool, async"},
    Setting{"CUEMM_PINNED_MAXIMUM_CACHED", "released pinned blocks the pinned host pool keeps once idle", "pool, async"},
    Setting{"CUEMM_ASYNC_RELEASE_THRESHOLD", "bytes the driver's pool keeps past a synchronisation", "async"},
    Setting{"CUEMM_ASYNC_EXPORTABLE", "1: the driver's pool is made exportable (IPC)", "async"},
    Setting{"CUEMM_SIM_DRIVER", "the simulated driver library to load"},
    Setting{"CUEMM_SIM_DEVICES", "the simulated driver's device count"},
    Setting{"CUEMM_SIM_MEMORY", "each simulated device's memory"},
    Setting{"CUEMM_SIM_PEER_ACCESS", "1: simulated devices are peers"},
    Setting{"CUEMM_SIM_FAULTS", "driver calls the simulated driver fails, for tests"},
    Setting{"CUEMM_SIM_EARLY_MEMSETS", "0: simulated memsets wait for the stream's earlier work"},
};

// Families in which any other name is a misspelling. (CUEMM_SIM_ is left out:
// builds and tests pass paths such as CUEMM_SIM_DRIVER_PATH.)
constexpr std::array<std::string_view, 8> kFamilies{"CUEMM_POOL_", "CUEMM_ASYNC_",   "CUEMM_PINNED_",
                                                    "CUEMM_LOG_",  "CUEMM_LIMIT_",   "CUEMM_MAX_PENDING_",
                                                    "CUEMM_MEMORY_", "CUEMM_ADAPTOR"};

// Edits (insert, delete, replace, swap of neighbours) that turn `a` into `b`.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      const bool swapped = i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1];
      if (swapped) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::span<const Setting> settings() { return kSettings; }

std::vector<UnknownSetting> unknown_settings() {
  std::vector<UnknownSetting> unknown;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view assignment(*entry);
    const std::string_view name = assignment.substr(0, assignment.find('='));
    if (!name.starts_with("CUEMM_")) continue;
    const Setting* nearest = nullptr;
    std::size_t distance = 0;
    for (const Setting& setting : kSettings) {
      const std::size_t edits = edit_distance(name, setting.name);
      if (!nearest || edits < distance) nearest = &setting, distance = edits;
    }
    if (distance == 0) continue;
    const bool in_a_family = std::any_of(kFamilies.begin(), kFamilies.end(),
                                         [&](std::string_view family) { return name.starts_with(family); });
    if (in_a_family || distance <= 2) unknown.push_back({std::string(name), nearest->name});
  }
  std::sort(unknown.begin(), unknown.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return unknown;
}

std::vector<std::string_view> Setting::manager_names() const {
  std::vector<std::string_view> names;
  for (std::string_view rest = managers ? managers : ""; !rest.empty();) {
    const std::size_t comma = rest.find(", ");
    names.push_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
  }
  return names;
}

std::vector<std::string> settings_for_other_managers(std::string_view manager) {
  std::vector<std::string> others;
  for (const Setting& setting : kSettings) {
    const char* value = std::getenv(setting.name);
    if (!setting.managers || !value || !*value) continue;  // (set empty reads as unset)
    const auto names = setting.manager_names();
    if (std::find(names.begin(), names.end(), manager) == names.end()) others.push_back(setting.name);
  }
  return others;
}

void warn_of_unknown_settings() {
  static std::once_flag warned;
  std::call_once(warned, [] {
    for (const UnknownSetting& setting : unknown_settings())
      std::fprintf(stderr, "cuemm: %s is not a setting cuemm reads (did you mean %s?); it is ignored\n",
                   setting.name.c_str(), setting.resembles.c_str());
  });
}

}  // namespace cuemm
