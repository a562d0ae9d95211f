#include "cuemm/adaptors/manager_adaptor.hpp"

#include <chrono>

#include "cuemm/error.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "util/keep_until_exit.hpp"

namespace cuemm {

namespace {
thread_local std::string current_call_site;
}

ScopedCallSite::ScopedCallSite(std::string site) : previous_(std::exchange(current_call_site, std::move(site))) {}
ScopedCallSite::~ScopedCallSite() { current_call_site = std::move(previous_); }
const std::string& ScopedCallSite::current() noexcept { return current_call_site; }

double adaptor_clock() noexcept {
  static const auto origin = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
}

// Read by every release, written only by reset() and the destructor: on a
// cache line of its own, so that it stays shared between the threads' caches.
struct alignas(64) ManagerAdaptor::Shared {
  std::shared_ptr<AllocationObserver> observer;
  std::atomic<std::uint64_t> generation{0};  // bumped by reset() and when the adaptor goes
};

ManagerAdaptor::ManagerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                               std::shared_ptr<AllocationObserver> observer)
    : BaseMemoryManager(context), upstream_(std::move(upstream)) {
  if (!upstream_) throw InvalidArgument("an adaptor needs a manager to wrap (upstream is null)");
  raw_upstream_ = dynamic_cast<RawDeviceAllocator*>(upstream_.get());
  if (!observer) throw InvalidArgument("an adaptor needs an observer (it is null)");
  shared_ = std::make_shared<Shared>();
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
// Gives the memory back to the upstream (`let_go`) and reports its release
// (unless a reset() gave it back meanwhile); with `detailed`, timed and with
// the call site.
template <typename Shared, typename LetGo>
void release_and_report(const Shared& shared, LetGo&& let_go, AllocationRecord& record, std::uint64_t generation,
                        bool detailed) noexcept {
  if (detailed) record.start = adaptor_clock();
  let_go();
  if (detailed) {
    record.end = adaptor_clock();
    record.call_site = ScopedCallSite::current();
  }
  if (shared.generation.load(std::memory_order_relaxed) == generation) shared.observer->released(record);
}

// What an adaptor hands out: a pointer of the upstream's kind, at the same
// addresses, that holds the upstream pointer and reports its release. The
// finalizer captures only `this`, so std::function stores it inline (made at
// allocation rate: no allocation but the recycled pointer's own), and the
// destructor runs it while the members it uses still exist.
template <typename Base, typename Shared>
class ObservedPointer final : public Base {
 public:
  template <typename... BaseArguments>
  ObservedPointer(Shared* shared, std::uint64_t generation, bool detailed,
                  std::shared_ptr<MemoryPointer>&& upstream, AllocationRecord&& record, BaseArguments&&... base)
      : Base(std::forward<BaseArguments>(base)..., nullptr, [this] { release(); }),
        shared_(shared),
        upstream_(std::move(upstream)),
        record_(std::move(record)),
        generation_(generation),
        detailed_(detailed) {}
  ~ObservedPointer() override { this->finalize_unshared(); }

 private:
  void release() noexcept {
    // The upstream's own finalizer runs as its pointer goes.
    release_and_report(*shared_, [this] { upstream_.reset(); }, record_, generation_, detailed_);
  }

  Shared* shared_;  // outlives this (see ~ManagerAdaptor)
  std::shared_ptr<MemoryPointer> upstream_;
  AllocationRecord record_;
  std::uint64_t generation_;
  bool detailed_;
};

// The same over device memory that the upstream gave as a bare address
// (RawDeviceAllocator): one pointer object per allocation, not two.
template <typename Shared>
class ObservedRawPointer final : public MemoryPointer {
 public:
  ObservedRawPointer(Shared* shared, std::uint64_t generation, bool detailed, RawDeviceAllocator::Releaser releaser,
                     AllocationRecord&& record, Context* context)
      : MemoryPointer(context, record.address, record.size, nullptr, [this] { release(); }),
        shared_(shared),
        releaser_(releaser),
        record_(std::move(record)),
        generation_(generation),
        detailed_(detailed) {}
  ~ObservedRawPointer() override { this->finalize_unshared(); }

 private:
  void release() noexcept {
    release_and_report(
        *shared_, [this] { releaser_.release(releaser_.state, record_.address, record_.size); }, record_,
        generation_, detailed_);
  }

  Shared* shared_;  // outlives this (see ~ManagerAdaptor)
  RawDeviceAllocator::Releaser releaser_;
  AllocationRecord record_;
  std::uint64_t generation_;
  bool detailed_;
};
}  // namespace

template <typename Allocate>
ManagerAdaptor::Unwrapped ManagerAdaptor::allocate_observed(MemoryKind kind, std::size_t size, Allocate&& allocate) {
  observer().before_allocation(kind, size);
  const bool detailed = observer().wants_times_and_call_sites();
  const double start = detailed ? adaptor_clock() : 0.0;
  std::shared_ptr<MemoryPointer> upstream;
  try {
    upstream = allocate();
    if (!upstream) throw PluginError("the wrapped memory manager returned no pointer");
  } catch (...) {
    observer().allocation_failed(kind, size);
    throw;
  }
  const MemoryKind made = upstream->kind();
  const std::uintptr_t address = made == MemoryKind::Pinned ? upstream->host_pointer() : upstream->handle();
  AllocationRecord record{made, address, size, start, detailed ? adaptor_clock() : 0.0,
                          detailed ? ScopedCallSite::current() : std::string()};
  observer().allocated(record);
  return {std::move(upstream), std::move(record), shared_->generation.load(std::memory_order_relaxed), detailed};
}

template <typename Allocate>
std::shared_ptr<MemoryPointer> ManagerAdaptor::observe(MemoryKind kind, std::size_t size, Allocate&& allocate) {
  auto [upstream, record, generation, detailed] = allocate_observed(kind, size, std::forward<Allocate>(allocate));
  const MemoryKind made = record.kind;
  const std::uintptr_t address = record.address;
  Context* context = upstream->context();
  const std::uintptr_t handle = upstream->handle();
  auto* host = reinterpret_cast<void*>(upstream->host_pointer());
  // Made at allocation rate: through the recycling allocator, as managers do.
  // If making it fails, the upstream pointer goes with this frame and its release is reported.
  try {
    switch (made) {
      case MemoryKind::Device:
        return detail::make_recycled<ObservedPointer<MemoryPointer, Shared>>(
            shared_.get(), generation, detailed, std::move(upstream), std::move(record), context, handle, size);
      case MemoryKind::Mapped:
        return detail::make_recycled<ObservedPointer<MappedMemory, Shared>>(
            shared_.get(), generation, detailed, std::move(upstream), std::move(record), context, host, handle, size);
      case MemoryKind::Pinned:
        return detail::make_recycled<ObservedPointer<PinnedMemory, Shared>>(
            shared_.get(), generation, detailed, std::move(upstream), std::move(record), context, host, size);
      case MemoryKind::Managed:
        return detail::make_recycled<ObservedPointer<ManagedMemory, Shared>>(
            shared_.get(), generation, detailed, std::move(upstream), std::move(record), context, handle, size);
    }
    throw StateError("unknown memory kind");
  } catch (...) {
    observer().released({made, address, size, 0.0, 0.0, std::string()});
    throw;
  }
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  if (raw_upstream_) return observe_raw(size);
  return observe(MemoryKind::Device, size, [&] { return upstream_->memalloc(size); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::observe_raw(std::size_t size) {
  observer().before_allocation(MemoryKind::Device, size);
  const bool detailed = observer().wants_times_and_call_sites();
  const double start = detailed ? adaptor_clock() : 0.0;
  RawDeviceAllocator::Allocation allocation;
  try {
    allocation = raw_upstream_->allocate_raw(size);
  } catch (...) {
    observer().allocation_failed(MemoryKind::Device, size);
    throw;
  }
  const auto [address, releaser] = allocation;
  AllocationRecord record{MemoryKind::Device, address, size, start, detailed ? adaptor_clock() : 0.0,
                          detailed ? ScopedCallSite::current() : std::string()};
  observer().allocated(record);
  const std::uint64_t generation = shared_->generation.load(std::memory_order_relaxed);
  try {
    return detail::make_recycled<ObservedRawPointer<Shared>>(shared_.get(), generation, detailed, releaser,
                                                             std::move(record), &context());
  } catch (...) {
    releaser.release(releaser.state, address, size);
    observer().released({MemoryKind::Device, address, size, 0.0, 0.0, std::string()});
    throw;
  }
}

ManagerAdaptor::Unwrapped ManagerAdaptor::memalloc_unwrapped(std::size_t size) {
  require_allocation_size(size, "memalloc");
  return allocate_observed(MemoryKind::Device, size, [&] { return upstream_->memalloc(size); });
}

void ManagerAdaptor::release_unwrapped(Unwrapped& allocation) noexcept {
  if (allocation.memory)
    release_and_report(
        *shared_, [&] { allocation.memory.reset(); }, allocation.record, allocation.generation, allocation.detailed);
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memhostalloc(std::size_t size, bool mapped, bool portable, bool wc) {
  require_allocation_size(size, "memhostalloc");
  return observe(mapped ? MemoryKind::Mapped : MemoryKind::Pinned, size,
                 [&] { return upstream_->memhostalloc(size, mapped, portable, wc); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::mempin(std::shared_ptr<const void> owner, void* pointer,
                                                      std::size_t size, bool mapped) {
  return observe(mapped ? MemoryKind::Mapped : MemoryKind::Pinned, size,
                 [&] { return upstream_->mempin(std::move(owner), pointer, size, mapped); });
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memallocmanaged(std::size_t size, bool attach_global) {
  require_allocation_size(size, "memallocmanaged");
  return observe(MemoryKind::Managed, size, [&] { return upstream_->memallocmanaged(size, attach_global); });
}

IpcHandle ManagerAdaptor::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  return upstream_->get_ipc_handle(memory);
}

void ManagerAdaptor::reset() {
  shared_->generation.fetch_add(1);
  observer().reset();
  upstream_->reset();
}

}  // namespace cuemm
