#include "cuemm/managers/pool_memory_manager.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuemm/driver/driver.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/runtime/context.hpp"
#include "util/byte_size.hpp"

namespace cuemm {
namespace {

constexpr std::size_t kMinimumGrowth = std::size_t{32} << 20;

std::size_t round_up(std::size_t value, std::size_t granularity) {
  return (value + granularity - 1) / granularity * granularity;
}

// "512M", "2G", "1073741824": a byte count from an environment variable.
std::size_t byte_size_from_environment(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return 0;
  const auto bytes = util::parse_byte_size(text);
  if (!bytes)
    throw InvalidArgument(std::string(variable) + " must be a byte count such as 512M or 2G (got '" + text + "')");
  return *bytes;
}

}  // namespace

PoolOptions PoolOptions::from_environment() {
  PoolOptions options;
  options.initial_size = byte_size_from_environment("CUEMM_POOL_INITIAL_SIZE");
  options.maximum_size = byte_size_from_environment("CUEMM_POOL_MAXIMUM_SIZE");
  return options;
}

// Everything the pointers' finalizers reach. A finalizer holds a raw pointer
// to its Core (so it fits std::function's inline storage: no allocation), and
// Cores are never deleted once they have handed out memory: reset and
// destruction retire them, and a retired Core ignores late finalizers.
struct PoolMemoryManager::Core {
  struct Epoch {
    std::vector<std::uintptr_t> blocks;
    std::size_t bytes = 0;
    cuda::CUevent event = nullptr;
  };

  Context* context;
  PoolOptions options;
  mutable std::mutex mutex;
  detail::TlsfBlockAllocator blocks{kBlockGranularity};
  std::vector<std::uintptr_t> current;  // freed since the last seal
  std::size_t current_bytes = 0;
  std::deque<Epoch> sealed;  // oldest first
  std::size_t quarantined_bytes = 0;
  std::vector<cuda::CUevent> spare_events;
  int defer_depth = 0;
  std::atomic<bool> retired{false};

  Core(Context* context_, PoolOptions options_) : context(context_), options(options_) {}

  // The finalizer of every block.
  void release(std::uintptr_t address) noexcept {
    if (retired.load(std::memory_order_acquire)) return;
    std::lock_guard lock(mutex);
    const std::size_t size = blocks.block_size(address);
    if (size == 0) return;
    try {
      current.push_back(address);
    } catch (...) {
      blocks.deallocate(address);  // no room to defer: reuse at once rather than leak
      return;
    }
    current_bytes += size;
    quarantined_bytes += size;
    if (current_bytes > blocks.region_bytes() / 8) seal();
  }

  // Closes the current epoch with an event on the legacy default stream.
  void seal() noexcept {
    if (current.empty()) return;
    Epoch epoch{std::move(current), current_bytes, nullptr};
    current = {};
    current_bytes = 0;
    try {
      ScopedContext scope(*context);
      if (!spare_events.empty()) {
        epoch.event = spare_events.back();
        spare_events.pop_back();
      } else {
        CUEMM_CU(cuEventCreate, &epoch.event, cuda::CU_EVENT_DISABLE_TIMING);
      }
      CUEMM_CU(cuEventRecord, epoch.event, cuda::CU_STREAM_LEGACY);
    } catch (const std::exception& error) {
      // Without an event, wait for the device: slower, still safe.
      std::fprintf(stderr, "cuemm pool: cannot record a reuse event (%s); synchronising instead\n", error.what());
      if (epoch.event) spare_events.push_back(epoch.event);
      epoch.event = nullptr;
      CUEMM_CU_RESULT(cuCtxSynchronize);
    }
    sealed.push_back(std::move(epoch));
  }

  // Returns the blocks of completed epochs to the index; with `wait`, waits
  // for pending ones too. Returns the bytes reclaimed.
  std::size_t reclaim(bool wait) {
    std::size_t reclaimed = 0;
    while (!sealed.empty()) {
      Epoch& epoch = sealed.front();
      if (epoch.event) {
        ScopedContext scope(*context);
        const cuda::CUresult result =
            wait ? CUEMM_CU_RESULT(cuEventSynchronize, epoch.event) : CUEMM_CU_RESULT(cuEventQuery, epoch.event);
        if (result == cuda::CUDA_ERROR_NOT_READY) break;
        driver::check(result, wait ? "cuEventSynchronize" : "cuEventQuery");
        spare_events.push_back(epoch.event);
      }
      for (std::uintptr_t address : epoch.blocks) blocks.deallocate(address);
      quarantined_bytes -= epoch.bytes;
      reclaimed += epoch.bytes;
      sealed.pop_front();
    }
    return reclaimed;
  }

  // Takes a new segment of at least `size` bytes from the driver. Returns
  // false when the driver or the pool's maximum has no room.
  bool grow(std::size_t size) {
    // The index searches lists whose blocks are all >= size: up to 1/16 above
    // it (Note [Two-level segregated fit]); a segment that small must still be found.
    const std::size_t wanted = round_up(size + size / 16 + kBlockGranularity, kSegmentGranularity);
    // Growing by an eighth of the pool (at least 32 MiB) keeps segments few
    // while reserving at most about 1/8 more than is needed.
    std::size_t segment = std::max(wanted, round_up(std::max(blocks.region_bytes() / 8, kMinimumGrowth),
                                                    kSegmentGranularity));
    if (options.maximum_size) {
      const std::size_t room = options.maximum_size > blocks.region_bytes()
                                   ? options.maximum_size - blocks.region_bytes() : 0;
      if (room < wanted) return false;
      segment = std::min(segment, room / kSegmentGranularity * kSegmentGranularity);
    }
    ScopedContext scope(*context);
    for (;;) {
      cuda::CUdeviceptr base = 0;
      const cuda::CUresult result = CUEMM_CU_RESULT(cuMemAlloc, &base, segment);
      if (result == cuda::CUDA_SUCCESS) {
        blocks.add_region(base, segment);
        return true;
      }
      if (result != cuda::CUDA_ERROR_OUT_OF_MEMORY) driver::throw_allocation_error(result, "cuMemAlloc", segment);
      if (segment == wanted) return false;
      segment = wanted;  // the generous size did not fit: try the exact one
    }
  }

  std::size_t release_free_segments() {
    std::size_t released = 0;
    ScopedContext scope(*context);
    for (const auto& region : blocks.take_free_regions()) {
      CUEMM_CU_RESULT(cuMemFree, region.base);
      released += region.size;
    }
    return released;
  }

  // Gives everything back to the driver; late finalizers become no-ops.
  void retire() noexcept {
    std::lock_guard lock(mutex);
    retired = true;
    try {
      ScopedContext scope(*context);
      for (auto& epoch : sealed) {
        if (epoch.event) {
          CUEMM_CU_RESULT(cuEventSynchronize, epoch.event);
          CUEMM_CU_RESULT(cuEventDestroy, epoch.event);
        }
      }
      for (cuda::CUevent event : spare_events) CUEMM_CU_RESULT(cuEventDestroy, event);
      CUEMM_CU_RESULT(cuCtxSynchronize);  // blocks in use may still be read by queued work
      for (const auto& region : blocks.take_all_regions()) CUEMM_CU_RESULT(cuMemFree, region.base);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm pool: returning memory failed: %s\n", error.what());
    }
    sealed.clear();
    spare_events.clear();
    current.clear();
    current_bytes = quarantined_bytes = 0;
  }
};

namespace {
// Retired cores may still be reached by pointers that outlive a reset or the
// manager; they are small and kept until exit.
void keep_retired(std::shared_ptr<void> core) {
  static auto* retired = new std::vector<std::shared_ptr<void>>();
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  retired->push_back(std::move(core));
}
}  // namespace

PoolMemoryManager::PoolMemoryManager(Context* context, PoolOptions options)
    : HostOnlyMemoryManager(context), options_(options), core_(std::make_shared<Core>(context, options)) {
  if (options_.maximum_size && options_.initial_size > options_.maximum_size) {
    throw InvalidArgument("pool: the initial size (" + describe_bytes(options_.initial_size) +
                          ") exceeds the maximum size (" + describe_bytes(options_.maximum_size) + ")");
  }
}

PoolMemoryManager::~PoolMemoryManager() {
  if (core_->blocks.region_count() > 0) core_->retire();
  keep_retired(core_);
}

void PoolMemoryManager::on_initialize() {
  std::lock_guard lock(core_->mutex);
  if (options_.initial_size && core_->blocks.region_bytes() == 0 && !core_->grow(options_.initial_size)) {
    throw OutOfMemory("PoolMemoryManager::initialize", options_.initial_size, "the initial pool does not fit");
  }
}

void PoolMemoryManager::on_reset() {
  auto retiring = std::exchange(core_, std::make_shared<Core>(has_context() ? &context() : nullptr, options_));
  retiring->retire();
  keep_retired(std::move(retiring));
}

CleanupGuard PoolMemoryManager::on_defer_cleanup() {
  {
    std::lock_guard lock(core_->mutex);
    ++core_->defer_depth;
  }
  return CleanupGuard([core = core_] {
    std::lock_guard lock(core->mutex);
    --core->defer_depth;
  });
}

std::uintptr_t PoolMemoryManager::allocate_block(std::size_t size) {
  Core& core = *core_;
  std::lock_guard lock(core.mutex);
  if (auto address = core.blocks.allocate(size)) [[likely]]
    return *address;
  // Slow path, in order of cost: completed epochs, pending epochs when they
  // hold enough, the driver, any pending epoch, and finally giving empty
  // segments back so that one large one fits.
  core.seal();
  core.reclaim(false);
  if (auto address = core.blocks.allocate(size)) return *address;
  // Enough freed memory is waiting for the GPU: wait for it rather than grow.
  if (core.quarantined_bytes >= size) {
    core.reclaim(true);
    if (auto address = core.blocks.allocate(size)) return *address;
  }
  auto grown = [&]() -> std::optional<std::uintptr_t> {
    return core.grow(size) ? core.blocks.allocate(size) : std::nullopt;
  };
  if (auto address = grown()) return *address;
  core.reclaim(true);
  if (auto address = core.blocks.allocate(size)) return *address;
  if (core.release_free_segments() > 0) {
    if (auto address = grown()) return *address;
  }
  throw OutOfMemory("PoolMemoryManager::memalloc", size,
                    "the pool holds " + describe_bytes(core.blocks.region_bytes()) + " in " +
                        std::to_string(core.blocks.region_count()) + " segment(s), " +
                        describe_bytes(core.blocks.allocated_bytes()) + " in use" +
                        (options_.maximum_size ? "; maximum " + describe_bytes(options_.maximum_size) : ""));
}

std::shared_ptr<MemoryPointer> PoolMemoryManager::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  const std::uintptr_t address = with_flush_and_retry([&] { return allocate_block(size); });
  Core* core = core_.get();
  try {
    return std::make_shared<MemoryPointer>(&context(), address, size, nullptr,
                                           [core, address] { core->release(address); });
  } catch (...) {
    core->release(address);
    throw;
  }
}

IpcHandle PoolMemoryManager::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  // The driver's handle names the whole segment; the block's offset in it
  // travels in the IpcHandle.
  return export_device_memory(context(), memory);
}

MemoryInfo PoolMemoryManager::get_memory_info() {
  MemoryInfo info = driver_memory_info(context());
  std::lock_guard lock(core_->mutex);
  info.free += core_->blocks.free_bytes() + core_->quarantined_bytes;
  return info;
}

std::size_t PoolMemoryManager::trim() {
  std::lock_guard lock(core_->mutex);
  if (core_->defer_depth > 0) return 0;
  core_->seal();
  core_->reclaim(true);
  return core_->release_free_segments();
}

PoolStatistics PoolMemoryManager::statistics() const {
  std::lock_guard lock(core_->mutex);
  PoolStatistics statistics;
  statistics.reserved_bytes = core_->blocks.region_bytes();
  statistics.quarantined_bytes = core_->quarantined_bytes;
  statistics.in_use_bytes = core_->blocks.allocated_bytes() - core_->quarantined_bytes;
  statistics.segments = core_->blocks.region_count();
  statistics.free_blocks = core_->blocks.free_blocks();
  return statistics;
}

}  // namespace cuemm
