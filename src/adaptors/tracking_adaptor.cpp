#include "cuemm/adaptors/tracking_adaptor.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>

#include "cuemm/error.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "util/at_exit.hpp"

namespace cuemm {

struct TrackingAdaptor::Table : AllocationObserver {
  mutable BlockingAwareMutex mutex;
  // Keyed by (kind, address): pinned host and device addresses may coincide.
  std::map<std::pair<int, std::uintptr_t>, AllocationRecord> live;
  std::ostream* report;

  explicit Table(std::ostream* report_) : report(report_) {}

  void allocated(const AllocationRecord& record) noexcept override {
    try {
      std::lock_guard lock(mutex);
      live[{static_cast<int>(record.kind), record.address}] = record;
    } catch (...) {
    }
  }
  void released(const AllocationRecord& record) noexcept override {
    std::lock_guard lock(mutex);
    live.erase({static_cast<int>(record.kind), record.address});
  }

  std::string text() const {
    std::vector<AllocationRecord> records;
    {
      std::lock_guard lock(mutex);
      for (const auto& [key, record] : live) records.push_back(record);
    }
    if (records.empty()) return "";
    std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    std::size_t bytes = 0;
    for (const auto& record : records) bytes += record.size;
    std::string out = "cuemm: " + std::to_string(records.size()) + " allocation(s) outstanding, " +
                      describe_bytes(bytes) + ":\n";
    for (const auto& record : records) {
      char line[160];
      std::snprintf(line, sizeof line, "  %-8s 0x%" PRIxPTR " %12zu bytes at %.6f s  ", to_string(record.kind),
                    record.address, record.size, record.start);
      out += line + (record.call_site.empty() ? std::string("(call site unknown)") : record.call_site) + "\n";
    }
    return out;
  }

  void print() noexcept {
    try {
      const std::string leaks = text();
      if (leaks.empty()) return;
      if (report)
        *report << leaks << std::flush;
      else
        std::fputs(leaks.c_str(), stderr);
    } catch (...) {
    }
  }

  void reset() noexcept override {
    print();
    std::lock_guard lock(mutex);
    live.clear();
  }
};

TrackingAdaptor::TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::ostream* report)
    : TrackingAdaptor(context, std::move(upstream), std::make_shared<Table>(report)) {
  // The adaptor lives until exit with its context: the report it would give
  // when destroyed comes at exit. (To stderr only: a stream given may be gone.)
  if (context && !report) util::at_exit_while_alive<Table>(table_, [](Table& table) { table.print(); });
}

TrackingAdaptor::TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                 std::shared_ptr<Table> table)
    : ManagerAdaptor(context, std::move(upstream), table), table_(std::move(table)) {}

TrackingAdaptor::~TrackingAdaptor() {
  if (has_context()) table_->print();
  std::lock_guard lock(table_->mutex);
  table_->live.clear();  // the table is kept until exit (see ~ManagerAdaptor); its records are not
}

std::vector<AllocationRecord> TrackingAdaptor::outstanding() const {
  std::vector<AllocationRecord> records;
  {
    std::lock_guard lock(table_->mutex);
    for (const auto& [key, record] : table_->live) records.push_back(record);
  }
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  return records;
}

std::string TrackingAdaptor::leak_report() const { return table_->text(); }

}  // namespace cuemm
