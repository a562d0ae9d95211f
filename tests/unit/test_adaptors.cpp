// What each adaptor adds: statistics, the CSV log, leak tracking, the limit,
// and composing them by name.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::ScopedVariable;
using cuemm::testing::throws;

namespace {
class Adaptors : public ::testing::Test {
 protected:
  Context& context = current_context();
  std::unique_ptr<BaseMemoryManager> pool() { return std::make_unique<PoolMemoryManager>(&context); }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A device-only manager whose next block is the one freed last, and whose
// release can be held up once it has the block back: the moment in which
// another thread may be given the address before the release is reported.
class ReusingManager : public HostOnlyMemoryManager {
 public:
  explicit ReusingManager(Context* context) : HostOnlyMemoryManager(context) {}

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override {
    std::uintptr_t address;
    {
      std::lock_guard lock(mutex_);
      if (freed_.empty()) {
        address = next_;
        next_ += 1 << 20;
      } else {
        address = freed_.back();
        freed_.pop_back();
      }
    }
    return std::make_shared<MemoryPointer>(&context(), address, size, nullptr, [this, address] {
      std::unique_lock lock(mutex_);
      freed_.push_back(address);
      if (!hold_releases_) return;
      const int number = ++held_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return !hold_releases_ || number == let_go_; });
    });
  }
  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>&) override {
    throw NotSupported("no IPC in this test's manager");
  }
  MemoryInfo get_memory_info() override { return {0, 0}; }

  void hold_releases() {
    std::lock_guard lock(mutex_);
    hold_releases_ = true;
  }
  void wait_until_releases_are_held(int count = 1) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return held_ >= count; });
  }
  // Lets the `number`th release held up go (from 1), the others held still.
  void let_release_go(int number) {
    std::lock_guard lock(mutex_);
    let_go_ = number;
    changed_.notify_all();
  }
  void let_releases_go() {
    std::lock_guard lock(mutex_);
    hold_releases_ = false;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::uintptr_t> freed_;
  std::uintptr_t next_ = 0x7e0000000000;
  bool hold_releases_ = false;
  int held_ = 0;  // releases held up so far
  int let_go_ = 0;  // the one let go of them
};

// An adaptor over a ReusingManager whose first block (256 bytes) a thread of
// its own frees, the release held up once the manager has the block back.
template <typename Adaptor>
struct AReleaseHeldUp {
  template <typename... Arguments>
  explicit AReleaseHeldUp(Context& context, Arguments&&... arguments)
      : AReleaseHeldUp(std::make_unique<ReusingManager>(&context), context, std::forward<Arguments>(arguments)...) {}
  ~AReleaseHeldUp() { finish(); }
  // Lets every release go and waits for the first's.
  void finish() {
    upstream.let_releases_go();
    if (releasing.joinable()) releasing.join();
  }

  ReusingManager& upstream;
  Adaptor adaptor;
  std::thread releasing;

 private:
  template <typename... Arguments>
  AReleaseHeldUp(std::unique_ptr<ReusingManager> owned, Context& context, Arguments&&... arguments)
      : upstream(*owned), adaptor(&context, std::move(owned), std::forward<Arguments>(arguments)...) {
    adaptor.initialize();
    upstream.hold_releases();
    releasing = std::thread([first = adaptor.memalloc(256)]() mutable { first.reset(); });
    upstream.wait_until_releases_are_held();
  }
};

// Rows as fields (no location has a comma here).
std::vector<std::vector<std::string>> rows_of(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  const auto lines = lines_of(text);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> fields;
    std::stringstream row(lines[i]);
    for (std::string field; std::getline(row, field, ',');) fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}
}  // namespace

TEST_F(Adaptors, StatisticsCountCurrentPeakAndTotal) {
  StatisticsAdaptor stats(&context, pool());
  stats.initialize();
  {
    auto a = stats.memalloc(1000);
    auto b = stats.memalloc(3000);
    auto host = stats.memhostalloc(4096, false, false, false);
    const MemoryStatistics during = stats.statistics();
    EXPECT_EQ(during.of(MemoryKind::Device).current_bytes, 4000u);
    EXPECT_EQ(during.of(MemoryKind::Device).current_count, 2u);
    EXPECT_EQ(during.of(MemoryKind::Pinned).current_bytes, 4096u);
    EXPECT_GE(during.reserved_bytes, 4000u);
  }
  auto c = stats.memalloc(500);
  const MemoryStatistics after = stats.statistics();
  const AllocationCounts& device = after.of(MemoryKind::Device);
  EXPECT_EQ(device.current_bytes, 500u);
  EXPECT_EQ(device.peak_bytes, 4000u);
  EXPECT_EQ(device.total_bytes, 4500u);
  EXPECT_EQ(device.total_count, 3u);
  EXPECT_EQ(device.peak_count, 2u);
  EXPECT_EQ(after.device_size_histogram[8], 1u);   // 500 is in [256, 512)
  EXPECT_EQ(after.device_size_histogram[9], 1u);   // 1000 in [512, 1024)
  EXPECT_EQ(after.device_size_histogram[11], 1u);  // 3000 in [2048, 4096)
  EXPECT_NE(after.summary().find("device"), std::string::npos);
}

// Reserved is what the manager holds from the driver, not what is in use:
// the async manager's driver pool keeps freed blocks (release threshold max
// by default) until trimmed; managed memory counts under every manager.
TEST_F(Adaptors, StatisticsReserveWhatTheAsyncManagersDriverPoolHolds) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  AsyncOptions options;
  options.release_threshold = std::numeric_limits<std::uint64_t>::max();
  StatisticsAdaptor stats(&context, std::make_unique<AsyncMemoryManager>(&context, options));
  stats.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(stats.memalloc(8 * kMiB));
  blocks.resize(2);
  auto managed = stats.memallocmanaged(kMiB, true);
  ScopedContext scope(context);
  CUEMM_CU(cuStreamSynchronize, cuda::CU_STREAM_LEGACY);  // the frees have run
  const MemoryStatistics held = stats.statistics();
  EXPECT_EQ(held.of(MemoryKind::Device).current_bytes, 16 * kMiB);
  EXPECT_GE(held.reserved_bytes, 64 * kMiB + kMiB) << "the driver pool's freed blocks are still reserved";
  release_unused_memory(stats);
  const MemoryStatistics trimmed = stats.statistics();
  EXPECT_GE(trimmed.reserved_bytes, 16 * kMiB + kMiB);
  EXPECT_LT(trimmed.reserved_bytes, held.reserved_bytes) << "trimming left the reserved bytes as they were";
}

// Reports of reserved bytes (the statistics, `cuemm replay`) find the pooling
// manager under any adaptors; over the default manager there is none to ask.
TEST_F(Adaptors, ReservedDeviceBytesAreThePoolingManagersUnderAnyAdaptors) {
  TrackingAdaptor tracked(&context, std::make_unique<LimitingAdaptor>(&context, pool(), std::size_t{1} << 30));
  tracked.initialize();
  auto& below = dynamic_cast<PoolMemoryManager&>(dynamic_cast<LimitingAdaptor&>(tracked.upstream()).upstream());
  auto block = tracked.memalloc(std::size_t{3} << 20);
  const std::size_t reserved = below.statistics().reserved_bytes;
  EXPECT_GE(reserved, std::size_t{3} << 20);
  EXPECT_EQ(reserved_device_bytes(tracked), reserved);
  EXPECT_EQ(reserved_device_bytes(below), reserved);

  AsyncMemoryManager async(&context);
  async.initialize();
  auto ordered = async.memalloc(std::size_t{2} << 20);
  const std::optional<std::size_t> driver_pool = reserved_device_bytes(async);
  ASSERT_TRUE(driver_pool.has_value());
  EXPECT_GE(*driver_pool, std::size_t{2} << 20);

  StatisticsAdaptor over_default(&context, std::make_unique<DefaultMemoryManager>(&context));
  over_default.initialize();
  auto plain = over_default.memalloc(4096);
  EXPECT_FALSE(reserved_device_bytes(over_default).has_value());
  EXPECT_EQ(over_default.statistics().reserved_bytes, 4096u) << "without a pool, the bytes in use";
}

TEST_F(Adaptors, StatisticsCountFailuresAndForgetMemoryAResetGaveBack) {
  StatisticsAdaptor stats(&context, std::make_unique<LimitingAdaptor>(&context, pool(), 1 << 20));
  stats.initialize();
  EXPECT_THROW(stats.memalloc(2 << 20), OutOfMemory);
  auto held = stats.memalloc(1000);
  stats.reset();
  held.reset();  // already given back by the reset: not counted again
  const MemoryStatistics after = stats.statistics();
  EXPECT_EQ(after.failed_allocations, 1u);
  EXPECT_EQ(after.of(MemoryKind::Device).current_bytes, 0u);
  EXPECT_EQ(after.of(MemoryKind::Device).current_count, 0u);
}

// Over the pool (a RawDeviceAllocator) the adaptor's pointer is the only one:
// its release gives the block back, and after a reset a late release goes to
// the retired pool, not into the blocks of the new one.
TEST_F(Adaptors, OverThePoolAnAdaptorsPointerGivesTheBlockBackItself) {
  StatisticsAdaptor stats(&context, pool());
  stats.initialize();
  auto& upstream = dynamic_cast<PoolMemoryManager&>(stats.upstream());
  auto early = stats.memalloc(1000);
  EXPECT_GE(upstream.statistics().in_use_bytes, 1000u);
  auto second = stats.memalloc(1000);  // in the same segment, at an offset
  EXPECT_EQ(stats.get_ipc_handle(second).offset(), second->device_pointer() - early->device_pointer())
      << "an IPC handle through the adaptor names the block's offset in its segment";
  second.reset();
  early.reset();
  EXPECT_EQ(upstream.statistics().in_use_bytes, 0u);
  auto before = stats.memalloc(1000);
  stats.reset();
  auto after = stats.memalloc(1000);
  before.reset();  // to the retired pool: ignored
  auto next = stats.memalloc(1000);
  EXPECT_NE(next->device_pointer(), after->device_pointer()) << "a late release freed a block of the new pool";
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 2u);
}

// Totals and the histogram are kept per thread: what threads counted stays
// counted after they finish, also when a later thread reuses a finished one's
// shard, and the adaptor may go before its threads do.
TEST_F(Adaptors, StatisticsOfManyThreadsAddUpAfterTheyFinish) {
  auto stats = std::make_unique<StatisticsAdaptor>(&context, pool());
  stats->initialize();
  constexpr int kThreads = 8, kEach = 500;
  for (int wave = 0; wave < 2; ++wave) {  // the second wave reuses the first's shards
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < kEach; ++i) stats->memalloc(3000);
      });
    for (auto& thread : threads) thread.join();
  }
  std::vector<std::shared_ptr<MemoryPointer>> held;
  for (int i = 0; i < 5; ++i) held.push_back(stats->memalloc(100));  // and this thread's own
  const MemoryStatistics after = stats->statistics();
  const AllocationCounts& device = after.of(MemoryKind::Device);
  EXPECT_EQ(device.total_count, 2u * kThreads * kEach + 5u);
  EXPECT_EQ(device.total_bytes, 2u * kThreads * kEach * 3000u + 500u);
  EXPECT_EQ(after.device_size_histogram[11], 2u * kThreads * kEach);  // 3000 in [2048, 4096)
  EXPECT_EQ(after.device_size_histogram[6], 5u);                      // 100 in [64, 128)
  EXPECT_EQ(device.current_count, 5u);
  EXPECT_EQ(device.current_bytes, 500u);
  EXPECT_GE(device.peak_count, 5u);
  EXPECT_LE(device.peak_count, std::size_t{kThreads} + 5u) << "each thread holds one block at a time";
  // A thread that counted for the adaptor and outlives it finishes cleanly
  // (its shard's adaptor is gone by then).
  std::atomic<bool> counted{false}, adaptor_gone{false};
  std::thread late([&] {
    stats->memalloc(100);
    counted = true;
    while (!adaptor_gone) std::this_thread::yield();
  });
  while (!counted) std::this_thread::yield();
  held.clear();
  stats.reset();
  adaptor_gone = true;
  late.join();
}

// Threads count on their own cache lines; a peak reached by several threads
// together may be short by what each other thread held unpublished (at most
// 4 MiB), never above the truth, and exact again once the blocks were published.
TEST_F(Adaptors, APeakOfSeveralThreadsIsWithinTheirUnpublishedShares) {
  StatisticsAdaptor stats(&context, pool());
  stats.initialize();
  constexpr int kThreads = 6;
  constexpr std::size_t kEach = 5, kBlock = 1 << 20;  // 5 MiB a thread: past the 4 MiB each may keep unpublished
  std::atomic<int> holding{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      std::vector<std::shared_ptr<MemoryPointer>> held;
      for (std::size_t i = 0; i < kEach; ++i) held.push_back(stats.memalloc(kBlock));
      ++holding;
      while (!release) std::this_thread::yield();
    });
  while (holding < kThreads) std::this_thread::yield();
  const std::size_t all = kThreads * kEach * kBlock;
  const AllocationCounts during = stats.statistics().of(MemoryKind::Device);
  EXPECT_EQ(during.current_bytes, all);
  EXPECT_EQ(during.current_count, kThreads * kEach);
  release = true;
  for (auto& thread : threads) thread.join();
  const AllocationCounts after = stats.statistics().of(MemoryKind::Device);
  EXPECT_EQ(after.current_bytes, 0u);
  EXPECT_EQ(after.current_count, 0u);
  EXPECT_LE(after.peak_bytes, all);
  EXPECT_GE(after.peak_bytes, all - (kThreads - 1) * (std::size_t{4} << 20));
  EXPECT_EQ(after.peak_count, kThreads * kEach) << "read while all were held";
  stats.reset_peaks();
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).peak_bytes, 0u);
}

// Each adaptor's allocation holds the one's under it in a section of its
// own, which a thread keeps only so many of: a stack beyond that is refused
// as it is made, and one as deep as allowed works.
TEST_F(Adaptors, AStackOfTooManyAdaptorsIsRefused) {
  const auto stack_of = [&](int adaptors) {
    std::unique_ptr<BaseMemoryManager> stack = std::make_unique<PoolMemoryManager>(&context);
    for (int i = 0; i < adaptors; ++i) stack = std::make_unique<StatisticsAdaptor>(&context, std::move(stack));
    return stack;
  };
  EXPECT_TRUE(throws<InvalidArgument>([&] { stack_of(kMostStackedAdaptors + 1); },
                                      std::to_string(kMostStackedAdaptors + 1) + "th stacked",
                                      "at most " + std::to_string(kMostStackedAdaptors)));
  std::unique_ptr<BaseMemoryManager> deepest = stack_of(kMostStackedAdaptors);
  deepest->initialize();
  auto memory = deepest->memalloc(4096);
  EXPECT_EQ(find_adaptor<StatisticsAdaptor>(*deepest)->statistics().of(MemoryKind::Device).current_count, 1u);
  memory.reset();
  deepest->reset();
}

// An observer of the program's own, on the public hooks: it sees each
// allocation and release in turn, with the release's ticket passed from
// releasing() to released(); it refuses an allocation by throwing, which
// reaches the caller with no block taken; and its questions about what
// records carry are asked once, as the adaptor is made, whatever the calls.
TEST_F(Adaptors, AnObserverOfTheProgramsOwnSeesEachEventInTurn) {
  struct Events final : AllocationObserver {
    std::vector<std::string> seen;
    std::vector<AllocationRecord> records;
    std::uint64_t next_ticket = 100;
    bool durations = false;
    mutable int asked_details = 0, asked_durations = 0, asked_releasing = 0;

    void before_allocation(MemoryKind, std::size_t size) override {
      if (size == 12345) throw OutOfMemory("the program's observer", size, "this program's own cap");
      seen.push_back("before " + std::to_string(size));
    }
    void allocated(const AllocationRecord& record) noexcept override {
      seen.push_back("allocated " + std::to_string(record.size));
      records.push_back(record);
    }
    void releasing(AllocationRecord& record) noexcept override {
      record.ticket = ++next_ticket;
      seen.push_back("releasing " + std::to_string(record.size));
    }
    void released(const AllocationRecord& record) noexcept override {
      seen.push_back("released " + std::to_string(record.size) + " ticket " + std::to_string(record.ticket));
      records.push_back(record);
    }
    void reset() noexcept override { seen.push_back("reset"); }
    bool wants_releasing() const noexcept override { return ++asked_releasing, true; }
    bool wants_times_and_call_sites() const noexcept override { return ++asked_details, true; }
    bool wants_durations() const noexcept override { return ++asked_durations, durations; }
  };
  for (const bool durations : {false, true}) {
    SCOPED_TRACE(durations ? "with durations" : "without durations");
    auto events = std::make_shared<Events>();
    events->durations = durations;
    ManagerAdaptor adaptor(&context, pool(), events);
    adaptor.initialize();
    {
      ScopedCallSite site("train.py:7, in step");
      auto memory = adaptor.memalloc(4096);
      ASSERT_TRUE(memory);
      EXPECT_TRUE(throws<OutOfMemory>([&] { adaptor.memalloc(12345); }, "12345 bytes", "this program's own cap"));
      const cuda::CUdeviceptr block = adaptor.allocate(512, nullptr);
      adaptor.deallocate(block, 512, nullptr);
    }
    adaptor.reset();
    for (int i = 0; i < 20; ++i) adaptor.memalloc(256 * (i + 1)).reset();
    EXPECT_EQ(events->asked_details, 1);
    EXPECT_EQ(events->asked_durations, 1);
    EXPECT_EQ(events->asked_releasing, 1);

    const std::vector<std::string> expected_start = {
        "before 4096",    "allocated 4096",           // (the refused 12345 bytes: no event)
        "before 512",     "allocated 512",            // allocate(size, stream)
        "releasing 512",  "released 512 ticket 101",  // deallocate()
        "releasing 4096", "released 4096 ticket 102", // the pointer dropped
        "reset"};
    ASSERT_GE(events->seen.size(), expected_start.size());
    EXPECT_EQ(std::vector<std::string>(events->seen.begin(), events->seen.begin() + expected_start.size()),
              expected_start);
    EXPECT_EQ(events->seen.size(), expected_start.size() + 20 * 4) << "four events for each later pair";
    const AllocationRecord& allocated = events->records[0];
    EXPECT_EQ(allocated.call_site, "train.py:7, in step");
    EXPECT_FALSE(allocated.stream.has_value());
    if (durations) {
      EXPECT_GT(allocated.start, 0.0);
      EXPECT_GE(allocated.end, allocated.start);
    } else {  // (the coarse clock's, which may still read 0 this early)
      EXPECT_GE(allocated.start, 0.0);
      EXPECT_EQ(allocated.end, allocated.start) << "an observer that wants no durations gets one time";
    }
    const AllocationRecord& ordered = events->records[1];
    EXPECT_EQ(ordered.stream, std::optional<std::uintptr_t>(0)) << "allocate(size, stream) names its stream";
    const AllocationRecord& released = events->records[3];
    EXPECT_EQ(released.address, allocated.address);
    EXPECT_EQ(released.ticket, 102u);
    if (durations) {
      EXPECT_EQ(released.call_site, "train.py:7, in step");
      EXPECT_GE(released.end, released.start);
      EXPECT_GE(released.start, allocated.start);
    } else {
      EXPECT_TRUE(released.call_site.empty()) << "releases are timed only for an observer that wants durations";
    }
  }
}

// Pointers may outlive their adaptor: they release into the upstream as
// usual, and nothing is reported any more (the log is closed with the
// adaptor), also when a release runs while the adaptor goes.
TEST_F(Adaptors, PointersOutliveTheirAdaptor) {
  const std::string path = ::testing::TempDir() + "/cuemm_outliving_log.csv";
  std::shared_ptr<MemoryPointer> kept;
  std::vector<std::shared_ptr<MemoryPointer>> racing;
  {
    auto logged = std::make_unique<LoggingAdaptor>(&context, std::make_unique<StatisticsAdaptor>(&context, pool()),
                                                   path);
    logged->initialize();
    kept = logged->memalloc(4096);
    for (int i = 0; i < 200; ++i) racing.push_back(logged->memalloc(256));
    std::thread releaser([&] { racing.clear(); });
    logged.reset();
    releaser.join();
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const auto rows = lines_of(text.str());
  ASSERT_GE(rows.size(), 202u) << "the header and every allocation, written when the adaptor went";
  kept->free();  // into the pool that the adaptor owned, which outlives it for its pointers
  EXPECT_FALSE(kept->is_alive());
  std::ifstream again(path);
  std::stringstream later;
  later << again.rdbuf();
  EXPECT_EQ(lines_of(later.str()).size(), rows.size()) << "a release after the adaptor went was logged";
}

// memalloc_unwrapped: the upstream's own pointer, observed like a wrapped one.
TEST_F(Adaptors, AnUnwrappedAllocationIsObservedAndLoggedLikeAWrappedOne) {
  std::ostringstream text;
  auto stats = std::make_unique<StatisticsAdaptor>(&context, pool());
  StatisticsAdaptor* counted = stats.get();
  LoggingAdaptor logged(&context, std::move(stats), text);
  logged.initialize();
  ManagerAdaptor::Unwrapped held = logged.memalloc_unwrapped(5000);
  ASSERT_NE(held.memory, nullptr);
  EXPECT_EQ(held.block.size, 5000u);
  EXPECT_EQ(held.block.address, held.memory->handle());
  EXPECT_EQ(counted->statistics().of(MemoryKind::Device).current_bytes, 5000u);
  logged.release_unwrapped(held);
  EXPECT_EQ(held.memory, nullptr);
  logged.release_unwrapped(held);  // twice: nothing more
  EXPECT_EQ(counted->statistics().of(MemoryKind::Device).current_bytes, 0u);
  EXPECT_EQ(counted->statistics().of(MemoryKind::Device).total_count, 1u);
  logged.flush();
  const auto rows = lines_of(text.str());
  ASSERT_EQ(rows.size(), 3u) << text.str();  // header, allocation, release
  EXPECT_NE(rows[2].find(",5000,"), std::string::npos) << rows[2];

  // Memory a reset gave back is not reported again.
  ManagerAdaptor::Unwrapped stale = logged.memalloc_unwrapped(100);
  logged.reset();
  logged.release_unwrapped(stale);
  EXPECT_EQ(counted->statistics().of(MemoryKind::Device).current_bytes, 0u);
  EXPECT_THROW(logged.memalloc_unwrapped(0), InvalidArgument);
}

// Over the pool (a RawDeviceAllocator), memalloc_unwrapped is a bare block:
// no pointer object at all, given back by its releaser.
TEST_F(Adaptors, OverThePoolAnUnwrappedAllocationIsABareBlock) {
  StatisticsAdaptor stats(&context, pool());
  stats.initialize();
  auto& upstream = dynamic_cast<PoolMemoryManager&>(stats.upstream());
  ManagerAdaptor::Unwrapped bare = stats.memalloc_unwrapped(3000);
  EXPECT_EQ(bare.memory, nullptr);
  ASSERT_TRUE(bare.held());
  EXPECT_EQ(bare.handle(), bare.block.address);
  EXPECT_EQ(bare.block.size, 3000u);
  EXPECT_EQ(bare.handle() % 256, 0u);
  EXPECT_GE(upstream.statistics().in_use_bytes, 3000u);
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_bytes, 3000u);
  stats.release_unwrapped(bare);
  EXPECT_FALSE(bare.held());
  stats.release_unwrapped(bare);  // twice: nothing more
  EXPECT_EQ(upstream.statistics().in_use_bytes, 0u);
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_bytes, 0u);

  // A release after a reset goes to the retired pool and is not counted.
  ManagerAdaptor::Unwrapped stale = stats.memalloc_unwrapped(1000);
  stats.reset();
  ManagerAdaptor::Unwrapped fresh = stats.memalloc_unwrapped(1000);
  stats.release_unwrapped(stale);
  ManagerAdaptor::Unwrapped next = stats.memalloc_unwrapped(1000);
  EXPECT_NE(next.handle(), fresh.handle()) << "a late release freed a block of the new pool";
  EXPECT_EQ(stats.statistics().of(MemoryKind::Device).current_count, 2u);
  stats.release_unwrapped(fresh);
  stats.release_unwrapped(next);
  EXPECT_EQ(upstream.statistics().in_use_bytes, 0u);
}

TEST_F(Adaptors, TheLogHasTheProposalsColumnsAndOneRowPerEvent) {
  std::ostringstream out;
  {
    LoggingAdaptor logged(&context, pool(), out);
    logged.initialize();
    std::uintptr_t address = 0;
    {
      ScopedCallSite site("example.py:12, in main");
      auto memory = logged.memalloc(80);
      address = memory->device_pointer();
    }
    const auto lines = lines_of(out.str());
    ASSERT_EQ(lines.size(), 3u) << out.str();
    EXPECT_EQ(lines[0], LoggingAdaptor::header());
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(address));
    EXPECT_EQ(lines[1].rfind(std::string("Alloc,0,") + hex + ",0,80,", 0), 0u) << lines[1];
    EXPECT_EQ(lines[2].rfind(std::string("Free,0,") + hex + ",0,80,", 0), 0u) << lines[2];
    EXPECT_NE(lines[1].find(",\"example.py:12, in main\""), std::string::npos) << "the location is not quoted";
    // Current Allocs: 1 after the allocation, 0 after the free.
    EXPECT_EQ(std::count(lines[1].begin(), lines[1].end(), ','), 12);
  }
}

// Lines are formatted by their threads before the log's lock: from threads
// at once, every line must still be whole, and the log must read back with
// each free after its own allocation (memory info, read under the lock,
// too).
TEST_F(Adaptors, ALogFromThreadsAtOnceReadsBackWhole) {
  for (const bool memory_info : {false, true}) {
    std::ostringstream out;
    {
      LoggingOptions options;
      options.memory_info = memory_info;
      LoggingAdaptor logged(&context, pool(), out, options);
      logged.initialize();
      std::vector<std::thread> threads;
      for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
          ScopedContext scope(context);
          ScopedCallSite site("worker.py:" + std::to_string(t) + ", in step");
          for (int i = 0; i < 200; ++i) logged.memalloc(256 * (1 + (t + i) % 16)).reset();
        });
      }
      for (auto& thread : threads) thread.join();
      logged.flush();
    }
    const auto lines = lines_of(out.str());
    ASSERT_EQ(lines.size(), 1u + 8 * 200 * 2);
    for (std::size_t i = 1; i < lines.size(); ++i) {
      ASSERT_EQ(std::count(lines[i].begin(), lines[i].end(), ','), 12) << lines[i];  // one in the location
      ASSERT_NE(lines[i].find(", in step\""), std::string::npos) << lines[i];
      // Frees are timed as allocations are (the log wants durations): Start, End and Elapsed.
      std::vector<std::string> fields;
      std::stringstream row(lines[i]);
      for (std::string field; fields.size() < 11 && std::getline(row, field, ',');) fields.push_back(field);
      ASSERT_EQ(fields.size(), 11u) << lines[i];
      ASSERT_GT(std::stod(fields[8]), 0.0) << lines[i];
      ASSERT_GE(std::stod(fields[9]), std::stod(fields[8])) << lines[i];
      if (memory_info) {
        ASSERT_EQ(lines[i].find(",0,0,"), std::string::npos) << "no memory info in " << lines[i];
      }
    }
    std::istringstream in(out.str());
    MemoryLogGaps gaps;
    const std::vector<LoggedEvent> events = read_memory_log(in, "threads.csv", &gaps);
    EXPECT_EQ(events.size(), 8u * 200 * 2);
    EXPECT_EQ(gaps.frees_of_unknown_addresses, 0u);
    EXPECT_EQ(gaps.frees_inferred, 0u);
    EXPECT_FALSE(gaps.untimed);
  }
}

// Without thread caches a block freed by one thread is at once another's, so
// the log must order a free before the next allocation of its address: a
// row written after the upstream had the block back could follow that
// allocation's row (an address allocated twice, then a free of nothing).
TEST_F(Adaptors, ALogOfBlocksPassingBetweenThreadsFreesEachBeforeItIsAllocatedAgain) {
  PoolOptions no_caches;
  no_caches.thread_cache_size = 0;
  std::ostringstream out;
  {
    LoggingAdaptor logged(&context, std::make_unique<PoolMemoryManager>(&context, no_caches), out);
    logged.initialize();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        ScopedContext scope(context);
        std::vector<std::shared_ptr<MemoryPointer>> held;
        for (int i = 0; i < 2000; ++i) {
          held.push_back(logged.memalloc(4096));
          if (held.size() > 3) held.erase(held.begin());
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  const auto rows = rows_of(out.str());
  ASSERT_EQ(rows.size(), 8u * 2000 * 2);
  std::set<std::string> live;
  long long allocs = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::string>& fields = rows[i];
    ASSERT_GE(fields.size(), 8u) << "row " << i;
    if (fields[0] == "Alloc") {
      ASSERT_TRUE(live.insert(fields[2]).second) << "row " << i << " allocates a live address: " << fields[2];
      ++allocs;
    } else {
      ASSERT_EQ(live.erase(fields[2]), 1u) << "row " << i << " frees an address not live: " << fields[2];
      --allocs;
    }
    ASSERT_EQ(std::stoll(fields[7]), allocs) << "row " << i << "'s Current Allocs, " << fields[0] << " " << fields[2];
  }
  EXPECT_TRUE(live.empty());
}

// The deterministic form of the race above: the upstream has the block back
// and another allocation takes its address before the release is reported.
TEST_F(Adaptors, ALogWritesAFreeBeforeTheAllocationThatTookItsAddressMeanwhile) {
  std::ostringstream out;
  AReleaseHeldUp<LoggingAdaptor> held(context, out);
  auto second = held.adaptor.memalloc(512);
  ASSERT_EQ(second->device_pointer(), 0x7e0000000000u);  // the first's address
  EXPECT_EQ(rows_of(held.adaptor.text()).size(), 1u) << "the second's row waits for the first's free";
  held.finish();
  const auto rows = rows_of(held.adaptor.text());
  ASSERT_EQ(rows.size(), 3u) << held.adaptor.text();
  EXPECT_EQ(rows[0][0], "Alloc");
  EXPECT_EQ(rows[1][0], "Free");
  EXPECT_EQ(rows[1][4], "256");
  EXPECT_EQ(rows[2][0], "Alloc");
  EXPECT_EQ(rows[2][4], "512");
  EXPECT_EQ(rows[0][7] + rows[1][7] + rows[2][7], "101");  // Current Allocs
}

// Two releases of one address under way at once, the later allocated in
// between: whichever finishes first, the rows read as the events came.
TEST_F(Adaptors, ALogOrdersTwoReleasesOfOneAddressUnderWayAtOnce) {
  for (int round = 0; round < 4; ++round) {
    std::ostringstream out;
    AReleaseHeldUp<LoggingAdaptor> held(context, out);
    auto second = held.adaptor.memalloc(512);
    std::thread releasing_second([&] { second.reset(); });
    held.upstream.wait_until_releases_are_held(2);
    auto third = held.adaptor.memalloc(1024);
    EXPECT_EQ(rows_of(held.adaptor.text()).size(), 1u);
    if (round % 2) {  // the second first
      held.upstream.let_release_go(2);
      releasing_second.join();
      EXPECT_EQ(rows_of(held.adaptor.text()).size(), 1u) << "all wait for the first release";
    }
    held.finish();
    if (releasing_second.joinable()) releasing_second.join();
    const auto rows = rows_of(held.adaptor.text());
    ASSERT_EQ(rows.size(), 5u) << held.adaptor.text();
    std::string events;
    for (const auto& row : rows) events += row[0] + " " + row[4] + " " + row[7] + "; ";
    ASSERT_EQ(events, "Alloc 256 1; Free 256 0; Alloc 512 1; Free 512 0; Alloc 1024 1; ") << "round " << round;
  }
}

// A reset() while a release is held up forgets that release: a row that
// waited for it is written then, and later rows do not wait for it.
TEST_F(Adaptors, ALogsRowsWaitingForAReleaseThatAResetOvertookAreWritten) {
  for (const bool allocate_while_held : {false, true}) {
    std::ostringstream out;
    AReleaseHeldUp<LoggingAdaptor> held(context, out);
    LoggingAdaptor& logged = held.adaptor;
    std::shared_ptr<MemoryPointer> second;
    if (allocate_while_held) second = logged.memalloc(512);
    logged.reset();  // (the release is still held up)
    auto third = logged.memalloc(1024);
    const auto rows = rows_of(logged.text());
    held.finish();
    ASSERT_EQ(rows.size(), allocate_while_held ? 3u : 2u) << logged.text();
    EXPECT_EQ(rows.back()[4], "1024") << logged.text();
    EXPECT_EQ(rows.back()[7], "1") << "counted from the reset";
    if (allocate_while_held) {
      EXPECT_EQ(rows[1][4], "512") << logged.text();
    }
    EXPECT_EQ(rows_of(logged.text()).size(), rows.size()) << "the forgotten release is not logged";
  }
}

TEST_F(Adaptors, TrackingListsABlockAllocatedAtTheAddressOfAReleaseUnderWay) {
  std::ostringstream report;
  AReleaseHeldUp<TrackingAdaptor> held(context, &report);
  auto second = held.adaptor.memalloc(512);
  held.finish();
  const auto outstanding = held.adaptor.outstanding();
  ASSERT_EQ(outstanding.size(), 1u);
  EXPECT_EQ(outstanding[0].address, second->device_pointer());
  EXPECT_EQ(outstanding[0].size, 512u);
}

TEST_F(Adaptors, ALogReadsBackAndDrawsEachKind) {
  std::ostringstream out;
  {
    LoggingAdaptor logged(&context, pool(), out);
    logged.initialize();
    auto device = logged.memalloc(4096);
    auto host = logged.memhostalloc(8192, false, false, false);
    {
      ScopedCallSite site("quoted, with \"marks\"");
      logged.memalloc(1 << 20).reset();
    }
    device.reset();
    logged.flush();
  }
  std::istringstream in(out.str());
  const std::vector<LoggedEvent> events = read_memory_log(in, "log.csv");
  ASSERT_EQ(events.size(), 6u) << out.str();  // the host block goes back as the adaptor's scope ends
  EXPECT_TRUE(events[0].allocate && events[0].kind == LoggedKind::Device && events[0].size == 4096);
  EXPECT_TRUE(events[1].allocate && events[1].kind == LoggedKind::Host && events[1].size == 8192);
  EXPECT_EQ(events[3].id, events[2].id) << "a free is paired with its allocation";
  EXPECT_FALSE(events[4].allocate);
  EXPECT_EQ(events[4].id, events[0].id);
  EXPECT_TRUE(!events[5].allocate && events[5].kind == LoggedKind::Host && events[5].id == events[1].id);
  const std::string svg = memory_plot_svg(events);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("device memory in use"), std::string::npos);
  EXPECT_NE(svg.find("host memory in use"), std::string::npos);
  EXPECT_EQ(svg.find("managed memory in use"), std::string::npos) << "a kind the log never used is drawn";

  std::istringstream not_a_log("time,bytes\n1,2\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(not_a_log, "numbers.csv"); }, "numbers.csv"));
  std::istringstream bad_size(std::string(LoggingAdaptor::header()) + "\nAlloc,0,0x10,0,lots,0,0,1,0,0,0,\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(bad_size, "bad.csv"); }, "bad.csv:2"));
  std::istringstream negative(std::string(LoggingAdaptor::header()) + "\nAlloc,0,0x10,0,-5,0,0,1,0,0,0,\n");
  EXPECT_THROW(read_memory_log(negative, "negative.csv"), InvalidArgument) << "a negative size was read as a huge one";
  // Zero-byte allocations hold no memory: left out, with the free of their address.
  std::istringstream zero(std::string(LoggingAdaptor::header()) +
                          "\nAlloc,0,0x10,0,0,0,0,1,0,1,0,\nAlloc,0,0x20,0,64,0,0,2,0,2,0,\nFree,0,0x10,0,0,0,0,1,0,3,0,\n");
  const std::vector<LoggedEvent> kept = read_memory_log(zero, "zero.csv");
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].size, 64u);
}

// A long log is drawn column by column: its peak, however brief, stays on the
// picture, and the file stays small.
TEST(MemoryLog, ALongLogsPlotKeepsItsPeakInASmallFile) {
  std::vector<LoggedEvent> events;
  std::uint64_t id = 0;
  for (int i = 0; i < 100'000; ++i) {
    const std::size_t size = i == 61'234 ? 1 << 30 : 4096;  // one brief spike
    events.push_back({true, LoggedKind::Device, id, size, i * 1e-3});
    events.push_back({false, LoggedKind::Device, id++, size, i * 1e-3 + 5e-4});
  }
  const std::string svg = memory_plot_svg(events);
  EXPECT_LT(svg.size(), std::size_t{200'000}) << "200,000 events drawn one by one";
  EXPECT_NE(svg.find(">1.0 GiB<"), std::string::npos) << "the peak is not labelled";
  // The top of the plot (y 10.0) is the peak's: drawn, though 1 event in 200,000.
  EXPECT_NE(svg.find(",10.0 "), std::string::npos) << "the spike was lost";
}

// Threads time their rows before they take the log's lock, so a row may be
// timed a little before the row above it: the lines still only go forward
// (a long log's columns zigzagged back and forth), and stay small.
TEST(MemoryLog, RowsTimedOutOfOrderAreDrawnForwardOnly) {
  std::vector<LoggedEvent> events;
  std::uint64_t id = 0;
  for (int i = 0; i < 100'000; ++i) {
    const double jitter = (i % 7 == 3 ? -3e-3 : 0.0);  // a row timed before its neighbours
    events.push_back({true, LoggedKind::Device, id, 4096, i * 1e-3 + jitter});
    events.push_back({false, LoggedKind::Device, id++, 4096, i * 1e-3 + 5e-4 + jitter});
  }
  const std::string svg = memory_plot_svg(events);
  EXPECT_LT(svg.size(), std::size_t{200'000});
  const auto begin = svg.find("points=\"") + 8;
  std::istringstream points(svg.substr(begin, svg.find('"', begin) - begin));
  double previous = -1;
  std::size_t count = 0;
  for (double x, y; points >> x && points.ignore(1) && points >> y; ++count) {
    ASSERT_GE(x, previous) << "point " << count << " went back";
    previous = x;
  }
  EXPECT_GT(count, 1000u);
}

// Between its labelled ends the plot has round ticks, in the unit that suits
// the log's length, and the legend gives each kind's own peak (a small host
// line is flat beside device memory's).
TEST(MemoryLog, ThePlotHasRoundTicksAndEachKindsPeak) {
  std::vector<LoggedEvent> events;
  for (std::uint64_t i = 0; i < 103; ++i)  // 1 MiB every 0.1 ms: 103 MiB at 10.2 ms
    events.push_back({true, LoggedKind::Device, i, std::size_t{1} << 20, i * 1e-4});
  events.push_back({true, LoggedKind::Host, 1000, 288 << 10, 0.005});
  const std::string svg = memory_plot_svg(events);
  for (const char* label : {">103.0 MiB<", ">0 B<", ">20.0 MiB<", ">80.0 MiB<", ">10.200 ms<", ">0 ms<", ">2 ms<",
                            ">8 ms<", "device memory in use (peak 103.0 MiB)", "host memory in use (peak 288.0 KiB)"})
    EXPECT_NE(svg.find(label), std::string::npos) << label << " is missing: " << svg;
  EXPECT_EQ(svg.find(">100.0 MiB<"), std::string::npos) << "a tick's label touches the peak's";
  EXPECT_EQ(svg.find(" s<"), std::string::npos) << "a log of milliseconds is labelled in seconds";
  // A log without times counts whole rows.
  std::vector<LoggedEvent> rows{{true, LoggedKind::Device, 1, 64, 2}, {false, LoggedKind::Device, 1, 64, 3}};
  const std::string by_row = memory_plot_svg(rows, /*untimed=*/true);
  EXPECT_NE(by_row.find(">row 2<"), std::string::npos) << by_row;
  EXPECT_NE(by_row.find(">row 3<"), std::string::npos) << by_row;
  EXPECT_EQ(by_row.find(">row 2<"), by_row.rfind(">row 2<")) << "a row is labelled twice: " << by_row;
  // Three bytes at one instant: ticks of whole bytes, and no ticks of time.
  const std::string instant = memory_plot_svg({{true, LoggedKind::Device, 1, 3, 5.0}});
  EXPECT_EQ(instant.find(">0 B<"), instant.rfind(">0 B<")) << "a fraction of a byte is a tick: " << instant;
  EXPECT_NE(instant.find(">2 B<"), std::string::npos) << instant;
  EXPECT_NE(instant.find(">0.000 s<"), std::string::npos) << instant;
  EXPECT_EQ(instant.find(" us<"), std::string::npos) << "an instant has ticks of time: " << instant;
}

// Any lines over one axis (cuemm replay --plot: live and reserved bytes by
// operation): each in its own colour, counted as given, its peak in the legend.
TEST(MemoryLog, SeriesPlotDrawsEachLineWithItsPeakOverACount) {
  const std::vector<PlotSeries> lines{{"reserved", {{0, 0}, {10, 4 << 20}, {100, 4 << 20}}, "#d62728"},
                                      {"live", {{0, 0}, {10, 3 << 20}, {50, 1 << 20}, {100, 2 << 20}}},
                                      {"other", {{0, 0}, {100, 1 << 20}}}};
  const std::string svg = plot_series_svg(lines, "operation");
  std::size_t polylines = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 3u) << svg;
  for (const char* label : {">reserved (peak 4.0 MiB)<", ">live (peak 3.0 MiB)<", ">operation 0<", ">operation 100<",
                            "stroke=\"#d62728\""})
    EXPECT_NE(svg.find(label), std::string::npos) << label << " is missing: " << svg;
  EXPECT_EQ(svg.find(" s<"), std::string::npos) << "a count is labelled as time: " << svg;
  // Lines without a colour of their own take different ones.
  const auto colour_of = [&](const std::string& label) {
    const std::size_t text = svg.find(">" + label + " (peak");
    const std::size_t fill = svg.rfind("fill=\"", text);
    return svg.substr(fill, 14);
  };
  EXPECT_NE(colour_of("live"), colour_of("other")) << svg;
  EXPECT_NE(colour_of("live"), colour_of("reserved")) << "a palette's colour is another line's own: " << svg;
  EXPECT_NE(colour_of("other"), colour_of("reserved")) << svg;
}

// A log of several devices: each row keeps its device, and a free pairs with
// the allocation of its own device (addresses may repeat across devices).
TEST(MemoryLog, RowsKeepTheirDeviceAndPairOnIt) {
  std::istringstream two(std::string(LoggingAdaptor::header()) +
                         "\nAlloc,0,0x10,0,64,0,0,1,0,1,0,\nAlloc,1,0x10,0,128,0,0,1,0,2,0,"
                         "\nFree,1,0x10,0,128,0,0,0,0,3,0,\nFree,0,0x10,0,64,0,0,0,0,4,0,\n");
  const std::vector<LoggedEvent> events = read_memory_log(two, "two.csv");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].device, 0);
  EXPECT_EQ(events[1].device, 1);
  EXPECT_NE(events[0].id, events[1].id);
  EXPECT_EQ(events[2].id, events[1].id) << "device 1's free paired with device 0's block";
  EXPECT_EQ(events[3].id, events[0].id);
  std::istringstream bad(std::string(LoggingAdaptor::header()) + "\nAlloc,gpu,0x10,0,64,0,0,1,0,1,0,\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(bad, "bad.csv"); }, "bad.csv:2", "device ID 'gpu'"));
}

// RMM's logging_resource_adaptor writes Thread,Time,Action,Pointer,Size,Stream:
// its logs replay too, with times in seconds or as a time of day.
TEST(MemoryLog, RmmsLogsAreReadAsDeviceEvents) {
  std::istringstream rmm(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "7,1634567890.5,allocate,0x7f8a40000000,1024,0x1\n"
      "7,1634567890.75,allocate failure,0x0,99999999999,0x1\n"
      "7,1634567891,allocate,0x7f8a40000400,2048,0x1\n"
      "7,1634567892,free,0x7f8a40000000,1024,0x1\n");
  const std::vector<LoggedEvent> events = read_memory_log(rmm, "rmm.csv");
  ASSERT_EQ(events.size(), 3u) << "a failed allocation holds nothing, and RMM's free is a free";
  EXPECT_TRUE(events[0].allocate && events[0].kind == LoggedKind::Device && events[0].size == 1024);
  EXPECT_DOUBLE_EQ(events[0].time, 1634567890.5);
  EXPECT_EQ(events[1].size, 2048u);
  EXPECT_FALSE(events[2].allocate);
  EXPECT_EQ(events[2].id, events[0].id) << "the free is paired with its allocation by pointer";
  const std::string svg = memory_plot_svg(events);
  EXPECT_NE(svg.find(">1.500 s<"), std::string::npos) << "time does not run from the first event: " << svg;
  EXPECT_NE(svg.find(">3.0 KiB<"), std::string::npos) << "the peak is not labelled: " << svg;
  std::istringstream time_of_day("Thread,Time,Action,Pointer,Size,Stream\n1,14:51:34.25,allocate,0x10,4096,0x0\n");
  EXPECT_DOUBLE_EQ(read_memory_log(time_of_day, "rmm.csv").at(0).time, 14 * 3600 + 51 * 60 + 34.25);
  std::istringstream no_time("Thread,Time,Action,Pointer,Size,Stream\n1,noon,allocate,0x10,4096,0x0\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(no_time, "rmm.csv"); }, "rmm.csv:2: the time 'noon'"));
  std::istringstream not_finite("Thread,Time,Action,Pointer,Size,Stream\n1,nan,allocate,0x10,4096,0x0\n");
  EXPECT_THROW(read_memory_log(not_finite, "rmm.csv"), InvalidArgument);
  std::istringstream no_pointer("Thread,Time,Action,Size,Stream\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(no_pointer, "rmm.csv"); }, "no 'Pointer' column"));
  // RMM's logs without the backwards-compatible format write pointers without 0x; "deallocate" reads too.
  std::istringstream plain("Thread,Time,Action,Pointer,Size,Stream\n1,1,allocate,7f0000000000,64,0\n"
                           "1,2,deallocate,7f0000000000,64,0\n");
  const std::vector<LoggedEvent> paired = read_memory_log(plain, "rmm.csv");
  ASSERT_EQ(paired.size(), 2u);
  EXPECT_EQ(paired[1].id, paired[0].id);
}

// A log that does not hold together: a free of an address it never
// allocated (it began mid-run) is skipped, and an address allocated again
// while live implies the free that was not logged, which comes first.
TEST(MemoryLog, FreesItNeverLoggedOrCannotPairAreInferredOrSkippedAndCounted) {
  std::istringstream log(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,1,free,0x100,4096,0x0\n"
      "1,2,allocate,0x200,1024,0x0\n"
      "1,3,allocate,0x200,2048,0x0\n"
      "1,4,free,0x200,2048,0x0\n"
      "1,5,allocate,0x300,0,0x0\n"
      "1,6,free,0x300,0,0x0\n");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_memory_log(log, "gaps.csv", &gaps);
  EXPECT_EQ(gaps.frees_of_unknown_addresses, 1u) << "(a zero-byte allocation's free is no gap)";
  EXPECT_EQ(gaps.zero_byte_allocations, 1u);
  EXPECT_EQ(gaps.frees_inferred, 1u);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_TRUE(events[0].allocate);
  EXPECT_FALSE(events[1].allocate) << "the second allocation of an address was not preceded by a free";
  EXPECT_EQ(events[1].id, events[0].id);
  EXPECT_TRUE(events[2].allocate);
  EXPECT_EQ(events[3].id, events[2].id);
  std::map<std::uint64_t, std::size_t> sizes;  // of the live allocations
  std::size_t live = 0, peak = 0;
  for (const LoggedEvent& event : events) {
    if (event.allocate)
      live += sizes[event.id] = event.size;
    else
      live -= sizes.at(event.id);
    peak = std::max(peak, live);
  }
  EXPECT_EQ(peak, 2048u) << "the first allocation stayed live";
  EXPECT_EQ(live, 0u);
}

// Event types in another case are still allocations and frees; rows of types
// a replay does not know are skipped and counted, so that a log of another
// tool does not replay as an empty one without a word. RMM's failed
// allocations are known: they hold nothing.
TEST(MemoryLog, EventTypesInAnyCaseCountAndOtherTypesAreCountedAndNamed) {
  std::istringstream ours(
      "Event Type,Device ID,Address,Stream,Size (bytes),Free Memory,Total Memory,Current Allocs,Start,End,Elapsed,"
      "Location\n"
      "ALLOC,0,0x100,0,4096,0,0,1,0,1,0,x\n"
      "Resize,0,0x100,0,8192,0,0,1,0,2,0,x\n"
      "Aloc,0,0x200,0,4096,0,0,1,0,3,0,x\n"
      "free,0,0x100,0,0,0,0,0,0,4,0,x\n");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_memory_log(ours, "ours.csv", &gaps);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].allocate);
  EXPECT_EQ(events[0].size, 4096u);
  EXPECT_FALSE(events[1].allocate);
  EXPECT_EQ(events[1].id, events[0].id);
  EXPECT_EQ(gaps.rows_of_other_types, 2u);
  EXPECT_EQ(gaps.first_other_type, "Resize");
  EXPECT_EQ(gaps.frees_of_unknown_addresses, 0u);
  // RMM's action names read in the seed's columns too.
  std::istringstream named_as_rmm(
      "Event Type,Address,Size (bytes)\nallocate,0x100,64\nDeallocate,0x100,64\nallocate failure,0x0,64\n");
  const std::vector<LoggedEvent> named = read_memory_log(named_as_rmm, "ours.csv", &gaps);
  ASSERT_EQ(named.size(), 2u);
  EXPECT_TRUE(named[0].allocate && named[0].kind == LoggedKind::Device);
  EXPECT_TRUE(!named[1].allocate && named[1].id == named[0].id);
  EXPECT_EQ(gaps.rows_of_other_types, 1u) << "a failure is RMM's row only; here it is another type";

  std::istringstream rmm(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,1,Allocate,0x100,1024,0x0\n"
      "1,2,allocate failure,0x0,1099511627776,0x0\n"
      "1,3,FREE,0x100,1024,0x0\n");
  MemoryLogGaps rmm_gaps;
  EXPECT_EQ(read_memory_log(rmm, "rmm.csv", &rmm_gaps).size(), 2u);
  EXPECT_EQ(rmm_gaps.rows_of_other_types, 0u) << "a failed allocation is no unknown row";
  EXPECT_EQ(rmm_gaps.failed_allocations, 1u);
  EXPECT_EQ(gaps.failed_allocations, 0u) << "only RMM's logs hold failed allocations";
}

TEST_F(Adaptors, TheLogCanGoToAFile) {
  const std::string path = ::testing::TempDir() + "/cuemm_adaptor_log.csv";
  {
    LoggingAdaptor logged(&context, pool(), path);
    logged.initialize();
    logged.memalloc(4096).reset();
    logged.memhostalloc(4096, true, false, false).reset();
    logged.flush();
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const auto lines = lines_of(text.str());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3].rfind("HostAlloc,", 0), 0u);
  EXPECT_EQ(lines[4].rfind("HostFree,", 0), 0u);
  EXPECT_THROW(LoggingAdaptor(&context, pool(), std::string("/nonexistent/dir/log.csv")), InvalidArgument);
}

// text(): the log so far, for a caller that did not keep the file's name or
// the stream (Python's write_log() and plot() under CUEMM_ADAPTORS=log).
TEST_F(Adaptors, TheLogReadsBackAsTextFromAFileOrAStringStreamAndSaysWhyNotElse) {
  const std::string path = ::testing::TempDir() + "/cuemm_log_text.csv";
  LoggingAdaptor to_file(&context, pool(), path);
  to_file.initialize();
  auto block = to_file.memalloc(4096);
  const std::string text = to_file.text();  // unflushed rows come too
  const auto lines = lines_of(text);
  ASSERT_EQ(lines.size(), 2u) << text;
  EXPECT_EQ(lines[0], LoggingAdaptor::header());
  EXPECT_EQ(lines[1].rfind("Alloc,", 0), 0u) << lines[1];
  {  // A relative name is read back from where it was opened, whatever the directory now.
    struct BackWhereItWas {
      std::filesystem::path before = std::filesystem::current_path();
      ~BackWhereItWas() { std::filesystem::current_path(before); }
    } directory;
    std::filesystem::current_path(::testing::TempDir());
    LoggingAdaptor relative(&context, pool(), std::string("cuemm_log_text_relative.csv"));
    std::filesystem::current_path("/");
    relative.initialize();
    relative.memalloc(256).reset();
    EXPECT_EQ(lines_of(relative.text()).size(), 3u);
  }
  std::remove(path.c_str());
  EXPECT_TRUE(throws<StateError>([&] { (void)to_file.text(); }, path, "cannot read back"));
  block.reset();

  std::ostringstream memory;
  LoggingAdaptor to_memory(&context, pool(), memory);
  to_memory.initialize();
  to_memory.memalloc(512).reset();
  EXPECT_EQ(lines_of(to_memory.text()).size(), 3u);
  EXPECT_EQ(to_memory.text(), memory.str());

  std::stringstream elsewhere;  // a stream, but not one the adaptor knows how to read back
  LoggingAdaptor to_elsewhere(&context, pool(), static_cast<std::ostream&>(elsewhere));
  EXPECT_TRUE(throws<NotSupported>([&] { (void)to_elsewhere.text(); }, "cannot be read back"));
}

// A context, and so its manager and adaptors, lives until the process ends:
// a program that exits with its log open still finds every row in the file
// (in a child process of its own, which exits so), once: not again from a
// child it forked.
TEST(AdaptorsAtExit, AProgramThatExitsWithItsLogOpenFindsEveryRowInIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // (a fresh process, not a fork of this one and its driver)
  const std::string path = ::testing::TempDir() + "/cuemm_log_at_exit.csv";
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        Context& context = current_context();
        // (Reachable from statics, as a context's manager is: no leak for LeakSanitizer.)
        static auto* logged = new LoggingAdaptor(&context, std::make_unique<PoolMemoryManager>(&context), path);
        logged->initialize();
        logged->memalloc(4096).reset();
        [[maybe_unused]] static auto* held = new std::shared_ptr<MemoryPointer>(logged->memalloc(8192));  // (still held at exit)
        // A child forked now inherits the buffered rows: it must not write them too.
        if (const pid_t child = fork(); child == 0) std::exit(0);
        else if (child > 0) waitpid(child, nullptr, 0);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const auto lines = lines_of(text.str());
  ASSERT_EQ(lines.size(), 4u) << text.str();
  EXPECT_EQ(lines[0], LoggingAdaptor::header());
  EXPECT_EQ(lines[1].rfind("Alloc,", 0), 0u);
  EXPECT_EQ(lines[2].rfind("Free,", 0), 0u);
  EXPECT_NE(lines[3].find(",8192,"), std::string::npos) << lines[3];
  std::remove(path.c_str());
}

// The same for the leak report: an adaptor reporting to stderr that lives
// until exit reports there what is still held then, and only that.
TEST(AdaptorsAtExit, AProgramThatExitsHoldingMemoryGetsItsLeakReport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Context& context = current_context();
        static auto* tracked = new TrackingAdaptor(&context, std::make_unique<PoolMemoryManager>(&context));
        tracked->initialize();
        tracked->memalloc(4096).reset();
        [[maybe_unused]] static auto* held = new std::shared_ptr<MemoryPointer>(tracked->memalloc(12345));  // (still held at exit)
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "1 allocation\\(s\\) outstanding, 12\\.06 KiB \\(12345 bytes\\)");
}

TEST_F(Adaptors, TrackingListsOutstandingAllocationsAndReportsLeaksAtReset) {
  std::ostringstream report;
  TrackingAdaptor tracked(&context, pool(), &report);
  tracked.initialize();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // (past the clock's origin by several ticks)
  const double before = adaptor_clock();
  auto kept = [&] {
    ScopedCallSite site("leaky.cpp:7");
    return tracked.memalloc(12345);
  }();
  const double after = adaptor_clock();
  tracked.memalloc(100).reset();
  const auto outstanding = tracked.outstanding();
  ASSERT_EQ(outstanding.size(), 1u);
  EXPECT_EQ(outstanding[0].size, 12345u);
  EXPECT_EQ(outstanding[0].address, kept->device_pointer());
  EXPECT_EQ(outstanding[0].call_site, "leaky.cpp:7");
  // When it was allocated, on the adaptors' clock: the coarse clock's reading
  // lags the precise one by at most a tick (at most 10 ms where HZ is 100).
  EXPECT_GT(outstanding[0].start, 0.0);
  EXPECT_GE(outstanding[0].start, before - 0.011);
  EXPECT_LE(outstanding[0].start, after);
  tracked.reset();
  EXPECT_NE(report.str().find("1 allocation(s) outstanding"), std::string::npos) << report.str();
  EXPECT_NE(report.str().find("leaky.cpp:7"), std::string::npos);
  EXPECT_TRUE(tracked.outstanding().empty());
}

// A long report (a program that exits holding thousands of arrays) is summed
// up by call site, the most bytes first, then lists only the oldest blocks.
TEST_F(Adaptors, TrackingSumsUpALongLeakReportByCallSite) {
  std::ostringstream report;
  TrackingAdaptor tracked(&context, pool(), &report);
  tracked.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> kept;
  auto from = [&](const std::string& site, int count, std::size_t size) {
    ScopedCallSite scope(site);
    for (int i = 0; i < count; ++i) kept.push_back(tracked.memalloc(size));
  };
  from("small.cpp:2", 30, 256);
  from("big.cpp:1", 40, 4096);
  for (int i = 0; i < 20; ++i) from("once.cpp:" + std::to_string(100 + i), 1, 512);
  const std::string text = tracked.leak_report();
  EXPECT_EQ(text.rfind("cuemm: 90 allocation(s) outstanding", 0), 0u) << text;
  const auto big = text.find("40 allocation(s), 160.00 KiB (163840 bytes)  big.cpp:1\n");
  const auto small = text.find("30 allocation(s), 7.50 KiB (7680 bytes)  small.cpp:2\n");
  ASSERT_NE(big, std::string::npos) << text;
  ASSERT_NE(small, std::string::npos) << text;
  EXPECT_LT(big, small) << "the most bytes first";
  EXPECT_NE(text.find("and 6 other call site(s): 6 allocation(s), 3.00 KiB (3072 bytes)"), std::string::npos) << text;
  const auto oldest = text.find("the oldest 32:\n");
  ASSERT_NE(oldest, std::string::npos) << text;
  const auto listed = lines_of(text.substr(oldest));
  ASSERT_EQ(listed.size(), 34u) << text;  // the heading, 32 blocks, what is left out
  EXPECT_NE(listed[1].find("256 bytes"), std::string::npos) << "the oldest first: " << listed[1];
  EXPECT_NE(listed[1].find("small.cpp:2"), std::string::npos) << listed[1];
  EXPECT_NE(listed[32].find("big.cpp:1"), std::string::npos) << listed[32];
  EXPECT_EQ(listed[33].rfind("  and 58 more", 0), 0u) << listed[33];
  kept.resize(32);  // as many as are listed: one by one again, no summary
  EXPECT_EQ(tracked.leak_report().find("by call site"), std::string::npos) << tracked.leak_report();
  EXPECT_EQ(lines_of(tracked.leak_report()).size(), 33u);
  kept.clear();
}

// Starts come from the coarse clock, so many blocks share one: a thread's
// blocks are still listed in the order it allocated them.
TEST_F(Adaptors, TrackingListsAThreadsBlocksInTheOrderItMadeThem) {
  TrackingAdaptor tracked(&context, pool(), nullptr);
  tracked.initialize();
  std::vector<std::shared_ptr<MemoryPointer>> kept;
  for (int i = 0; i < 200; ++i) kept.push_back(tracked.memalloc(256 * (1 + (i * 37) % 50)));
  const auto outstanding = tracked.outstanding();
  ASSERT_EQ(outstanding.size(), kept.size());
  for (std::size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(outstanding[i].address, kept[i]->device_pointer()) << i;
  kept.clear();
  EXPECT_TRUE(tracked.outstanding().empty());
}

// The table is in shards by address: threads that allocate and free at once
// must still leave exactly what they hold listed, oldest first, with its
// call site, and a reset must report and forget all of it.
TEST_F(Adaptors, TrackingListsWhatRacingThreadsStillHold) {
  std::ostringstream report;
  TrackingAdaptor tracked(&context, pool(), &report);
  tracked.initialize();
  constexpr int kThreads = 8, kRounds = 300;
  std::vector<std::vector<std::shared_ptr<MemoryPointer>>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string site = "thread " + std::to_string(t);
      ScopedCallSite scope(site);
      for (int i = 0; i < kRounds; ++i) {
        auto block = tracked.memalloc(256 + 256 * ((t * kRounds + i) % 64));
        if (i % 3 == 0) kept[t].push_back(std::move(block));  // the others go at once
      }
    });
  }
  for (auto& thread : threads) thread.join();

  const auto outstanding = tracked.outstanding();
  std::size_t expected = 0;
  for (const auto& blocks : kept) expected += blocks.size();
  ASSERT_EQ(outstanding.size(), expected);
  for (std::size_t i = 1; i < outstanding.size(); ++i) EXPECT_LE(outstanding[i - 1].start, outstanding[i].start);
  for (int t = 0; t < kThreads; ++t) {
    for (const auto& block : kept[t]) {
      const auto found = std::find_if(outstanding.begin(), outstanding.end(),
                                      [&](const AllocationRecord& r) { return r.address == block->device_pointer(); });
      ASSERT_NE(found, outstanding.end()) << "a held block is missing";
      EXPECT_EQ(found->size, block->size());
      EXPECT_EQ(found->call_site, "thread " + std::to_string(t));
    }
  }
  kept[0].clear();
  EXPECT_EQ(tracked.outstanding().size(), expected - kRounds / 3);
  tracked.reset();
  EXPECT_NE(report.str().find(std::to_string(expected - kRounds / 3) + " allocation(s) outstanding"),
            std::string::npos);
  EXPECT_TRUE(tracked.outstanding().empty());
}

// As the log's: a block freed by one thread and at once allocated by another
// (no thread caches) is listed as the second's, never dropped with the
// first's release.
TEST_F(Adaptors, TrackingKeepsABlockThatAnotherThreadFreedJustBefore) {
  PoolOptions no_caches;
  no_caches.thread_cache_size = 0;
  std::ostringstream report;
  TrackingAdaptor tracked(&context, std::make_unique<PoolMemoryManager>(&context, no_caches), &report);
  tracked.initialize();
  constexpr int kThreads = 8, kRounds = 3000;
  std::vector<std::vector<std::shared_ptr<MemoryPointer>>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ScopedContext scope(context);
      for (int i = 0; i < kRounds; ++i) {
        auto block = tracked.memalloc(4096);
        if (i % 50 == 0) kept[t].push_back(std::move(block));  // the others go at once
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<std::uintptr_t> held;
  for (const auto& blocks : kept)
    for (const auto& block : blocks) held.insert(block->device_pointer());
  std::set<std::uintptr_t> listed;
  for (const AllocationRecord& record : tracked.outstanding()) listed.insert(record.address);
  std::size_t missing = 0;
  for (const std::uintptr_t address : held) missing += listed.count(address) == 0;
  EXPECT_EQ(missing, 0u) << "held blocks missing from the " << listed.size() << " listed, of " << held.size();
  EXPECT_EQ(listed.size(), held.size());
  kept.clear();
  EXPECT_TRUE(tracked.outstanding().empty());
}

TEST_F(Adaptors, TheLimitRefusesWithTheRequestTheUseAndTheCap) {
  LimitingAdaptor limited(&context, pool(), 10 << 20);
  limited.initialize();
  auto held = limited.memalloc(6 << 20);
  EXPECT_TRUE(throws<OutOfMemory>([&] { limited.memalloc(5 << 20); }, "5.00 MiB", "and 6.00 MiB", "are in use",
                                  "limit is 10.00 MiB"));
  EXPECT_EQ(limited.in_use(), std::size_t{6} << 20) << "a refused request still counts";
  auto host = limited.memhostalloc(8 << 20, false, false, false);  // host memory is not capped
  held.reset();
  EXPECT_NO_THROW(limited.memalloc(9 << 20));
}

// Programs size their work by memory info (Numba's get_memory_info, a
// batch that fills what is free): under a cap it must be the cap's.
TEST_F(Adaptors, MemoryInfoUnderALimitIsTheCapsView) {
  LimitingAdaptor limited(&context, pool(), 10 << 20);
  limited.initialize();
  const MemoryInfo device = limited.upstream().get_memory_info();
  ASSERT_GT(device.total, std::size_t{10} << 20);
  EXPECT_EQ(limited.get_memory_info().total, std::size_t{10} << 20);
  EXPECT_EQ(limited.get_memory_info().free, std::size_t{10} << 20);
  auto held = limited.memalloc(6 << 20);
  auto host = limited.memhostalloc(1 << 20, false, false, false);  // not counted
  EXPECT_EQ(limited.get_memory_info().free, std::size_t{4} << 20);
  EXPECT_NO_THROW(limited.memalloc(limited.get_memory_info().free)) << "what it says is free is served";
  held.reset();
  EXPECT_EQ(limited.get_memory_info().free, std::size_t{10} << 20);

  // A cap above the device changes nothing.
  LimitingAdaptor loose(&context, pool(), std::numeric_limits<std::size_t>::max());
  loose.initialize();
  EXPECT_EQ(loose.get_memory_info().total, device.total);
  EXPECT_LE(loose.get_memory_info().free, device.total);
}

TEST_F(Adaptors, TheLimitHoldsUnderRacingThreads) {
  LimitingAdaptor limited(&context, pool(), 64 << 20);
  limited.initialize();
  std::vector<std::thread> threads;
  std::atomic<std::size_t> peak{0};
  // What the threads hold by their own count, beside the adaptor's.
  std::atomic<std::size_t> held_bytes{0}, held_peak{0}, refused{0};
  auto raise = [](std::atomic<std::size_t>& to, std::size_t now) {
    std::size_t seen = to.load();
    while (now > seen && !to.compare_exchange_weak(seen, now)) {
    }
  };
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      ScopedContext scope(context);
      std::vector<std::shared_ptr<MemoryPointer>> held;
      for (int i = 0; i < 100; ++i) {
        try {
          held.push_back(limited.memalloc(3 << 20));
          raise(held_peak, held_bytes += 3 << 20);
        } catch (const OutOfMemory&) {
          ++refused;
          if (!held.empty()) {
            held_bytes -= 3 << 20;
            held.erase(held.begin());
          }
        }
        raise(peak, limited.in_use());
      }
      held_bytes -= held.size() * (3 << 20);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(peak.load(), std::size_t{64} << 20);
  EXPECT_LE(held_peak.load(), std::size_t{64} << 20);
  EXPECT_GT(refused.load(), 0u);
  // The threads' credit never kept the cap from filling (21 blocks of 3 MiB fit).
  EXPECT_GE(held_peak.load(), std::size_t{48} << 20);
  EXPECT_EQ(limited.in_use(), 0u);
}

// A thread keeps the bytes it releases as credit for its next requests
// (Note [Credit kept by each thread]): that credit must never make another
// thread's request fail that the bytes in use let through, nor show as in use.
TEST_F(Adaptors, BytesAThreadReleasedServeAnotherThreadAtTheCap) {
  LimitingAdaptor limited(&context, pool(), 10 << 20);
  limited.initialize();
  std::thread other([&] {
    ScopedContext scope(context);
    for (int i = 0; i < 3; ++i) limited.memalloc(3 << 20).reset();  // its credit: 3 MiB
    auto large = limited.memalloc(8 << 20);
    large.reset();  // its credit: 8 MiB (twice the block at hand is kept)
    EXPECT_EQ(limited.in_use(), 0u);
    EXPECT_EQ(limited.get_memory_info().free, std::size_t{10} << 20);
  });
  other.join();
  EXPECT_NO_THROW(limited.memalloc(10 << 20).reset()) << "the whole cap, after another thread's frees";

  // The same while the other thread lives and keeps its credit.
  std::atomic<int> stage{0};
  std::thread keeper([&] {
    ScopedContext scope(context);
    limited.memalloc(9 << 20).reset();
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    EXPECT_NO_THROW(limited.memalloc(2 << 20).reset()) << "its credit was taken back, the cap serves it";
  });
  while (stage.load() != 1) std::this_thread::yield();
  auto held = limited.memalloc(7 << 20);
  EXPECT_EQ(limited.in_use(), std::size_t{7} << 20);
  EXPECT_TRUE(throws<OutOfMemory>([&] { limited.memalloc(4 << 20); }, "and 7.00 MiB", "are in use"));
  stage = 2;
  keeper.join();
  held.reset();
  EXPECT_EQ(limited.in_use(), 0u);
}

// The out-of-memory handler frees what a program keeps elsewhere (here
// blocks it cached itself) and the allocation is asked again.
TEST_F(Adaptors, AnOutOfMemoryHandlerFreesMemoryElsewhereAndTheRequestIsRetried) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  std::vector<std::shared_ptr<MemoryPointer>> program_cache;
  std::vector<std::pair<std::size_t, int>> calls;  // (bytes asked, attempt)
  OutOfMemoryHandlerAdaptor handled(
      &context, std::make_unique<LimitingAdaptor>(&context, pool(), 64 * kMiB),
      [&](const OutOfMemory& error, int attempt) {
        calls.emplace_back(error.requested(), attempt);
        const bool freed = !program_cache.empty();
        program_cache.clear();
        return freed;
      });
  handled.initialize();
  for (int i = 0; i < 6; ++i) program_cache.push_back(handled.memalloc(10 * kMiB));
  auto fits_after_the_handler = handled.memalloc(16 * kMiB);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(16 * kMiB, 1));
  EXPECT_TRUE(program_cache.empty());

  // Nothing more to free: the handler says so, and the request fails as the limit says.
  calls.clear();
  EXPECT_TRUE(throws<OutOfMemory>([&] { handled.memalloc(60 * kMiB); }, "limit is 64.00 MiB"));
  EXPECT_EQ(calls, (std::vector<std::pair<std::size_t, int>>{{60 * kMiB, 1}}));
  // Host memory runs out through the handler too.
  auto pinned = handled.memhostalloc(4096, false, false, false);
  EXPECT_EQ(pinned->size(), 4096u);
}

// A handler asks for retries as long as it likes, up to
// kMostRetriesAfterOutOfMemory (each call says which attempt failed; one that
// always asks again does not hang the program); one that throws fails the
// allocation with its exception;
// an allocation inside the handler that runs out does not call it again;
// and a failed allocation leaves nothing counted in use.
TEST_F(Adaptors, AnOutOfMemoryHandlerDecidesHowOftenToRetry) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  std::vector<int> attempts;
  bool throw_instead = false;
  bool allocate_inside = false;
  bool always_again = false;
  BaseMemoryManager* self = nullptr;
  auto handled = std::make_unique<OutOfMemoryHandlerAdaptor>(
      &context, std::make_unique<StatisticsAdaptor>(&context, std::make_unique<LimitingAdaptor>(&context, pool(), 8 * kMiB)),
      [&](const OutOfMemory&, int attempt) {
        attempts.push_back(attempt);
        if (throw_instead) throw std::runtime_error("the handler gave up");
        if (allocate_inside) {
          EXPECT_THROW(self->memalloc(9 * kMiB), OutOfMemory);
        }
        return always_again || attempt < 3;
      });
  self = handled.get();
  handled->initialize();
  EXPECT_THROW(handled->memalloc(9 * kMiB), OutOfMemory);
  EXPECT_EQ(attempts, (std::vector<int>{1, 2, 3}));

  attempts.clear();
  throw_instead = true;
  EXPECT_TRUE(throws<std::runtime_error>([&] { handled->memalloc(9 * kMiB); }, "the handler gave up"));
  EXPECT_EQ(attempts, (std::vector<int>{1}));

  attempts.clear();
  throw_instead = false;
  allocate_inside = true;
  EXPECT_THROW(handled->memalloc(9 * kMiB), OutOfMemory);
  EXPECT_EQ(attempts, (std::vector<int>{1, 2, 3})) << "the allocation inside the handler called it again";

  attempts.clear();
  allocate_inside = false;
  always_again = true;
  EXPECT_TRUE(throws<OutOfMemory>([&] { handled->memalloc(9 * kMiB); }, "still asked to try again after 100 retries",
                                  "requested 9.00 MiB"));
  ASSERT_EQ(attempts.size(), std::size_t{kMostRetriesAfterOutOfMemory} + 1);
  EXPECT_EQ(attempts.back(), kMostRetriesAfterOutOfMemory + 1);

  const MemoryStatistics counts = find_adaptor<StatisticsAdaptor>(*handled)->statistics();
  EXPECT_EQ(counts.of(MemoryKind::Device).current_bytes, 0u);
  EXPECT_NO_THROW(handled->memalloc(8 * kMiB)) << "the whole limit after the failures";
}

TEST_F(Adaptors, AdaptorsComposeByName) {
  {
    ScopedVariable limit("CUEMM_LIMIT", "256M");
    auto manager = wrap_with_adaptors(&context, pool(), "statistics,tracking,limit");
    ASSERT_NE(find_adaptor<LimitingAdaptor>(*manager), nullptr);
    ASSERT_NE(find_adaptor<TrackingAdaptor>(*manager), nullptr);
    ASSERT_NE(find_adaptor<StatisticsAdaptor>(*manager), nullptr);
    ASSERT_NE(find_adaptor<PoolMemoryManager>(*manager), nullptr);
    EXPECT_EQ(find_adaptor<LimitingAdaptor>(*manager)->limit(), std::size_t{256} << 20);
    EXPECT_EQ(find_adaptor<LoggingAdaptor>(*manager), nullptr);
    manager->initialize();
    auto memory = manager->memalloc(1 << 20);
    EXPECT_EQ(find_adaptor<StatisticsAdaptor>(*manager)->statistics().of(MemoryKind::Device).current_bytes, 1u << 20);
    memory.reset();
    EXPECT_TRUE(
        throws<InvalidArgument>([&] { wrap_with_adaptors(&context, pool(), "statistics,sparkles"); }, "'sparkles'"));
  }
  ScopedVariable no_limit("CUEMM_LIMIT", nullptr);
  EXPECT_THROW(wrap_with_adaptors(&context, pool(), "limit"), InvalidArgument);
}

TEST_F(Adaptors, PercentPInTheLogFileIsTheProcessId) {
  const std::string directory = ::testing::TempDir();
  const std::string expected = directory + "cuemm-" + std::to_string(::getpid()) + ".csv";
  std::remove(expected.c_str());
  {
    ScopedVariable log_file("CUEMM_LOG_FILE", (directory + "cuemm-%p.csv").c_str());
    auto manager = wrap_with_adaptors(&context, pool(), "log");
    manager->initialize();
    manager->memalloc(4096).reset();
  }
  std::ifstream log(expected);
  ASSERT_TRUE(log) << "no log at " << expected;
  const std::vector<LoggedEvent> events = read_memory_log(log, expected);
  EXPECT_EQ(events.size(), 2u);
  std::remove(expected.c_str());
}

TEST_F(Adaptors, TheLogFileVariableAddsTheLog) {
  ScopedVariable no_limit("CUEMM_LIMIT", nullptr);  // (its adaptor would be added too)
  {
    ScopedVariable log_file("CUEMM_LOG_FILE", "x.csv");
    // Spaces after the commas name the same adaptors (and the log once).
    for (const auto& [named, spec] : {std::pair{"statistics", "statistics,log"}, {"log,statistics", "log,statistics"},
                                      {"statistics, log", "statistics,log"}}) {
      ScopedVariable adaptors("CUEMM_ADAPTORS", named);
      EXPECT_EQ(adaptors_from_environment(), spec) << named;
    }
  }
  auto manager = wrap_with_adaptors(&context, pool(), " statistics , tracking ");
  EXPECT_NE(find_adaptor<StatisticsAdaptor>(*manager), nullptr);
  EXPECT_NE(find_adaptor<TrackingAdaptor>(*manager), nullptr);
  ScopedVariable no_log_file("CUEMM_LOG_FILE", nullptr), no_adaptors("CUEMM_ADAPTORS", nullptr);
  EXPECT_EQ(adaptors_from_environment(), "");
}

// Two logs would write one file from two writers: an adaptor named twice is
// refused before any is made, with the name and the list.
TEST_F(Adaptors, AnAdaptorNamedTwiceIsRefused) {
  for (const char* spec : {"statistics,log,statistics", "log, log", "tracking,limit,tracking"}) {
    const std::string twice = std::string(spec).substr(0, std::string(spec).find(','));
    EXPECT_TRUE(throws<InvalidArgument>([&] { wrap_with_adaptors(&context, pool(), spec); },
                                        "the adaptor '" + twice + "' is named twice", spec))
        << spec;
  }
  EXPECT_NE(find_adaptor<StatisticsAdaptor>(*wrap_with_adaptors(&context, pool(), "statistics,,tracking")), nullptr);
}

// A cap set without naming its adaptor is a cap, not a setting ignored.
TEST_F(Adaptors, TheLimitVariableAddsTheLimit) {
  ScopedVariable no_log_file("CUEMM_LOG_FILE", nullptr), no_adaptors("CUEMM_ADAPTORS", nullptr),
      no_limit("CUEMM_LIMIT", nullptr);
  {
    ScopedVariable limit("CUEMM_LIMIT", "64M");
    EXPECT_EQ(adaptors_from_environment(), "limit");
    {
      ScopedVariable log_file("CUEMM_LOG_FILE", "x.csv");
      EXPECT_EQ(adaptors_from_environment(), "log,limit");
      ScopedVariable adaptors("CUEMM_ADAPTORS", "limit, statistics");
      EXPECT_EQ(adaptors_from_environment(), "limit,statistics,log");
    }
    auto manager = wrap_with_adaptors(&context, pool(), adaptors_from_environment());
    manager->initialize();
    ASSERT_NE(find_adaptor<LimitingAdaptor>(*manager), nullptr);
    EXPECT_EQ(find_adaptor<LimitingAdaptor>(*manager)->limit(), std::size_t{64} << 20);
    EXPECT_THROW(manager->memalloc(std::size_t{65} << 20), OutOfMemory);
  }
  EXPECT_EQ(adaptors_from_environment(), "");
}

// Logs written by other hands: a byte-order mark, spaces after the commas,
// columns in another order and no time column (rows then replay in order,
// each timed by its row's number).
TEST(MemoryLog, OtherWritersLogsReadWithTheirColumnsAnywhereAndNoTimes) {
  std::istringstream spaced("\xef\xbb\xbf" "Size (bytes), Address , Event Type, Device ID\n"
                            "4096, 0x10, Alloc, 1\n 64 , \"0x20\" , alloc , 0\r\n4096,0x10,FREE,1\n");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_memory_log(spaced, "spaced.csv", &gaps);
  EXPECT_TRUE(gaps.untimed);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].allocate && events[0].size == 4096 && events[0].device == 1);
  EXPECT_TRUE(events[1].allocate && events[1].size == 64 && events[1].device == 0);
  EXPECT_TRUE(!events[2].allocate && events[2].id == events[0].id);
  EXPECT_DOUBLE_EQ(events[0].time, 2);  // its row
  EXPECT_DOUBLE_EQ(events[2].time, 4);
  EXPECT_NE(memory_plot_svg(events, gaps.untimed).find(">row 4<"), std::string::npos);
  // With a Start column and no End, Start times it.
  std::istringstream started("Event Type,Address,Size (bytes),Start\nAlloc,0x10,64,2.5\n");
  EXPECT_DOUBLE_EQ(read_memory_log(started, "started.csv", &gaps).at(0).time, 2.5);
  EXPECT_FALSE(gaps.untimed);
  std::istringstream rmm_untimed("Action,Size,Pointer\nallocate,100,0x1\nfree,100,0x1\n");
  const std::vector<LoggedEvent> rmm = read_memory_log(rmm_untimed, "rmm.csv");
  ASSERT_EQ(rmm.size(), 2u);
  EXPECT_EQ(rmm[1].id, rmm[0].id);
}

// A writer that leaves the time fields empty (in some rows or all) does not
// stop a replay, which needs no times: such a row is read, and drawn at the
// time of the timed row above it; a log with no time in any row counts rows.
TEST(MemoryLog, RowsWithEmptyTimesAreReadAndDrawnAtTheTimeAbove) {
  const std::string header = "Event Type,Device ID,Address,Stream,Size (bytes),Free Memory,Total Memory,"
                             "Current Allocs,Start,End,Elapsed,Location\n";
  std::istringstream some(header + "Alloc,0,0x10,0,64,,,1,,,,\n"        // before any timed row
                                   "Alloc,0,0x20,0,128,,,2,1.5,1.5,0,\n"
                                   "Free,0,0x10,0,0,,,1,,,,\n"          // after a timed row
                                   "Alloc,0,0x10,0,256,,,2,,,,\n"       // 0x10 again, after its free
                                   "Alloc,0,0x10,0,512,,,3,,,,\n"       // an inferred free of the 256
                                   "Free,0,0x20,0,0,,,2,4.0,4.0,0,\n");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_memory_log(some, "blank.csv", &gaps);
  EXPECT_FALSE(gaps.untimed);
  EXPECT_EQ(gaps.rows_without_time, 4u);
  EXPECT_EQ(gaps.frees_inferred, 1u);
  ASSERT_EQ(events.size(), 7u);
  EXPECT_DOUBLE_EQ(events[0].time, 1.5) << "a row above every timed one takes the first timed row's time";
  EXPECT_DOUBLE_EQ(events[1].time, 1.5);
  EXPECT_DOUBLE_EQ(events[2].time, 1.5) << "the free takes the time of the row above";
  EXPECT_DOUBLE_EQ(events[3].time, 1.5);
  EXPECT_FALSE(events[4].allocate) << "the free that 0x10's second allocation implies";
  EXPECT_DOUBLE_EQ(events[4].time, 1.5);
  EXPECT_DOUBLE_EQ(events[6].time, 4.0);
  EXPECT_NE(memory_plot_svg(events).find(">2.500 s<"), std::string::npos)
      << "time does not run from the first row's: " << memory_plot_svg(events);
  std::istringstream none(header + "Alloc,0,0x10,0,64,,,1,,,,\nFree,0,0x10,0,0,,,0,,,,\n");
  const std::vector<LoggedEvent> untimed = read_memory_log(none, "blank.csv", &gaps);
  EXPECT_TRUE(gaps.untimed) << "no row has a time, so the rows are counted";
  ASSERT_EQ(untimed.size(), 2u);
  EXPECT_DOUBLE_EQ(untimed[1].time, 3);
  std::istringstream garbled(header + "Alloc,0,0x10,0,64,,,1,soon,soon,,\n");
  EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(garbled, "blank.csv"); }, "blank.csv:2: the time 'soon'"))
      << "a time that is there must still read";
}

// A process killed while writing its log leaves a last row cut short, with
// no newline: that row is left out and said so; a bad row anywhere else, or
// a bad last row that ends its line, is still an error naming it, and a good
// last row without a newline is kept.
TEST(MemoryLog, AnUnfinishedLastRowIsLeftOutAndSaid) {
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  const std::string rows = "1,1,allocate,0x10,64,0x0\n1,2,allocate,0x20,128,0x0\n";
  for (const std::string cut : {"1,3,free,0x10", "1,3,free,0x10,", "1,3,fr"}) {
    SCOPED_TRACE(cut);
    std::istringstream in(header + rows + cut);
    MemoryLogGaps gaps;
    EXPECT_EQ(read_memory_log(in, "cut.csv", &gaps).size(), 2u);
    EXPECT_TRUE(gaps.unfinished_last_row);
    std::istringstream ended(header + rows + cut + "\n");
    EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(ended, "cut.csv"); }, "cut.csv:4"));
    std::istringstream middle(header + cut + "\n" + rows);
    EXPECT_TRUE(throws<InvalidArgument>([&] { read_memory_log(middle, "cut.csv"); }, "cut.csv:2"));
  }
  std::istringstream whole(header + rows + "1,3,free,0x10,64,0x0");
  MemoryLogGaps gaps;
  const std::vector<LoggedEvent> events = read_memory_log(whole, "whole.csv", &gaps);
  EXPECT_FALSE(gaps.unfinished_last_row);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_FALSE(events[2].allocate);
}

// Logs mangled at random (bytes changed, put in or taken out, lines repeated,
// swapped or cut short), as a disk, an editor or another tool may leave them:
// each reads, or is refused with InvalidArgument naming the file; nothing
// else escapes. What reads holds together as a replay needs: each free pairs
// with the one live allocation of its kind and device, and the picture of it
// has only finite numbers. (Under the sanitizers' build it also shows that no
// such log reads out of bounds. A fuzzer ran 1.6 million such logs, too slow
// for every test run; these are the same mutations, seeded.)
TEST(MemoryLog, MangledLogsReadWholeOrAreRefusedNamingTheFile) {
  const std::vector<std::string> originals = {
      std::string(LoggingAdaptor::header()) +
          "\nAlloc,0,0x7f00,0,4096,0,0,1,0.5,0.52,1e-05,\nHostAlloc,1,0x9a00,0,8192,0,0,1,0.6,0.61,1e-05,"
          "\"here, there\"\nFree,0,0x7f00,0,4096,0,0,0,0.7,0.71,1e-05,\nManagedAlloc,0,0x7f00,0,64,0,0,1,0.8,0.8,0,\n"
          "HostFree,1,0x9a00,0,8192,0,0,0,0.9,0.95,0,\n",
      "Thread,Time,Action,Pointer,Size,Stream\n1,08:12:13.123456,allocate,0x7f0000000000,3000,0x0\n"
      "2,08:12:14.5,allocate failure,0x0,99999999999,0x0\n2,08:12:14.75,free,0x7f0000000000,3000,0x0\n",
      "Size (bytes),Address,Event Type\n4096,0x10,Alloc\n64,0x20,alloc\n4096,0x10,FREE\n0,0x30,Alloc\n"};
  const std::string alphabet = ",\n\r\"0123456789.-+:xeEAFlocfreHt \t\xef\xbb\xbf";
  std::mt19937 random(20261129);
  auto below = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(random); };
  std::size_t read = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text = originals[trial % originals.size()];
    for (std::size_t m = 1 + below(4); m > 0 && !text.empty(); --m) {
      const std::size_t at = below(text.size());
      switch (below(6)) {
        case 0: text[at] = alphabet[below(alphabet.size())]; break;
        case 1: text.insert(at, 1, alphabet[below(alphabet.size())]); break;
        case 2: text.erase(at, 1 + below(8)); break;
        case 3: text.resize(at); break;
        case 4: {  // a line again, just after itself
          const std::size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
          const std::size_t end = std::min(text.size(), text.find('\n', at) + 1);
          text.insert(end, text.substr(begin, end - begin));
          break;
        }
        default: {  // the line holding `at` swapped with the next
          const std::size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
          const std::size_t middle = text.find('\n', at);
          if (middle == std::string::npos) break;
          const std::size_t end = std::min(text.size(), text.find('\n', middle + 1) + 1);
          const std::string first = text.substr(begin, middle + 1 - begin);
          text.replace(begin, end - begin, text.substr(middle + 1, end - middle - 1) + "\n" + first);
          break;
        }
      }
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ", the log:\n" << text);
    std::istringstream in(text);
    MemoryLogGaps gaps;
    std::vector<LoggedEvent> events;
    try {
      events = read_memory_log(in, "mangled.csv", &gaps);
    } catch (const InvalidArgument& error) {
      ASSERT_NE(std::string(error.what()).find("mangled.csv"), std::string::npos) << error.what();
      continue;
    } catch (const std::exception& error) {
      FAIL() << "read_memory_log() threw another error: " << error.what();
    }
    ++read;
    std::map<std::uint64_t, const LoggedEvent*> live;
    for (const LoggedEvent& event : events) {
      ASSERT_TRUE(std::isfinite(event.time));
      if (event.allocate) {
        ASSERT_GT(event.size, 0u) << "a zero-byte allocation was kept";
        ASSERT_TRUE(live.emplace(event.id, &event).second) << "two live allocations share id " << event.id;
        continue;
      }
      const auto it = live.find(event.id);
      ASSERT_NE(it, live.end()) << "a free of id " << event.id << ", which is not live";
      ASSERT_EQ(it->second->kind, event.kind);
      ASSERT_EQ(it->second->device, event.device);
      live.erase(it);
    }
    const std::string svg = memory_plot_svg(events, gaps.untimed);
    ASSERT_EQ(svg.rfind("<svg", 0), 0u);
    for (const char* bad : {"nan", "inf"}) ASSERT_EQ(svg.find(bad), std::string::npos) << svg;
  }
  // Most mangled logs still read (the mutations are small): the checks above
  // ran on thousands of them, not on none.
  EXPECT_GT(read, 5000u);
}
