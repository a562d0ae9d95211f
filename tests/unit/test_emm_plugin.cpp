// The behaviours numba-cuda checks for EMM plugins, against a device-only
// plugin that records its calls. Runs in its own process: the plugin is
// registered before any context exists.
#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::ManagerLog;
using cuemm::testing::recording_log;
using cuemm::testing::RecordingManager;
using cuemm::testing::throws;

namespace {

class RegisterRecordingManager : public ::testing::Environment {
 public:
  void SetUp() override { set_memory_manager<RecordingManager>(); }
};
const auto* const kRegistration = ::testing::AddGlobalTestEnvironment(new RegisterRecordingManager);

class EmmPlugin : public ::testing::Test {
 protected:
  Context& context = current_context();
  ManagerLog& log = *recording_log();
};

class VersionTwoManager : public RecordingManager {
 public:
  using RecordingManager::RecordingManager;
  int interface_version() const override { return 2; }
};

}  // namespace

TEST_F(EmmPlugin, TheContextUsesThePlugin) {
  EXPECT_NE(dynamic_cast<RecordingManager*>(&context.memory_manager()), nullptr);
  EXPECT_EQ(memory_manager_name(), "custom");
}

TEST_F(EmmPlugin, InitializeRunsBeforeTheFirstMemalloc) {
  auto memory = context.memalloc(256);
  EXPECT_GE(log.count("initialize"), 1);
  EXPECT_EQ(log.count("memalloc-before-initialize"), 0);
}

TEST_F(EmmPlugin, FinalizerRunsOnReleaseAndOnlyThen) {
  const int before = log.finalized;
  auto memory = context.memalloc(1024);
  auto array_reference = memory;
  memory.reset();
  EXPECT_EQ(log.finalized, before) << "finalized while a reference remained";
  array_reference.reset();
  EXPECT_EQ(log.finalized, before + 1);
  {
    DeviceArray<float> array(64, context);
    EXPECT_EQ(log.finalized, before + 1);
  }
  EXPECT_EQ(log.finalized, before + 2) << "a device array's memory was not given back";
}

TEST_F(EmmPlugin, ResetReachesThePlugin) {
  const int before = log.count("reset");
  context.reset();
  EXPECT_EQ(log.count("reset"), before + 1);
}

TEST_F(EmmPlugin, MemoryInfoAndIpcRequestsRouteToThePlugin) {
  const MemoryInfo info = context.get_memory_info();
  EXPECT_EQ(info.free, 1234u);
  EXPECT_EQ(info.total, 5678u);
  auto memory = context.memalloc(64);
  const int before = log.count("get_ipc_handle");
  IpcHandle handle = context.get_ipc_handle(memory);
  EXPECT_EQ(log.count("get_ipc_handle"), before + 1);
  EXPECT_EQ(handle.size(), 64u);
}

TEST_F(EmmPlugin, DeferCleanupNestsAndChainsToTheHostSide) {
  auto& manager = dynamic_cast<RecordingManager&>(context.memory_manager());
  const int begun = log.count("defer_cleanup");
  const int ended = log.count("defer_cleanup_end");
  {
    auto outer = context.defer_cleanup();
    {
      auto inner = context.defer_cleanup();
      EXPECT_TRUE(manager.deallocations().is_deferred());
      auto pinned = context.memhostalloc(4096);
      pinned.reset();
      EXPECT_GE(manager.deallocations().pending_count(), 1u) << "host memory was freed inside defer_cleanup";
    }
    EXPECT_EQ(log.count("defer_cleanup_end"), ended + 1);
    EXPECT_TRUE(manager.deallocations().is_deferred());
  }
  EXPECT_EQ(log.count("defer_cleanup"), begun + 2);
  EXPECT_EQ(log.count("defer_cleanup_end"), ended + 2);
  EXPECT_FALSE(manager.deallocations().is_deferred());
}

TEST_F(EmmPlugin, TheRuntimeNeverCallsCuMemAllocOrCuMemFree) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  simulation::reset_call_counts();
  {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 50; ++i) blocks.push_back(context.memalloc(1u << 20));
    auto view = blocks[0]->view(128);
    DeviceArray<double> array(1000, context);
    Stream stream = context.create_stream();
    Event event = context.create_event();
    event.record(stream);
    stream.synchronize();
  }
  context.deallocations().flush_all();
  context.reset();
  EXPECT_EQ(simulation::call_count("cuMemAlloc"), 0u);
  EXPECT_EQ(simulation::call_count("cuMemFree"), 0u);
  EXPECT_GE(simulation::call_count("cuStreamDestroy"), 1u) << "the stream went through the context queue";
}

TEST_F(EmmPlugin, StreamsEventsAndModulesAreReleasedByTheContextNotTheManager) {
  const auto events_before = log.snapshot().size();
  const std::size_t pending_before = context.deallocations().pending_count();
  {
    Stream stream = context.create_stream();
    Event event = context.create_event();
    Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  }
  EXPECT_EQ(context.deallocations().pending_count(), pending_before + 3);
  EXPECT_EQ(log.snapshot().size(), events_before) << "the manager saw a stream, event or module";
  context.deallocations().flush_all();
  EXPECT_EQ(context.deallocations().pending_count(), 0u);
}

TEST_F(EmmPlugin, InitializeMayRunAgainWithoutLosingState) {
  auto& manager = dynamic_cast<RecordingManager&>(context.memory_manager());
  auto pinned = context.memhostalloc(4096);
  const std::size_t live = manager.live_allocations();
  context.prepare_for_use();
  context.prepare_for_use();
  EXPECT_EQ(manager.live_allocations(), live);
  EXPECT_TRUE(pinned->is_alive());
}

TEST_F(EmmPlugin, ResetBeforeInitializeIsSafe) {
  RecordingManager fresh(&context);
  EXPECT_NO_THROW(fresh.reset());
  EXPECT_NO_THROW(fresh.initialize());
  EXPECT_NO_THROW(fresh.reset());
}

TEST_F(EmmPlugin, SetMemoryManagerOnceAContextExistsIsRefused) {
  EXPECT_TRUE(throws<StateError>([&] { set_memory_manager<RecordingManager>(); }, "before the first context"));
}

TEST_F(EmmPlugin, APluginDeclaringInterfaceVersionTwoIsRefusedNamingBothVersions) {
  EXPECT_TRUE(throws<PluginError>([&] { set_memory_manager<VersionTwoManager>(); }, "version 2", "version 1"));
}
