// cuemm/memory/detail/recycling_allocator.hpp: storage for pointer objects
// that are made and dropped at allocation rate.
//
// An allocator for std::allocate_shared that keeps up to kKeep freed chunks
// per thread and per chunk size, so a MemoryPointer (object and control block
// in one chunk) costs no trip to malloc in steady state. A chunk freed on
// another thread joins that thread's list.
#pragma once

#include <cstddef>
#include <memory>
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
    return ::operator new(Bytes);
  }
  static void give(void* chunk) noexcept {
    List& list = list_;
    if (list.count >= kKeep || list.state != State::Keeping) [[unlikely]] {
      if (list.state != State::Fresh || !start_keeping()) return ::operator delete(chunk);
    }
    auto* node = static_cast<Node*>(chunk);
    node->next = list.head;
    list.head = node;
    ++list.count;
  }

 private:
  static constexpr std::size_t kKeep = 256;
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
  struct Cleaner {
    ~Cleaner() {
      List& list = list_;
      list.state = State::Done;  // chunks given back during later thread-exit destructors go to the heap
      while (Node* node = list.head) {
        list.head = node->next;
        ::operator delete(node);
      }
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
