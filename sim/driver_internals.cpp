// driver_internals.cpp: the simulated driver's state, its contexts' memory and
// streams, and how work is queued (what driver_internals.hpp declares).
#include "driver_internals.hpp"

#include <pthread.h>

#include <atomic>

namespace cuemm::sim {

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

std::size_t bytes_from_environment(const char* variable, std::size_t fallback) {
  const char* text = std::getenv(variable);
  const auto bytes = text ? util::parse_byte_size(text) : std::nullopt;
  return bytes && *bytes > 0 ? *bytes : fallback;
}

thread_local std::vector<Context*> context_stack;
thread_local PerThreadStreams per_thread_streams;

bool is_live(State& s, Context* context) { return context && s.contexts.count(context); }

Context* current_context(State& s) {
  if (context_stack.empty()) return nullptr;
  Context* context = context_stack.back();
  return is_live(s, context) ? context : nullptr;
}

Context* make_context(State& s, Device* device, bool primary) {
  auto context = std::make_unique<Context>();
  context->device = device;
  context->primary = primary;
  context->legacy = std::make_shared<SimStream>(context.get(), 0);
  Context* raw = context.get();
  s.context_storage.push_back(std::move(context));
  s.contexts.insert(raw);
  return raw;
}

// Device memory arena, created on first use of the device.
bool ensure_arena(Device& device) {
  if (device.arena) return true;
  const std::string name = "cuemm-sim-device-" + std::to_string(device.ordinal);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return false;
  if (ftruncate(fd, static_cast<off_t>(device.capacity)) != 0) {
    close(fd);
    return false;
  }
  void* arena = mmap(nullptr, device.capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                     fd, 0);
  if (arena == MAP_FAILED) {
    close(fd);
    return false;
  }
  device.memfd = fd;
  device.arena = static_cast<char*>(arena);
  device.ranges = std::make_unique<util::RangeAllocator>(device.capacity);
  return true;
}

CUresult place_device_memory(State& s, Context* context, std::size_t size, std::size_t footprint,
                             AllocationKind kind, unsigned flags, CUdeviceptr* pointer) {
  Device& device = *context->device;
  if (!ensure_arena(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto offset = device.ranges->allocate(footprint);
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = reinterpret_cast<std::uintptr_t>(device.arena + *offset);
  allocation.size = size;
  allocation.kind = kind;
  allocation.context = context;
  allocation.device = device.ordinal;
  allocation.flags = flags;
  allocation.arena_offset = *offset;
  allocation.arena_size = footprint;
  allocation.id = s.next_allocation_id++;
  s.allocations.emplace(allocation.base, allocation);
  *pointer = allocation.base;
  return CUDA_SUCCESS;
}

CUresult allocate_device_memory(State& s, Context* context, std::size_t size, AllocationKind kind,
                                unsigned flags, CUdeviceptr* pointer) {
  Device& device = *context->device;
  const std::size_t footprint = cuemm::util::round_up(size, size > kDevicePage ? kDevicePage : kDeviceAlignment);
  if (footprint < size) return CUDA_ERROR_OUT_OF_MEMORY;
  if (kind != AllocationKind::Device || size > kDevicePage) {
    if (!make_room(s, device, footprint)) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult result = place_device_memory(s, context, size, footprint, kind, flags, pointer);
    if (result == CUDA_SUCCESS) device.used += footprint;
    return result;
  }
  // A block of at most a page shares pages with others (Note [cuMemAlloc's shared pages]).
  std::optional<std::size_t> shared = device.shared_pages.place(footprint);
  if (!shared) {
    if (!make_room(s, device, kDevicePage)) return CUDA_ERROR_OUT_OF_MEMORY;
    device.shared_pages.add_page();
    device.used += kDevicePage;
    shared = device.shared_pages.place(footprint);
  }
  const CUresult result = place_device_memory(s, context, size, footprint, kind, flags, pointer);
  if (result != CUDA_SUCCESS) {
    if (device.shared_pages.release(*shared, footprint)) device.used -= kDevicePage;
    return result;
  }
  s.allocations.at(*pointer).shared_page_offset = shared;
  return CUDA_SUCCESS;
}

bool make_room(State& s, Device& device, std::size_t bytes, const MemoryPool* except) {
  if (device.capacity - device.used >= bytes) return true;
  for (auto& [key, pool] : s.pools) {
    if (pool->device == device.ordinal && pool.get() != except && pool->imported_fd < 0) trim_pool(s, *pool, 0);
  }
  return device.capacity - device.used >= bytes;
}

void trim_pool(State& s, MemoryPool& pool, std::uint64_t keep) {
  const std::uint64_t floor = std::max(keep, cuemm::util::round_up(pool.used, kDevicePage));
  if (floor >= pool.reserved) return;
  s.devices[pool.device]->used -= pool.reserved - floor;
  pool.reserved = floor;
}

void forget_pool_if_done(State& s, MemoryPool* pool) {
  if (!pool->destroyed || pool->used != 0) return;
  if (pool->imported_fd >= 0) close(pool->imported_fd);
  s.devices[pool->device]->used -= pool->reserved;
  s.pools.erase(pool);
}

void release_past_thresholds(State& s, int device) {
  for (auto& [key, pool] : s.pools) {
    if (pool->device == device && pool->imported_fd < 0) trim_pool(s, *pool, pool->release_threshold);
  }
}

// Gives the memory of a cuMemCreate handle back (an imported one's stays the exporter's).
void release_physical(State& s, std::map<std::uint64_t, PhysicalMemory>::iterator it) {
  if (it->second.fd >= 0) close(it->second.fd);
  if (!it->second.imported) {
    Device& device = *s.devices[it->second.device];
    if (it->second.fd < 0) {
      fallocate(device.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(it->second.arena_offset), static_cast<off_t>(it->second.size));
    }
    device.ranges->release(it->second.arena_offset, it->second.size);
    device.used -= it->second.size;
  }
  s.physical.erase(it);
}

// Returns the allocation's memory to where it came from and forgets it.
void release_allocation(State& s, std::map<std::uintptr_t, Allocation>::iterator it) {
  Allocation& allocation = it->second;
  switch (allocation.kind) {
    case AllocationKind::Device:
    case AllocationKind::Managed: {
      Device& device = *s.devices[allocation.device];
      // A stream-ordered pool keeps the bytes (until destroyed: then they go).
      if (MemoryPool* pool = allocation.pool) {
        pool->used -= allocation.arena_size;
        if (pool->destroyed) {
          pool->reserved -= allocation.arena_size;
          device.used -= allocation.arena_size;
          forget_pool_if_done(s, pool);
        }
      } else if (allocation.shared_page_offset) {
        if (device.shared_pages.release(*allocation.shared_page_offset, allocation.arena_size))
          device.used -= kDevicePage;
      } else {
        device.used -= allocation.arena_size;
      }
      // Give large blocks' pages back to the host: a freed 4 GiB block must
      // not keep 4 GiB of RAM.
      if (allocation.arena_size >= kPunchThreshold) {
        const std::size_t start = cuemm::util::round_up(allocation.arena_offset, page_size());
        const std::size_t end = (allocation.arena_offset + allocation.arena_size) / page_size() *
                                page_size();
        if (end > start) {
          fallocate(device.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(start), static_cast<off_t>(end - start));
        }
      }
      device.ranges->release(allocation.arena_offset, allocation.arena_size);
      break;
    }
    case AllocationKind::PinnedHost:
      munmap(reinterpret_cast<void*>(allocation.base), allocation.mapping_size);
      break;
    case AllocationKind::IpcMapping:
      munmap(allocation.mapping, allocation.mapping_size);
      break;
    case AllocationKind::RegisteredHost:
      break;
    case AllocationKind::VirtualMapping: {
      // The addresses stay reserved, without memory behind them.
      mmap(reinterpret_cast<void*>(allocation.base), allocation.size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      auto physical = s.physical.find(allocation.physical);
      if (physical != s.physical.end() && --physical->second.mappings == 0 && physical->second.released)
        release_physical(s, physical);
      break;
    }
  }
  s.allocations.erase(it);
}

std::vector<std::shared_ptr<SimStream>> all_streams_of(Context* context) {
  std::vector<std::shared_ptr<SimStream>> streams(context->streams.begin(), context->streams.end());
  streams.push_back(context->legacy);
  return streams;
}

// Waits, without the state lock, until every stream of the context is idle.
void synchronize_context(std::unique_lock<std::mutex>& lock, Context* context) {
  auto streams = all_streams_of(context);
  lock.unlock();
  for (auto& stream : streams) stream->synchronize();
  lock.lock();
}

// Frees everything a context owns (reset, destroy, or last release of a primary).
void destroy_resources(std::unique_lock<std::mutex>& lock, State& s, Context* context) {
  auto streams = all_streams_of(context);
  context->streams.clear();
  lock.unlock();
  for (auto& stream : streams) stream->shut_down();
  lock.lock();
  for (auto& stream : streams) s.streams.erase(stream.get());
  context->legacy = std::make_shared<SimStream>(context, 0);
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    auto next = std::next(it);
    if (it->second.context == context) release_allocation(s, it);
    it = next;
  }
  std::erase_if(s.events, [&](const auto& entry) { return entry.second->context == context; });
  std::erase_if(s.captures, [&](const auto& entry) { return entry.first->context() == context; });
  std::erase_if(s.graphs, [&](const auto& entry) { return entry.second->context == context; });
  std::erase_if(s.executables, [&](const auto& entry) { return entry.second->context == context; });
  for (auto it = s.modules.begin(); it != s.modules.end();) {
    if (it->second->context == context) {
      for (auto& function : it->second->functions) s.functions.erase(function.second.get());
      it = s.modules.erase(it);
    } else {
      ++it;
    }
  }
}

// The stream a handle names in the current context: 0 and CU_STREAM_LEGACY
// are the legacy default stream, CU_STREAM_PER_THREAD this thread's stream.
std::shared_ptr<SimStream> resolve_stream(State& s, CUstream handle, CUresult* error) {
  Context* context = current_context(s);
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    if (!context) {
      *error = CUDA_ERROR_INVALID_CONTEXT;
      return nullptr;
    }
    if (handle != CU_STREAM_PER_THREAD) return context->legacy;
    auto& stream = per_thread_streams.of_context[context];
    if (!stream || !context->streams.count(stream)) {
      stream = std::make_shared<SimStream>(context, 0);
      context->streams.insert(stream);
      s.streams.emplace(stream.get(), stream);
    }
    return stream;
  }
  auto it = s.streams.find(reinterpret_cast<SimStream*>(handle));
  if (it == s.streams.end()) {
    *error = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  return it->second;
}

// What work queued on `stream` now waits for, by the legacy default stream's
// implicit ordering: work on the legacy stream waits for all blocking
// streams, and work on a blocking stream waits for the legacy stream.
std::vector<SimStream::Dependency> implicit_dependencies(const std::shared_ptr<SimStream>& stream) {
  Context* context = stream->context();
  std::vector<SimStream::Dependency> dependencies;
  if (stream == context->legacy) {
    for (const auto& other : context->streams) {
      if (other->blocking()) dependencies.push_back({other, other->last_ticket()});
    }
  } else if (stream->blocking()) {
    dependencies.push_back({context->legacy, context->legacy->last_ticket()});
  }
  return dependencies;
}

// Queues an operation behind its implicit_dependencies().
std::uint64_t submit(const std::shared_ptr<SimStream>& stream, SimStream::Operation operation, bool marker) {
  return stream->enqueue(std::move(operation), implicit_dependencies(stream), marker);
}

// Whether work queued on `stream` now would run at once: nothing is pending
// there, nor on the streams that submit() makes it wait for. (The caller holds
// the state's mutex, under which all work is queued, so the answer holds.)
bool would_run_at_once(const std::shared_ptr<SimStream>& stream) {
  if (!stream->is_complete(stream->last_ticket())) return false;
  for (const auto& dependency : implicit_dependencies(stream)) {
    if (!dependency.stream->is_complete(dependency.ticket)) return false;
  }
  return true;
}

// Runs an operation on the legacy stream and, unless `wait` is false, waits
// for it: the synchronous copies and memsets.
CUresult run_synchronously(State& s, std::unique_lock<std::mutex>& lock, CUdeviceptr memory,
                           SimStream::Operation operation, bool wait) {
  Context* context = current_context(s);
  if (!context) {
    // Unified addressing: the device memory involved names its context.
    Allocation* allocation = s.find(memory);
    if (!allocation || !is_live(s, allocation->context)) return CUDA_ERROR_INVALID_CONTEXT;
    context = allocation->context;
  }
  auto stream = context->legacy;
  if (const CUresult refused = check_captures(s, DuringCapture::legacy_stream_work, context)) return refused;
  const auto ticket = submit(stream, std::move(operation));
  lock.unlock();
  if (wait) stream->wait_for(ticket);
  return CUDA_SUCCESS;
}

// Whether a "synchronous" memset of `memory` returns before it ran: CUDA's
// do, on the legacy stream, except for host memory and managed memory (seen
// on the H100, where CapturedGraph.AGraphDroppedWhileItsLaunchWaitsLeavesLaterBlocksAlone
// first relied on the wait). So tests that order a memset before work on
// another stream, or read a block through another context, fail here too.
// CUEMM_SIM_EARLY_MEMSETS=0 waits as before.
bool memset_returns_early(State& s, CUdeviceptr memory) {
  static const bool early = [] {
    const char* setting = std::getenv("CUEMM_SIM_EARLY_MEMSETS");
    return !setting || std::string_view(setting) != "0";
  }();
  if (!early) return false;
  const Allocation* allocation = s.find(memory);
  return allocation && (allocation->kind == AllocationKind::Device || allocation->kind == AllocationKind::IpcMapping ||
                        allocation->kind == AllocationKind::VirtualMapping);
}

CUresult run_on_stream(State& s, CUstream handle, SimStream::Operation operation) {
  CUresult error = CUDA_SUCCESS;
  auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  return queue_or_capture(s, stream, std::move(operation));
}

CUresult run_on_stream_and_wait(State& s, std::unique_lock<std::mutex>& lock, CUstream handle,
                                SimStream::Operation operation) {
  CUresult error = CUDA_SUCCESS;
  auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  if (capture_of(s, stream)) return queue_or_capture(s, stream, std::move(operation));
  const auto ticket = submit(stream, std::move(operation));
  lock.unlock();
  stream->wait_for(ticket);
  return CUDA_SUCCESS;
}

Allocation* map_exported_memory(State& s, Context* context, int fd, std::uint64_t arena_offset, std::uint64_t size,
                                int device, std::uint64_t id, int exporter_pid) {
  const std::size_t page = page_size();
  const std::size_t start = arena_offset / page * page;
  const std::size_t length = cuemm::util::round_up(arena_offset + size, page) - start;
  void* mapping = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (mapping == MAP_FAILED) return nullptr;
  Allocation allocation;
  allocation.base = reinterpret_cast<std::uintptr_t>(mapping) + (arena_offset - start);
  allocation.size = size;
  allocation.kind = AllocationKind::IpcMapping;
  allocation.context = context;
  allocation.device = device;
  allocation.mapping = mapping;
  allocation.mapping_size = length;
  allocation.id = id;
  allocation.exporter_pid = exporter_pid;
  return &s.allocations.emplace(allocation.base, allocation).first->second;
}

// Device-accessible memory: device, managed, opened IPC, and page-locked host
// memory (which UVA maps into every context).
bool device_accessible(State& s, CUdeviceptr pointer, std::size_t size) {
  if (size == 0) return true;
  return s.find(pointer, size) != nullptr;
}


Allocation* State::find(std::uintptr_t address, std::size_t size) {
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return nullptr;
  --it;
  Allocation& allocation = it->second;
  const std::size_t extent =
      allocation.kind == AllocationKind::PinnedHost ? allocation.mapping_size : allocation.size;
  if (address < allocation.base) return nullptr;
  std::uintptr_t end = allocation.base + std::max<std::size_t>(extent, 1);
  // Physical memory mapped side by side into reserved addresses is one range
  // to the device, as on a GPU.
  for (auto next = std::next(it); address + size > end && allocation.kind == AllocationKind::VirtualMapping &&
                                  next != allocations.end() && next->first == end &&
                                  next->second.kind == AllocationKind::VirtualMapping;
       ++next)
    end += next->second.size;
  if (address + size > end) return nullptr;
  return &allocation;
}

State& state() {
  static State* s = new State();
  return *s;
}

namespace {
std::atomic<bool> forked_child{false};
}
bool forked_after_init() noexcept { return forked_child.load(std::memory_order_relaxed); }
void watch_for_forks() {
  pthread_atfork(nullptr, nullptr, [] { forked_child.store(true, std::memory_order_relaxed); });
}

PerThreadStreams::~PerThreadStreams() {
  // Their queued work runs first: until it has, the legacy stream (and so a
  // query of it from another thread) still waits for it.
  for (auto& entry : of_context)
    if (entry.second) entry.second->synchronize();
  // One at a time, allocating nothing: a thread's end may come where host
  // memory has run out, and a destructor must not throw.
  State& s = state();
  for (auto& [context, stream] : of_context) {
    std::shared_ptr<SimStream> ending;
    {
      std::lock_guard lock(s.mutex);
      if (!stream || !is_live(s, context) || !context->streams.erase(stream)) continue;
      s.streams.erase(stream.get());
      ending = std::move(stream);
    }
    ending.reset();  // unlocked: a stream's end joins its worker
  }
}


Device* device_at(State& s, CUdevice ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(s.devices.size())) return nullptr;
  return s.devices[ordinal].get();
}

}  // namespace cuemm::sim
