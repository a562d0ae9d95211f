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
#include <utility>
#include <vector>

namespace cuemm {

enum class LoggedKind { Device, Host, Managed };

struct LoggedEvent {
  bool allocate;
  LoggedKind kind;
  std::uint64_t id;  // pairs a free with its allocation (matched by kind and address)
  std::size_t size;
  double time;       // the row's End column (else Start; RMM's: Time), in seconds; else its row number
  int device = 0;    // the Device ID column (RMM's logs have none: 0)
};

// Where a log does not hold together, and what read_memory_log() did about it.
struct MemoryLogGaps {
  // Skipped: a log that began after the allocation, say.
  std::size_t frees_of_unknown_addresses = 0;
  // An address allocated again while the log held it live: its free was
  // not logged, and is taken to have come just before (else the first
  // allocation would stay live to the end of a replay).
  std::size_t frees_inferred = 0;
  // Rows whose event type is none a replay knows (a log of another tool, a
  // misspelt "Aloc"): skipped; the first such type, to name in a warning.
  // RMM's failed allocations are not among them: see below.
  std::size_t rows_of_other_types = 0;
  std::string first_other_type;
  // RMM's failed allocations ("allocate failure"): they held nothing, so a
  // replay leaves them out, but they say the program asked for more than it got.
  std::size_t failed_allocations = 0;
  // Allocations of 0 bytes: they hold no memory (and managers refuse them),
  // so they and the frees of their addresses are left out.
  std::size_t zero_byte_allocations = 0;
  // The log ends in a row that does not read and has no newline, as a
  // process killed while writing it leaves: that row is left out.
  bool unfinished_last_row = false;
  // No time column (End or Start; RMM's Time), or no row with a time in it:
  // each event's time is its row's number.
  bool untimed = false;
  // Rows whose time field is empty (a writer that left timing out): a
  // replay does not need times, so they are read; each is drawn at the time
  // of the timed row before it (rows before any, at the first timed row's).
  std::size_t rows_without_time = 0;
};

// The Alloc/Free rows of a log (RMM's: allocate/free; either in any case),
// in order; other rows and frees of addresses the log never allocated (on that
// device) are skipped, and a free that an address's second allocation
// implies is added (both counted in `gaps`, where given).
// Columns may come in any order, the time columns may be missing. Throws
// InvalidArgument naming `source` (and the row) when the text is neither
// log.
std::vector<LoggedEvent> read_memory_log(std::istream& in, const std::string& source, MemoryLogGaps* gaps = nullptr);

// An SVG picture of the bytes in use over time, one line per kind present;
// `untimed`: the events' times are row numbers (MemoryLogGaps::untimed).
std::string memory_plot_svg(const std::vector<LoggedEvent>& events, bool untimed = false);

// One line of such a picture: bytes that hold from each point to the next.
struct PlotSeries {
  std::string label;                                   // the legend's, before its peak
  std::vector<std::pair<double, std::size_t>> points;  // (x, bytes), x not decreasing
  const char* colour = nullptr;                        // an SVG colour; else the next of a palette
};

// Lines over one x axis: seconds, drawn from the first point (ticks in s, ms
// or us), or, with `count_name` ("row", "operation"), a count labelled as it
// is. What `cuemm replay --plot` draws (live bytes and the manager's reserved
// bytes, operation by operation) and memory_plot_svg() is made of.
std::string plot_series_svg(const std::vector<PlotSeries>& series, const char* count_name = nullptr);

}  // namespace cuemm
