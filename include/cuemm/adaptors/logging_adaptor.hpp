// cuemm/adaptors/logging_adaptor.hpp: a CSV log of every allocation and release.
//
// The columns are those of the EMM proposal's example log:
//   Event Type,Device ID,Address,Stream,Size (bytes),Free Memory,Total Memory,
//   Current Allocs,Start,End,Elapsed,Location
// Event Type is Alloc or Free (HostAlloc/HostFree, ManagedAlloc/ManagedFree
// for other kinds); Size is given for frees too, so a log can be replayed
// (`cuemm replay`). Stream is 0 for the plugin interface's calls, which have
// none, and the stream's handle in hex (0x2: the per-thread default stream)
// for stream-ordered ones (StreamOrderedAllocator). Start and End are seconds on the adaptors' clock, Elapsed
// is End - Start. Free and Total Memory are the manager's memory info when
// asked for (it costs a driver call per event), else 0.
//
// To the file named by CUEMM_LOG_FILE (with CUEMM_ADAPTORS=log), to a path, or
// to any std::ostream. Lines are written whole under a lock, in the order of the
// events: a free's row comes before the next allocation of its address,
// whichever threads made them, and Current Allocs counts the rows above. A log to a file
// is flushed when the adaptor goes, by flush(), and at exit (contexts, and so
// their managers, live until the process ends).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "cuemm/adaptors/manager_adaptor.hpp"

namespace cuemm {

struct LoggingOptions {
  bool memory_info = false;  // fill Free/Total Memory (CUEMM_LOG_MEMORY_INFO=1)
};

class LoggingAdaptor : public ManagerAdaptor {
 public:
  // Logs to `path` (truncated). InvalidArgument when it cannot be opened.
  LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, const std::string& path,
                 LoggingOptions options = {});
  // Logs to `stream`, which must outlive the adaptor.
  LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::ostream& stream,
                 LoggingOptions options = {});
  ~LoggingAdaptor() override;  // flushes and closes the log
  void flush();
  // The log so far, header first: a file's read back (StateError naming it
  // where it no longer reads), a std::ostringstream's text. NotSupported for
  // other streams, which cannot be read back.
  std::string text();

  static const char* header() noexcept;

 private:
  struct Log;
  LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::shared_ptr<Log> log);
  std::shared_ptr<Log> log_;
};

}  // namespace cuemm
