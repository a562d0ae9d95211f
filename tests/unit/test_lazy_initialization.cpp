// NBEP 7's import-order promise: loading cuemm, registering a plugin and making
// objects before first use call no driver function; the driver is loaded (and
// the manager initialised) only at first use. Runs in its own process.
#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::RecordingManager;
using cuemm::testing::recording_log;

TEST(LazyInitialization, NothingTouchesTheDriverBeforeFirstUse) {
  set_memory_manager<RecordingManager>();
  RecordingManager probe(nullptr);
  EXPECT_EQ(probe.interface_version(), 1);
  PendingDeallocations pending;
  CleanupGuard guard = pending.defer();
  Stream legacy = Stream::legacy_default();
  auto bytes = IpcHandle(nullptr, cuda::CUipcMemHandle{}, 64, DeviceIdentity{0, 1, 0}, 0).to_bytes();
  IpcHandle rebuilt = IpcHandle::from_bytes(bytes);
  auto memory = std::make_shared<MemoryPointer>(nullptr, 0x1000, 16);
  EXPECT_FALSE(driver::Driver::is_loaded()) << "building objects loaded the driver";

  Context& context = current_context();  // first use
  EXPECT_TRUE(driver::Driver::is_loaded());
  if (simulation::active()) {
    EXPECT_EQ(simulation::call_count("cuInit"), 1u);
  }
  auto allocation = context.memalloc(100);
  const auto events = recording_log()->snapshot();
  ASSERT_FALSE(events.empty());
  const auto initialize = std::find(events.begin(), events.end(), "initialize");
  const auto memalloc = std::find(events.begin(), events.end(), "memalloc");
  ASSERT_NE(initialize, events.end());
  ASSERT_NE(memalloc, events.end());
  EXPECT_LT(initialize - events.begin(), memalloc - events.begin()) << "memalloc ran before initialize";
  EXPECT_EQ(recording_log()->count("memalloc-before-initialize"), 0);
}
