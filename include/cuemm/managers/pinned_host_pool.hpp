// cuemm/managers/pinned_host_pool.hpp: a cache of page-locked host memory.
//
// cuMemHostAlloc costs about 0.1 ms for 4 KiB and tens of milliseconds for
// 64 MiB, so released blocks are kept and handed out again: a cached block
// comes back without a driver call. Blocks are kept apart by kind (mapped,
// portable, write-combined) and by size class (a quarter power of two, at
// least 4 KiB). A released block is reused only after work queued before its
// release has completed (see ReuseEpochs). When the oldest released block of
// the kind and size is not ready, a small block is allocated anew until 16
// were released (then the epoch is sealed: two driver calls), and a large
// one (1 MiB or more) is waited for, as waiting costs less than allocating.
// Released blocks rotate, so a loop pays a seal per rotation: up to 64 small
// ones of a kind and size within 32 MiB, and 16 large ones within 512 MiB
// (at least 4). Beyond 16 small ones, and for large ones, a loop adds one to
// its rotation only once its seals have cost about as much as the new block.
// Each thread keeps its own released blocks (four kinds and sizes, a rotation
// each) and takes them back without the pool's lock; what a thread keeps
// counts towards `maximum_cached_bytes`, and goes back to the pool when the
// thread ends (Note [Per-thread fronts] in the .cpp).
//
// Pinning (mempin) of caller memory is cached too: a released registration is
// kept, with its owner alive, so pinning the same range again is free. At most
// `registration_cache_bytes` of registrations are kept (the least recently
// used go first); trim() gives up all of them. A range pinned without an owner
// is unregistered at its release: nothing keeps that memory mapped, and a
// registration kept past its unmapping would be of pages no longer there.
//
// Used by any HostOnlyMemoryManager that asks for it (the pool manager does).
// Thread-safe. Blocks handed out stay valid after the pool goes.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "cuemm/memory/memory_pointer.hpp"

namespace cuemm {

struct PinnedHostPoolOptions {
  // Cached (released) blocks beyond this many bytes are freed once they have
  // waited idle_before_eviction, and any beyond four times as many at once: a
  // working set that goes round between threads (staging buffers a loader
  // fills and another drops) stays cached, and what it leaves idle goes at
  // the pool's next release past the maximum or request it cannot serve
  // from a thread's own blocks (or at trim()).
  std::size_t maximum_cached_bytes = std::size_t{1} << 30;
  std::chrono::milliseconds idle_before_eviction{1000};
  std::size_t registration_cache_bytes = std::size_t{64} << 20;
};

struct PinnedHostPoolStatistics {
  std::size_t allocated_bytes = 0;  // taken from the driver and not yet given back
  std::size_t cached_bytes = 0;     // released blocks waiting for reuse
  std::size_t cached_registrations = 0;
  std::size_t hits = 0;             // allocations and pins served from the caches
  std::size_t front_hits = 0;       // of those, served by a thread's own front, without the pool's lock
  std::size_t misses = 0;
  std::size_t seals = 0;            // epochs sealed so far, two driver calls each (ReuseEpochs)
};

class PinnedHostPool {
 public:
  explicit PinnedHostPool(Context& context, PinnedHostPoolOptions options = {});
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  // As BaseMemoryManager::memhostalloc: MappedMemory when `mapped`, else PinnedMemory.
  std::shared_ptr<MemoryPointer> allocate(std::size_t size, bool mapped, bool portable, bool write_combined);
  // As BaseMemoryManager::mempin.
  std::shared_ptr<MemoryPointer> pin(std::shared_ptr<const void> owner, void* pointer, std::size_t size,
                                     bool mapped);
  // Frees every cached block and registration; returns the bytes freed.
  std::size_t trim();
  // Frees everything, blocks still handed out included (their pointers become
  // dead: releasing them later does nothing), and takes no more back. For a
  // manager's reset(), after which the context may be reset too.
  void release_everything();
  PinnedHostPoolStatistics statistics() const;

  struct State;  // implementation, shared with the blocks' finalizers

 private:
  std::shared_ptr<State> state_;
};

}  // namespace cuemm
