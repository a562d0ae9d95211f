// Devices, contexts, streams, events, modules and device arrays.
#include <chrono>
#include <limits>
#include <thread>

#include "support/host_allocation_faults.hpp"
#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::caught;
using cuemm::testing::throws;

namespace {
class Runtime : public ::testing::Test {
 protected:
  Context& context = current_context();
};
constexpr std::uint64_t kSpinNanoseconds = 50'000'000;  // long enough to still run when the host moves on
}  // namespace

TEST_F(Runtime, DevicesHaveNamesUuidsAndIdentities) {
  ASSERT_GE(Device::count(), 1);
  for (int i = 0; i < Device::count(); ++i) {
    Device& device = Device::get(i);
    EXPECT_EQ(device.id(), i);
    EXPECT_FALSE(device.name().empty());
    EXPECT_EQ(device.uuid().rfind("GPU-", 0), 0u) << device.uuid();
    EXPECT_EQ(device.uuid().size(), 40u) << device.uuid();
    EXPECT_EQ(&Device::from_identity(device.identity()), &device);
    EXPECT_GE(device.compute_capability().first, 3);
  }
}

TEST_F(Runtime, AnOrdinalBeyondTheDevicesNamesTheCount) {
  EXPECT_TRUE(throws<InvalidArgument>([&] { Device::get(Device::count()); },
                                      "sees " + std::to_string(Device::count()) + " device"));
  EXPECT_THROW(Device::get(-1), InvalidArgument);
  EXPECT_THROW(Device::from_identity(DeviceIdentity{999, 999, 999}), InvalidArgument);
}

TEST_F(Runtime, TheCurrentContextIsDeviceZerosPrimaryContext) {
  EXPECT_EQ(&context, &Device::get(0).primary_context());
  EXPECT_EQ(&context.device(), &Device::get(0));
  EXPECT_EQ(&current_context(), &context);
  const MemoryInfo info = context.get_memory_info();
  EXPECT_GT(info.total, 0u);
  EXPECT_LE(info.free, info.total);
}

TEST_F(Runtime, EveryThreadSeesTheSameContext) {
  std::vector<std::thread> threads;
  std::atomic<int> same{0};
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { same += &current_context() == &context; });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(same, 4);
}

TEST_F(Runtime, DeviceArraysRoundTripOnAStream) {
  Stream stream = context.create_stream();
  std::vector<int> values(1000);
  for (int i = 0; i < 1000; ++i) values[i] = i * i;
  auto array = to_device(values, stream);
  std::vector<int> back(1000, -1);
  array.copy_to_host(back, stream);
  stream.synchronize();
  EXPECT_EQ(back, values);
  array.memset(0xff, stream);
  array.copy_to_host(back, stream);
  stream.synchronize();
  EXPECT_EQ(back, std::vector<int>(1000, -1));
  EXPECT_THROW(array.copy_to_host(std::span<int>(back.data(), 10)), InvalidArgument);
  EXPECT_TRUE(device_array<float>(0).empty());
}

// A count whose bytes pass 2^64 is refused by name, not wrapped to a small
// block that the array's size then overstates; so is wrapping memory that
// holds fewer bytes than the count asks for.
TEST_F(Runtime, DeviceArraysRefuseCountsWhoseBytesWrap) {
  const std::size_t wraps = (std::numeric_limits<std::size_t>::max() / sizeof(double)) + 2;  // * 8 wraps to 8
  EXPECT_TRUE(throws<InvalidArgument>([&] { device_array<double>(wraps); }, std::to_string(wraps),
                                                      "8 bytes"));
  auto memory = context.memalloc(64);
  EXPECT_TRUE(throws<InvalidArgument>([&] { DeviceArray<double>(memory, wraps); },
                                                      std::to_string(wraps)));
  EXPECT_THROW(DeviceArray<double>(memory, 9), InvalidArgument);
  EXPECT_EQ(DeviceArray<double>(memory, 8).nbytes(), 64u);
}

// Copies and memsets into memory already given back are refused by name
// (they would write bytes the manager may have handed to another block),
// through the array and through a view of the freed memory.
TEST_F(Runtime, CopiesIntoFreedMemoryAreRefused) {
  auto array = device_array<int>(256);
  auto view = array.gpu_data()->view(0, 512);
  array.gpu_data()->free();
  std::vector<int> values(256, 7);
  EXPECT_TRUE(throws<StateError>([&] { array.copy_to_device(values); }, "copy to the device of freed device memory"));
  EXPECT_TRUE(throws<StateError>([&] { array.copy_to_host(values); }, "copy to the host of freed"));
  EXPECT_TRUE(throws<StateError>([&] { array.memset(0); }, "memset of freed"));
  EXPECT_FALSE(view->is_alive()) << "a view of freed memory reads as alive";
  EXPECT_TRUE(throws<StateError>([&] { view->memset(0); }, "memset of freed"));
  EXPECT_EQ(values, std::vector<int>(256, 7));
}

TEST_F(Runtime, KernelsOnAStreamRunInOrder) {
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Function spin_fill = module.function("cuemm_spin_fill_u32");
  Function add = module.function("cuemm_add_u32");
  Stream stream = context.create_stream();
  const std::uint64_t count = 1 << 16;
  auto array = device_array<std::uint32_t>(count);
  spin_fill.launch({64}, {256}, stream, array.device_pointer(), 41u, count, kSpinNanoseconds);
  add.launch({64}, {256}, stream, array.device_pointer(), 1u, count);
  std::vector<std::uint32_t> back(count);
  array.copy_to_host(back, stream);
  stream.synchronize();
  EXPECT_EQ(back, std::vector<std::uint32_t>(count, 42u));
}

TEST_F(Runtime, TheLegacyStreamWaitsForBlockingStreams) {
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Stream stream = context.create_stream();
  const std::uint64_t count = 4096;
  auto array = device_array<std::uint32_t>(count);
  array.memset(0);
  module.function("cuemm_spin_fill_u32").launch({16}, {256}, stream, array.device_pointer(), 9u, count,
                                                  kSpinNanoseconds);
  EXPECT_EQ(array.copy_to_host(), std::vector<std::uint32_t>(count, 9u))
      << "a synchronous copy did not wait for the blocking stream's kernel";
}

TEST_F(Runtime, EventsOrderStreamsAndMeasureTime) {
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Stream producer = context.create_stream(/*non_blocking=*/true);
  Stream consumer = context.create_stream(/*non_blocking=*/true);
  Event start = context.create_event();
  Event produced = context.create_event();
  const std::uint64_t count = 4096;
  auto array = device_array<std::uint32_t>(count);
  start.record(producer);
  module.function("cuemm_spin_fill_u32").launch({16}, {256}, producer, array.device_pointer(), 5u, count,
                                                  kSpinNanoseconds);
  produced.record(producer);
  consumer.wait_event(produced);
  module.function("cuemm_add_u32").launch({16}, {256}, consumer, array.device_pointer(), 1u, count);
  std::vector<std::uint32_t> back(count);
  array.copy_to_host(back, consumer);
  consumer.synchronize();
  EXPECT_EQ(back, std::vector<std::uint32_t>(count, 6u));
  EXPECT_TRUE(produced.query());
  EXPECT_GT(Event::elapsed_time(start, produced), 0.0f);
}

TEST_F(Runtime, StreamCallbacksRunAfterEarlierWork) {
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  Stream stream = context.create_stream();
  auto array = device_array<std::uint32_t>(256);
  std::atomic<bool> ran{false};
  module.function("cuemm_spin_fill_u32").launch({1}, {256}, stream, array.device_pointer(), 3u,
                                                  std::uint64_t{256}, kSpinNanoseconds);
  stream.add_callback([&] { ran = true; });
  stream.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_TRUE(stream.query());
}

// The driver answers "invalid handle" for an event without timing and for
// one not recorded; the error says what that means.
TEST_F(Runtime, TheElapsedTimeOfEventsThatHaveNoneSaysWhy) {
  Event timed = context.create_event();
  Event untimed = context.create_event(/*timing=*/false);
  Event unrecorded = context.create_event();
  timed.record();
  untimed.record();
  timed.synchronize();
  untimed.synchronize();
  for (const Event* other : {&untimed, &unrecorded}) {
    const auto error = caught<CudaError>([&] { Event::elapsed_time(timed, *other); });
    ASSERT_TRUE(error);
    EXPECT_EQ(error->code_name(), "CUDA_ERROR_INVALID_HANDLE");
    EXPECT_NE(std::string(error->what()).find("without timing"), std::string::npos) << error->what();
  }
  EXPECT_GE(Event::elapsed_time(timed, timed), 0.0f);
}

// An event records streams of its own context only (the driver's answer is a
// bare "invalid handle"); another device's stream may still wait for it.
TEST_F(Runtime, AnEventRecordsOnlyStreamsOfItsOwnContextAndOthersWaitForIt) {
  if (Device::count() < 2) GTEST_SKIP() << "needs two devices (the simulated driver gives two with CUEMM_SIM_DEVICES=2)";
  Context& other = Device::get(1).primary_context();
  Event event = context.create_event();
  Stream foreign = other.create_stream();
  EXPECT_TRUE(throws<InvalidArgument>([&] { event.record(foreign); }, "device 0's context", "device 1's"));
  event.record();
  EXPECT_NO_THROW(foreign.wait_event(event));
  EXPECT_NO_THROW(foreign.synchronize());
}

// A callback runs on a driver thread, where an exception would end the
// program: it comes out of the stream's next synchronize() instead, once,
// and the stream works on.
TEST_F(Runtime, WhatAStreamCallbackThrowsComesOutOfTheStreamsSynchronize) {
  Stream stream = context.create_stream();
  stream.add_callback([] { throw std::runtime_error("the first callback failed"); });
  stream.add_callback([] { throw std::runtime_error("the second callback failed"); });
  std::atomic<bool> ran{false};
  stream.add_callback([&] { ran = true; });
  const auto error = caught<std::runtime_error>([&] { stream.synchronize(); });
  ASSERT_TRUE(error) << "the callback's exception was lost";
  EXPECT_STREQ(error->what(), "the first callback failed");
  EXPECT_TRUE(ran) << "a callback after the one that threw did not run";
  EXPECT_NO_THROW(stream.synchronize()) << "a failure came out twice";
  ran = false;
  stream.add_callback([&] { ran = true; });
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_TRUE(ran);
}

// A default stream's callback failure comes out of the context's
// synchronize(), and not out of another stream's.
TEST_F(Runtime, WhatADefaultStreamsCallbackThrowsComesOutOfTheContextsSynchronize) {
  Stream other = context.create_stream();
  Stream().add_callback([] { throw std::invalid_argument("a default stream's callback failed"); });
  EXPECT_NO_THROW(other.synchronize());
  const auto error = caught<std::invalid_argument>([&] { context.synchronize(); });
  ASSERT_TRUE(error);
  EXPECT_STREQ(error->what(), "a default stream's callback failed");
  EXPECT_NO_THROW(context.synchronize());
}

TEST_F(Runtime, AMissingKernelIsNamed) {
  Module module = context.load_module(cuemm::testing::test_kernels_ptx());
  const auto error = caught<CudaError>([&] { module.function("no_such_kernel"); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code_name(), "CUDA_ERROR_NOT_FOUND");
  EXPECT_NE(std::string(error->what()).find("no_such_kernel"), std::string::npos) << error->what();
  EXPECT_THROW(context.load_module(""), InvalidArgument);
}

TEST_F(Runtime, StreamsAndEventsAreReleasedThroughTheContextQueue) {
  context.deallocations().flush_all();
  {
    Stream stream = context.create_stream();
    Event event = context.create_event(false);
    event.record(stream);
    event.synchronize();
  }
  EXPECT_EQ(context.deallocations().pending_count(), 2u);
  context.deallocations().flush_all();
  EXPECT_EQ(context.deallocations().pending_count(), 0u);
}

// A handle is released once, by its last owner (moves hand it on); a
// default stream, which no one owns, never. Those made before a reset of the
// context are still released when they go, as the driver still has them
// (Numba's reset leaves streams alone too; they had leaked here before).
// (Only a device reset, which destroys them, makes them stale.)
TEST_F(Runtime, AHandleIsReleasedOnceByItsLastOwner) {
  context.deallocations().flush_all();
  {
    Stream first = context.create_stream();
    Stream second = std::move(first);
    Stream third = context.create_stream();
    third = std::move(second);  // third's own stream is released here
    EXPECT_EQ(context.deallocations().pending_count(), 1u);
    Module module = context.load_module(cuemm::testing::test_kernels_ptx());
    Module moved = std::move(module);
    Stream legacy = Stream::legacy_default();
    Stream per_thread = Stream::per_thread_default();
  }
  EXPECT_EQ(context.deallocations().pending_count(), 3u) << "two streams and a module, each once";
  context.deallocations().flush_all();

  Stream made_before = context.create_stream();
  Event event = context.create_event();
  context.reset();
  made_before.synchronize();  // still the driver's
  { Stream gone = std::move(made_before); }
  { Event gone = std::move(event); }
  EXPECT_EQ(context.deallocations().pending_count(), 2u) << "a context reset leaked its streams and events";
  context.deallocations().flush_all();
}

// Each host allocation of a runtime workload fails in turn, as where the
// process runs out of memory (a stream, an event, a module and its kernel,
// device arrays, a callback, pinned memory through the context): each call
// throws or completes, and once all is released the driver holds no more
// streams, events, modules or memory than before.
TEST_F(Runtime, AnyHostAllocationFailingLeavesNothingBehind) {
  CUEMM_REQUIRE_SIMULATION("record of what is allocated, and its call counters");  // (the counts are the simulated driver's; the fault spares its own allocations)
  const std::string ptx = cuemm::testing::test_kernels_ptx();
  const std::uint32_t count = 1024;
  const std::vector<std::uint32_t> values(count, 41u);
  std::vector<std::uint32_t> back(count);
  context.deallocations().flush_all();
  if (auto* host = find_adaptor<HostOnlyMemoryManager>(context.memory_manager())) host->deallocations().flush_all();
  context.synchronize();
  const auto streams = simulation::live_streams();
  const auto allocations = simulation::live_allocations();
  const auto device_bytes = simulation::device_bytes_in_use(0);
  simulation::reset_call_counts();
  std::uint64_t nth = 1;
  for (bool struck = true; struck; ++nth) {
    ASSERT_LT(nth, 20000u);
    SCOPED_TRACE("host allocation " + std::to_string(nth) + " failing");
    std::string failed;
    std::atomic<bool> called_back{false};
    {
      cuemm::testing::HostAllocationFault fault(nth);
      try {
        Stream stream = context.create_stream();
        Event event = context.create_event();
        Module module = context.load_module(ptx);
        Function add = module.function("cuemm_add_u32");
        auto array = to_device(values, stream);
        add.launch({4}, {256}, stream, array.device_pointer(), 1u, std::uint64_t{count});
        event.record(stream);
        stream.add_callback([&] { called_back = true; });
        array.copy_to_host(back, stream);
        auto pinned = context.memhostalloc(4096, true);
        stream.synchronize();
        if (back != std::vector<std::uint32_t>(count, 42u)) failed = "the kernel's result was not copied back";
      } catch (const std::bad_alloc&) {
        failed = "std::bad_alloc";
      } catch (const Error& error) {
        failed = error.what();
      }
      struck = fault.struck();
    }
    if (!struck) {
      EXPECT_EQ(failed, "") << "the workload failed though no allocation did";
      EXPECT_TRUE(called_back);
    }
    context.deallocations().flush_all();
    if (auto* host = find_adaptor<HostOnlyMemoryManager>(context.memory_manager())) host->deallocations().flush_all();
    context.synchronize();
    EXPECT_EQ(simulation::live_streams(), streams) << "a stream was left with the driver";
    EXPECT_EQ(simulation::live_allocations(), allocations) << "memory was left with the driver";
    EXPECT_EQ(simulation::device_bytes_in_use(0), device_bytes) << "device memory was left with the driver";
    EXPECT_EQ(simulation::call_count("cuEventCreate"), simulation::call_count("cuEventDestroy"))
        << "an event was left with the driver";
    EXPECT_EQ(simulation::call_count("cuModuleLoadData") + simulation::call_count("cuModuleLoadDataEx"),
              simulation::call_count("cuModuleUnload"))
        << "a module was left with the driver";
    if (HasFailure()) break;
  }
  std::printf("[          ] %llu host allocations failed in turn\n", static_cast<unsigned long long>(nth - 2));
}
