#include "cuemm/adaptors/logging_adaptor.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>

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
  std::string path;  // the file's, absolute
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

  // Each line is formatted before the lock, by its own thread: formatting
  // took most of an event's time (printf's `%.9g`, three times a line: 4-5 us
  // an allocate+free pair, simulated), and under the lock threads waited for
  // each other's. Only memory info, opt-in, is read under it.
  void write(const AllocationRecord& record, bool allocation) noexcept {
    const long long allocs = allocation ? current.fetch_add(1) + 1 : current.fetch_sub(1) - 1;
    Line line;
    if (!options.memory_info) line.format(record, allocation, device, {}, allocs);
    std::lock_guard lock(mutex);
    if (!out) return;  // an event that was under way as the adaptor went
    if (options.memory_info) {
      MemoryInfo info;
      if (manager) {
        try {
          info = manager->get_memory_info();
        } catch (...) {
        }
      }
      line.format(record, allocation, device, info, allocs);
    }
    out->write(line.text, line.length);
    write_location(record.call_site);
    out->put('\n');
  }
  // A location with a comma or quote is quoted, as CSV wants.
  void write_location(const std::string& location) {
    if (location.find_first_of(",\"") == std::string::npos) {
      *out << location;
      return;
    }
    out->put('"');
    for (char c : location) {
      if (c == '"') out->put('"');
      out->put(c);
    }
    out->put('"');
  }

  // One line up to its location: text that fits in `text`, with std::to_chars
  // (what printf would print for `%.9g`, at a fraction of its cost).
  struct Line {
    char text[256];
    std::size_t length = 0;

    void format(const AllocationRecord& record, bool allocation, int device, const MemoryInfo& info,
                long long allocs) noexcept {
      char* at = text;
      char* const end = text + sizeof text;
      auto put = [&](std::string_view part) {
        const std::size_t n = std::min(part.size(), static_cast<std::size_t>(end - at));
        at = std::copy_n(part.data(), n, at);
      };
      auto number = [&](auto value, auto... how) {
        const auto [next, error] = std::to_chars(at, end, value, how...);
        if (error == std::errc()) at = next;
      };
      put(event_name(record.kind, allocation));
      put(",");
      number(device);
      put(",0x");
      number(record.address, 16);
      if (record.stream) {  // a stream-ordered call's stream, as its handle
        put(",0x");
        number(*record.stream, 16);
        put(",");
      } else {
        put(",0,");
      }
      number(record.size);
      put(",");
      number(info.free);
      put(",");
      number(info.total);
      put(",");
      number(allocs);
      for (const double seconds : {record.start, record.end, record.end - record.start}) {
        put(",");
        number(seconds, std::chars_format::general, 9);
      }
      put(",");
      length = static_cast<std::size_t>(at - text);
    }
  };
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
        std::error_code unknown;  // (then the path as given)
        const std::filesystem::path absolute = std::filesystem::absolute(path, unknown);
        log->path = unknown ? path : absolute.string();  // text() reads it back after a chdir too
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

std::string LoggingAdaptor::text() {
  // (Under the lock: no line is half written while it is read.)
  std::lock_guard lock(log_->mutex);
  log_->out->flush();
  if (log_->file) {
    std::ifstream in(log_->path);
    if (!in) throw StateError("cannot read back the allocation log '" + log_->path + "' (moved or deleted?)");
    std::ostringstream text;
    text << in.rdbuf();  // (nothing, and failbit, where the file was emptied)
    return text.str();
  }
  if (const auto* memory = dynamic_cast<const std::ostringstream*>(log_->out)) return memory->str();
  throw NotSupported("the allocation log goes to a stream that cannot be read back (log to a file or a "
                     "std::ostringstream to read it)");
}

}  // namespace cuemm
