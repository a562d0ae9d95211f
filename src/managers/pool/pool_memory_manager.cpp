// pool/pool_memory_manager.cpp: PoolMemoryManager, the manager: its options, its
// life (initialize, reset, destruction), and the interface's calls into its Core.
#include "core.hpp"

namespace cuemm {

std::atomic<const std::atomic<std::int64_t>*> detail::replay_clock{nullptr};

PoolOptions PoolOptions::from_environment() {
  PoolOptions options;
  options.initial_size = util::byte_size_from_environment("CUEMM_POOL_INITIAL_SIZE").value_or(0);
  options.maximum_size = util::byte_size_from_environment("CUEMM_POOL_MAXIMUM_SIZE").value_or(0);
  options.thread_cache_size =
      util::byte_size_from_environment("CUEMM_POOL_THREAD_CACHE_SIZE").value_or(options.thread_cache_size);
  options.dedicated_size =
      util::byte_size_from_environment("CUEMM_POOL_DEDICATED_SIZE").value_or(options.dedicated_size);
  options.expandable = util::flag_from_environment("CUEMM_POOL_EXPANDABLE").value_or(options.expandable);
  options.assemble_blocks =
      util::flag_from_environment("CUEMM_POOL_ASSEMBLE_BLOCKS").value_or(options.assemble_blocks);
  options.split_spares = util::flag_from_environment("CUEMM_POOL_SPLIT_SPARES").value_or(options.split_spares);
  options.small_blocks_apart =
      util::flag_from_environment("CUEMM_POOL_SMALL_BLOCKS_APART").value_or(options.small_blocks_apart);
  options.pinned_host_pool = util::flag_from_environment("CUEMM_PINNED_HOST_POOL").value_or(options.pinned_host_pool);
  options.pinned_maximum_cached =
      util::byte_size_from_environment("CUEMM_PINNED_MAXIMUM_CACHED").value_or(options.pinned_maximum_cached);
  options.check_frees = util::flag_from_environment("CUEMM_POOL_CHECK_FREES").value_or(options.check_frees);
  options.busy_overshoot = util::fraction_from_environment("CUEMM_POOL_BUSY_OVERSHOOT",
                                                           PoolMemoryManager::kLargestBusyOvershoot)
                               .value_or(options.busy_overshoot);
  return options;
}

void PoolOptions::check() const {
  if (maximum_size && maximum_size < PoolMemoryManager::kSegmentGranularity) {
    throw InvalidArgument("pool: the maximum size (" + describe_bytes(maximum_size) + ") is less than one segment (" +
                          describe_bytes(PoolMemoryManager::kSegmentGranularity) + "): no allocation could succeed");
  }
  if (!(busy_overshoot >= 0 && busy_overshoot <= PoolMemoryManager::kLargestBusyOvershoot)) {
    char text[96];
    std::snprintf(text, sizeof text, "pool: the busy overshoot (%g) must be a fraction of the peak from 0 to %g",
                  busy_overshoot, PoolMemoryManager::kLargestBusyOvershoot);
    throw InvalidArgument(text);
  }
  if (maximum_size && initial_size > maximum_size) {
    throw InvalidArgument("pool: the initial size (" + describe_bytes(initial_size) + ") exceeds the maximum size (" +
                          describe_bytes(maximum_size) + ")");
  }
  if (assemble_blocks && !expandable) {
    throw InvalidArgument("pool: assembled blocks (CUEMM_POOL_ASSEMBLE_BLOCKS=1) are made of the expandable pool's "
                          "pages, but the pool is not expandable (CUEMM_POOL_EXPANDABLE=1)");
  }
}

namespace {
PoolOptions checked(const PoolOptions& options) {
  options.check();
  return options;
}
}  // namespace

PoolMemoryManager::PoolMemoryManager(Context* context, PoolOptions options)
    : HostOnlyMemoryManager(context),
      options_(checked(options)),  // before any part of the pool is made
      core_(std::make_shared<Core>(context, options)),
      current_core_(core_.get()),
      next_core_(std::make_shared<Core>(context, options)),
      core_context_(context) {
  if (options_.pinned_host_pool) use_pinned_host_pool({.maximum_cached_bytes = options_.pinned_maximum_cached});
  if (options_.check_frees) free_checker_ = std::make_unique<detail::RawFreeChecker>();
}

PoolMemoryManager::~PoolMemoryManager() {
  core().retire();
  util::keep_until_exit(core_);  // pointers that outlive the manager still free into it
}

void PoolMemoryManager::on_initialize() {
  // At once, rather than at the first request.
  if (options_.expandable && has_context()) detail::ExpandableArena::require_support(context().device().id());
  if (has_context()) {
    const std::size_t share = context().device().total_memory() / Core::kDeviceFractionOfHeldRotationBudget;
    core().held_rotation_budget.store(std::min(Core::kLargestHeldRotationBudget, share), std::memory_order_relaxed);
  }
  if (!options_.initial_size) return;
  refuse_without_a_context();
  for (;;) {
    Core& core = this->core();
    try {
      std::lock_guard lock(core.mutex);
      if (core.blocks.region_bytes() == 0 && !core.grow_initially(options_.initial_size))
        throw OutOfMemory("PoolMemoryManager::initialize", options_.initial_size, "the initial pool does not fit");
      return;
    } catch (const Core::Retired&) {
      // (a reset meanwhile: the new core is current)
    }
  }
}

// Note [Resets under way]
// reset() may come from one thread while others allocate and free (a
// library resets its context while another's threads still work). The new
// core replaces the old one in current_core_, and the old one is retired:
// its memory goes back to the driver, its caches are emptied, and frees into
// it are ignored. A request that had already read the old core finds
// nothing left in it and would grow it; retired cores refuse to grow
// (Core::Retired, under the core's lock, which retire() holds too), and
// the slow paths hand the request to the newest core (again, in a loop,
// where a reset retires that one too), so the raw interface's fast path
// stays a tail call with no handler of its own.
// memalloc's finalizer must free into the core that served, which
// Core::forwarded_to names where that was a successor. A request that
// finished on the old core just before it was retired got memory that the
// reset freed, as every block handed out before a reset does.
void PoolMemoryManager::refuse_without_a_context() const {
  if (!core_context_) [[unlikely]]
    (void)context();  // (throws: an instance made to read its version allocates nothing)
}

template <typename Allocate>
std::pair<PoolMemoryManager::Core*, std::uintptr_t> PoolMemoryManager::on_current_core(Allocate&& allocate) {
  Core* core = &this->core();
  Core::forwarded_to = nullptr;
  const std::uintptr_t address = allocate(*core);
  if (Core* server = std::exchange(Core::forwarded_to, nullptr)) [[unlikely]]
    core = server;  // (a reset retired `core` meanwhile: its successor served)
  return {core, address};
}
void PoolMemoryManager::on_reset() {
  std::shared_ptr<Core> retiring;
  {
    std::lock_guard lock(reset_mutex_);  // (two resets at once retire one core each)
    auto make_core = [&] { return std::make_shared<Core>(has_context() ? &context() : nullptr, options_); };
    std::shared_ptr<Core> next = std::move(next_core_);
    if (!next) next = make_core();  // (may throw: nothing has changed yet)
    next->held_rotation_budget.store(core_->held_rotation_budget.load());
    retiring = std::exchange(core_, std::move(next));
    retiring->successor.store(core_.get(), std::memory_order_release);  // (before it refuses anything)
    current_core_.store(core_.get(), std::memory_order_release);
    try {
      next_core_ = make_core();
    } catch (const std::bad_alloc&) {  // (the next reset makes it, or says why not)
    }
  }
  retiring->retire();
  util::keep_until_exit(std::move(retiring));
  if (free_checker_) free_checker_->forget_all();
  std::unordered_map<cuda::CUdeviceptr, std::shared_ptr<MemoryPointer>> captured;  // (dropped outside the lock)
  std::lock_guard lock(captured_raw_mutex_);
  captured.swap(captured_raw_);
  has_captured_raw_.store(false, std::memory_order_relaxed);
}

CleanupGuard PoolMemoryManager::on_defer_cleanup() {
  Core* core = &this->core();  // (kept until exit, as every core)
  {
    std::lock_guard lock(core->mutex);
    ++core->defer_depth;
  }
  return CleanupGuard([core] {
    std::lock_guard lock(core->mutex);
    --core->defer_depth;
  });
}

inline bool PoolMemoryManager::capture_under_way() const noexcept {
  return core_context_ && core_context_->capturing();
}

cuda::CUdeviceptr PoolMemoryManager::allocate(std::size_t size) {
  require_allocation_size(size, "PoolMemoryManager::allocate");
  if (free_checker_ || !core_context_ || core_context_->capturing()) [[unlikely]]
    return allocate_off_the_fast_path(size, nullptr);
  Core& core = this->core();
  return core.allocate(size, core.size_class(size));  // (a retired core's slow paths ask its successor)
}

void PoolMemoryManager::deallocate(cuda::CUdeviceptr pointer, std::size_t size) noexcept {
  if (!pointer || !size) return;
  // A pointer off the block granularity is no block's: cheap enough to check
  // at every free. The rest only with the record (PoolOptions::check_frees),
  // or while blocks are kept for a capture.
  if (pointer % kBlockGranularity || free_checker_ || has_captured_raw_.load(std::memory_order_relaxed)) [[unlikely]]
    return deallocate_off_the_fast_path(pointer, size, nullptr);
  Core& core = this->core();
  core.deallocate(pointer, core.size_class(size));
}

cuda::CUdeviceptr PoolMemoryManager::allocate_off_the_fast_path(std::size_t size, const cuda::CUstream* stream) {
  refuse_without_a_context();
  if (stream && capture_under_way()) {
    if (const cuda::CUdeviceptr reused = reused_captured_raw_block(size, *stream)) return reused;
  }
  const auto served = on_current_core([&](Core& core) {
    return stream ? allocate_unrecorded(core, size, *stream) : core.allocate(size, core.size_class(size));
  });
  Core* const core = served.first;
  const cuda::CUdeviceptr address = served.second;
  if (free_checker_) {
    try {
      free_checker_->handed_out(address, size);
    } catch (...) {
      core->deallocate(address, core->size_class(size));  // no record, no block: as if it had failed
      throw;
    }
  }
  if (capture_under_way()) {
    try {
      keep_captured_raw_block(address, size);  // (which frees the block where it fails)
    } catch (...) {
      if (free_checker_) (void)free_checker_->take_back(address, size);
      throw;
    }
  }
  return address;
}

void PoolMemoryManager::deallocate_off_the_fast_path(cuda::CUdeviceptr pointer, std::size_t size,
                                                     const cuda::CUstream* stream) noexcept {
  if (has_captured_raw_.load(std::memory_order_relaxed) && let_go_of_captured_raw_block(pointer, size, stream))
    return;
  std::optional<std::string> refused;
  try {
    if (pointer % kBlockGranularity != 0)
      refused = "it is not " + std::to_string(kBlockGranularity) + "-byte aligned, so no block of this pool starts there";
    else if (free_checker_)
      refused = free_checker_->take_back(pointer, size);
  } catch (const std::exception& error) {
    refused = std::string("its check failed: ") + error.what();
  }
  if (refused) {
    rejected_frees_.fetch_add(1, std::memory_order_relaxed);
    std::fprintf(stderr, "cuemm: PoolMemoryManager::deallocate(%s, %zu bytes%s) refused: %s; nothing was freed\n",
                 util::hex_address(pointer).c_str(), size, stream ? ", stream" : "", refused->c_str());
    return;
  }
  Core& core = this->core();
  if (stream)
    deallocate_unchecked(core, pointer, size, *stream);
  else
    core.deallocate(pointer, core.size_class(size));
}

std::pair<PoolMemoryManager::Core*, std::uintptr_t> PoolMemoryManager::allocate_for_a_holder(std::size_t size,
                                                                                             int size_class) {
  require_allocation_size(size, "memalloc");
  refuse_without_a_context();
  return on_current_core(
      [&](Core& core) { return with_flush_and_retry([&] { return core.allocate(size, size_class); }); });
}

std::shared_ptr<MemoryPointer> PoolMemoryManager::memalloc(std::size_t size) {
  const int size_class = this->core().size_class(size);  // (the same in every core)
  const auto [found_core, address] = allocate_for_a_holder(size, size_class);
  Core* const core = found_core;  // (the finalizer captures it; clang before 16 captures no structured binding)
  // The finalizer keeps the size class in the address's low bits (blocks are
  // 256-byte aligned) so that its closure fits std::function's inline storage.
  const std::uintptr_t tagged = address | static_cast<std::uintptr_t>(size_class + 1);
  try {
    return detail::make_recycled<MemoryPointer>(&context(), address, size, nullptr, [core, tagged] {
      core->deallocate(tagged & ~std::uintptr_t{0xff}, static_cast<int>(tagged & 0xff) - 1);
    });
  } catch (...) {
    core->deallocate(address, size_class);
    throw;
  }
}

RawDeviceAllocator::Allocation PoolMemoryManager::allocate_raw(std::size_t size) {
  const auto [core, address] = allocate_for_a_holder(size, this->core().size_class(size));
  // The core stays until exit (see ~PoolMemoryManager); once retired it ignores frees.
  const Releaser releaser{[](void* state, std::uintptr_t freed, std::size_t bytes) noexcept {
                            Core* owner = static_cast<Core*>(state);
                            owner->deallocate(freed, owner->size_class(bytes));
                          },
                          core};
  return {address, releaser};
}

cuda::CUdeviceptr PoolMemoryManager::allocate(std::size_t size, cuda::CUstream stream) {
  require_allocation_size(size, "PoolMemoryManager::allocate");
  if (free_checker_ || !core_context_ || core_context_->capturing()) [[unlikely]]
    return allocate_off_the_fast_path(size, &stream);
  return allocate_unrecorded(core(), size, stream);
}

void PoolMemoryManager::keep_captured_raw_block(cuda::CUdeviceptr address, std::size_t size) {
  std::shared_ptr<MemoryPointer> kept;
  Core* core = &this->core();
  const int size_class = core->size_class(size);
  try {
    const bool captured = core_context_->keep_for_capture([&] {
      // (Freed as the raw free would, once the GraphMemory goes too; the
      // core stays until exit, see ~PoolMemoryManager.)
      kept = std::make_shared<MemoryPointer>(core_context_, address, size, nullptr,
                                             [core, address, size_class] { core->deallocate(address, size_class); });
      return kept;
    });
    if (!captured) return;  // another thread's capture
    hold_for_the_program(address, kept);
  } catch (...) {
    if (!kept) core->deallocate(address, size_class);  // (no pointer frees it: as if the allocation had failed)
    throw;  // (else the pointer frees it once the GraphMemory goes)
  }
}

cuda::CUdeviceptr PoolMemoryManager::reused_captured_raw_block(std::size_t size, cuda::CUstream stream) {
  std::shared_ptr<MemoryPointer> view = core_context_->reuse_for_capture(size, stream);
  if (!view) return 0;
  const cuda::CUdeviceptr address = view->device_pointer();
  if (free_checker_) free_checker_->handed_out(address, size);  // (on failure the view goes: let go again)
  try {
    hold_for_the_program(address, view);
  } catch (...) {
    if (free_checker_) (void)free_checker_->take_back(address, size);
    throw;
  }
  return address;
}

void PoolMemoryManager::hold_for_the_program(cuda::CUdeviceptr address, const std::shared_ptr<MemoryPointer>& block) {
  std::lock_guard lock(captured_raw_mutex_);
  captured_raw_.emplace(address, block);  // (a copy: where this throws, the caller's reference stands)
  has_captured_raw_.store(true, std::memory_order_relaxed);
}

bool PoolMemoryManager::let_go_of_captured_raw_block(cuda::CUdeviceptr pointer, std::size_t size,
                                                      const cuda::CUstream* stream) noexcept {
  std::shared_ptr<MemoryPointer> program_reference;  // (dropped outside the lock: it may be the last)
  {
    std::lock_guard lock(captured_raw_mutex_);
    const auto found = captured_raw_.find(pointer);
    if (found == captured_raw_.end()) return false;
    program_reference = std::move(found->second);
    captured_raw_.erase(found);
    if (captured_raw_.empty()) has_captured_raw_.store(false, std::memory_order_relaxed);
  }
  if (stream && capture_under_way()) {
    try {
      core_context_->let_go_for_capture(pointer, *stream);  // (before the reference goes)
    } catch (const std::exception&) {
      // Not noted: the block is kept and not reused, as after a stream-less free.
    }
  }
  if (free_checker_) (void)free_checker_->take_back(pointer, size);  // (its record goes with the free)
  return true;
}

cuda::CUdeviceptr PoolMemoryManager::allocate_unrecorded(Core& core, std::size_t size, cuda::CUstream stream) {
  const int size_class = core.size_class(size);
  // The default streams' work is what the legacy stream's events cover, so a
  // thread may reuse its frees on them at once (Note [Stream-ordered reuse]);
  // so too its frees on another stream, for that stream, where the stream
  // has a tag (Note [Same-stream reuse]). Otherwise a block for any other
  // stream is one that every stream may use.
  if (cuda::is_default_stream(stream)) return core.allocate_ordered(size, size_class);
  const std::uint64_t tag = core.may_hold_frees_of(stream) ? core.same_stream_tag(stream) : 0;
  return tag ? core.allocate_ordered(size, size_class, tag) : core.allocate_on_another_stream(size, size_class);
}

void PoolMemoryManager::deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept {
  if (!pointer || !size) return;
  if (pointer % kBlockGranularity || free_checker_ || has_captured_raw_.load(std::memory_order_relaxed)) [[unlikely]]
    return deallocate_off_the_fast_path(pointer, size, &stream);
  deallocate_unchecked(core(), pointer, size, stream);
}

void PoolMemoryManager::deallocate_unchecked(Core& core, cuda::CUdeviceptr pointer, std::size_t size,
                                             cuda::CUstream stream) noexcept {
  const int size_class = core.size_class(size);
  if (cuda::is_default_stream(stream)) return core.deallocate_ordered(pointer, size_class);
  if (!core.refuses_without_asking(stream)) {
    if (const std::uint64_t tag = core.same_stream_tag(stream))
      return core.deallocate_ordered(pointer, size_class, tag, reinterpret_cast<std::uintptr_t>(stream));
  }
  core.order_after(stream);
  core.deallocate(pointer, size_class);
}

IpcHandle PoolMemoryManager::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  require_device_memory_to_export(memory);
  if (options_.expandable) {
    // The arena's memory has no cuIpcGetMemHandle: the handle names the
    // mappings under the block (Note [Expandable arena]).
    Core& core = this->core();
    std::lock_guard lock(core.mutex);
    if (core.arena && (core.arena->contains(memory->device_pointer()) ||
                       core.arena->in_assembled_block(memory->device_pointer()))) {
      ScopedContext scope(context());
      std::size_t offset = 0;
      MappedExport exported = core.arena->share(memory->device_pointer(), memory->size(), offset);
      return IpcHandle(memory, std::move(exported), memory->size(), context().device().identity(), offset);
    }
  }
  // The driver's handle names the whole segment; the block's offset in it
  // travels in the IpcHandle.
  return export_device_memory(context(), memory);
}

MemoryInfo PoolMemoryManager::get_memory_info() {
  MemoryInfo info = driver_memory_info(context());
  Core& core = this->core();
  std::lock_guard lock(core.mutex);
  // (The arena's free space counts where its pages are mapped.)
  // (Assembled blocks' own pages hold no free space the index could hand out.)
  const std::size_t free_in_index =
      core.arena ? core.arena->mapped_bytes() - core.arena->assembled_page_bytes() - core.blocks.allocated_bytes()
                 : core.blocks.free_bytes();
  const std::size_t free_in_pool = free_in_index + core.small_blocks.free_bytes() + core.recurring.free_bytes() +
                                   core.dedicated.spare_bytes() + core.quarantined_bytes + core.cached_bytes();
  info.free += free_in_pool;
  if (const std::size_t maximum = options_.maximum_size) {
    const std::size_t reserved = core.reserved_bytes();
    return within_cap(info, maximum, maximum > reserved ? maximum - reserved + free_in_pool : free_in_pool);
  }
  return info;
}

std::size_t PoolMemoryManager::trim() {
  if (!core_context_) return 0;  // (made without a context: it never held anything)
  Core& core = this->core();
  std::lock_guard lock(core.mutex);
  if (core.defer_depth > 0 || core.retired) return 0;  // (a reset under way gives it all back)
  core.flush_caches();
  core.seal();
  core.reclaim(true);
  return core.release_free_segments();
}

PoolStatistics PoolMemoryManager::statistics() const {
  const Core& core = this->core();
  std::lock_guard lock(core.mutex);
  PoolStatistics statistics;
  statistics.reserved_bytes = core.reserved_bytes();
  statistics.quarantined_bytes = core.quarantined_bytes;
  statistics.cached_bytes = core.cached_bytes();
  statistics.in_use_bytes = core.in_use_bytes(statistics.cached_bytes);  // (one reading of the caches for both)
  statistics.segments = core.segment_count();
  statistics.free_blocks = core.blocks.free_blocks() + core.small_blocks.free_blocks() +
                           core.recurring.free_blocks() + core.dedicated.spare_count();
  statistics.seals = core.epochs.seals();
  statistics.driver_allocations = core.driver_allocations;
  statistics.spares_taken_over = core.spares_taken_over;
  statistics.blocks_assembled = core.blocks_assembled;
  statistics.gpu_waits_avoided = core.gpu_waits_avoided;
  statistics.queued_large_frees = core.queued_large_frees;
  statistics.queued_small_frees = core.queued_small_frees;
  statistics.driver_frees = core.driver_frees;
  statistics.rejected_frees = rejected_frees_.load(std::memory_order_relaxed);
  return statistics;
}

const char* to_string(PoolSegment::Kind kind) noexcept {
  switch (kind) {
    case PoolSegment::Kind::shared: return "shared";
    case PoolSegment::Kind::small: return "small";
    case PoolSegment::Kind::own: return "own";
    case PoolSegment::Kind::split_spares: return "split spares";
    case PoolSegment::Kind::arena: return "arena";
  }
  return "?";
}

std::vector<PoolSegment> PoolMemoryManager::segments() const {
  const Core& core = this->core();
  std::lock_guard lock(core.mutex);
  std::vector<PoolSegment> segments;
  auto add_regions = [&](const detail::TlsfBlockAllocator& index, PoolSegment::Kind kind) {
    for (const auto& region : index.region_use()) {
      const std::size_t mapped =
          kind == PoolSegment::Kind::arena ? std::min(core.arena->mapped_bytes(), region.size) : region.size;
      segments.push_back(PoolSegment{kind, region.base, region.size, mapped, region.free_bytes, region.free_blocks,
                                     region.largest_free_block});
    }
  };
  add_regions(core.blocks, core.arena ? PoolSegment::Kind::arena : PoolSegment::Kind::shared);
  add_regions(core.small_blocks, PoolSegment::Kind::small);
  add_regions(core.recurring, PoolSegment::Kind::split_spares);
  core.dedicated.for_each([&](std::uintptr_t base, std::size_t size, bool spare) {
    segments.push_back(PoolSegment{PoolSegment::Kind::own, base, size, size, spare ? size : 0, spare ? 1u : 0u,
                                   spare ? size : 0});
  });
  std::sort(segments.begin(), segments.end(),
            [](const PoolSegment& a, const PoolSegment& b) { return a.address < b.address; });
  return segments;
}

}  // namespace cuemm
