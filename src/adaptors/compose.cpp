#include "cuemm/adaptors/compose.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "cuemm/adaptors/limiting_adaptor.hpp"
#include "cuemm/adaptors/logging_adaptor.hpp"
#include "cuemm/adaptors/statistics_adaptor.hpp"
#include "cuemm/adaptors/tracking_adaptor.hpp"
#include "cuemm/error.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "util/environment.hpp"

namespace cuemm {

namespace {
std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// CUEMM_LOG_FILE, where "%p" becomes the process id (so that processes
// started with the same environment keep logs of their own), and a device
// suffix for devices other than 0.
std::string log_path(Context* context) {
  std::string path = environment("CUEMM_LOG_FILE");
  if (path.empty()) path = "cuemm_log.csv";
  for (auto at = path.find("%p"); at != std::string::npos; at = path.find("%p", at))
    path.replace(at, 2, std::to_string(::getpid()));
  const int device = context ? context->device().id() : 0;
  if (device == 0) return path;
  const auto dot = path.rfind('.');
  const std::string suffix = ".device" + std::to_string(device);
  return dot == std::string::npos || dot < path.rfind('/') + 1 ? path + suffix : path.insert(dot, suffix);
}

// `spec` without its spaces: "statistics, log" names the same adaptors as
// "statistics,log" (no adaptor's name has one).
std::string without_spaces(std::string spec) {
  std::erase_if(spec, [](char c) { return c == ' ' || c == '\t'; });
  return spec;
}
}  // namespace

std::string adaptors_from_environment() {
  std::string spec = without_spaces(environment("CUEMM_ADAPTORS"));
  // A log file or a limit set alone asks for its adaptor (outermost, in that order).
  for (const auto& [variable, adaptor] : {std::pair{"CUEMM_LOG_FILE", "log"}, std::pair{"CUEMM_LIMIT", "limit"}}) {
    const bool named = ("," + spec + ",").find("," + std::string(adaptor) + ",") != std::string::npos;
    if (!environment(variable).empty() && !named) spec += (spec.empty() ? "" : ",") + std::string(adaptor);
  }
  return spec;
}

std::vector<std::string> adaptor_names(const std::string& spec) {
  static constexpr const char* kKnown[] = {"statistics", "log", "tracking", "limit"};
  std::vector<std::string> names;
  std::stringstream listed(without_spaces(spec));
  for (std::string name; std::getline(listed, name, ',');) {
    if (name.empty()) continue;
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown))
      throw InvalidArgument("CUEMM_ADAPTORS: unknown adaptor '" + name + "' (known: statistics, log, tracking, limit)");
    // Each once: two logs would write one file from two writers, and a
    // second of the others adds only cost.
    if (std::find(names.begin(), names.end(), name) != names.end())
      throw InvalidArgument("CUEMM_ADAPTORS: the adaptor '" + name + "' is named twice in '" + spec + "'");
    names.push_back(name);
  }
  if (std::find(names.begin(), names.end(), "limit") != names.end() && !util::byte_size_from_environment("CUEMM_LIMIT"))
    throw InvalidArgument("the limit adaptor needs CUEMM_LIMIT, a byte count such as 2G (it is not set)");
  return names;
}

std::unique_ptr<BaseMemoryManager> wrap_with_adaptors(Context* context, std::unique_ptr<BaseMemoryManager> manager,
                                                      const std::string& spec) {
  for (const std::string& name : adaptor_names(spec)) {  // (all checked before any is made)
    if (name == "statistics") {
      manager = std::make_unique<StatisticsAdaptor>(context, std::move(manager));
    } else if (name == "log") {
      // The version probe (no context) writes no log.
      if (context) manager = std::make_unique<LoggingAdaptor>(context, std::move(manager), log_path(context));
    } else if (name == "tracking") {
      manager = std::make_unique<TrackingAdaptor>(context, std::move(manager));
    } else {
      manager = std::make_unique<LimitingAdaptor>(context, std::move(manager),
                                                  util::byte_size_from_environment("CUEMM_LIMIT").value());
    }
  }
  return manager;
}

}  // namespace cuemm
