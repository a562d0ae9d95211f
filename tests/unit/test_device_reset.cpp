// Device::reset() in a process of its own (it destroys everything the device
// holds, which other tests of a shared process would still use), once for
// each bundled manager (CUEMM_MEMORY_MANAGER, set by tests/CMakeLists.txt).
//
// The driver's reset frees all of the primary context's memory and destroys
// its streams, events and modules. What cuemm made before it may outlive it:
// a pointer, a stream, an event, a module dropped later must not hand a stale
// handle back to the driver, where the same address or handle may by then
// belong to something made after the reset.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuemm/cuemm.hpp"
#include "support/test_support.hpp"

namespace cuemm {
namespace {

const char* manager_name() {
  const char* name = std::getenv("CUEMM_MEMORY_MANAGER");
  return name ? name : "default";
}

std::vector<std::uint8_t> read_back(const std::shared_ptr<MemoryPointer>& memory) {
  return DeviceArray<std::uint8_t>(memory, memory->size()).copy_to_host();
}

// Driver calls that give something back, on the simulated driver (0 on the real one).
std::uint64_t release_calls() {
  if (!simulation::active()) return 0;
  std::uint64_t calls = 0;
  for (const char* call : {"cuMemFree", "cuMemFreeAsync", "cuMemFreeHost", "cuMemHostUnregister", "cuStreamDestroy",
                           "cuEventDestroy", "cuModuleUnload", "cuMemPoolDestroy", "cuMemRelease", "cuMemUnmap"})
    calls += simulation::call_count(call);
  return calls;
}

bool overlap(const MemoryPointer& a, const MemoryPointer& b) {
  return a.device_pointer() < b.device_pointer() + b.size() && b.device_pointer() < a.device_pointer() + a.size();
}

TEST(DeviceReset, WhatWasMadeBeforeItNeverReachesWhatIsMadeAfter) {
  constexpr std::size_t kSize = std::size_t{1} << 20;
  Device& device = Device::get(0);
  Context& context = device.primary_context();
  SCOPED_TRACE(manager_name());

  auto before = context.memalloc(kSize);
  auto pinned = context.memhostalloc(std::size_t{1} << 16);
  auto mapped = context.memhostalloc(std::size_t{1} << 16, /*mapped=*/true);
  auto managed = context.memallocmanaged(std::size_t{1} << 16);
  auto host = std::make_shared<std::vector<std::uint8_t>>(std::size_t{1} << 16);
  auto pinned_range = context.mempin(host, host->data(), host->size());
  before->memset(0x11);
  Stream stream = context.create_stream();
  Event event = context.create_event();
  Module module = context.load_module(testing::test_kernels_ptx());

  device.reset();

  Context& again = device.primary_context();
  EXPECT_EQ(&again, &context) << "the device's primary context is one object, before and after its reset";
  auto after = again.memalloc(kSize);
  after->memset(0x22);
  Stream new_stream = again.create_stream();
  Event new_event = again.create_event();

  // Everything made before the reset goes now (device, pinned, mapped,
  // managed and pinned-range memory, a stream, an event, a module), and its
  // deferred releases run: none may reach the driver (on the simulated
  // driver, counted).
  const std::uint64_t calls = release_calls();
  before.reset();
  pinned.reset();
  mapped.reset();
  managed.reset();
  pinned_range.reset();
  { Stream gone = std::move(stream); }
  { Event gone = std::move(event); }
  { Module gone = std::move(module); }
  again.deallocations().flush_all();
  EXPECT_EQ(release_calls(), calls) << "something made before the reset was given back to the driver after it";

  // Nor did they give back memory made after the reset: the manager does not hand it out again.
  std::vector<std::shared_ptr<MemoryPointer>> more;
  for (int i = 0; i < 32; ++i) {
    more.push_back(again.memalloc(kSize));
    EXPECT_FALSE(overlap(*more.back(), *after)) << "a block made after the reset was handed out twice";
  }
  EXPECT_EQ(read_back(after), std::vector<std::uint8_t>(kSize, 0x22)) << "memory made after the reset changed";
  new_event.record(new_stream);
  new_stream.synchronize();
  EXPECT_TRUE(new_event.query()) << "a stream or event made after the reset was destroyed";
}

TEST(DeviceReset, TheManagerStartsEmptyAndServesAgain) {
  constexpr std::size_t kSize = std::size_t{4} << 20;
  Device& device = Device::get(0);
  Context& context = device.primary_context();
  SCOPED_TRACE(manager_name());
  {
    std::vector<std::shared_ptr<MemoryPointer>> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(context.memalloc(kSize));
  }
  device.reset();
  Context& again = device.primary_context();
  std::vector<std::shared_ptr<MemoryPointer>> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(again.memalloc(kSize));
    blocks.back()->memset(static_cast<std::uint8_t>(i + 1));
  }
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(read_back(blocks[i]), std::vector<std::uint8_t>(kSize, static_cast<std::uint8_t>(i + 1))) << "block " << i;
}

}  // namespace
}  // namespace cuemm
