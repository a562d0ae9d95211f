// cuemm/memory/detail/recycling_allocator.hpp: storage for pointer objects
// that are made and dropped at allocation rate.
//
// An allocator for std::allocate_shared that keeps up to kKeep freed chunks
// per thread and per chunk size, so a MemoryPointer (object and control block
// in one chunk) costs no trip to malloc in steady state. A chunk freed on
// another thread joins that thread's list. A thread whose list is full gives
// half of it to a shared depot in one batch, and a thread whose list is empty
// takes a batch from there: where one thread makes pointers and another drops
// them (a loader thread and a compute thread), the chunks go round through the
// depot, a lock per kBatch chunks, rather than through malloc's arenas (whose
// locks the two threads took in turn at every pair: a fifth of a pinned
// block's hand-over, simulated).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

namespace cuemm::detail {

template <std::size_t Bytes>
class ChunkRecycler {
 public:
  static void* take() {
    List& list = list_;
    if (Node* node = list.head) {
      list.head = node->next;
      --list.count;
      return node;
    }
    return take_from_depot();
  }
  static void give(void* chunk) noexcept {
    List& list = list_;
    if (list.count >= kKeep || list.state != State::Keeping) [[unlikely]] {
      if (!make_room()) return release(chunk);
    }
    auto* node = static_cast<Node*>(chunk);
    node->next = list.head;
    list.head = node;
    ++list.count;
  }

  // Batches waiting in the depot (for tests).
  static std::size_t batches_in_depot() noexcept {
    std::lock_guard lock(depot_.mutex);
    return depot_.count;
  }

  static constexpr std::size_t kKeep = 256;
  // Chunks take whole cache lines of their own. Those of one batch were
  // made one after another, side by side, and threads that take batches from
  // the depot each write their pointer's counts at every pair: chunks on one
  // line made 4 threads' memalloc pairs 2.4x slower on the H200
  // (docs/pool-measurements.md, "4 threads' memalloc pairs after the
  // benchmarks before them"). 128 bytes, as src/util/own_lines.hpp says why:
  // x86 CPUs fetch lines in aligned pairs.
  static constexpr std::size_t kLine = 128;
  static constexpr std::size_t kChunkBytes = (Bytes + kLine - 1) / kLine * kLine;
  static constexpr std::size_t kBatch = kKeep / 2;
  static constexpr std::size_t kDepotBatches = 32;

 private:
  struct Node {
    Node* next;
  };
  static_assert(Bytes >= sizeof(Node));
  enum class State : unsigned char { Fresh, Keeping, Done };
  // Trivial and initial-exec, so the hot path reads it with one load; a
  // thread_local with a destructor costs a call into the dynamic linker per
  // access (6% of a cached pool pair, measured). The Cleaner below empties it
  // at thread exit, registered on the thread's first free.
  struct List {
    Node* head;
    std::size_t count;
    State state;
  };
  // Batches of exactly kBatch chunks, each a chain through `next`. Beyond
  // kDepotBatches, chunks go back to the heap.
  struct Depot {
    std::mutex mutex;
    std::array<Node*, kDepotBatches> batches{};
    std::size_t count = 0;

    Node* take() noexcept {
      std::lock_guard lock(mutex);
      return count ? batches[--count] : nullptr;
    }
    bool give(Node* batch) noexcept {
      std::lock_guard lock(mutex);
      if (count == kDepotBatches) return false;
      batches[count++] = batch;
      return true;
    }
  };
  static void* fresh_chunk() { return ::operator new(kChunkBytes, std::align_val_t{kLine}); }
  static void release(void* chunk) noexcept { ::operator delete(chunk, std::align_val_t{kLine}); }
  static void delete_chain(Node* node) noexcept {
    while (node) release(std::exchange(node, node->next));
  }
  // Moves the newest kBatch chunks of a full list to the depot (or the heap).
  static void give_batch(List& list) noexcept {
    Node* batch = list.head;
    Node* last = batch;
    for (std::size_t i = 1; i < kBatch; ++i) last = last->next;
    list.head = last->next;
    last->next = nullptr;
    list.count -= kBatch;
    if (!depot_.give(batch)) delete_chain(batch);
  }
  // Room for one more chunk in the thread's list: false when it keeps none.
  [[gnu::noinline]] static bool make_room() noexcept {
    List& list = list_;
    if (list.state == State::Fresh && !start_keeping()) return false;
    if (list.state != State::Keeping) return false;
    if (list.count >= kKeep) give_batch(list);
    return true;
  }
  [[gnu::noinline]] static void* take_from_depot() {
    List& list = list_;
    if (list.state == State::Fresh) start_keeping();
    if (list.state == State::Keeping) {
      if (Node* batch = depot_.take()) {
        list.head = batch->next;
        list.count = kBatch - 1;
        return batch;
      }
    }
    return fresh_chunk();
  }
  struct Cleaner {
    ~Cleaner() {
      List& list = list_;
      list.state = State::Done;  // chunks given back during later thread-exit destructors go to the heap
      // Whole batches to the depot, for the threads that stay.
      while (list.count >= kBatch) give_batch(list);
      delete_chain(std::exchange(list.head, nullptr));
      list.count = 0;
    }
  };
  [[gnu::noinline]] static bool start_keeping() noexcept {
    try {
      thread_local Cleaner cleaner;
      (void)cleaner;
    } catch (...) {  // no memory for the thread's destructor list: keep nothing
      return false;
    }
    list_.state = State::Keeping;
    return true;
  }
  [[gnu::tls_model("initial-exec")]] static inline thread_local List list_{nullptr, 0, State::Fresh};
  static inline Depot depot_;
};

template <typename T>
struct RecyclingAllocator {
  using value_type = T;
  RecyclingAllocator() = default;
  template <typename U>
  RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {}

  T* allocate(std::size_t count) {
    if (count != 1) return static_cast<T*>(::operator new(count * sizeof(T)));
    return static_cast<T*>(ChunkRecycler<sizeof(T)>::take());
  }
  void deallocate(T* pointer, std::size_t count) noexcept {
    if (count != 1) return ::operator delete(pointer);
    ChunkRecycler<sizeof(T)>::give(pointer);
  }
  template <typename U>
  bool operator==(const RecyclingAllocator<U>&) const noexcept { return true; }
};

// std::make_shared through the recycling allocator.
template <typename T, typename... Arguments>
std::shared_ptr<T> make_recycled(Arguments&&... arguments) {
  return std::allocate_shared<T>(RecyclingAllocator<T>{}, std::forward<Arguments>(arguments)...);
}

}  // namespace cuemm::detail
