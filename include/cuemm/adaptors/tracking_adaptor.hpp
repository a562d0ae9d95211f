// cuemm/adaptors/tracking_adaptor.hpp: every outstanding allocation, and who made it.
//
// Keeps each live allocation with its size, kind, time and call site (see
// ScopedCallSite). reset() and the adaptor's destruction print a leak report
// of what is still outstanding (to stderr, or the stream given), and so does
// the process's exit for an adaptor reporting to stderr (contexts, and their
// adaptors, live until then); outstanding() lists it at any time. Maps in
// 1,024 shards by address, each under a lock of its own, so that threads
// seldom wait for each other; still a debugging tool (a record and a map
// node a block).
#pragma once

#include <iosfwd>
#include <vector>

#include "cuemm/adaptors/manager_adaptor.hpp"

namespace cuemm {

class TrackingAdaptor : public ManagerAdaptor {
 public:
  // `report` receives the leak reports; null means stderr.
  TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::ostream* report = nullptr);
  ~TrackingAdaptor() override;

  // Live allocations, oldest first: each thread's in the order it made
  // them, those of different threads to within a tick of the coarse clock.
  std::vector<AllocationRecord> outstanding() const;
  // The leak report text ("" when nothing is outstanding): each block, or
  // past 32 of them what each call site holds (the most bytes first) and the
  // oldest 32 blocks.
  std::string leak_report() const;

 private:
  struct Table;
  TrackingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::shared_ptr<Table> table);
  std::shared_ptr<Table> table_;
};

}  // namespace cuemm
