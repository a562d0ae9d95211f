#include "cuemm/adaptors/manager_adaptor.hpp"

#include <cxxabi.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <type_traits>
#include <typeinfo>
#include <variant>

#include "cuemm/error.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "threading/section_gate.hpp"
#include "util/address_map.hpp"
#include "util/address_shard.hpp"
#include "util/keep_until_exit.hpp"

namespace cuemm {

namespace {
thread_local std::string current_call_site;
}

ScopedCallSite::ScopedCallSite(std::string site) : previous_(std::exchange(current_call_site, std::move(site))) {}
ScopedCallSite::~ScopedCallSite() { current_call_site = std::move(previous_); }
const std::string& ScopedCallSite::current() noexcept { return current_call_site; }

namespace {
// (steady_clock is CLOCK_MONOTONIC)
std::chrono::steady_clock::time_point clock_origin() noexcept {
  static const auto origin = std::chrono::steady_clock::now();
  return origin;
}
// The origin is when the library was loaded, so the coarse clock has ticked
// past it by the time anything allocates.
[[maybe_unused]] const auto origin_at_load = clock_origin();
}  // namespace

double adaptor_clock() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_origin()).count();
}

namespace {
// The same timeline at the kernel's last tick (a few milliseconds), read
// without the clock source: enough for when a block was allocated, and a
// fraction of the precise read where the host is a virtual machine
// (bench/probes/probe_clock.cpp).
double adaptor_coarse_clock() noexcept {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  const auto since = std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec) -
                     clock_origin().time_since_epoch();
  return std::max(0.0, std::chrono::duration<double>(since).count());  // (it may lag the origin by a tick)
}
}  // namespace

// Note [Counting across a reset]
// reset() may come from one thread while others allocate and free. An
// allocation is asked of the observer (before_allocation, which a limit
// counts), made by the upstream and reported (allocated) in one section of
// `gate` (detail::SectionGate), with the generation it read there; a
// release is reported in sections too. reset() closes the gate while it
// forgets the counts and resets the upstream: so an allocation, its count
// and the generation its block is tagged with fall wholly before the reset
// or wholly after it. A block counted before is forgotten with the rest, and
// its release is not reported; one counted after is released as any other.
// The upstream's reset is inside too: were an allocation made while it ran
// (the gate opened before it, as it once was), the upstream could give the
// block back and hand its address out again, while the adaptor counted
// both, in the new generation, and its record of stream-ordered blocks held
// one of them (a count that outlived its block: the H100, resets beside
// four threads). Only an out-of-memory handler runs outside (it may wait, or
// free through this adaptor); where a reset came while it ran, the count
// was forgotten, and the next attempt asks again.
//
// Read by every allocation and release, written only by reset() and the
// destructor: on a cache line of its own, so that it stays shared between
// the threads' caches.
struct alignas(64) ManagerAdaptor::Shared {
  std::shared_ptr<AllocationObserver> observer;
  bool observes_releasing = false;           // the observer's wants_releasing()
  bool records_details = false;              // its wants_times_and_call_sites()
  bool records_durations = false;            // that, and its wants_durations(): releases timed too
  std::atomic<std::uint64_t> generation{0};  // bumped by reset() and when the adaptor goes
  detail::SectionGate gate;                  // closed by reset() while the observer forgets
  BlockingAwareMutex resetting;              // one reset() at a time closes the gate
};

// Note [Stream-ordered blocks of an adaptor]
// A block from allocate(size, stream) has no pointer object to carry what
// its release needs: the generation it was counted in (Note [Counting across
// a reset]). The adaptor keeps that by address until deallocate(), in shards
// under locks of their own, so that threads seldom meet on one. The record
// also lets the adaptor refuse a free of no block of its, or of the wrong
// size, before the upstream sees it: its counts stay right whatever the
// upstream checks (the pool checks frees only with PoolOptions::check_frees).
// Entries are made and taken, and the upstream called, in the sections of
// Note [Counting across a reset]; reset() starts a new generation, resets
// the upstream and forgets the earlier generations' entries with the gate
// closed. So nothing stays from before a reset, and a later free of such a
// block is refused (the upstream gave it back), not passed on to free
// whatever the upstream has since handed out there. Where the upstream's
// reset fails (the host out of memory), nothing is forgotten: the blocks it
// still holds can be freed, and their releases go uncounted, as the counts
// were reset. Once the upstream hands such an address out again, a late
// free of the old block cannot be told from one of the new: as with any
// allocator, a block a reset gave back must not be freed after.
struct ManagerAdaptor::StreamOrderedBlocks {
  struct Entry {
    std::size_t size;
    std::uint64_t generation;
  };
  struct alignas(64) Shard {
    BlockingAwareMutex mutex;
    util::AddressMap<Entry> live;
  };
  static constexpr int kShardBits = 6;
  std::array<Shard, std::size_t{1} << kShardBits> shards;
  std::atomic<std::uint64_t> refused{0};

  Shard& shard_of(cuda::CUdeviceptr pointer) noexcept { return shards[util::address_shard(pointer, kShardBits)]; }
  // A block handed out before a reset and recorded late may share its
  // address with one handed out after it (the upstream gave it back and
  // out again): the later generation's entry is the one kept.
  void record(cuda::CUdeviceptr pointer, Entry entry) {
    Shard& shard = shard_of(pointer);
    std::lock_guard lock(shard.mutex);
    if (const Entry* there = shard.live.find(pointer); there && there->generation > entry.generation) return;
    shard.live.insert_or_assign(pointer, entry);
  }
  // Takes out the entries of generations before `generation`.
  void forget_before(std::uint64_t generation) noexcept {
    for (Shard& shard : shards) {
      std::lock_guard lock(shard.mutex);
      shard.live.erase_if([&](const Entry& entry) { return entry.generation < generation; });
    }
  }
  // The block's entry, taken off the record; else why the free is refused.
  std::variant<Entry, std::string> take(cuda::CUdeviceptr pointer, std::size_t size) {
    Shard& shard = shard_of(pointer);
    std::lock_guard lock(shard.mutex);
    const Entry* found = shard.live.find(pointer);
    if (!found)
      return std::string("no block from this adaptor's allocate(size, stream) starts there (freed already, "
                         "never allocated through it, or given back by a reset())");
    if (found->size != size) return "the block there was allocated with " + std::to_string(found->size) + " bytes";
    return *shard.live.take(pointer);
  }
};

static_assert(kMostStackedAdaptors + 2 <= detail::SectionGate::kMostNested);  // (and a release nested in one)

namespace {
// The manager at the bottom of a stack of adaptors, and how many lie above it.
struct StackBottom {
  const BaseMemoryManager* manager;
  int adaptors;
};
StackBottom bottom_of(const BaseMemoryManager& top) noexcept {
  StackBottom bottom{&top, 0};
  while (const auto* adaptor = dynamic_cast<const ManagerAdaptor*>(bottom.manager)) {
    bottom.manager = &adaptor->upstream();
    ++bottom.adaptors;
  }
  return bottom;
}
}  // namespace

ManagerAdaptor::ManagerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                               std::shared_ptr<AllocationObserver> observer)
    : BaseMemoryManager(context), upstream_(std::move(upstream)) {
  if (!upstream_) throw InvalidArgument("an adaptor needs a manager to wrap (upstream is null)");
  // Each adaptor's call holds its upstream's in a section (Note [Counting
  // across a reset]): a stack deeper than a thread's sections would go unseen.
  const int stacked = 1 + bottom_of(*upstream_).adaptors;
  if (stacked > kMostStackedAdaptors)
    throw InvalidArgument("this adaptor would be the " + std::to_string(stacked) + "th stacked on one manager; at most " +
                          std::to_string(kMostStackedAdaptors) + " are");
  raw_upstream_ = dynamic_cast<RawDeviceAllocator*>(upstream_.get());
  stream_ordered_upstream_ = stream_ordered_allocator(*upstream_);
  stream_ordered_blocks_ = std::make_unique<StreamOrderedBlocks>();
  if (!observer) throw InvalidArgument("an adaptor needs an observer (it is null)");
  shared_ = std::make_shared<Shared>();
  shared_->observes_releasing = observer->wants_releasing();
  shared_->records_details = observer->wants_times_and_call_sites();
  shared_->records_durations = shared_->records_details && observer->wants_durations();
  shared_->observer = std::move(observer);
}

// The pointers handed out reach Shared by a raw pointer (a reference count
// per pointer would have every thread write one cache line), so it is kept
// until exit; the new generation stops their later releases being reported.
ManagerAdaptor::~ManagerAdaptor() {
  shared_->generation.fetch_add(1);
  util::keep_until_exit(std::move(shared_));
}

AllocationObserver& ManagerAdaptor::observer() const noexcept { return *shared_->observer; }

namespace {
using detail::ObservedBlock;

// Reports a release to the observer, unless a reset() gave the memory back
// meanwhile (Note [Counting across a reset]).
template <typename Shared>
void report_release(Shared& shared, const AllocationRecord& record, std::uint64_t generation) noexcept {
  detail::SectionGate::Section section(shared.gate);
  if (shared.generation.load(std::memory_order_relaxed) == generation) shared.observer->released(record);
}

// Note [A release seen before the upstream has the block]
// A release is reported once the upstream has the block back, and timed
// around that. But from then on the upstream may hand the same address to
// another thread, whose allocation can be reported first: the log then
// read an address allocated twice and a free of nothing after it (a tenth
// of a percent of 4 threads' rows over the pool, simulated), and the
// tracking table dropped the second thread's live block with the first's
// release, missing it from the leak report. So an observer that needs the
// release first (wants_releasing()) also hears of it just before the
// upstream does: the tracking table forgets the block there, and the log
// takes the row's place in its order there (LoggingAdaptor's Note [Rows in
// the order of events]).

// A release's record, timed from now where `detailed_release`.
AllocationRecord release_record(const ObservedBlock& block, bool detailed_release) noexcept {
  AllocationRecord record = block.record();
  if (detailed_release) record.start = adaptor_clock();
  return record;
}
// Once the upstream has the block: where `detailed_release`, its end and call site.
void finish_release_record(AllocationRecord& record, bool detailed_release) noexcept {
  if (!detailed_release) return;
  record.end = adaptor_clock();
  try {
    record.call_site = ScopedCallSite::current();
  } catch (const std::bad_alloc&) {  // (no memory for its copy: the release is reported without it)
  }
}

// Gives the memory back to the upstream (`let_go`) and reports its release;
// with `detailed_release`, timed and with the call site. A pointer's release:
// let go outside the sections, as it may drop the last reference to what
// the upstream held (a Python owner, whose destructor may run any code).
// The upstream's reset cannot leave it confused, as allocate(size, stream)'s
// record could be: the pointer carries its own generation.
template <typename Shared, typename LetGo>
void release_and_report(Shared& shared, LetGo&& let_go, const ObservedBlock& block, std::uint64_t generation,
                        bool detailed_release) noexcept {
  AllocationRecord record = release_record(block, detailed_release);
  if (shared.observes_releasing) {
    detail::SectionGate::Section section(shared.gate);
    if (shared.generation.load(std::memory_order_relaxed) == generation) shared.observer->releasing(record);
  }
  let_go();
  finish_release_record(record, detailed_release);
  report_release(shared, record, generation);
}

// What an adaptor's pointer holds of the upstream's allocation, and how it
// gives it back: the upstream's own pointer (whose finalizer runs as it
// goes), or a RawDeviceAllocator's block (one pointer object per allocation,
// not two).
struct UpstreamPointer {
  std::shared_ptr<MemoryPointer> memory;
  void let_go(const ObservedBlock&) noexcept { memory.reset(); }
};
struct UpstreamBlock {
  RawDeviceAllocator::Releaser releaser;
  void let_go(const ObservedBlock& block) noexcept { releaser.release(releaser.state, block.address, block.size); }
};

// A block from the upstream's allocate(size, stream), and how to give it back.
struct UpstreamStreamOrderedBlock {
  cuda::CUdeviceptr address;
  StreamOrderedAllocator* upstream;
  cuda::CUstream stream;
};

// What the upstream returned, as a record names it; null is the upstream's error.
struct Made {
  MemoryKind kind;
  std::uintptr_t address;
  std::optional<std::uintptr_t> stream;  // a stream-ordered call's
};
Made made_by(const std::shared_ptr<MemoryPointer>& upstream) {
  if (!upstream) throw PluginError("the wrapped memory manager returned no pointer");
  const MemoryKind kind = upstream->kind();
  return {kind, kind == MemoryKind::Pinned ? upstream->host_pointer() : upstream->handle(), std::nullopt};
}
Made made_by(const RawDeviceAllocator::Allocation& block) { return {MemoryKind::Device, block.address, std::nullopt}; }
Made made_by(const UpstreamStreamOrderedBlock& block) {
  if (!block.address) throw PluginError("the wrapped memory manager's allocate(size, stream) returned a null pointer");
  return {MemoryKind::Device, block.address, reinterpret_cast<std::uintptr_t>(block.stream)};
}

// What an adaptor hands out: a pointer of the upstream's kind, at the same
// addresses, that holds the upstream's allocation and reports its release.
// The finalizer captures only `this`, so std::function stores it inline
// (made at allocation rate: no allocation but the recycled pointer's own),
// and the destructor runs it while the members it uses still exist.
template <typename Base, typename Shared, typename Held>
class ObservedPointer final : public Base {
 public:
  template <typename... BaseArguments>
  ObservedPointer(Shared* shared, std::uint64_t generation, Held&& held, const ObservedBlock& block,
                  BaseArguments&&... base)
      : Base(std::forward<BaseArguments>(base)..., nullptr, [this] { release(); }),
        shared_(shared),
        held_(std::move(held)),
        block_(block),
        generation_(generation) {}
  ~ObservedPointer() override { this->finalize_unshared(); }

 private:
  void release() noexcept {
    release_and_report(*shared_, [this] { held_.let_go(block_); }, block_, generation_, shared_->records_durations);
  }

  Shared* shared_;  // outlives this (see ~ManagerAdaptor)
  Held held_;
  ObservedBlock block_;
  std::uint64_t generation_;
};

// Makes the adaptor's pointer, through the recycling allocator as managers
// do (at allocation rate). If making it fails, the upstream's allocation is
// given back and its release reported.
template <typename Base, typename Shared, typename Held, typename... BaseArguments>
std::shared_ptr<MemoryPointer> make_observed(Shared* shared, std::uint64_t generation, Held&& held,
                                             const ObservedBlock& block, BaseArguments&&... base) {
  try {
    return detail::make_recycled<ObservedPointer<Base, Shared, std::remove_cvref_t<Held>>>(
        shared, generation, std::forward<Held>(held), block, std::forward<BaseArguments>(base)...);
  } catch (...) {
    // (Still here: making the pointer failed before its member took it.)
    release_and_report(*shared, [&] { held.let_go(block); }, block, generation, false);
    throw;
  }
}

// What allocations other than allocate(size, stream)'s keep of their block
// in the adaptor: nothing (their pointer object carries it).
struct KeepNothing {
  template <typename Upstream>
  void operator()(const Upstream&, const ObservedBlock&, std::uint64_t) const noexcept {}
};

// Gives back what the upstream returned, where the allocation failed after all.
void give_back_upstream(std::shared_ptr<MemoryPointer>& memory, const ObservedBlock&) noexcept { memory.reset(); }
void give_back_upstream(RawDeviceAllocator::Allocation& allocation, const ObservedBlock& block) noexcept {
  UpstreamBlock{allocation.releaser}.let_go(block);
}
void give_back_upstream(UpstreamStreamOrderedBlock& allocation, const ObservedBlock& block) noexcept {
  allocation.upstream->deallocate(allocation.address, block.size, allocation.stream);
}

std::string type_name(const BaseMemoryManager& manager) {
  const char* mangled = typeid(manager).name();
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && readable ? readable : mangled;
  std::free(readable);
  return name;
}
}  // namespace

template <typename Allocate, typename Keep>
auto ManagerAdaptor::allocate_observed(MemoryKind kind, std::size_t size, Allocate&& allocate, Keep&& keep)
    -> Observed<decltype(allocate())> {
  const bool detailed = shared_->records_details;
  const bool durations = shared_->records_durations;
  std::optional<std::uint64_t> counted;  // the generation before_allocation() counted it in
  for (int attempt = 1;; ++attempt) {
    std::exception_ptr ran_out;  // the upstream's OutOfMemory
    {
      // One section: asked, made and reported (Note [Counting across a reset]).
      detail::SectionGate::Section section(shared_->gate);
      const std::uint64_t generation = shared_->generation.load(std::memory_order_relaxed);
      if (counted != generation) {  // (the first attempt, or a reset forgot the count)
        observer().before_allocation(kind, size);
        counted = generation;
      }
      const double start = !detailed ? 0.0 : durations ? adaptor_clock() : adaptor_coarse_clock();
      decltype(allocate()) upstream{};
      Made made;
      try {
        upstream = allocate();
        made = made_by(upstream);
      } catch (const OutOfMemory&) {
        ran_out = std::current_exception();
      } catch (...) {
        observer().allocation_failed(kind, size);
        throw;
      }
      if (!ran_out) {
        const ObservedBlock block{made.kind, made.address, size};
        AllocationRecord record = block.record();
        try {
          record.start = start;
          record.end = durations ? adaptor_clock() : start;
          if (detailed) record.call_site = ScopedCallSite::current();
          record.stream = made.stream;
          keep(upstream, block, generation);
        } catch (...) {  // (the host out of memory) The block goes back, uncounted.
          give_back_upstream(upstream, block);
          observer().allocation_failed(kind, size);
          throw;
        }
        observer().allocated(record);
        return {std::move(upstream), block, generation};
      }
    }
    // Outside the section: the handler may wait, or free through this adaptor.
    const auto failed = [&]() noexcept {
      detail::SectionGate::Section section(shared_->gate);
      if (shared_->generation.load(std::memory_order_relaxed) == counted) observer().allocation_failed(kind, size);
    };
    try {
      std::rethrow_exception(ran_out);
    } catch (const OutOfMemory& error) {
      bool retry = false;
      try {
        retry = observer().retry_after_out_of_memory(kind, error, attempt);
      } catch (...) {
        failed();
        throw;
      }
      if (!retry) {
        failed();
        throw;
      }
    }
  }
}

template <typename Allocate>
std::shared_ptr<MemoryPointer> ManagerAdaptor::observe(MemoryKind kind, std::size_t size, Allocate&& allocate) {
  auto [upstream, block, generation] = allocate_observed(kind, size, std::forward<Allocate>(allocate), KeepNothing{});
  Context* context = upstream->context();
  const std::uintptr_t handle = upstream->handle();
  auto* host = reinterpret_cast<void*>(upstream->host_pointer());
  UpstreamPointer held{std::move(upstream)};
  switch (block.kind) {
    case MemoryKind::Device:
      return make_observed<MemoryPointer>(shared_.get(), generation, std::move(held), block, context, handle, size);
    case MemoryKind::Mapped:
      return make_observed<MappedMemory>(shared_.get(), generation, std::move(held), block, context, host, handle,
                                         size);
    case MemoryKind::Pinned:
      return make_observed<PinnedMemory>(shared_.get(), generation, std::move(held), block, context, host, size);
    case MemoryKind::Managed:
      return make_observed<ManagedMemory>(shared_.get(), generation, std::move(held), block, context, handle, size);
  }
  release_and_report(*shared_, [&held, &observed = block] { held.let_go(observed); }, block, generation, false);
  throw StateError("unknown memory kind");
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  if (raw_upstream_) return observe_raw(size);
  return observe(MemoryKind::Device, size, [&] { return upstream_->memalloc(size); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::observe_raw(std::size_t size) {
  auto [allocation, block, generation] =
      allocate_observed(MemoryKind::Device, size, [&] { return raw_upstream_->allocate_raw(size); }, KeepNothing{});
  return make_observed<MemoryPointer>(shared_.get(), generation, UpstreamBlock{allocation.releaser}, block, &context(),
                                      block.address, size);
}

ManagerAdaptor::Unwrapped ManagerAdaptor::memalloc_unwrapped(std::size_t size) {
  require_allocation_size(size, "memalloc");
  if (raw_upstream_) {
    auto [allocation, block, generation] =
        allocate_observed(MemoryKind::Device, size, [&] { return raw_upstream_->allocate_raw(size); }, KeepNothing{});
    return {nullptr, block, generation, allocation.releaser};
  }
  auto [memory, block, generation] =
      allocate_observed(MemoryKind::Device, size, [&] { return upstream_->memalloc(size); }, KeepNothing{});
  return {std::move(memory), block, generation};
}

void ManagerAdaptor::release_unwrapped(Unwrapped& allocation) noexcept {
  if (!allocation.held()) return;
  release_and_report(
      *shared_,
      [&] {
        if (allocation.memory)
          allocation.memory.reset();
        else
          UpstreamBlock{std::exchange(allocation.releaser, {})}.let_go(allocation.block);
      },
      allocation.block, allocation.generation, shared_->records_durations);
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memhostalloc(std::size_t size, bool mapped, bool portable, bool wc) {
  require_allocation_size(size, "memhostalloc");
  return observe(mapped ? MemoryKind::Mapped : MemoryKind::Pinned, size,
                 [&] { return upstream_->memhostalloc(size, mapped, portable, wc); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::mempin(std::shared_ptr<const void> owner, void* pointer,
                                                      std::size_t size, bool mapped) {
  return observe(mapped ? MemoryKind::Mapped : MemoryKind::Pinned, size,
                 // (A copy: where the upstream fails, the last reference, perhaps a Python
                 // object's, goes here, outside the adaptor's section.)
                 [&] { return upstream_->mempin(owner, pointer, size, mapped); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memallocmanaged(std::size_t size, bool attach_global) {
  require_allocation_size(size, "memallocmanaged");
  return observe(MemoryKind::Managed, size, [&] { return upstream_->memallocmanaged(size, attach_global); });
}

IpcHandle ManagerAdaptor::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  return upstream_->get_ipc_handle(memory);
}

void ManagerAdaptor::reset() {
  if (shared_->gate.inside())
    throw StateError("reset() of an adaptor from inside one of its own allocations or releases (an "
                     "out-of-memory handler of a manager under it?): the reset would wait for itself");
  std::lock_guard lock(shared_->resetting);
  // The upstream's reset too, with the gate closed (Note [Counting across a reset]).
  shared_->gate.close_and_drain();
  struct Reopen {
    detail::SectionGate& gate;
    ~Reopen() { gate.open(); }
  } reopen{shared_->gate};
  const std::uint64_t generation = shared_->generation.fetch_add(1) + 1;
  observer().reset();
  upstream_->reset();
  // Once the upstream has given them back (Note [Stream-ordered blocks of an adaptor]).
  stream_ordered_blocks_->forget_before(generation);
}

cuda::CUdeviceptr ManagerAdaptor::allocate(std::size_t size, cuda::CUstream stream) {
  require_allocation_size(size, "allocate(size, stream)");
  if (!stream_ordered_upstream_) {
    throw NotSupported("allocate(size, stream) of " + std::to_string(size) +
                       " bytes: the memory manager under this adaptor (" + type_name(*bottom_of(*upstream_).manager) +
                       ") has no stream-ordered calls (the pool and the async manager have them)");
  }
  StreamOrderedAllocator* upstream = stream_ordered_upstream_;
  StreamOrderedBlocks& blocks = *stream_ordered_blocks_;
  return allocate_observed(
             MemoryKind::Device, size,
             [&] { return UpstreamStreamOrderedBlock{upstream->allocate(size, stream), upstream, stream}; },
             [&](const UpstreamStreamOrderedBlock& made, const ObservedBlock&, std::uint64_t generation) {
               blocks.record(made.address, {size, generation});
             })
      .upstream.address;
}

void ManagerAdaptor::deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept {
  std::variant<StreamOrderedBlocks::Entry, std::string> taken;
  {
    // One section: taken off the record, freed and reported, with no reset
    // between (Note [Stream-ordered blocks of an adaptor]).
    detail::SectionGate::Section section(shared_->gate);
    try {
      taken = stream_ordered_blocks_->take(pointer, size);
    } catch (...) {  // (no memory for the reason)
      taken = std::string();
    }
    if (const auto* entry = std::get_if<StreamOrderedBlocks::Entry>(&taken)) {
      // (Not counted where the entry is an earlier generation's: the
      // upstream's reset failed and it still holds the block, whose count
      // was forgotten.)
      const bool counted = shared_->generation.load(std::memory_order_relaxed) == entry->generation;
      const bool detailed_release = shared_->records_durations;
      AllocationRecord record = release_record(ObservedBlock{MemoryKind::Device, pointer, size}, detailed_release);
      record.stream = reinterpret_cast<std::uintptr_t>(stream);
      if (counted && shared_->observes_releasing) observer().releasing(record);
      stream_ordered_upstream_->deallocate(pointer, size, stream);
      finish_release_record(record, detailed_release);
      if (counted) observer().released(record);
      return;
    }
  }
  const std::string& why = *std::get_if<std::string>(&taken);  // (no throw: the entry's case returned)
  stream_ordered_blocks_->refused.fetch_add(1, std::memory_order_relaxed);
  // (The address printed without a string: a failed allocation here would end the program.)
  std::fprintf(stderr, "cuemm: ManagerAdaptor::deallocate(0x%llx, %zu bytes, stream %p) refused, nothing freed: %s\n",
               static_cast<unsigned long long>(pointer), size, static_cast<void*>(stream),
               why.empty() ? "its record could not be read" : why.c_str());
}

std::uint64_t ManagerAdaptor::refused_frees() const noexcept {
  return stream_ordered_blocks_->refused.load(std::memory_order_relaxed);
}

}  // namespace cuemm
