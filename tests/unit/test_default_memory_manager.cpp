// Numba's own behaviour, as the default manager: deferred frees with count and
// byte thresholds, defer_cleanup, flush-and-retry on out-of-memory, host and
// managed memory, reset, and clear errors that leave nothing behind.
#include <cstring>
#include <numeric>

#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::caught;
using cuemm::testing::throws;

namespace {

class DefaultManager : public ::testing::Test {
 protected:
  void SetUp() override {
    manager = dynamic_cast<DefaultMemoryManager*>(&context.memory_manager());
    ASSERT_NE(manager, nullptr) << "expected the default manager, got " << memory_manager_name();
    manager->deallocations().flush_all();
    if (simulation::active()) simulation::clear_faults();
  }
  void TearDown() override {
    if (simulation::active()) simulation::clear_faults();
  }
  std::uint64_t frees() { return simulation::call_count("cuMemFree"); }

  Context& context = current_context();
  DefaultMemoryManager* manager = nullptr;
};

}  // namespace

TEST_F(DefaultManager, ZerosGoToTheDeviceAndBack) {
  std::vector<double> zeros(10, 0.0);
  auto array = to_device(zeros);
  EXPECT_EQ(array.copy_to_host(), zeros);
  std::vector<double> values(10);
  std::iota(values.begin(), values.end(), 1.0);
  array.copy_to_device(values);
  EXPECT_EQ(array.copy_to_host(), values);
  array.memset(0);
  EXPECT_EQ(array.copy_to_host(), zeros);
}

TEST_F(DefaultManager, FreesWaitUntilMoreThanTheCountArePending) {
  CUEMM_REQUIRE_SIMULATION("call counters");
  ASSERT_EQ(manager->deallocations().max_count(), 10u);
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 11; ++i) blocks.push_back(context.memalloc(4096));
  const auto before = frees();
  for (int i = 0; i < 10; ++i) blocks[i].reset();
  EXPECT_EQ(frees(), before) << "a free was not deferred";
  EXPECT_EQ(manager->deallocations().pending_count(), 10u);
  blocks[10].reset();  // 11 > 10
  EXPECT_EQ(frees(), before + 11);
  EXPECT_EQ(manager->deallocations().pending_count(), 0u);
}

TEST_F(DefaultManager, ALargeFreeFlushesThroughTheByteThreshold) {
  const MemoryInfo info = context.get_memory_info();
  const std::size_t threshold = manager->deallocations().max_bytes();
  EXPECT_EQ(threshold, static_cast<std::size_t>(static_cast<double>(info.total) * 0.2));
  auto small = context.memalloc(4096);
  small.reset();
  EXPECT_EQ(manager->deallocations().pending_count(), 1u);
  auto large = context.memalloc(threshold + (1u << 20));
  large.reset();
  EXPECT_EQ(manager->deallocations().pending_count(), 0u) << "over the byte threshold, yet still pending";
}

TEST_F(DefaultManager, DeferCleanupHoldsFreesUntilItEnds) {
  {
    auto guard = context.defer_cleanup();
    for (int i = 0; i < 25; ++i) context.memalloc(4096).reset();
    EXPECT_EQ(manager->deallocations().pending_count(), 25u);
  }
  EXPECT_EQ(manager->deallocations().pending_count(), 0u);
}

TEST_F(DefaultManager, OutOfMemoryFlushesPendingFreesAndRetriesOnce) {
  CUEMM_REQUIRE_SIMULATION("fault injection and call counters");
  for (int i = 0; i < 3; ++i) context.memalloc(1u << 20).reset();
  ASSERT_EQ(manager->deallocations().pending_count(), 3u);
  const auto allocs = simulation::call_count("cuMemAlloc");
  const auto before = frees();
  simulation::inject_fault("cuMemAlloc", 1, cuda::CUDA_ERROR_OUT_OF_MEMORY);
  auto memory = context.memalloc(1u << 20);
  EXPECT_TRUE(memory->is_alive());
  EXPECT_EQ(simulation::call_count("cuMemAlloc"), allocs + 2) << "expected one failure and one retry";
  EXPECT_EQ(frees(), before + 3) << "the pending frees were not flushed before the retry";
}

TEST_F(DefaultManager, OutOfMemoryWithNothingToFlushNamesTheRequestAndTheDevicesFreeMemory) {
  const std::size_t live = manager->live_allocations();
  const std::size_t huge = std::size_t{1} << 50;  // 1 PiB: more than any device
  const auto error = caught<OutOfMemory>([&] { context.memalloc(huge); });
  ASSERT_TRUE(error) << "a 1 PiB allocation succeeded";
  const std::string message = error->what();
  EXPECT_EQ(message.rfind("[CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY", 0), 0u)
      << message;
  EXPECT_NE(message.find("1125899906842624 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("the device has "), std::string::npos) << "not what the device has free: " << message;
  EXPECT_EQ(error->code(), cuda::CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(error->requested(), huge);
  EXPECT_EQ(manager->live_allocations(), live);
  auto after = context.memalloc(4096);  // still usable
  EXPECT_TRUE(after->is_alive());
}

TEST_F(DefaultManager, ZeroSizesAndNullPointersAreRefusedByName) {
  char buffer[64];
  EXPECT_TRUE(throws<InvalidArgument>([&] { context.memalloc(0); }, "memalloc: size must be at least 1 byte (got 0)"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { context.memhostalloc(0); }, "memhostalloc: size"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { context.memallocmanaged(0); }, "memallocmanaged: size"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { context.mempin(nullptr, nullptr, 64); }, "mempin: the pointer is null"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { context.mempin(nullptr, buffer, 0); }, "mempin: size"));
  EXPECT_TRUE(throws<InvalidArgument>([&] { manager->memalloc(0); }, "memalloc: size"));
}

TEST_F(DefaultManager, MappedHostMemoryIsVisibleThroughItsDevicePointer) {
  auto mapped = context.memhostalloc(4096, /*mapped=*/true);
  EXPECT_EQ(mapped->kind(), MemoryKind::Mapped);
  EXPECT_NE(dynamic_cast<MappedMemory*>(mapped.get()), nullptr);
  auto* host = reinterpret_cast<std::uint32_t*>(mapped->host_pointer());
  for (int i = 0; i < 1024; ++i) host[i] = 7u * i;
  std::vector<std::uint32_t> read(1024);
  DeviceArray<std::uint32_t> view(mapped, 1024);
  view.copy_to_host(read);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(read[i], 7u * i);

  auto pinned = context.memhostalloc(4096, false, /*portable=*/true, /*wc=*/true);
  EXPECT_EQ(pinned->kind(), MemoryKind::Pinned);
  EXPECT_THROW((void)pinned->device_pointer(), StateError);
}

TEST_F(DefaultManager, MempinPinsAnyRegionOnceAndUnpinsOnRelease) {
  auto buffer = std::make_shared<std::vector<char>>(3 * 4096);
  char* unaligned = buffer->data() + 1;  // the driver pins whole pages around it
  auto pinned = context.mempin(buffer, unaligned, 4096);
  EXPECT_EQ(pinned->kind(), MemoryKind::Pinned);
  EXPECT_EQ(pinned->host_pointer(), reinterpret_cast<std::uintptr_t>(unaligned));
  const auto twice = caught<CudaError>([&] { context.mempin(buffer, unaligned, 4096); });
  ASSERT_TRUE(twice) << "pinning the same region twice succeeded";
  EXPECT_EQ(twice->code_name(), "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED") << twice->what();
  pinned.reset();  // unpinned at once: nothing waits in the queue
  EXPECT_EQ(manager->deallocations().pending_count(), 0u);
  auto mapped = context.mempin(buffer, unaligned, 4096, /*mapped=*/true);
  EXPECT_EQ(mapped->kind(), MemoryKind::Mapped);
  EXPECT_EQ(mapped->device_pointer(), reinterpret_cast<cuda::CUdeviceptr>(unaligned));
}

// A released pin is unpinned at once, as Numba's finalizer does, not queued
// with the deferred frees: the range can be pinned again at any time, inside
// defer_cleanup() too, where nothing queued would run (numba's
// test_pinned_contextmanager and test_mapped_contextmanager).
TEST_F(DefaultManager, AReleasedPinIsUnpinnedAtOnceEvenUnderDeferCleanup) {
  auto buffer = std::make_shared<std::vector<char>>(3 * 4096);
  char* start = buffer->data() + 1;
  context.mempin(buffer, start, 4096).reset();
  EXPECT_EQ(manager->deallocations().pending_count(), 0u) << "the unpin waited in the queue";
  std::shared_ptr<MemoryPointer> again;
  ASSERT_NO_THROW(again = context.mempin(buffer, start, 4096, /*mapped=*/true));
  EXPECT_EQ(again->host_pointer(), reinterpret_cast<std::uintptr_t>(start));
  // Pinning a range that is pinned now is still refused, by name.
  EXPECT_TRUE(throws<CudaError>([&] { context.mempin(buffer, start, 4096); }, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"));
  again.reset();
  {
    auto guard = context.defer_cleanup();
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("pin " + std::to_string(round) + " under defer_cleanup");
      std::shared_ptr<MemoryPointer> pinned;
      ASSERT_NO_THROW(pinned = context.mempin(buffer, start, 4096, /*mapped=*/round % 2 == 1));
    }
    // Device memory released meanwhile still waits for the guard.
    context.memalloc(4096).reset();
    EXPECT_EQ(manager->deallocations().pending_count(), 1u);
  }
}

// What a release adds to the pending bytes, as Numba's finalizers count it:
// device, managed and mapped memory their size, pinned host memory nothing.
TEST_F(DefaultManager, PendingBytesCountWhatNumbaCounts) {
  manager->deallocations().flush_all();
  auto expect_pending = [&](std::shared_ptr<MemoryPointer> memory, std::size_t bytes, const char* what) {
    const std::size_t before = manager->deallocations().pending_bytes();
    memory.reset();
    EXPECT_EQ(manager->deallocations().pending_bytes() - before, bytes) << what;
  };
  expect_pending(context.memalloc(8192), 8192, "device memory");
  expect_pending(context.memallocmanaged(8192, true), 8192, "managed memory");
  expect_pending(context.memhostalloc(8192, /*mapped=*/true, false, false), 8192, "mapped memory");
  expect_pending(context.memhostalloc(8192, /*mapped=*/false, false, false), 0, "pinned host memory");
  manager->deallocations().flush_all();
}

TEST_F(DefaultManager, ManagedMemoryIsReachableFromHostAndDevice) {
  auto managed = context.memallocmanaged(1 << 16);
  EXPECT_EQ(managed->kind(), MemoryKind::Managed);
  managed->memset(0x5a);
  context.synchronize();
  const auto* bytes = reinterpret_cast<const unsigned char*>(managed->host_pointer());
  EXPECT_EQ(bytes[0], 0x5a);
  EXPECT_EQ(bytes[(1 << 16) - 1], 0x5a);
}

TEST_F(DefaultManager, ResetReleasesEverythingAndLeavesPointersDead) {
  const std::size_t live_before = manager->live_allocations();
  auto device = context.memalloc(1 << 20);
  auto pinned = context.memhostalloc(4096);
  auto managed = context.memallocmanaged(4096);
  const auto sim_before = simulation::active() ? simulation::live_allocations() : 0;
  context.reset();
  EXPECT_FALSE(device->is_alive());
  EXPECT_FALSE(pinned->is_alive());
  EXPECT_FALSE(managed->is_alive());
  EXPECT_EQ(manager->live_allocations(), 0u);
  if (simulation::active()) {
    EXPECT_EQ(simulation::live_allocations(), sim_before - 3 - live_before);
    const auto frees_before = frees();
    device.reset();
    managed.reset();
    manager->deallocations().flush_all();
    EXPECT_EQ(frees(), frees_before) << "memory released by reset was freed again";
  }
  EXPECT_THROW(pinned->free(), StateError);
}

// Every driver call an allocation makes may fail: the manager must stay
// consistent (nothing tracked, nothing leaked) and work again afterwards.
TEST_F(DefaultManager, AFailureAtEveryDriverCallLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("fault injection");
  context.reset();
  const auto sim_live = simulation::live_allocations();
  struct Case {
    const char* function;
    std::function<void()> operation;
  };
  const std::vector<Case> cases = {
      {"cuMemAlloc", [&] { context.memalloc(4096); }},
      {"cuCtxGetCurrent", [&] { context.memalloc(4096); }},
      {"cuMemHostAlloc", [&] { context.memhostalloc(4096, true); }},
      {"cuMemHostGetDevicePointer", [&] { context.memhostalloc(4096, true); }},
      {"cuMemHostRegister", [&] {
         static std::vector<char> buffer(8192);
         context.mempin(nullptr, buffer.data(), 4096, true);
       }},
      {"cuMemAllocManaged", [&] { context.memallocmanaged(4096); }},
      {"cuMemGetInfo", [&] { context.get_memory_info(); }},
      {"cuIpcGetMemHandle", [&] { context.get_ipc_handle(context.memalloc(4096)); }},
      {"cuMemGetAddressRange", [&] { context.get_ipc_handle(context.memalloc(4096)); }},
  };
  for (const auto& test : cases) {
    SCOPED_TRACE(test.function);
    simulation::inject_fault(test.function, 1, cuda::CUDA_ERROR_UNKNOWN);
    const auto error = caught<CudaError>(test.operation);
    EXPECT_TRUE(error) << "no error when " << test.function << " failed";
    if (error) {
      EXPECT_EQ(error->code(), cuda::CUDA_ERROR_UNKNOWN);
      EXPECT_NE(std::string(error->what()).find(test.function), std::string::npos) << error->what();
    }
    simulation::clear_faults();
    manager->deallocations().flush_all();
    EXPECT_EQ(manager->live_allocations(), 0u);
    EXPECT_EQ(simulation::live_allocations(), sim_live);
    EXPECT_NO_THROW(test.operation()) << "the manager did not recover";
    manager->deallocations().flush_all();
    EXPECT_EQ(simulation::live_allocations(), sim_live);
  }
}

TEST_F(DefaultManager, ThreadsAllocatingTogetherKeepTheirContents) {
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 40; ++round) {
        std::vector<std::uint32_t> values(257 + round, static_cast<std::uint32_t>(t * 1000 + round));
        auto array = to_device(values, Stream(), context);
        if (array.copy_to_host() != values) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, 0);
}
