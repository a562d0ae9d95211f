// cuemm/memory/registry.hpp: choosing the memory manager.
//
// One manager implementation serves every context of the process, chosen
// before the first context exists:
//
//   cuemm::set_memory_manager<MyManager>();          // from code, or
//   CUEMM_MEMORY_MANAGER=default ./app                // a bundled manager, or
//   CUEMM_MEMORY_MANAGER=/path/libmymanager.so ./app  // a plugin library
//
// When CUEMM_MEMORY_MANAGER is set it wins: set_memory_manager() warns on
// stderr and is ignored. A plugin library exports the C-linkage factory
// `cuemm_create_memory_manager`; CUEMM_EXPORT_MEMORY_MANAGER(Type) writes it.
// Every manager's interface_version() is checked against
// kMemoryManagerInterfaceVersion before use.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuemm/memory/memory_manager.hpp"

namespace cuemm {

// Makes the manager of a context; called with nullptr once to read the version.
using MemoryManagerFactory = std::function<std::unique_ptr<BaseMemoryManager>(Context*)>;

// Registers the factory for every context created from now on. PluginError on
// an interface-version mismatch; StateError once a context exists.
void set_memory_manager(MemoryManagerFactory factory);

template <typename Manager>
void set_memory_manager() {
  set_memory_manager([](Context* context) { return std::make_unique<Manager>(context); });
}

// "default", "plugin:/path/lib.so", a bundled name, or "custom" (set from code).
std::string memory_manager_name();

// The bundled managers CUEMM_MEMORY_MANAGER accepts by name.
std::vector<std::string> bundled_memory_managers();

// A new instance of the bundled manager `name` for `context` (the Numba bridge
// makes its own); InvalidArgument lists the bundled names for an unknown one.
std::unique_ptr<BaseMemoryManager> make_bundled_memory_manager(const std::string& name, Context* context);

// Checks what the bundled manager `name` and the environment's adaptors would
// read from the environment, making nothing on a device: InvalidArgument
// names a bad setting. (The Numba bridge asks at use_cuemm_for_numba(), rather
// than fail at Numba's first allocation.)
void check_memory_manager_settings(const std::string& name);

// Whether CUEMM_MEMORY_MANAGER's `value` names a plugin library (it has a '/'
// or ends in .so) rather than a bundled manager.
bool names_a_plugin_library(const std::string& value);

// As make_bundled_memory_manager(), or, for the path of a plugin library, a
// new instance of the manager it makes, its interface version checked first
// (PluginError otherwise). The `cuemm` tool replays and benchmarks with it.
std::unique_ptr<BaseMemoryManager> make_memory_manager(const std::string& name_or_path, Context* context);

namespace detail {
// Used by Context: makes its manager and records that a context exists.
std::unique_ptr<BaseMemoryManager> create_memory_manager(Context& context);
// Registers a bundled manager name (managers library, at first registry use).
void register_bundled_memory_manager(const std::string& name, MemoryManagerFactory factory);
}  // namespace detail

}  // namespace cuemm

// The symbol a plugin library exports.
extern "C" {
typedef cuemm::BaseMemoryManager* (*cuemm_memory_manager_factory_t)(cuemm::Context*);
}

#define CUEMM_EXPORT_MEMORY_MANAGER(Type)                                                   \
  extern "C" __attribute__((visibility("default"))) cuemm::BaseMemoryManager*               \
  cuemm_create_memory_manager(cuemm::Context* context) {                                    \
    return new Type(context);                                                               \
  }
