#include "cuemm/adaptors/logging_adaptor.hpp"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <mutex>

#include "cuemm/error.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "util/at_exit.hpp"

namespace cuemm {

const char* LoggingAdaptor::header() noexcept {
  return "Event Type,Device ID,Address,Stream,Size (bytes),Free Memory,Total Memory,Current Allocs,Start,End,"
         "Elapsed,Location";
}

struct LoggingAdaptor::Log : AllocationObserver {
  BlockingAwareMutex mutex;
  std::unique_ptr<std::ofstream> file;
  std::ostream* out;  // null once the adaptor is gone
  LoggingOptions options;
  int device = 0;
  BaseMemoryManager* manager = nullptr;  // for memory info; null once the adaptor is gone
  std::atomic<long long> current{0};

  Log(std::ostream* out_, LoggingOptions options_) : out(out_), options(options_) {}

  static const char* event_name(MemoryKind kind, bool allocation) {
    switch (kind) {
      case MemoryKind::Device: return allocation ? "Alloc" : "Free";
      case MemoryKind::Managed: return allocation ? "ManagedAlloc" : "ManagedFree";
      case MemoryKind::Pinned:
      case MemoryKind::Mapped: return allocation ? "HostAlloc" : "HostFree";
    }
    return "?";
  }

  void write(const AllocationRecord& record, bool allocation) noexcept {
    const long long allocs = allocation ? current.fetch_add(1) + 1 : current.fetch_sub(1) - 1;
    MemoryInfo info;
    std::lock_guard lock(mutex);
    if (!out) return;  // an event that was under way as the adaptor went
    if (options.memory_info && manager) {
      try {
        info = manager->get_memory_info();
      } catch (...) {
      }
    }
    // A location with a comma or quote is quoted, as CSV wants.
    std::string location = record.call_site;
    if (location.find_first_of(",\"") != std::string::npos) {
      std::string quoted = "\"";
      for (char c : location) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      location = quoted + "\"";
    }
    char line[512];
    std::snprintf(line, sizeof line, "%s,%d,0x%" PRIxPTR ",0,%zu,%zu,%zu,%lld,%.9g,%.9g,%.9g,", event_name(record.kind, allocation),
                  device, record.address, record.size, info.free, info.total, allocs, record.start, record.end,
                  record.end - record.start);
    *out << line << location << '\n';
  }
  void allocated(const AllocationRecord& record) noexcept override { write(record, true); }
  void released(const AllocationRecord& record) noexcept override { write(record, false); }
  void reset() noexcept override { current = 0; }
};

namespace {
LoggingOptions with_environment(LoggingOptions options) {
  if (const char* text = std::getenv("CUEMM_LOG_MEMORY_INFO"); text && std::string(text) == "1")
    options.memory_info = true;
  return options;
}
}  // namespace

LoggingAdaptor::LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                               const std::string& path, LoggingOptions options)
    : LoggingAdaptor(context, std::move(upstream), [&] {
        auto file = std::make_unique<std::ofstream>(path, std::ios::trunc);
        if (!*file) throw InvalidArgument("cannot open the allocation log '" + path + "' for writing");
        auto log = std::make_shared<Log>(file.get(), with_environment(options));
        log->file = std::move(file);
        util::at_exit_while_alive<Log>(log, [](Log& open) {  // (its adaptor lives until exit)
          std::lock_guard lock(open.mutex);
          if (open.out) open.out->flush();
        });
        return log;
      }()) {}

LoggingAdaptor::LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::ostream& stream,
                               LoggingOptions options)
    : LoggingAdaptor(context, std::move(upstream), std::make_shared<Log>(&stream, with_environment(options))) {}

LoggingAdaptor::LoggingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                               std::shared_ptr<Log> log)
    : ManagerAdaptor(context, std::move(upstream), log), log_(std::move(log)) {
  log_->manager = &this->upstream();
  if (context) log_->device = context->device().id();
  *log_->out << header() << '\n';
}

LoggingAdaptor::~LoggingAdaptor() {
  std::lock_guard lock(log_->mutex);
  log_->out->flush();
  log_->out = nullptr;
  log_->manager = nullptr;
  log_->file.reset();  // closes the file
}

void LoggingAdaptor::flush() {
  std::lock_guard lock(log_->mutex);
  log_->out->flush();
}

}  // namespace cuemm
