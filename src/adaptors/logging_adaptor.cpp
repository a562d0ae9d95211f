#include "cuemm/adaptors/logging_adaptor.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <vector>

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

// Note [Rows in the order of events]
// Rows are written by the threads whose events they are, so without care a
// free's row could follow the row of the next allocation of its address,
// made by another thread as soon as the upstream had the block (Note [A
// release seen before the upstream has the block]). So releasing(), before
// the upstream has the block, puts the release among those under way; a row
// of an address with a release under way waits in that release's `after`
// (the latest one's, where several of an address are under way), and the
// release's own row, once its turn comes, writes them after it. Rows of
// other addresses do not wait. Current Allocs is counted as the rows are
// written, so it follows them. A reset() ends the wait for releases it
// overtook (their rows are not written: their memory was forgotten), and
// so do the adaptor's end and the program's.
struct LoggingAdaptor::Log : AllocationObserver {
  BlockingAwareMutex mutex;
  std::unique_ptr<std::ofstream> file;
  std::string path;  // the file's, absolute
  std::ostream* out;  // null once the adaptor is gone
  LoggingOptions options;
  int device = 0;
  BaseMemoryManager* manager = nullptr;  // for memory info; null once the adaptor is gone

  // One row but its Current Allocs: text that fits in `text`, formatted with
  // std::to_chars (what printf would print for `%.9g`, at a fraction of its
  // cost); Current Allocs goes between text[0, split) and text[split, length).
  struct Line {
    char text[256];
    std::size_t split = 0;
    std::size_t length = 0;

    void format(const AllocationRecord& record, bool allocation, int device, const MemoryInfo& info) noexcept {
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
      split = static_cast<std::size_t>(at - text);
      for (const double seconds : {record.start, record.end, record.end - record.start}) {
        put(",");
        number(seconds, std::chars_format::general, 9);
      }
      put(",");
      length = static_cast<std::size_t>(at - text);
    }
  };
  struct Row {
    AllocationRecord record;
    bool allocation;
    Line line;  // formatted, unless the row carries memory info (read as it is written)
  };

  // A release between releasing() and released() (Note [Rows in the order of events]).
  struct UnderWay {
    std::uint64_t id;
    std::uintptr_t address;
    bool host;
    std::unique_ptr<Row> own_row;  // once released(), while an earlier release of its address is under way
    std::vector<Row> after;        // rows of its address that came since, in order
  };
  static bool host_memory(MemoryKind kind) { return kind == MemoryKind::Pinned || kind == MemoryKind::Mapped; }

  // Under the mutex:
  std::vector<UnderWay> under_way;  // oldest first
  std::uint64_t releases = 0;       // ids of releases under way, the first 1
  long long current = 0;            // Current Allocs, as of the rows written

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
    Line line{};  // (with memory info, formatted as it is written)
    if (!options.memory_info) line.format(record, allocation, device, {});
    std::lock_guard lock(mutex);
    if (!out) return;  // an event that was under way as the adaptor went
    const auto own = !allocation && record.ticket ? find_under_way(record.ticket) : under_way.end();
    const auto before = latest_under_way(record.address, host_memory(record.kind), own);
    try {
      if (before != under_way.end()) {  // its turn comes after that release's row
        if (own == under_way.end()) {
          before->after.push_back(Row{record, allocation, line});
        } else {
          own->own_row = std::make_unique<Row>(Row{record, allocation, line});
        }
        return;
      }
    } catch (...) {  // (the host out of memory) Written now, out of turn.
    }
    write_row(record, allocation, line);
    if (own != under_way.end()) finish(own);
  }
  // The release under way with this id.
  std::vector<UnderWay>::iterator find_under_way(std::uint64_t id) noexcept {
    return std::find_if(under_way.begin(), under_way.end(), [&](const UnderWay& release) { return release.id == id; });
  }
  // The latest release of this address under way before `end`, or under_way.end().
  std::vector<UnderWay>::iterator latest_under_way(std::uintptr_t address, bool host,
                                                   std::vector<UnderWay>::iterator end) noexcept {
    for (auto release = end; release != under_way.begin();) {
      --release;
      if (release->address == address && release->host == host) return release;
    }
    return under_way.end();
  }
  // Its row is written: the rows after it, then the next release of its
  // address if that one's row waits for its turn.
  void finish(std::vector<UnderWay>::iterator release) noexcept {
    for (;;) {
      for (const Row& row : release->after) write_row(row);
      const std::uintptr_t address = release->address;
      const bool host = release->host;
      release = under_way.erase(release);
      release = std::find_if(release, under_way.end(), [&](const UnderWay& next) {
        return next.address == address && next.host == host;
      });
      if (release == under_way.end() || !release->own_row) return;
      write_row(*release->own_row);
    }
  }
  // Every waiting row, in order: the releases they wait for will not come
  // (those whose own rows wait are written).
  void write_waiting_rows() noexcept {
    for (UnderWay& release : under_way) {
      if (release.own_row) write_row(*release.own_row);
      for (const Row& row : release.after) write_row(row);
    }
    under_way.clear();
  }
  void write_row(const AllocationRecord& record, bool allocation, Line line) noexcept {
    current += allocation ? 1 : -1;
    if (options.memory_info) {
      MemoryInfo info;
      if (manager) {
        try {
          info = manager->get_memory_info();
        } catch (...) {
        }
      }
      line.format(record, allocation, device, info);
    }
    char allocs[24];
    const auto counted = std::to_chars(std::begin(allocs), std::end(allocs), current).ptr;
    out->write(line.text, static_cast<std::streamsize>(line.split));
    out->write(allocs, counted - allocs);
    out->write(line.text + line.split, static_cast<std::streamsize>(line.length - line.split));
    write_location(record.call_site);
    out->put('\n');
  }
  void write_row(const Row& row) noexcept { write_row(row.record, row.allocation, row.line); }
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

  void allocated(const AllocationRecord& record) noexcept override { write(record, true); }
  void releasing(AllocationRecord& record) noexcept override {
    std::lock_guard lock(mutex);
    try {
      under_way.push_back({releases + 1, record.address, host_memory(record.kind), nullptr, {}});
      record.ticket = ++releases;
    } catch (...) {  // (the host out of memory) Its row will be written as it comes.
    }
  }
  void released(const AllocationRecord& record) noexcept override { write(record, false); }
  bool wants_releasing() const noexcept override { return true; }
  // (With the adaptor's gate closed: no event is being counted.)
  void reset() noexcept override {
    std::lock_guard lock(mutex);
    if (out) {
      write_waiting_rows();
    } else {
      under_way.clear();
    }
    current = 0;
  }
  // As the adaptor or the program ends, under the mutex.
  void finish_and_flush() noexcept {
    if (!out) return;
    write_waiting_rows();
    out->flush();
  }
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
          open.finish_and_flush();
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
  log_->finish_and_flush();
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
