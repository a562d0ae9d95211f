// info_command.cpp: `cuemm info`, what a process would run on and with.
#include "info_command.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuemm/cuemm.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "tool_options.hpp"

namespace cuemm::tool {

int info_command(const std::vector<std::string>& args) {
  refuse_leftovers(args, "info");
  std::printf("cuemm %s\n", version());
  const auto& driver = driver::Driver::get();
  std::printf("driver: %s (%s), CUDA %d\n", simulation::active() ? "simulated" : "cuda", driver.library_path().c_str(),
              driver.version());
  for (int i = 0; i < Device::count(); ++i) {
    Device& device = Device::get(i);
    const MemoryInfo memory = driver_memory_info(device.primary_context());
    std::printf("device %d: %s, %s total, %s free", i, device.name().c_str(), describe_bytes(memory.total).c_str(),
                describe_bytes(memory.free).c_str());
    // The devices whose memory its kernels can use once peer access is enabled (Note [Peer access]).
    std::string peers;
    for (int j = 0; j < Device::count(); ++j) {
      if (j != i && device.can_access_peer(Device::get(j))) peers += (peers.empty() ? "" : ", ") + std::to_string(j);
    }
    std::printf("%s\n", peers.empty() ? "" : ("; can access the memory of device(s) " + peers).c_str());
  }
  // What the pools wait for before they reuse a block freed without a stream (Note [Stream-safe reuse]).
  if (Device::count() > 0) {
    detail::ReuseEpochs epochs(&Device::get(0).primary_context());
    std::printf("pools reuse a freed block once %s\n",
                epochs.covers_every_stream()
                    ? "the work queued before its free has run, on every stream (cuCtxRecordEvent)"
                    : "the legacy and blocking streams' work queued before its free has run (no cuCtxRecordEvent: "
                      "synchronise a non-blocking stream before freeing what it uses)");
    epochs.retire();  // (its probe's event)
  }
  const std::string manager = memory_manager_name();
  const std::vector<std::string> bundled_names = bundled_memory_managers();
  const bool plugin = std::find(bundled_names.begin(), bundled_names.end(), manager) == bundled_names.end();
  std::string bundled;
  for (const auto& name : bundled_names) bundled += (bundled.empty() ? "" : ", ") + name;
  std::printf("manager for new contexts: %s; bundled: %s\n", manager.c_str(), bundled.c_str());
  // A bad setting of the manager's or the adaptors' is an error here too, as
  // it would be at a context's first allocation.
  const std::string adaptors = adaptors_from_environment();
  plugin ? (void)adaptor_names(adaptors) : check_memory_manager_settings(manager);
  std::printf("adaptors: %s\n", adaptors.empty() ? "none" : adaptors.c_str());
  // The options a bundled manager takes from the environment.
  const auto yes_no = [](bool on) { return on ? "yes" : "no"; };
  if (manager == "pool") {
    const PoolOptions pool = PoolOptions::from_environment();
    std::printf("pool options: initial size %s; maximum size %s; thread caches %s; segments of their own "
                "from %s; expandable %s; assembled blocks %s; split spares %s; past its peak while the GPU is "
                "busy by up to %.3f of it; pinned host pool %s\n",
                describe_bytes(pool.initial_size).c_str(),
                pool.maximum_size ? describe_bytes(pool.maximum_size).c_str() : "the device's",
                pool.thread_cache_size ? (describe_bytes(pool.thread_cache_size) + " each").c_str() : "off",
                describe_bytes(pool.dedicated_size).c_str(), yes_no(pool.expandable), yes_no(pool.assemble_blocks),
                yes_no(pool.split_spares), pool.busy_overshoot, yes_no(pool.pinned_host_pool));
  } else if (manager == "async") {
    const AsyncOptions async = AsyncOptions::from_environment();
    std::printf("async options: release threshold %s; exportable %s; pinned host pool %s\n",
                async.release_threshold == UINT64_MAX ? "none (keeps every freed byte)"
                                                      : describe_bytes(async.release_threshold).c_str(),
                yes_no(async.exportable), yes_no(async.pinned_host_pool));
  }
  std::string set;
  for (const Setting& setting : settings()) {
    if (const char* value = std::getenv(setting.name))
      set += (set.empty() ? "" : ", ") + std::string(setting.name) + "=" + value;
  }
  std::printf("settings in the environment: %s\n", set.empty() ? "none" : set.c_str());
  // Options of a bundled manager that new contexts do not get: most often a
  // pool's size set while CUEMM_MEMORY_MANAGER was left out. (A plugin may
  // read any of them.)
  const std::vector<std::string> unused = plugin ? std::vector<std::string>{} : settings_for_other_managers(manager);
  if (!unused.empty()) {
    std::string names;
    for (const auto& name : unused) names += (names.empty() ? "" : ", ") + name;
    std::printf("settings of other managers, unused by %s: %s\n", manager.c_str(), names.c_str());
    std::fprintf(stderr, "cuemm: %s set, but new contexts get the manager '%s', which does not read %s\n",
                 names.c_str(), manager.c_str(), unused.size() == 1 ? "it" : "them");
  }
  warn_of_unknown_settings();  // (on stderr, as wherever a manager is made)
  return 0;
}

int settings_command(const std::vector<std::string>& args) {
  refuse_leftovers(args, "settings");
  // A column of the bundled managers each setting is an option of (blank: not one manager's).
  std::printf("%-34s %-12s %s\n", "variable", "option of", "what it sets (= its value here)");
  for (const Setting& setting : settings()) {
    const char* value = std::getenv(setting.name);
    std::printf("%-34s %-12s %s%s\n", setting.name, setting.managers ? setting.managers : "", setting.meaning,
                value ? (std::string(" = ") + value).c_str() : "");
  }
  warn_of_unknown_settings();
  return 0;
}

}  // namespace cuemm::tool
