// cuemm/adaptors/memory_log.hpp: reading back the CSV log that LoggingAdaptor
// writes (or one of RMM's logging_resource_adaptor), and drawing it. The
// `cuemm` tool replays and plots logs with these, and Python's cuemm.plot()
// draws the running process's log.
//
//   std::ifstream file("alloc.csv");
//   auto events = cuemm::read_memory_log(file, "alloc.csv");
//   std::ofstream("memory.svg") << cuemm::memory_plot_svg(events);
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace cuemm {

enum class LoggedKind { Device, Host, Managed };

struct LoggedEvent {
  bool allocate;
  LoggedKind kind;
  std::uint64_t id;  // pairs a free with its allocation (matched by kind and address)
  std::size_t size;
  double time;       // the row's End column (RMM's: Time), in seconds
  int device = 0;    // the Device ID column (RMM's logs have none: 0)
};

// The Alloc/Free rows of a log (RMM's: allocate/deallocate), in order;
// other rows and frees of addresses the log never allocated (on that
// device) are skipped.
// Throws InvalidArgument naming `source` (and the row) when the text is
// neither log.
std::vector<LoggedEvent> read_memory_log(std::istream& in, const std::string& source);

// An SVG picture of the bytes in use over time, one line per kind present.
std::string memory_plot_svg(const std::vector<LoggedEvent>& events);

}  // namespace cuemm
