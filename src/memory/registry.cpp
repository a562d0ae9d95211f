#include "cuemm/memory/registry.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "cuemm/adaptors/compose.hpp"
#include "cuemm/error.hpp"
#include "cuemm/managers/async_memory_manager.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/settings.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {
namespace {

struct Registry {
  BlockingAwareMutex mutex;
  MemoryManagerFactory chosen;  // from set_memory_manager(); empty means default
  std::string chosen_name = "default";
  std::map<std::string, MemoryManagerFactory> bundled;
  MemoryManagerFactory from_environment;  // resolved CUEMM_MEMORY_MANAGER, cached
  std::string environment_name;
  int contexts = 0;
  bool warned_ignored = false;
};

Registry& registry() {
  static Registry* table = [] {
    auto* created = new Registry();  // never destroyed: contexts may outlive statics
    created->bundled["default"] = [](Context* context) { return std::make_unique<DefaultMemoryManager>(context); };
    created->bundled["pool"] = [](Context* context) { return std::make_unique<PoolMemoryManager>(context); };
    created->bundled["async"] = [](Context* context) { return std::make_unique<AsyncMemoryManager>(context); };
    return created;
  }();
  return *table;
}

std::string environment_choice() {
  const char* value = std::getenv("CUEMM_MEMORY_MANAGER");
  return value ? value : "";
}

std::string bundled_names(const Registry& table) {
  std::string names;
  for (const auto& [name, factory] : table.bundled) names += (names.empty() ? "" : ", ") + name;
  return names;
}

// NBEP 7: the version is read from an instance made without a context.
void check_interface_version(const MemoryManagerFactory& factory, const std::string& what) {
  std::unique_ptr<BaseMemoryManager> probe = factory(nullptr);
  if (!probe) throw PluginError("memory manager " + what + " made no manager");
  const int version = probe->interface_version();
  if (version != kMemoryManagerInterfaceVersion) {
    throw PluginError("memory manager " + what + " implements EMM plugin interface version " +
                      std::to_string(version) + ", but cuemm requires version " +
                      std::to_string(kMemoryManagerInterfaceVersion));
  }
}

MemoryManagerFactory load_plugin_library(const std::string& path) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process
  if (!library) {
    const char* reason = dlerror();
    throw PluginError("cannot load memory manager plugin '" + path + "': " + (reason ? reason : "unknown error"));
  }
  auto create = reinterpret_cast<cuemm_memory_manager_factory_t>(dlsym(library, "cuemm_create_memory_manager"));
  if (!create) {
    dlclose(library);
    throw PluginError("memory manager plugin '" + path +
                      "' does not export cuemm_create_memory_manager "
                      "(write CUEMM_EXPORT_MEMORY_MANAGER(YourManager) in it)");
  }
  return [create](Context* context) { return std::unique_ptr<BaseMemoryManager>(create(context)); };
}

// Resolves CUEMM_MEMORY_MANAGER once. Caller holds the registry lock.
const MemoryManagerFactory& environment_factory(Registry& table, const std::string& choice) {
  if (table.from_environment && table.environment_name == choice) return table.from_environment;
  MemoryManagerFactory factory;
  std::string name = choice;
  if (auto it = table.bundled.find(choice); it != table.bundled.end()) {
    factory = it->second;
  } else if (names_a_plugin_library(choice)) {
    factory = load_plugin_library(choice);
  } else {
    throw PluginError("CUEMM_MEMORY_MANAGER='" + choice + "' is neither a bundled manager (" + bundled_names(table) +
                      ") nor the path of a plugin library");
  }
  check_interface_version(factory, "'" + choice + "' (CUEMM_MEMORY_MANAGER)");
  table.from_environment = std::move(factory);
  table.environment_name = name;
  return table.from_environment;
}

}  // namespace

void set_memory_manager(MemoryManagerFactory factory) {
  if (!factory) throw InvalidArgument("set_memory_manager: the factory is empty");
  Registry& table = registry();
  const std::string choice = environment_choice();
  if (!choice.empty()) {
    std::lock_guard lock(table.mutex);
    if (!table.warned_ignored) {
      std::fprintf(stderr,
                   "cuemm: CUEMM_MEMORY_MANAGER=%s is set, so set_memory_manager() is ignored\n", choice.c_str());
      table.warned_ignored = true;
    }
    return;
  }
  check_interface_version(factory, "passed to set_memory_manager()");
  std::lock_guard lock(table.mutex);
  if (table.contexts > 0) {
    throw StateError("set_memory_manager() must be called before the first context is created (" +
                     std::to_string(table.contexts) + " context(s) exist already)");
  }
  table.chosen = std::move(factory);
  table.chosen_name = "custom";
}

std::string memory_manager_name() {
  Registry& table = registry();
  const std::string choice = environment_choice();
  std::lock_guard lock(table.mutex);
  if (!choice.empty()) return table.bundled.count(choice) ? choice : "plugin:" + choice;
  return table.chosen_name;
}

std::vector<std::string> bundled_memory_managers() {
  Registry& table = registry();
  std::lock_guard lock(table.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : table.bundled) names.push_back(name);
  return names;
}

std::unique_ptr<BaseMemoryManager> make_bundled_memory_manager(const std::string& name, Context* context) {
  warn_of_unknown_settings();
  Registry& table = registry();
  MemoryManagerFactory factory;
  {
    std::lock_guard lock(table.mutex);
    auto it = table.bundled.find(name);
    if (it == table.bundled.end())
      throw InvalidArgument("no bundled memory manager is called '" + name + "' (there are: " + bundled_names(table) +
                            ")");
    factory = it->second;
  }
  return factory(context);
}

void check_memory_manager_settings(const std::string& name) {
  make_bundled_memory_manager(name, nullptr);  // (with no context, as the version probe: its options read)
  adaptor_names(adaptors_from_environment());
}

bool names_a_plugin_library(const std::string& value) {
  return value.find('/') != std::string::npos || value.ends_with(".so");
}

std::unique_ptr<BaseMemoryManager> make_memory_manager(const std::string& name_or_path, Context* context) {
  if (!names_a_plugin_library(name_or_path)) return make_bundled_memory_manager(name_or_path, context);
  warn_of_unknown_settings();
  const MemoryManagerFactory factory = load_plugin_library(name_or_path);
  check_interface_version(factory, "'" + name_or_path + "'");
  std::unique_ptr<BaseMemoryManager> manager = factory(context);
  if (!manager) throw PluginError("memory manager plugin '" + name_or_path + "' made no manager");
  return manager;
}

namespace detail {

std::unique_ptr<BaseMemoryManager> create_memory_manager(Context& context) {
  warn_of_unknown_settings();
  Registry& table = registry();
  const std::string choice = environment_choice();
  std::lock_guard lock(table.mutex);
  const MemoryManagerFactory& factory = !choice.empty() ? environment_factory(table, choice)
                                        : table.chosen  ? table.chosen
                                                        : table.bundled.at("default");
  std::unique_ptr<BaseMemoryManager> manager = factory(&context);
  if (!manager) throw PluginError("the memory manager factory returned no manager");
  if (const std::string adaptors = adaptors_from_environment(); !adaptors.empty())
    manager = wrap_with_adaptors(&context, std::move(manager), adaptors);
  ++table.contexts;
  return manager;
}

void register_bundled_memory_manager(const std::string& name, MemoryManagerFactory factory) {
  Registry& table = registry();
  std::lock_guard lock(table.mutex);
  table.bundled[name] = std::move(factory);
}

}  // namespace detail
}  // namespace cuemm
