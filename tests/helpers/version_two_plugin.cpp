// A plugin library whose manager declares interface version 2: cuemm must
// refuse to load it, naming both versions.
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/registry.hpp"

namespace {
class VersionTwoManager : public cuemm::DefaultMemoryManager {
 public:
  using DefaultMemoryManager::DefaultMemoryManager;
  int interface_version() const override { return 2; }
};
}  // namespace

CUEMM_EXPORT_MEMORY_MANAGER(VersionTwoManager)
