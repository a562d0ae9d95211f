#include "cuemm/adaptors/manager_adaptor.hpp"

#include <chrono>

#include "cuemm/error.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"

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

ManagerAdaptor::ManagerAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                               std::shared_ptr<AllocationObserver> observer)
    : BaseMemoryManager(context),
      upstream_(std::move(upstream)),
      observer_(std::move(observer)),
      generation_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
  if (!upstream_) throw InvalidArgument("an adaptor needs a manager to wrap (upstream is null)");
  if (!observer_) throw InvalidArgument("an adaptor needs an observer (it is null)");
}

namespace {
// The same kind of pointer as `upstream`, at the same addresses, whose
// finalizer is `finalizer`.
std::shared_ptr<MemoryPointer> rewrap(const std::shared_ptr<MemoryPointer>& upstream, std::size_t size,
                                      Finalizer finalizer) {
  Context* context = upstream->context();
  auto* host = reinterpret_cast<void*>(upstream->host_pointer());
  // Made at allocation rate: through the recycling allocator, as managers do.
  switch (upstream->kind()) {
    case MemoryKind::Device:
      return detail::make_recycled<MemoryPointer>(context, upstream->handle(), size, nullptr, std::move(finalizer));
    case MemoryKind::Mapped:
      return detail::make_recycled<MappedMemory>(context, host, upstream->handle(), size, nullptr,
                                                 std::move(finalizer));
    case MemoryKind::Pinned:
      return detail::make_recycled<PinnedMemory>(context, host, size, nullptr, std::move(finalizer));
    case MemoryKind::Managed:
      return detail::make_recycled<ManagedMemory>(context, upstream->handle(), size, nullptr, std::move(finalizer));
  }
  throw StateError("unknown memory kind");
}
}  // namespace

template <typename Allocate>
std::shared_ptr<MemoryPointer> ManagerAdaptor::observe(MemoryKind kind, std::size_t size, Allocate&& allocate) {
  observer_->before_allocation(kind, size);
  const bool detailed = observer_->wants_times_and_call_sites();
  const double start = detailed ? adaptor_clock() : 0.0;
  std::shared_ptr<MemoryPointer> upstream;
  try {
    upstream = allocate();
    if (!upstream) throw PluginError("the wrapped memory manager returned no pointer");
  } catch (...) {
    observer_->allocation_failed(kind, size);
    throw;
  }
  AllocationRecord record{upstream->kind(),
                          upstream->kind() == MemoryKind::Pinned ? upstream->host_pointer() : upstream->handle(),
                          size,
                          start,
                          detailed ? adaptor_clock() : 0.0,
                          detailed ? ScopedCallSite::current() : std::string()};
  observer_->allocated(record);
  const AllocationRecord allocated = record;
  const std::uint64_t generation = generation_->load();
  auto release = [observer = observer_, generations = generation_, generation, upstream, detailed,
                  record = std::move(record)]() mutable {
    if (detailed) record.start = adaptor_clock();
    upstream.reset();  // the upstream's own finalizer runs here
    if (detailed) {
      record.end = adaptor_clock();
      record.call_site = ScopedCallSite::current();
    }
    if (generations->load() == generation) observer->released(record);
  };
  try {
    return rewrap(upstream, size, std::move(release));
  } catch (...) {
    // `release` was moved into a pointer that failed to build, or not at all:
    // either way the upstream pointer goes with this frame.
    observer_->released(allocated);
    throw;
  }
}

std::shared_ptr<MemoryPointer> ManagerAdaptor::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  return observe(MemoryKind::Device, size, [&] { return upstream_->memalloc(size); });
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
  generation_->fetch_add(1);
  observer_->reset();
  upstream_->reset();
}

}  // namespace cuemm
