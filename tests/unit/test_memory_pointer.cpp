// The seed's ownership rules for pointer classes. These pointers have no
// context, so no driver is involved.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "cuemm/error.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/memory/memory_pointer.hpp"
#include "support/test_support.hpp"

using namespace cuemm;
using cuemm::testing::throws;

namespace {
struct Counter {
  std::atomic<int> calls{0};
  Finalizer finalizer() {
    return [this] { calls.fetch_add(1); };
  }
};
constexpr std::uintptr_t kAddress = 0x10000;
}  // namespace

TEST(MemoryPointer, FinalizerRunsOnceWhenTheLastReferenceGoes) {
  Counter counter;
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 64, nullptr, counter.finalizer());
  auto copy = memory;
  memory.reset();
  EXPECT_EQ(counter.calls, 0);
  EXPECT_TRUE(copy->is_alive());
  copy.reset();
  EXPECT_EQ(counter.calls, 1);
}

// A callable (not a std::function) becomes the finalizer in place, with the
// same rules: once, at free() or at the last reference, and device memory.
TEST(MemoryPointer, ACallableFinalizerRunsOnceAsAStdFunctionDoes) {
  int calls = 0;
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 64, nullptr, [&calls] { ++calls; });
  EXPECT_EQ(memory->kind(), MemoryKind::Device);
  EXPECT_EQ(memory->device_pointer(), kAddress);
  auto copy = memory;
  memory.reset();
  EXPECT_EQ(calls, 0);
  copy->free();
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(copy->free(), StateError);
  copy.reset();
  EXPECT_EQ(calls, 1);
}

// The pinned host pool's pointers take their callable in place too, and keep their kind.
TEST(MemoryPointer, PinnedAndMappedMemoryTakeACallableFinalizerToo) {
  int calls = 0;
  auto* host = reinterpret_cast<void*>(kAddress);
  auto pinned = std::make_shared<PinnedMemory>(nullptr, host, 64, nullptr, [&calls] { ++calls; });
  EXPECT_EQ(pinned->kind(), MemoryKind::Pinned);
  EXPECT_EQ(pinned->host_pointer(), kAddress);
  // Not mapped: no device address, and the error says why.
  const auto error = cuemm::testing::caught<StateError>([&] { (void)pinned->device_pointer(); });
  ASSERT_TRUE(error);
  EXPECT_NE(std::string(error->what()).find("is not mapped into the device address space"), std::string::npos);
  auto mapped = std::make_shared<MappedMemory>(nullptr, host, cuda::CUdeviceptr{kAddress + 4096}, 64, nullptr,
                                               [&calls] { calls += 10; });
  EXPECT_EQ(mapped->kind(), MemoryKind::Mapped);
  EXPECT_EQ(mapped->device_pointer(), kAddress + 4096);
  pinned.reset();
  EXPECT_EQ(calls, 1);
  mapped->free();
  EXPECT_EQ(calls, 11);
  mapped.reset();
  EXPECT_EQ(calls, 11);
}

TEST(MemoryPointer, FreeRunsTheFinalizerNowAndFreeingDeadMemoryIsAnError) {
  Counter counter;
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 64, nullptr, counter.finalizer());
  memory->free();
  EXPECT_EQ(counter.calls, 1);
  EXPECT_FALSE(memory->is_alive());
  EXPECT_TRUE(throws<StateError>([&] { memory->free(); }, "Freeing dead memory"));
  memory.reset();
  EXPECT_EQ(counter.calls, 1) << "the destructor ran the finalizer a second time";
}

TEST(MemoryPointer, DroppingAnOwnedReferenceDoesNotFree) {
  Counter counter;
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 64, nullptr, counter.finalizer());
  EXPECT_EQ(memory->refct(), 1);
  {
    OwnedPointer owned = memory->own();
    EXPECT_EQ(memory->refct(), 2);
    OwnedPointer second = owned;
    EXPECT_EQ(memory->refct(), 3);
  }
  EXPECT_EQ(memory->refct(), 1);
  EXPECT_EQ(counter.calls, 0);
  memory.reset();
  EXPECT_EQ(counter.calls, 1);
}

TEST(MemoryPointer, OwnedReferenceKeepsThePointerObjectAlive) {
  Counter counter;
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 64, nullptr, counter.finalizer());
  OwnedPointer owned = memory->own();
  memory.reset();
  EXPECT_EQ(counter.calls, 0);
  EXPECT_EQ(owned->handle(), kAddress);
  owned = OwnedPointer();
  EXPECT_EQ(counter.calls, 1);
}

TEST(AutoFreePointer, LastOwnedReferenceFrees) {
  Counter counter;
  auto memory = std::make_shared<AutoFreePointer>(nullptr, kAddress, 64, nullptr, counter.finalizer());
  EXPECT_EQ(memory->refct(), 0);
  {
    OwnedPointer first = memory->own();
    OwnedPointer second = memory->own();
    first = OwnedPointer();
    EXPECT_EQ(counter.calls, 0);
  }
  EXPECT_EQ(counter.calls, 1);
  EXPECT_FALSE(memory->is_alive());
  memory.reset();
  EXPECT_EQ(counter.calls, 1);
}

TEST(MemoryPointer, ViewsKeepTheirBaseAliveAndNeverFree) {
  Counter counter;
  auto base = std::make_shared<MemoryPointer>(nullptr, kAddress, 256, nullptr, counter.finalizer());
  auto view = base->view(16, 48);
  EXPECT_EQ(view->handle(), kAddress + 16);
  EXPECT_EQ(view->size(), 32u);
  EXPECT_FALSE(view->owns_memory());
  EXPECT_EQ(view->owner(), base);
  auto nested = view->view(8);
  EXPECT_EQ(nested->handle(), kAddress + 24);
  EXPECT_EQ(nested->owner(), base) << "a view of a view is owned by the root";
  base.reset();
  view.reset();
  EXPECT_EQ(counter.calls, 0) << "the base died while a view still referred to it";
  nested->free();  // a view's free() releases nothing
  EXPECT_EQ(counter.calls, 0);
  nested.reset();
  EXPECT_EQ(counter.calls, 1);
}

TEST(MemoryPointer, ViewOutsideTheMemoryIsInvalidArgumentNamingTheRange) {
  auto base = std::make_shared<MemoryPointer>(nullptr, kAddress, 100);
  EXPECT_TRUE(throws<InvalidArgument>([&] { base->view(50, 101); }, "[50, 101)", "100 bytes"));
  EXPECT_THROW(base->view(60, 40), InvalidArgument);
  EXPECT_NO_THROW(base->view(100));  // empty view at the end is fine
}

TEST(PinnedMemory, HasNoDevicePointer) {
  int buffer[4];
  auto pinned = std::make_shared<PinnedMemory>(nullptr, buffer, sizeof buffer);
  EXPECT_EQ(pinned->kind(), MemoryKind::Pinned);
  EXPECT_EQ(pinned->host_pointer(), reinterpret_cast<std::uintptr_t>(buffer));
  EXPECT_THROW((void)pinned->device_pointer(), StateError);
}

TEST(MemoryPointer, OwnerObjectLivesAsLongAsThePointer) {
  auto owner = std::make_shared<std::vector<char>>(64);
  std::weak_ptr<std::vector<char>> watch = owner;
  auto pinned = std::make_shared<PinnedMemory>(nullptr, owner->data(), owner->size(), owner);
  owner.reset();
  EXPECT_FALSE(watch.expired());
  pinned.reset();
  EXPECT_TRUE(watch.expired());
}

TEST(MemoryPointer, AThrowingFinalizerIsContained) {
  auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 8, nullptr,
                                                [] { throw std::runtime_error("release failed"); });
  EXPECT_NO_THROW(memory.reset());
}

TEST(MemoryPointer, ConcurrentFreesRunTheFinalizerOnce) {
  for (int round = 0; round < 50; ++round) {
    Counter counter;
    auto memory = std::make_shared<MemoryPointer>(nullptr, kAddress, 8, nullptr, counter.finalizer());
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, copy = memory] {
        try {
          copy->free();
        } catch (const StateError&) {
          errors.fetch_add(1);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    memory.reset();
    EXPECT_EQ(counter.calls, 1);
    EXPECT_EQ(errors, 7);
  }
}

// Pointer objects made on one thread and dropped on another (a loader
// thread's blocks): the chunks the dropping thread cannot keep go to the
// depot in batches, and the making thread takes them from there, not from
// malloc. (A chunk size no pointer class has: its recycler is this test's.)
TEST(ChunkRecycler, ChunksDroppedOnAnotherThreadComeBackThroughTheDepot) {
  using Recycler = detail::ChunkRecycler<1000>;
  constexpr std::size_t kChunks = 4 * Recycler::kKeep;
  std::vector<void*> made;
  for (std::size_t i = 0; i < kChunks; ++i) made.push_back(Recycler::take());
  std::thread([&] {
    for (void* chunk : made) Recycler::give(chunk);
  }).join();  // (at its exit, the thread's own list goes to the depot too)
  EXPECT_EQ(Recycler::batches_in_depot(), kChunks / Recycler::kBatch);
  std::vector<void*> again;
  for (std::size_t i = 0; i < kChunks; ++i) again.push_back(Recycler::take());
  const std::set<void*> first(made.begin(), made.end());
  const auto reused = std::count_if(again.begin(), again.end(), [&](void* chunk) { return first.count(chunk) > 0; });
  EXPECT_EQ(static_cast<std::size_t>(reused), kChunks) << "chunks came from malloc rather than the depot";
  EXPECT_EQ(std::set<void*>(again.begin(), again.end()).size(), kChunks) << "a chunk was handed out twice";
  for (void* chunk : again) Recycler::give(chunk);
}

// The depot keeps at most kDepotBatches batches: a thread that drops far
// more than that gives the rest back to the heap.
TEST(ChunkRecycler, TheDepotKeepsABoundedNumberOfBatches) {
  using Recycler = detail::ChunkRecycler<1008>;
  constexpr std::size_t kChunks = Recycler::kKeep + (Recycler::kDepotBatches + 8) * Recycler::kBatch;
  std::vector<void*> made;
  for (std::size_t i = 0; i < kChunks; ++i) made.push_back(Recycler::take());
  std::thread([&] {
    for (void* chunk : made) Recycler::give(chunk);
  }).join();
  EXPECT_EQ(Recycler::batches_in_depot(), Recycler::kDepotBatches);
  const std::set<void*> first(made.begin(), made.end());
  std::vector<void*> again;
  for (std::size_t i = 0; i < kChunks; ++i) again.push_back(Recycler::take());
  const auto reused = std::count_if(again.begin(), again.end(), [&](void* chunk) { return first.count(chunk) > 0; });
  // The depot's batches, and no more of them (what malloc hands out again may repeat some).
  EXPECT_GE(static_cast<std::size_t>(reused), Recycler::kDepotBatches * Recycler::kBatch);
  EXPECT_EQ(std::set<void*>(again.begin(), again.end()).size(), kChunks) << "a chunk was handed out twice";
  for (void* chunk : again) Recycler::give(chunk);
}

// Chunks made one after another lie side by side, and threads that take them
// from the depot write their pointers' counts at every pair: no two chunks
// may share a cache line, nor the pair of lines that x86 CPUs fetch together.
// (152 bytes is a MemoryPointer's chunk; this test's own size, 152 + 8, keeps
// its recycler apart from theirs.)
TEST(ChunkRecycler, NoTwoChunksShareACacheLine) {
  using Recycler = detail::ChunkRecycler<160>;
  constexpr std::uintptr_t kLine = 128;
  std::vector<std::uintptr_t> made;
  for (int i = 0; i < 64; ++i) made.push_back(reinterpret_cast<std::uintptr_t>(Recycler::take()));
  for (std::uintptr_t chunk : made) EXPECT_EQ(chunk % kLine, 0u) << "a chunk starts inside a cache line";
  std::vector<std::uintptr_t> sorted = made;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i)
    EXPECT_GE(sorted[i] - sorted[i - 1], Recycler::kChunkBytes) << "two chunks overlap";
  EXPECT_EQ(Recycler::kChunkBytes % kLine, 0u);
  EXPECT_GE(Recycler::kChunkBytes, 160u);
  for (std::uintptr_t chunk : made) Recycler::give(reinterpret_cast<void*>(chunk));
}
