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
    List& list = local();
    if (list.head) {
      Node* node = list.head;
      list.head = node->next;
      --list.count;
      return node;
    }
    return ::operator new(Bytes);
  }
  static void give(void* chunk) noexcept {
    List& list = local();
    if (list.count >= kKeep || list.destroyed) {
      ::operator delete(chunk);
      return;
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
  struct List {
    Node* head = nullptr;
    std::size_t count = 0;
    bool destroyed = false;
    ~List() {
      destroyed = true;  // chunks given back during later thread-exit destructors go to the heap
      while (head) {
        Node* next = head->next;
        ::operator delete(head);
        head = next;
      }
      count = 0;
    }
  };
  static List& local() {
    thread_local List list;
    return list;
  }
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
