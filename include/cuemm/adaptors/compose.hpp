// cuemm/adaptors/compose.hpp: adaptors chosen by name, for every context.
//
//   CUEMM_MEMORY_MANAGER=pool CUEMM_ADAPTORS=statistics,log CUEMM_LOG_FILE=alloc.csv ./app
//
// Names, innermost first: statistics, log (to CUEMM_LOG_FILE, default
// cuemm_log.csv, where %p stands for the process id; device N > 0 logs to
// name.deviceN.csv), tracking, limit (at
// CUEMM_LIMIT bytes, such as 2G). Setting CUEMM_LOG_FILE alone adds log;
// CUEMM_LIMIT alone adds limit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuemm/memory/memory_manager.hpp"

namespace cuemm {

// The adaptors named in `spec` (comma-separated, innermost first; spaces are
// ignored), each once. InvalidArgument names an unknown adaptor, one named
// twice, or the limit without a valid CUEMM_LIMIT.
std::vector<std::string> adaptor_names(const std::string& spec);

// Wraps `manager` in the adaptors named in `spec` (InvalidArgument as
// adaptor_names() says).
std::unique_ptr<BaseMemoryManager> wrap_with_adaptors(Context* context, std::unique_ptr<BaseMemoryManager> manager,
                                                      const std::string& spec);

// The spec from CUEMM_ADAPTORS, CUEMM_LOG_FILE and CUEMM_LIMIT ("" for none).
std::string adaptors_from_environment();

}  // namespace cuemm
