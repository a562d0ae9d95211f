#include "cuemm/managers/async_memory_manager.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "cuemm/driver/driver.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/detail/recycling_allocator.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "driver/peer_access.hpp"
#include "memory/descriptor_passing.hpp"
#include "util/address_shard.hpp"
#include "util/environment.hpp"
#include "util/hex_address.hpp"
#include "util/keep_until_exit.hpp"

namespace cuemm {

AsyncOptions AsyncOptions::from_environment() {
  AsyncOptions options;
  if (const auto threshold = util::byte_size_from_environment("CUEMM_ASYNC_RELEASE_THRESHOLD"))
    options.release_threshold = *threshold;
  options.exportable = util::flag_from_environment("CUEMM_ASYNC_EXPORTABLE").value_or(options.exportable);
  options.pinned_host_pool = util::flag_from_environment("CUEMM_PINNED_HOST_POOL").value_or(options.pinned_host_pool);
  options.pinned_maximum_cached =
      util::byte_size_from_environment("CUEMM_PINNED_MAXIMUM_CACHED").value_or(options.pinned_maximum_cached);
  return options;
}

// The live blocks, by start. reset() releases them all, and their finalizers
// then do nothing: the EMM interface's reset clears all of a context's
// memory, and a device's reset destroys it, after which the driver may give
// the same address to a new block. get_ipc_handle() finds a block's start
// here, without asking the driver (an H100 run once read 0, 0 from
// cuMemGetAddressRange for pool memory, though the probe of 2026-11-27,
// bench/probes/probe_pool_reserve.cpp, reads each block's range). The
// finalizers reach it by a raw pointer (so that their closures fit
// std::function's inline storage: no allocation), and it is kept until exit,
// as they may outlive the manager. (HostOnlyMemoryManager::track() keeps such
// a record for the default manager, but its releases wait in the deferred
// queue, as Numba's cuMemFree does; a stream-ordered free goes at once.)
struct AsyncMemoryManager::Blocks {
  explicit Blocks(Context* context_) : context(context_) {}
  Context* context;
  struct Live {
    std::size_t size;
    std::weak_ptr<MemoryPointer> memory;  // for reset(): its finalizer must not run after
    bool raw = false;                     // allocate()'s, which deallocate() frees
  };
  // In shards by address, each under a lock of its own, so that threads
  // allocating at once seldom meet on one (the driver's pool serves them
  // side by side; the record should not make them take turns).
  struct alignas(64) Shard {
    BlockingAwareMutex mutex;
    std::map<cuda::CUdeviceptr, Live> live;
  };
  static constexpr int kShardBits = 6;
  std::array<Shard, std::size_t{1} << kShardBits> shards;
  Shard& shard_of(cuda::CUdeviceptr pointer) noexcept { return shards[util::address_shard(pointer, kShardBits)]; }
  // The live block that holds [address, address + size), or 0.
  cuda::CUdeviceptr start_of_block_holding(cuda::CUdeviceptr address, std::size_t size) {
    for (Shard& shard : shards) {
      std::lock_guard lock(shard.mutex);
      auto after = shard.live.upper_bound(address);
      if (after != shard.live.begin() && address + size <= std::prev(after)->first + std::prev(after)->second.size)
        return std::prev(after)->first;
    }
    return 0;
  }
  // Puts a block on the record (its shard's lock held only for that).
  void record(cuda::CUdeviceptr pointer, Live block) {
    Shard& shard = shard_of(pointer);
    std::lock_guard lock(shard.mutex);
    shard.live.insert_or_assign(pointer, std::move(block));
  }
  // Held shared while a request or a release uses the pool (Note [The
  // pool's users]); a reset() that waits for it goes before later requests.
  BlockingAwareSharedMutex pool_use;

  // A block's finalizer: back to the pool, unless reset() released it already.
  void release(cuda::CUdeviceptr pointer) {
    std::shared_lock use(pool_use);  // (until its free is queued)
    {
      Shard& shard = shard_of(pointer);
      std::lock_guard lock(shard.mutex);
      if (shard.live.erase(pointer) == 0) return;
    }
    ScopedContext scope(*context);
    CUEMM_CU(cuMemFreeAsync, pointer, cuda::CU_STREAM_LEGACY);
  }

  // deallocate()'s: null once the block's free is queued on `stream`, else
  // why nothing was freed.
  std::optional<std::string> release_raw(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) {
    std::shared_lock use(pool_use);  // (until its free is queued)
    Shard& shard = shard_of(pointer);
    Live block;
    {
      std::lock_guard lock(shard.mutex);
      const auto it = shard.live.find(pointer);
      if (it == shard.live.end()) {
        return std::string("no live block of this manager starts there (freed already, never handed out by "
                           "allocate(), or handed out before a reset())");
      }
      if (!it->second.raw) return std::string("the block there is memalloc's: it is freed when its MemoryPointer is");
      if (it->second.size != size)
        return "the block there was allocated with " + std::to_string(it->second.size) + " bytes";
      block = std::move(it->second);
      shard.live.erase(it);
    }
    ScopedContext scope(*context);
    if (const cuda::CUresult result = CUEMM_CU_RESULT(cuMemFreeAsync, pointer, stream)) {
      record(pointer, std::move(block));  // still the pool's: a reset() frees it
      return std::string(CudaError(result, "cuMemFreeAsync").what()) + "; the block is still allocated";
    }
    return std::nullopt;
  }
  std::atomic<std::uint64_t> rejected_frees{0};
};

AsyncMemoryManager::AsyncMemoryManager(Context* context, AsyncOptions options)
    : HostOnlyMemoryManager(context), options_(options), blocks_(std::make_shared<Blocks>(context)) {
  if (options_.pinned_host_pool) use_pinned_host_pool({.maximum_cached_bytes = options_.pinned_maximum_cached});
}

AsyncMemoryManager::~AsyncMemoryManager() {
  util::keep_until_exit(blocks_);  // blocks still held free into it later
  if (cuda::CUmemoryPool pool = pool_.exchange(nullptr)) {
    try {
      ScopedContext scope(context());
      CUEMM_CU_RESULT(cuMemPoolDestroy, pool);  // outstanding blocks keep it alive in the driver
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cuemm async: destroying the pool failed: %s\n", error.what());
    }
  }
}

cuda::CUmemoryPool AsyncMemoryManager::pool() {
  if (cuda::CUmemoryPool pool = pool_.load(std::memory_order_acquire)) [[likely]]
    return pool;
  std::lock_guard lock(mutex_);
  if (cuda::CUmemoryPool pool = pool_.load()) return pool;
  Context& ctx = context();
  if (!driver::Driver::get().api().cuMemAllocFromPoolAsync)
    throw CudaError(cuda::CUDA_ERROR_NOT_SUPPORTED, "cuMemAllocFromPoolAsync",
                    "this driver has no stream-ordered allocator (CUDA 11.2 or later is needed)");
  if (ctx.device().attribute(cuda::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) {
    throw CudaError(cuda::CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolCreate",
                    "device " + std::to_string(ctx.device().id()) +
                        " has no stream-ordered memory pools, which the async manager allocates from; use "
                        "CUEMM_MEMORY_MANAGER=pool");
  }
  cuda::CUmemPoolProps properties{};
  properties.alloc_type = cuda::CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.handle_types =
      options_.exportable ? cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : cuda::CU_MEM_HANDLE_TYPE_NONE;
  properties.location = {cuda::CU_MEM_LOCATION_TYPE_DEVICE, ctx.device().id()};
  ScopedContext scope(ctx);
  cuda::CUmemoryPool pool = nullptr;
  CUEMM_CU(cuMemPoolCreate, &pool, &properties);
  std::uint64_t threshold = options_.release_threshold;
  if (const cuda::CUresult result = CUEMM_CU_RESULT(cuMemPoolSetAttribute, pool, cuda::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                    &threshold)) {
    CUEMM_CU_RESULT(cuMemPoolDestroy, pool);
    driver::check(result, "cuMemPoolSetAttribute");
  }
  // Peers reach a driver pool only where it was granted to them (Note [Peer access]).
  try {
    if (const std::vector<int> peers = driver::peers_with_access_to(ctx.device().id()); !peers.empty()) {
      const std::vector<cuda::CUmemAccessDesc> access = driver::read_write_access(peers);
      CUEMM_CU(cuMemPoolSetAccess, pool, access.data(), access.size());
    }
  } catch (...) {
    CUEMM_CU_RESULT(cuMemPoolDestroy, pool);
    throw;
  }
  pool_.store(pool, std::memory_order_release);
  return pool;
}

void AsyncMemoryManager::on_initialize() { pool(); }

void AsyncMemoryManager::on_reset() {
  // Alone: no request is using the pool's handle while it goes, and every
  // block it handed out is recorded (Note [The pool's users]).
  std::lock_guard alone(blocks_->pool_use);
  std::map<cuda::CUdeviceptr, Blocks::Live> live;
  for (Blocks::Shard& shard : blocks_->shards) {
    std::lock_guard lock(shard.mutex);
    live.merge(shard.live);
  }
  std::lock_guard lock(mutex_);
  const cuda::CUmemoryPool pool = pool_.exchange(nullptr);  // the next allocation makes a new one
  pool_token_ = 0;
  if (!pool && live.empty()) return;
  ScopedContext scope(context());
  for (auto& [pointer, block] : live) {
    if (auto memory = block.memory.lock()) memory->mark_released();
    if (const cuda::CUresult result = CUEMM_CU_RESULT(cuMemFreeAsync, pointer, cuda::CU_STREAM_LEGACY))
      std::fprintf(stderr, "cuemm async: releasing %s during reset failed: %s\n", util::hex_address(pointer).c_str(),
                   CudaError(result, "cuMemFreeAsync").what());
  }
  // The frees have run, and the pool's memory goes back with it (a device's
  // reset would leave its handle stale; a pool kept costs the driver 400 KB
  // of host memory, measured on the H100).
  CUEMM_CU(cuCtxSynchronize);
  if (pool) CUEMM_CU(cuMemPoolDestroy, pool);
}

// Note [The pool's users]
// reset() may come from one thread while others allocate. A request reads
// the pool's handle and then calls the driver with it; were the pool
// destroyed in between, the handle would dangle (and the driver may give
// the next pool the same one). So requests that use the handle hold
// Blocks::pool_use shared, and reset() takes it alone to take the pool away.
// They hold it until the block is recorded, so that reset() frees every
// block of the pool before it destroys it; and a release holds it from
// taking its block off the record until its free is queued, or reset()
// destroyed the pool with that block still out, and the driver crashed in
// a later cuMemAllocFromPoolAsync (H100, resets in a loop beside four
// allocating threads). The cost, two atomic updates a request and a release
// on a line of the thread's own (BlockingAwareSharedMutex), is small beside
// the driver's call, and threads do not take turns for it. (Before, every
// reader passed a mutex of the lock's, in turn.)

namespace {
// The driver pool's reserved and used bytes, without throwing: statistics()
// throws the failure, the out-of-memory explanation leaves the figures out.
// It takes no lock; both callers hold Blocks::pool_use (shared) already, and
// a second shared lock could wait behind a reset() that waits on the first.
struct PoolUseQuery {
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  const char* call = nullptr;  // the query that failed
};
PoolUseQuery read_pool_use(cuda::CUmemoryPool pool, AsyncStatistics& figures) noexcept {
  if (cuda::CUresult result = CUEMM_CU_RESULT(cuMemPoolGetAttribute, pool, cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                              &figures.reserved_bytes))
    return {result, "cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)"};
  if (cuda::CUresult result =
          CUEMM_CU_RESULT(cuMemPoolGetAttribute, pool, cuda::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &figures.used_bytes))
    return {result, "cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)"};
  return {};
}

// The driver's own error says only that it ran out: what its pool holds and
// has in use, and what the device has free, tell a pool that keeps freed
// memory (trim() gives it back) from a device that others filled.
OutOfMemory out_of_memory(std::size_t size, cuda::CUmemoryPool pool, Context& context) {
  std::string detail;
  if (AsyncStatistics figures; read_pool_use(pool, figures).result == cuda::CUDA_SUCCESS) {
    detail = "the stream-ordered pool holds " + describe_bytes(figures.reserved_bytes) + ", " +
             describe_bytes(figures.used_bytes) + " in use";
  }
  if (std::string device = describe_device_memory(context); !device.empty())
    detail += (detail.empty() ? "" : "; ") + device;
  return OutOfMemory("cuMemAllocFromPoolAsync", size, detail);
}
}  // namespace

cuda::CUdeviceptr AsyncMemoryManager::allocate_from_pool(std::size_t size, cuda::CUstream stream) {
  const cuda::CUmemoryPool pool = this->pool();
  return with_flush_and_retry(
      [&] {
        cuda::CUdeviceptr allocated = 0;
        CUEMM_CU_ALLOC(size, cuMemAllocFromPoolAsync, &allocated, size, pool, stream);
        return allocated;
      },
      [&] { return out_of_memory(size, pool, context()); });
}

cuda::CUdeviceptr AsyncMemoryManager::allocate(std::size_t size, cuda::CUstream stream) {
  require_allocation_size(size, "allocate");
  ScopedContext scope(context());
  std::shared_lock use(blocks_->pool_use);  // (until the block is recorded)
  const cuda::CUdeviceptr pointer = allocate_from_pool(size, stream);
  try {
    blocks_->record(pointer, Blocks::Live{size, {}, true});
  } catch (...) {
    CUEMM_CU_RESULT(cuMemFreeAsync, pointer, stream);  // not recorded: nothing would free it
    throw;
  }
  return pointer;
}

void AsyncMemoryManager::deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept {
  std::optional<std::string> refused;
  try {
    refused = blocks_->release_raw(pointer, size, stream);
  } catch (const std::exception& error) {
    refused = std::string("its free failed: ") + error.what();
  }
  if (!refused) return;
  blocks_->rejected_frees.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "cuemm: AsyncMemoryManager::deallocate(%s, %zu bytes) refused: %s; nothing was freed\n",
               util::hex_address(pointer).c_str(), size, refused->c_str());
}

std::shared_ptr<MemoryPointer> AsyncMemoryManager::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  Context* ctx = &context();
  ScopedContext scope(*ctx);
  std::shared_lock use(blocks_->pool_use);  // (until the block is recorded)
  const cuda::CUdeviceptr pointer = allocate_from_pool(size, cuda::CU_STREAM_LEGACY);
  Blocks* blocks = blocks_.get();
  std::shared_ptr<MemoryPointer> memory;
  try {
    memory = detail::make_recycled<MemoryPointer>(ctx, pointer, size, nullptr,
                                                  [blocks, pointer] { blocks->release(pointer); });
    blocks->record(pointer, Blocks::Live{size, memory});
  } catch (...) {
    if (memory) memory->mark_released();  // not recorded: its finalizer would find nothing to free
    CUEMM_CU_RESULT(cuMemFreeAsync, pointer, cuda::CU_STREAM_LEGACY);
    throw;
  }
  return memory;
}

IpcHandle AsyncMemoryManager::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  require_device_memory_to_export(memory);  // (what is wrong with the memory first, as every manager says)
  if (!options_.exportable) {
    throw NotSupported(
        "get_ipc_handle: the stream-ordered pool (CUEMM_MEMORY_MANAGER=async) was not created exportable, and the "
        "driver cannot export its memory with cuIpcGetMemHandle; create it exportable (CUEMM_ASYNC_EXPORTABLE=1, "
        "or AsyncOptions::exportable) or use CUEMM_MEMORY_MANAGER=pool");
  }
  const cuda::CUdeviceptr address = memory->device_pointer();
  const cuda::CUdeviceptr base = blocks_->start_of_block_holding(address, memory->size());
  if (!base) {
    throw InvalidArgument("get_ipc_handle: " + util::hex_address(address) + " (" + describe_bytes(memory->size()) +
                          ") is not within a block of this manager's stream-ordered pool");
  }
  Context& ctx = context();
  std::shared_lock use(blocks_->pool_use);
  const cuda::CUmemoryPool pool = this->pool();
  ScopedContext scope(ctx);
  PoolExport exported;
  {
    // The pool's descriptor is offered to other processes once (for as long as
    // this process lives); the driver exports no block of a pool before it.
    std::lock_guard lock(mutex_);
    if (pool_token_ == 0) {
      int descriptor = -1;
      CUEMM_CU(cuMemPoolExportToShareableHandle, &descriptor, pool, cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      pool_token_ = detail::offer_descriptor(descriptor);
    }
    exported.token = pool_token_;
  }
  exported.pid = static_cast<std::int32_t>(getpid());
  // The importer must not touch the block before its stream-ordered allocation has run.
  CUEMM_CU(cuStreamSynchronize, cuda::CU_STREAM_LEGACY);
  CUEMM_CU(cuMemPoolExportPointer, &exported.data, base);
  return IpcHandle(memory, exported, memory->size(), ctx.device().identity(), static_cast<std::size_t>(address - base));
}

AsyncStatistics AsyncMemoryManager::statistics() const {
  AsyncStatistics statistics;
  statistics.rejected_frees = blocks_->rejected_frees.load(std::memory_order_relaxed);
  std::shared_lock use(blocks_->pool_use);
  if (cuda::CUmemoryPool pool = pool_.load()) {
    ScopedContext scope(context());
    if (const PoolUseQuery query = read_pool_use(pool, statistics); query.result != cuda::CUDA_SUCCESS)
      driver::throw_cuda_error(query.result, query.call);
  }
  return statistics;
}

std::uint64_t AsyncMemoryManager::trim() {
  std::shared_lock use(blocks_->pool_use);
  const cuda::CUmemoryPool pool = pool_.load();
  if (!pool) return 0;
  ScopedContext scope(context());
  CUEMM_CU(cuStreamSynchronize, cuda::CU_STREAM_LEGACY);
  std::uint64_t before = 0, after = 0;
  CUEMM_CU(cuMemPoolGetAttribute, pool, cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &before);
  CUEMM_CU(cuMemPoolTrimTo, pool, std::size_t{0});
  CUEMM_CU(cuMemPoolGetAttribute, pool, cuda::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &after);
  return before > after ? before - after : 0;
}

MemoryInfo AsyncMemoryManager::get_memory_info() {
  MemoryInfo info = driver_memory_info(context());
  const AsyncStatistics statistics = this->statistics();
  info.free += statistics.reserved_bytes - std::min(statistics.used_bytes, statistics.reserved_bytes);
  return info;
}

}  // namespace cuemm
