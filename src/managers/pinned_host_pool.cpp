#include "cuemm/managers/pinned_host_pool.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/managers/detail/rent_or_buy.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {
namespace {

constexpr std::size_t kSmallestHostBlock = 4096;
// From this size a block is worth waiting for rather than allocating anew.
constexpr std::size_t kWaitForBlocksFrom = std::size_t{1} << 20;
// Seal (record an event) after this many frees, so the hot path rarely calls the driver.
constexpr std::size_t kFreesPerSeal = 16;
// A list of released blocks of one kind and size grows to this many bytes
// (at least 4 blocks, at most kFreesPerSeal) before it is sealed, so a loop
// of same-size requests pays one stream query a rotation, not one a request.
constexpr std::size_t kRotationBytes = std::size_t{32} << 20;
// A stream query costs about 0.35 us on the H100, cuMemHostAlloc about 0.1 ms
// plus 0.5 ms a MiB: a list of large blocks grows by one only once its seals
// have cost about as much as the new block (short loops wait instead).
constexpr std::size_t seals_worth_a_host_block(std::size_t bytes) { return 300 + 1500 * (bytes >> 20); }
// cuMemHostAlloc of a small block takes about 100 us: polling for a while first pays.
constexpr std::chrono::microseconds kPollBeforeAllocating{50};

// A quarter power of two, at least 4 KiB: at most 25% over the request.
std::size_t host_block_size(std::size_t size) {
  if (size <= kSmallestHostBlock) return kSmallestHostBlock;
  const std::size_t power = std::size_t{1} << (std::bit_width(size - 1) - 1);
  const std::size_t step = power / 4;
  return (size + step - 1) / step * step;
}

// The device address of mapped host memory that was just allocated or
// registered; when the driver cannot give one, `undo` gives that memory back
// before the error is thrown.
template <typename Undo>
cuda::CUdeviceptr mapped_device_pointer(void* host, Undo&& undo) {
  cuda::CUdeviceptr device = 0;
  const cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostGetDevicePointer, &device, host, 0);
  if (result != cuda::CUDA_SUCCESS) {
    undo();
    driver::check(result, "cuMemHostGetDevicePointer");
  }
  return device;
}

// The pointer handed out for page-locked host memory: MappedMemory when it is
// mapped (device address known), else PinnedMemory.
std::shared_ptr<MemoryPointer> host_memory_pointer(Context* context, void* host, cuda::CUdeviceptr device,
                                                   std::size_t size, std::shared_ptr<const void> owner,
                                                   Finalizer finalizer) {
  // Made at allocation rate: through the recycling allocator, as the device pool's are.
  if (device)
    return detail::make_recycled<MappedMemory>(context, host, device, size, std::move(owner), std::move(finalizer));
  return detail::make_recycled<PinnedMemory>(context, host, size, std::move(owner), std::move(finalizer));
}

}  // namespace

struct PinnedHostPool::State {
  struct Block;
  struct Freed {
    Block* block;
    std::uint64_t epoch;
  };
  struct Block {
    std::shared_ptr<State> state;  // the pool outlives its blocks
    void* host;
    cuda::CUdeviceptr device;  // 0 unless mapped
    std::size_t bytes;
    unsigned flags;
    bool dead = false;  // freed by release_everything() while handed out
    std::deque<Freed>* list = nullptr;  // its kind and size's, once released
    Block* previous_out = nullptr;  // links of the handed-out list
    Block* next_out = nullptr;
  };
  struct Registration {
    std::shared_ptr<State> state;
    std::shared_ptr<const void> owner;  // kept alive while the range stays registered
    void* pointer;
    std::size_t size;
    bool mapped;
    cuda::CUdeviceptr device;
    std::list<Registration*>::iterator in_cache;  // valid while cached
    bool dead = false;
  };
  using RegistrationKey = std::tuple<std::uintptr_t, std::size_t, bool>;

  Context* context;
  PinnedHostPoolOptions options;
  BlockingAwareMutex mutex;
  detail::ReuseEpochs epochs;
  // Per (flags, block size). Lists stay once made (there are few), so a
  // block can keep a pointer to its own: no lookup to release it.
  std::map<std::pair<unsigned, std::size_t>, std::deque<Freed>> free_lists;
  std::pair<unsigned, std::size_t> last_key{};  // the last list a request found, to skip the map
  std::deque<Freed>* last_list = nullptr;
  std::size_t frees_since_seal = 0;
  detail::RentOrBuy large_block_rental;  // the seals for large blocks, which buy one more
  std::list<Registration*> cached_registrations;  // most recently released first
  std::map<RegistrationKey, Registration*> registration_index;  // cached ones only
  std::size_t registration_bytes = 0;
  PinnedHostPoolStatistics counters;
  Block* handed_out = nullptr;  // a list through the blocks: no allocation per request
  std::set<Registration*> pinned_out;
  bool closed = false;  // the pool is gone: released memory is freed at once

  State(Context& context_, PinnedHostPoolOptions options_)
      : context(&context_), options(options_), epochs(&context_) {}

  static void free_block(Block* block) noexcept {
    try {
      ScopedContext scope(*block->state->context);
      CUEMM_CU(cuMemFreeHost, block->host);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pinned host pool: freeing a block failed: %s\n", error.what());
    }
  }
  static void unregister(Registration* registration) noexcept {
    try {
      ScopedContext scope(*registration->state->context);
      CUEMM_CU(cuMemHostUnregister, registration->pointer);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pinned host pool: unregistering failed: %s\n", error.what());
    }
  }

  // Gives the memory of records no pointer names back to the driver, and
  // forgets them. Outside the lock: deleting the last record may destroy the state.
  static void discard(const std::vector<Block*>& blocks) noexcept {
    for (Block* block : blocks) {
      free_block(block);
      delete block;
    }
  }
  static void discard(const std::vector<Registration*>& registrations) noexcept {
    for (Registration* registration : registrations) {
      unregister(registration);
      delete registration;
    }
  }

  // --- under `mutex` ---

  void hand_out(Block* block) noexcept {
    block->previous_out = nullptr;
    block->next_out = handed_out;
    if (handed_out) handed_out->previous_out = block;
    handed_out = block;
  }
  void take_back(Block* block) noexcept {
    (block->previous_out ? block->previous_out->next_out : handed_out) = block->next_out;
    if (block->next_out) block->next_out->previous_out = block->previous_out;
    block->previous_out = block->next_out = nullptr;
  }

  static std::size_t rotation_length(std::size_t bytes) noexcept {
    return std::clamp(kRotationBytes / bytes, std::size_t{4}, kFreesPerSeal);
  }

  // Takes a safe block of the list, sealing and waiting as the header says;
  // null when a new block should be allocated.
  Block* take_cached(std::deque<Freed>& list, std::size_t bytes) {
    if (list.empty()) return nullptr;
    if (!epochs.is_safe(list.front().epoch)) {
      const bool large = bytes >= kWaitForBlocksFrom;
      if (list.size() < rotation_length(bytes) &&
          (large ? large_block_rental.buys(seals_worth_a_host_block(bytes)) : frees_since_seal < kFreesPerSeal)) {
        if (large) large_block_rental.bought();
        return nullptr;
      }
      epochs.seal();
      frees_since_seal = 0;
      if (large) large_block_rental.rent();
      // A sealed epoch on an idle GPU completes within microseconds, far
      // sooner than cuMemHostAlloc returns: poll a little before giving up.
      const std::uint64_t epoch = list.front().epoch;
      if (!epochs.poll_until_safe(epoch, kPollBeforeAllocating) && large) epochs.poll(true);
      if (!epochs.is_safe(epoch)) return nullptr;
    }
    Block* block = list.front().block;
    list.pop_front();
    counters.cached_bytes -= block->bytes;
    return block;
  }

  // Removes the oldest cached blocks until at most `keep` bytes are cached;
  // returns them for freeing outside the lock.
  std::vector<Block*> evict_blocks(std::size_t keep) {
    std::vector<Block*> evicted;
    for (auto it = free_lists.begin(); it != free_lists.end() && counters.cached_bytes > keep;) {
      auto& list = it->second;
      while (!list.empty() && counters.cached_bytes > keep) {
        evicted.push_back(list.front().block);
        counters.cached_bytes -= list.front().block->bytes;
        counters.allocated_bytes -= list.front().block->bytes;
        list.pop_front();
      }
      ++it;
    }
    return evicted;
  }

  std::vector<Registration*> evict_registrations(std::size_t keep) {
    std::vector<Registration*> evicted;
    while (registration_bytes > keep && !cached_registrations.empty()) {
      Registration* oldest = cached_registrations.back();
      cached_registrations.pop_back();
      registration_index.erase({reinterpret_cast<std::uintptr_t>(oldest->pointer), oldest->size, oldest->mapped});
      registration_bytes -= oldest->size;
      evicted.push_back(oldest);
    }
    return evicted;
  }

  // --- the finalizers ---

  static void release(Block* block) noexcept {
    State& state = *block->state;
    std::vector<Block*> evicted;
    std::shared_ptr<State> keep;  // outlives the lock below
    {
      std::lock_guard lock(state.mutex);
      state.take_back(block);
      if (block->dead) {
        keep = std::move(block->state);
        delete block;
        return;
      }
      if (!state.closed) {
        try {
          if (!block->list) block->list = &state.free_lists[{block->flags, block->bytes}];
          block->list->push_back({block, state.epochs.tag()});
          state.counters.cached_bytes += block->bytes;
          ++state.frees_since_seal;
          evicted = state.evict_blocks(state.options.maximum_cached_bytes);
          block = nullptr;
        } catch (...) {
        }
      }
      if (block) state.counters.allocated_bytes -= block->bytes;
    }
    if (block) evicted.push_back(block);  // the pool is gone (or full): free it now
    discard(evicted);
  }

  static void release(Registration* registration) noexcept {
    State& state = *registration->state;
    std::vector<Registration*> evicted;
    std::shared_ptr<State> keep;  // outlives the lock below
    {
      std::lock_guard lock(state.mutex);
      state.pinned_out.erase(registration);
      if (registration->dead) {
        keep = std::move(registration->state);
        delete registration;
        return;
      }
      if (!state.closed && registration->size <= state.options.registration_cache_bytes) {
        try {
          const RegistrationKey key{reinterpret_cast<std::uintptr_t>(registration->pointer), registration->size,
                                    registration->mapped};
          if (state.registration_index.emplace(key, registration).second) {
            state.cached_registrations.push_front(registration);
            registration->in_cache = state.cached_registrations.begin();
            state.registration_bytes += registration->size;
            evicted = state.evict_registrations(state.options.registration_cache_bytes);
            registration = nullptr;
          }
        } catch (...) {
        }
      }
    }
    if (registration) evicted.push_back(registration);
    discard(evicted);
  }
};

PinnedHostPool::PinnedHostPool(Context& context, PinnedHostPoolOptions options)
    : state_(std::make_shared<State>(context, options)) {}

PinnedHostPool::~PinnedHostPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->closed = true;
  }
  trim();
  std::lock_guard lock(state_->mutex);
  state_->epochs.retire();
}

std::shared_ptr<MemoryPointer> PinnedHostPool::allocate(std::size_t size, bool mapped, bool portable,
                                                        bool write_combined) {
  const unsigned flags = (mapped ? cuda::CU_MEMHOSTALLOC_DEVICEMAP : 0u) |
                         (portable ? cuda::CU_MEMHOSTALLOC_PORTABLE : 0u) |
                         (write_combined ? cuda::CU_MEMHOSTALLOC_WRITECOMBINED : 0u);
  const std::size_t bytes = host_block_size(size);
  State::Block* block = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    State& state = *state_;
    const std::pair<unsigned, std::size_t> key{flags, bytes};
    if (!state.last_list || state.last_key != key) {
      auto found = state.free_lists.find(key);
      if (found != state.free_lists.end()) {
        state.last_key = key;
        state.last_list = &found->second;
      }
    }
    if (state.last_list && state.last_key == key) block = state.take_cached(*state.last_list, bytes);
    ++(block ? state.counters.hits : state.counters.misses);
    if (block) state.hand_out(block);
  }
  if (!block) {
    ScopedContext scope(*state_->context);
    void* host = nullptr;
    cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostAlloc, &host, bytes, flags);
    if (result == cuda::CUDA_ERROR_OUT_OF_MEMORY && trim() > 0)
      result = CUEMM_CU_RESULT(cuMemHostAlloc, &host, bytes, flags);
    if (result != cuda::CUDA_SUCCESS) driver::throw_allocation_error(result, "cuMemHostAlloc", bytes);
    const cuda::CUdeviceptr device =
        mapped ? mapped_device_pointer(host, [&] { CUEMM_CU_RESULT(cuMemFreeHost, host); }) : 0;
    block = new State::Block{state_, host, device, bytes, flags};
    std::lock_guard lock(state_->mutex);
    state_->counters.allocated_bytes += bytes;
    state_->hand_out(block);
  }
  try {
    return host_memory_pointer(state_->context, block->host, block->device, size, nullptr,
                               [block] { State::release(block); });
  } catch (...) {
    State::release(block);
    throw;
  }
}

std::shared_ptr<MemoryPointer> PinnedHostPool::pin(std::shared_ptr<const void> owner, void* pointer,
                                                   std::size_t size, bool mapped) {
  State& state = *state_;
  State::Registration* registration = nullptr;
  {
    std::lock_guard lock(state.mutex);
    auto found = state.registration_index.find({reinterpret_cast<std::uintptr_t>(pointer), size, mapped});
    if (found != state.registration_index.end()) {
      registration = found->second;
      state.cached_registrations.erase(registration->in_cache);
      state.registration_index.erase(found);
      state.registration_bytes -= size;
    }
    ++(registration ? state.counters.hits : state.counters.misses);
    if (registration) state.pinned_out.insert(registration);
  }
  if (!registration) {
    ScopedContext scope(*state.context);
    const unsigned flags = mapped ? cuda::CU_MEMHOSTREGISTER_DEVICEMAP : 0u;
    cuda::CUresult result = CUEMM_CU_RESULT(cuMemHostRegister, pointer, size, flags);
    if (result == cuda::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || result == cuda::CUDA_ERROR_OUT_OF_MEMORY) {
      // A cached registration may overlap the range, or hold the pinned memory the driver needs.
      std::vector<State::Registration*> evicted;
      {
        std::lock_guard lock(state.mutex);
        evicted = state.evict_registrations(0);
      }
      State::discard(evicted);
      if (!evicted.empty()) result = CUEMM_CU_RESULT(cuMemHostRegister, pointer, size, flags);
    }
    if (result != cuda::CUDA_SUCCESS) driver::throw_allocation_error(result, "cuMemHostRegister", size);
    const cuda::CUdeviceptr device =
        mapped ? mapped_device_pointer(pointer, [&] { CUEMM_CU_RESULT(cuMemHostUnregister, pointer); }) : 0;
    registration = new State::Registration{state_, owner, pointer, size, mapped, device, {}};
    std::lock_guard lock(state.mutex);
    state.pinned_out.insert(registration);
  }
  try {
    return host_memory_pointer(state.context, pointer, registration->device, size, std::move(owner),
                               [registration] { State::release(registration); });
  } catch (...) {
    State::release(registration);
    throw;
  }
}

std::size_t PinnedHostPool::trim() {
  std::vector<State::Block*> blocks;
  std::vector<State::Registration*> registrations;
  {
    std::lock_guard lock(state_->mutex);
    state_->epochs.seal();
    state_->epochs.poll(true);  // cached blocks may still be read by queued copies
    blocks = state_->evict_blocks(0);
    registrations = state_->evict_registrations(0);
  }
  std::size_t freed = 0;
  for (auto* block : blocks) freed += block->bytes;
  State::discard(blocks);
  State::discard(registrations);
  return freed;
}

void PinnedHostPool::release_everything() {
  std::vector<State::Block*> blocks;
  std::vector<State::Registration*> registrations;
  {
    std::lock_guard lock(state_->mutex);
    state_->closed = true;
    for (State::Block* block = state_->handed_out; block; block = block->next_out) {
      if (block->dead) continue;  // (an earlier call freed it)
      block->dead = true;
      blocks.push_back(block);
      state_->counters.allocated_bytes -= block->bytes;
    }
    for (State::Registration* registration : state_->pinned_out) {
      registration->dead = true;
      registrations.push_back(registration);
    }
  }
  trim();
  // Handed-out records stay (their pointers still name them); only the memory goes.
  for (State::Block* block : blocks) State::free_block(block);
  for (State::Registration* registration : registrations) State::unregister(registration);
}

PinnedHostPoolStatistics PinnedHostPool::statistics() const {
  std::lock_guard lock(state_->mutex);
  PinnedHostPoolStatistics statistics = state_->counters;
  statistics.cached_registrations = state_->cached_registrations.size();
  return statistics;
}

}  // namespace cuemm
