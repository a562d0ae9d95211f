// cuemm/memory/settings.hpp: the environment variables cuemm reads, and the
// ones that look like them but are not.
//
// A setting spelt wrong would otherwise be ignored without a word
// (CUEMM_POOL_INITAL_SIZE=8G runs with no initial size). The first manager a
// process makes (a context's, the Numba bridge's, the `cuemm` tool's) warns
// once on stderr of each such variable, naming the setting it resembles.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cuemm {

struct Setting {
  const char* name;     // CUEMM_POOL_INITIAL_SIZE, say
  const char* meaning;  // one line: what it sets
  // The bundled managers it is an option of ("pool", "pool, async"); null
  // where it does not belong to one manager (the driver, the adaptors).
  const char* managers = nullptr;

  // `managers` as a list: {"pool", "async"}; empty for null.
  std::vector<std::string_view> manager_names() const;
};

// Every environment variable the library and the simulated driver read.
std::span<const Setting> settings();

struct UnknownSetting {
  std::string name;       // as set: CUEMM_POOL_INITAL_SIZE, say
  std::string resembles;  // the nearest setting: CUEMM_POOL_INITIAL_SIZE
};

// The CUEMM_* variables set in the environment that cuemm does not read but
// that look like a setting: a family's prefix (CUEMM_POOL_, CUEMM_ASYNC_, ...)
// or a spelling within two edits of a setting's. Others (a build's or a
// script's CUEMM_COMMIT) are not settings and are left alone.
std::vector<UnknownSetting> unknown_settings();

// The settings set in the environment that are options of bundled managers
// other than `manager` (CUEMM_POOL_INITIAL_SIZE while contexts get "default"):
// harmless, but a sign the choice of manager is not what was meant. (`cuemm
// info` says so; a plugin library may read any of them, so it asks only of
// bundled managers.)
std::vector<std::string> settings_for_other_managers(std::string_view manager);

// Prints unknown_settings() to stderr, once per process.
void warn_of_unknown_settings();

}  // namespace cuemm
