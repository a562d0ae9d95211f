// simulated_driver.cpp: a libcuda-compatible driver that runs without a GPU.
//
// Exports the driver API under the symbol names libcuda exports (cuMemAlloc_v2
// and so on), so any program that dlopens libcuda can load this library
// instead: cuemm itself, or classic Numba through NUMBA_CUDA_DRIVER.
//
// Configuration (read at cuInit):
//   CUEMM_SIM_DEVICES      number of devices (default 1; 0 makes cuInit fail)
//   CUEMM_SIM_MEMORY       bytes per device, with K/M/G/T suffixes (default 16G)
//   CUEMM_SIM_PEER_ACCESS  1 lets devices map each other's memory (default 0)
//   CUEMM_SIM_FAULTS       fault injection, see call_log.hpp
//
// What it does not do: execute PTX (see kernels.hpp), link modules, or keep an
// exported block alive after its owner frees it while another process has it
// open (on a GPU the driver would).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "call_log.hpp"
#include "kernels.hpp"
#include "sim_control.h"
#include "sim_state.hpp"
#include "util/byte_size.hpp"
#include "util/round_up.hpp"

namespace cuemm::sim {
namespace {

constexpr std::size_t kDeviceAlignment = 512;  // what cuMemAlloc guarantees, and more
constexpr std::size_t kPunchThreshold = 2u << 20;  // return pages of freed blocks this large
constexpr int kDriverVersion = 13000;
constexpr const char* kDeviceName = "cuemm simulated GPU";
constexpr std::uint32_t kIpcMagic = 0x4d495043;  // "CPIM"

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// A byte count from the environment; unset, unparsable or zero keeps the default.
std::size_t bytes_from_environment(const char* variable, std::size_t fallback) {
  const char* text = std::getenv(variable);
  const auto bytes = text ? util::parse_byte_size(text) : std::nullopt;
  return bytes && *bytes > 0 ? *bytes : fallback;
}

// Per thread: the context stack, and the per-thread default stream of each context.
thread_local std::vector<Context*> context_stack;
// A thread's per-thread streams end with it, as the driver's do: kept, each
// would stay in its context's streams, which every operation on the legacy
// stream waits for (after 16-thread benchmarks had come and gone, a seal's
// query of the legacy stream took 50 ns a pair of the pool's 256 B pairs).
struct PerThreadStreams {
  std::map<Context*, std::shared_ptr<SimStream>> of_context;
  ~PerThreadStreams();
};
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

CUresult allocate_device_memory(State& s, Context* context, std::size_t size, AllocationKind kind,
                                unsigned flags, CUdeviceptr* pointer) {
  Device& device = *context->device;
  if (!ensure_arena(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t rounded = cuemm::util::round_up(size, kDeviceAlignment);
  if (rounded < size) return CUDA_ERROR_OUT_OF_MEMORY;
  auto offset = device.ranges->allocate(rounded);
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = reinterpret_cast<std::uintptr_t>(device.arena + *offset);
  allocation.size = size;
  allocation.kind = kind;
  allocation.context = context;
  allocation.device = device.ordinal;
  allocation.flags = flags;
  allocation.arena_offset = *offset;
  allocation.arena_size = rounded;
  allocation.id = s.next_allocation_id++;
  device.used += rounded;
  s.allocations.emplace(allocation.base, allocation);
  *pointer = allocation.base;
  return CUDA_SUCCESS;
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
      device.used -= allocation.arena_size;
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
std::uint64_t submit(const std::shared_ptr<SimStream>& stream, SimStream::Operation operation) {
  return stream->enqueue(std::move(operation), implicit_dependencies(stream));
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

// --- Stream capture --------------------------------------------------------------
// Work queued on a capturing stream is kept for its graph instead of run.
// What a capture under way makes of other calls follows the H100
// (bench/probes/probe_capture.cpp; docs/pool-measurements.md): a call that
// the capture forbids is refused and ends (invalidates) it. An event
// recorded on a capturing stream forks the capture to the streams that wait
// for it, and joins them back where a stream of the capture waits for an
// event recorded on them (Capture; bench/probes/probe_capture_fork.cpp, whose
// H100 results Driver.ACaptureForksToAStreamThatWaitsForItsEventAndEndsOnceJoined
// holds this driver to). Stream-ordered allocations on a capturing stream
// (the driver's graph memory nodes) are refused.

thread_local int thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;  // cuThreadExchangeStreamCaptureMode

enum class DuringCapture {
  potentially_unsafe,   // cuMemAlloc, cuMemFree, cuEventQuery, cuEventSynchronize
  legacy_stream_query,  // cuStreamQuery and cuStreamSynchronize of the legacy stream
  legacy_stream_work,   // work queued on the legacy stream
  whole_context,        // cuCtxRecordEvent, cuCtxSynchronize: refused in every mode
};

// CUDA_SUCCESS where the call may go on; else the error, every capture that
// forbids it invalidated. `context`: the legacy stream's, for its rules.
CUresult check_captures(State& s, DuringCapture call, const Context* context = nullptr) {
  CUresult result = CUDA_SUCCESS;
  const auto self = std::this_thread::get_id();
  for (auto& [stream, shared] : s.captures) {
    Capture& capture = *shared;
    const bool beside_legacy = stream->blocking() && stream->context() == context;
    CUresult refused = CUDA_SUCCESS;
    switch (call) {
      case DuringCapture::whole_context:
        refused = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        break;
      case DuringCapture::legacy_stream_work:
        if (beside_legacy) refused = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        break;
      case DuringCapture::legacy_stream_query:
        if (beside_legacy) {
          refused = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
          break;
        }
        [[fallthrough]];
      case DuringCapture::potentially_unsafe:
        // The thread's own capture forbids it unless one of the two is
        // relaxed; another thread's, where both are global.
        if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED || capture.mode == CU_STREAM_CAPTURE_MODE_RELAXED)
          break;
        if (capture.thread == self ||
            (capture.mode == CU_STREAM_CAPTURE_MODE_GLOBAL && thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL))
          refused = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        break;
    }
    if (refused != CUDA_SUCCESS) {
      capture.invalidated = true;
      if (result == CUDA_SUCCESS) result = refused;
    }
  }
  return result;
}

Capture* capture_of(State& s, const std::shared_ptr<SimStream>& stream) {
  const auto found = s.captures.find(stream.get());
  return found == s.captures.end() ? nullptr : found->second.get();
}

// The capture under way that `event` was last recorded in; null where it was
// recorded outside one, or its capture has ended (only the map of captures
// under way owns them). Call with the event's mutex held.
std::shared_ptr<Capture> live_capture_of(const SimEvent& event) { return event.capture.lock(); }

// Queues `operation` on `stream`, or keeps it for the stream's capture; work
// on the legacy stream first meets the captures' rules.
CUresult queue_or_capture(State& s, const std::shared_ptr<SimStream>& stream, SimStream::Operation operation) {
  if (Capture* capture = capture_of(s, stream)) {
    capture->operations.push_back(std::move(operation));
    if (stream.get() != capture->origin) capture->unjoined[stream.get()] = capture->operations.size();
    return CUDA_SUCCESS;
  }
  if (stream == stream->context()->legacy) {
    if (const CUresult refused = check_captures(s, DuringCapture::legacy_stream_work, stream->context()))
      return refused;
  }
  submit(stream, std::move(operation));
  return CUDA_SUCCESS;
}

// Refuses a call that a capturing `stream` does not take, ending its capture:
// a query or synchronisation of it, and here stream-ordered allocations on it.
CUresult refuse_on_a_capturing_stream(State& s, const std::shared_ptr<SimStream>& stream) {
  Capture* capture = capture_of(s, stream);
  if (!capture) return CUDA_SUCCESS;
  capture->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// A query or synchronisation of `stream`; of the legacy stream it meets the
// captures' rules.
CUresult check_stream_use(State& s, const std::shared_ptr<SimStream>& stream) {
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  if (stream != stream->context()->legacy) return CUDA_SUCCESS;
  return check_captures(s, DuringCapture::legacy_stream_query, stream->context());
}

// Runs an operation on the legacy stream and, unless `wait` is false, waits
// for it: the synchronous copies and memsets.
CUresult run_synchronously(State& s, std::unique_lock<std::mutex>& lock, CUdeviceptr memory,
                           SimStream::Operation operation, bool wait = true) {
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

// Device-accessible memory: device, managed, opened IPC, and page-locked host
// memory (which UVA maps into every context).
bool device_accessible(State& s, CUdeviceptr pointer, std::size_t size) {
  if (size == 0) return true;
  return s.find(pointer, size) != nullptr;
}

}  // namespace

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

PerThreadStreams::~PerThreadStreams() {
  // Their queued work runs first: until it has, the legacy stream (and so a
  // query of it from another thread) still waits for it.
  for (auto& entry : of_context)
    if (entry.second) entry.second->synchronize();
  std::vector<std::shared_ptr<SimStream>> ending;
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    for (auto& [context, stream] : of_context) {
      if (!stream || !is_live(s, context) || !context->streams.erase(stream)) continue;
      s.streams.erase(stream.get());
      ending.push_back(std::move(stream));
    }
  }
  ending.clear();  // unlocked: a stream's end joins its worker
}

}  // namespace cuemm::sim

// ---------------------------------------------------------------------------
// Exported driver API.

using namespace cuemm::sim;

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// Most functions need cuInit first; the state lock is held as `lock`.
#define SIM_BEGIN(name) SIM_BEGIN_AS(::cuemm::sim::Fn::name)
#define SIM_BEGIN_AS(function)                    \
  if (const CUresult injected = CallLog::instance().enter(function)) return injected; \
  State& s = state();                             \
  std::unique_lock<std::mutex> lock(s.mutex);     \
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED

#define SIM_CONTEXT()                              \
  Context* context = current_context(s);           \
  if (!context) return CUDA_ERROR_INVALID_CONTEXT

namespace {
Device* device_at(State& s, CUdevice ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(s.devices.size())) return nullptr;
  return s.devices[ordinal].get();
}
}  // namespace

#define SIM_DEVICE(ordinal)                       \
  Device* device = device_at(s, ordinal);         \
  if (!device) return CUDA_ERROR_INVALID_DEVICE

SIM_EXPORT CUresult cuInit(unsigned flags) {
  SIM_ENTER(cuInit);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.initialized) return CUDA_SUCCESS;
  const char* count_text = std::getenv("CUEMM_SIM_DEVICES");
  const int count = count_text ? std::atoi(count_text) : 1;
  if (count <= 0) return CUDA_ERROR_NO_DEVICE;
  const std::size_t capacity = bytes_from_environment("CUEMM_SIM_MEMORY", 16ull << 30);
  const char* peer = std::getenv("CUEMM_SIM_PEER_ACCESS");
  s.peer_access = peer && std::atoi(peer) != 0;
  for (int i = 0; i < count; ++i) {
    auto device = std::make_unique<Device>();
    device->ordinal = i;
    device->capacity = cuemm::util::round_up(capacity, 2u << 20);
    s.devices.push_back(std::move(device));
  }
  s.initialized = true;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDriverGetVersion(int* version) {
  SIM_ENTER(cuDriverGetVersion);
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

namespace {
struct ErrorName {
  int code;
  const char* name;
};
constexpr ErrorName kErrorNames[] = {
#include "driver/error_names.inc"
};
const char* error_name(CUresult code) {
  for (const auto& entry : kErrorNames) {
    if (entry.code == code) return entry.name;
  }
  return nullptr;
}
}  // namespace

SIM_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  SIM_ENTER(cuGetErrorName);
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  *name = error_name(error);
  return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  SIM_ENTER(cuGetErrorString);
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  *text = error_name(error);
  return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- Devices ----------------------------------------------------------------

SIM_EXPORT CUresult cuDeviceGetCount(int* count) {
  SIM_BEGIN(cuDeviceGetCount);
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  SIM_BEGIN(cuDeviceGet);
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!device_at(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetName);
  SIM_DEVICE(ordinal);
  if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "%s", kDeviceName);
  return CUDA_SUCCESS;
}

namespace {
// An H100-like device, unless a test said otherwise. Attributes not listed
// read as 0, as unsupported ones do.
int attribute_value(const Device& device, int attribute) {
  if (auto it = device.attribute_overrides.find(attribute); it != device.attribute_overrides.end()) return it->second;
  switch (attribute) {
    case 1: return 1024;                 // MAX_THREADS_PER_BLOCK
    case 2: case 3: return 1024;         // MAX_BLOCK_DIM_X, Y
    case 4: return 64;                   // MAX_BLOCK_DIM_Z
    case 5: return 2147483647;           // MAX_GRID_DIM_X
    case 6: case 7: return 65535;        // MAX_GRID_DIM_Y, Z
    case 8: return 49152;                // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: return 65536;                // TOTAL_CONSTANT_MEMORY
    case 10: return 32;                  // WARP_SIZE
    case 11: return 2147483647;          // MAX_PITCH
    case 12: return 65536;               // MAX_REGISTERS_PER_BLOCK
    case 13: return 1755000;             // CLOCK_RATE (kHz)
    case 14: return 512;                 // TEXTURE_ALIGNMENT
    case 15: return 1;                   // GPU_OVERLAP
    case 16: return 132;                 // MULTIPROCESSOR_COUNT
    case 19: return 1;                   // CAN_MAP_HOST_MEMORY
    case 31: return 1;                   // CONCURRENT_KERNELS
    case 32: return 1;                   // ECC_ENABLED
    case 33: return 0x10 + device.ordinal;  // PCI_BUS_ID
    case 36: return 2619000;             // MEMORY_CLOCK_RATE (kHz)
    case 37: return 5120;                // GLOBAL_MEMORY_BUS_WIDTH
    case 38: return 52428800;            // L2_CACHE_SIZE
    case 39: return 2048;                // MAX_THREADS_PER_MULTIPROCESSOR
    case 40: return 3;                   // ASYNC_ENGINE_COUNT
    case 41: return 1;                   // UNIFIED_ADDRESSING
    case 75: return 9;                   // COMPUTE_CAPABILITY_MAJOR
    case 76: return 0;                   // COMPUTE_CAPABILITY_MINOR
    case 78: case 79: case 80: return 1;  // STREAM_PRIORITIES, GLOBAL_L1, LOCAL_L1
    case 81: return 233472;              // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: return 65536;               // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 83: return 1;                   // MANAGED_MEMORY
    case 89: return 1;                   // CONCURRENT_MANAGED_ACCESS
    case 90: return 1;                   // COMPUTE_PREEMPTION_SUPPORTED
    case 91: return 1;                   // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    case 95: return 1;                   // COOPERATIVE_LAUNCH
    case 97: return 232448;              // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 102: return 1;                  // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    case 103: return 1;                  // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    case 106: return 32;                 // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 115: return 1;                  // MEMORY_POOLS_SUPPORTED
    default: return 0;
  }
}
}  // namespace

SIM_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetAttribute);
  SIM_DEVICE(ordinal);
  if (!value || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  *value = attribute_value(*device, attribute);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceComputeCapability);
  SIM_DEVICE(ordinal);
  if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
  *major = attribute_value(*device, 75);
  *minor = attribute_value(*device, 76);
  return CUDA_SUCCESS;
}

namespace {
CUresult device_uuid(CUuuid* uuid, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceGetUuid);
  SIM_DEVICE(ordinal);
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  // Stable per ordinal, so another process sees the same identity.
  const char pattern[16] = {'c', 'u', 'e', 'm', 'm', '-', 's', 'i', 'm', 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(uuid->bytes, pattern, sizeof pattern);
  uuid->bytes[15] = static_cast<char>(device->ordinal);
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice ordinal) { return device_uuid(uuid, ordinal); }
SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice ordinal) { return device_uuid(uuid, ordinal); }

SIM_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice ordinal) {
  SIM_BEGIN(cuDeviceTotalMem);
  SIM_DEVICE(ordinal);
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = device->capacity;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceCanAccessPeer(int* can, CUdevice ordinal, CUdevice peer) {
  SIM_BEGIN(cuDeviceCanAccessPeer);
  SIM_DEVICE(ordinal);
  if (!can || !device_at(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = (s.peer_access && ordinal != peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

// --- Contexts ---------------------------------------------------------------

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* out, CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxRetain);
  SIM_DEVICE(ordinal);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!device->primary) device->primary = make_context(s, device, true);
  ++device->primary->retains;
  *out = reinterpret_cast<CUcontext>(device->primary);
  return CUDA_SUCCESS;
}

namespace {
CUresult primary_release(CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxRelease);
  SIM_DEVICE(ordinal);
  Context* primary = device->primary;
  if (!primary || primary->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The last release destroys the context's resources; the handle stays usable
  // (a later retain revives it), which is more lenient than a GPU.
  if (--primary->retains == 0) destroy_resources(lock, s, primary);
  return CUDA_SUCCESS;
}
CUresult primary_reset(CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxReset);
  SIM_DEVICE(ordinal);
  if (device->primary) destroy_resources(lock, s, device->primary);
  device->peers_enabled.clear();
  return CUDA_SUCCESS;
}
CUresult primary_set_flags(CUdevice ordinal, unsigned flags) {
  SIM_BEGIN(cuDevicePrimaryCtxSetFlags);
  SIM_DEVICE(ordinal);
  if (!device->primary) device->primary = make_context(s, device, true);
  device->primary->flags = flags;
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return primary_release(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return primary_release(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return primary_reset(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return primary_reset(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned f) { return primary_set_flags(d, f); }
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { return primary_set_flags(d, f); }

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice ordinal, unsigned* flags, int* active) {
  SIM_BEGIN(cuDevicePrimaryCtxGetState);
  SIM_DEVICE(ordinal);
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  *flags = device->primary ? device->primary->flags : 0;
  *active = device->primary && device->primary->retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* out, unsigned flags, CUdevice ordinal) {
  SIM_BEGIN(cuCtxCreate);
  SIM_DEVICE(ordinal);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Context* context = make_context(s, device, false);
  context->flags = flags;
  context->retains = 1;
  context_stack.push_back(context);
  *out = reinterpret_cast<CUcontext>(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext handle) {
  SIM_BEGIN(cuCtxDestroy);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!is_live(s, context) || context->primary) return CUDA_ERROR_INVALID_CONTEXT;
  destroy_resources(lock, s, context);
  s.contexts.erase(context);
  std::erase(context_stack, context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext* out) {
  SIM_BEGIN(cuCtxGetCurrent);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUcontext>(current_context(s));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext handle) {
  SIM_BEGIN(cuCtxSetCurrent);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!context) {
    if (!context_stack.empty()) context_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_stack.empty()) {
    context_stack.push_back(context);
  } else {
    context_stack.back() = context;
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext handle) {
  SIM_BEGIN(cuCtxPushCurrent);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  context_stack.push_back(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* out) {
  SIM_BEGIN(cuCtxPopCurrent);
  if (context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (out) *out = reinterpret_cast<CUcontext>(context_stack.back());
  context_stack.pop_back();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice* out) {
  SIM_BEGIN(cuCtxGetDevice);
  SIM_CONTEXT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = context->device->ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize() {
  SIM_BEGIN(cuCtxSynchronize);
  SIM_CONTEXT();
  if (const CUresult refused = check_captures(s, DuringCapture::whole_context)) return refused;
  synchronize_context(lock, context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer_handle, unsigned flags) {
  SIM_BEGIN(cuCtxEnablePeerAccess);
  SIM_CONTEXT();
  auto* peer = reinterpret_cast<Context*>(peer_handle);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!is_live(s, peer)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!s.peer_access || peer->device == context->device) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (!context->device->peers_enabled.insert(peer->device->ordinal).second)
    return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

// --- Device and managed memory -------------------------------------------------

SIM_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  SIM_BEGIN(cuMemGetInfo);
  SIM_CONTEXT();
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  *total = context->device->capacity;
  *free = context->device->capacity - context->device->used;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* pointer, std::size_t size) {
  SIM_BEGIN(cuMemAlloc);
  SIM_CONTEXT();
  if (!pointer || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  return allocate_device_memory(s, context, size, AllocationKind::Device, 0, pointer);
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN(cuMemAllocManaged);
  SIM_CONTEXT();
  if (!pointer || size == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  return allocate_device_memory(s, context, size, AllocationKind::Managed, flags, pointer);
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer) {
  SIM_BEGIN(cuMemFree);
  // Like the real driver (unified addressing), the pointer names its context:
  // no context needs to be current.
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || (it->second.kind != AllocationKind::Device &&
                                    it->second.kind != AllocationKind::Managed && !it->second.pool_import))
    return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  Context* context = it->second.context;
  // cuMemFree waits for the device, as on a GPU: pending work may still use it.
  synchronize_context(lock, context);
  it = s.allocations.find(pointer);  // the table may have changed while unlocked
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size, CUdeviceptr pointer) {
  SIM_BEGIN(cuMemGetAddressRange);
  Allocation* allocation = s.find(pointer);
  if (!allocation) return CUDA_ERROR_NOT_FOUND;
  // Memory of a stream-ordered pool: success with 0 and 0, as the H100's
  // driver (580) answers.
  const bool pooled = allocation->pool != nullptr;
  if (base) *base = pooled ? 0 : allocation->base;
  if (size) *size = pooled ? 0 : allocation->size;
  return CUDA_SUCCESS;
}

// --- Virtual memory management ---------------------------------------------------
// Reserved addresses are PROT_NONE host mappings; cuMemCreate takes a range of
// the device's arena; cuMemMap maps that range of the arena's memfd over the
// reserved addresses, so mapped memory is device memory like any other.

namespace {
constexpr std::size_t kVirtualGranularity = std::size_t{2} << 20;

bool supports_virtual_memory(const Device& device) {
  return attribute_value(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
}

bool is_device_property(State& s, const CUmemAllocationProp* properties) {
  return properties && properties->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         properties->location.type == CU_MEM_LOCATION_TYPE_DEVICE && device_at(s, properties->location.id);
}

// Whether [pointer, pointer + bytes) lies inside one reservation.
bool is_reserved(State& s, std::uintptr_t pointer, std::size_t bytes) {
  auto it = s.reservations.upper_bound(pointer);
  if (it == s.reservations.begin()) return false;
  --it;
  return pointer >= it->first && pointer + bytes <= it->first + it->second;
}
}  // namespace

SIM_EXPORT CUresult cuMemGetAllocationGranularity(std::size_t* granularity, const CUmemAllocationProp* properties,
                                                   int option) {
  SIM_BEGIN(cuMemGetAllocationGranularity);
  (void)option;
  if (!granularity || !is_device_property(s, properties)) return CUDA_ERROR_INVALID_VALUE;
  if (!supports_virtual_memory(*s.devices[properties->location.id])) return CUDA_ERROR_NOT_SUPPORTED;
  *granularity = kVirtualGranularity;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* pointer, std::size_t bytes, std::size_t alignment,
                                        CUdeviceptr hint, unsigned long long flags) {
  SIM_BEGIN(cuMemAddressReserve);
  (void)hint;
  if (!pointer || bytes == 0 || bytes % kVirtualGranularity || flags != 0 ||
      (alignment && (alignment & (alignment - 1))))
    return CUDA_ERROR_INVALID_VALUE;
  alignment = std::max(alignment, kVirtualGranularity);
  const std::size_t span = bytes + alignment;
  void* mapping = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto start = reinterpret_cast<std::uintptr_t>(mapping);
  const std::uintptr_t base = cuemm::util::round_up(start, alignment);
  if (base > start) munmap(mapping, base - start);
  if (start + span > base + bytes) munmap(reinterpret_cast<void*>(base + bytes), start + span - base - bytes);
  s.reservations.emplace(base, bytes);
  *pointer = base;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr pointer, std::size_t bytes) {
  SIM_BEGIN(cuMemAddressFree);
  auto it = s.reservations.find(pointer);
  if (it == s.reservations.end() || it->second != bytes) return CUDA_ERROR_INVALID_VALUE;
  auto mapped = s.allocations.lower_bound(pointer);
  if (mapped != s.allocations.end() && mapped->first < pointer + bytes) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  munmap(reinterpret_cast<void*>(pointer), bytes);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t bytes,
                                const CUmemAllocationProp* properties, unsigned long long flags) {
  SIM_BEGIN(cuMemCreate);
  if (!handle || bytes == 0 || bytes % kVirtualGranularity || flags != 0 || !is_device_property(s, properties) ||
      (properties->requested_handle_types & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;  // (Linux has no other handle type)
  Device& device = *s.devices[properties->location.id];
  if (!supports_virtual_memory(device)) return CUDA_ERROR_NOT_SUPPORTED;
  if (!ensure_arena(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto offset = device.ranges->allocate_aligned(bytes, kVirtualGranularity);  // mmap wants page offsets
  if (!offset) return CUDA_ERROR_OUT_OF_MEMORY;
  PhysicalMemory physical{device.ordinal, *offset, bytes};
  if (properties->requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    physical.fd = memfd_create("cuemm-sim-shareable", MFD_CLOEXEC);
    if (physical.fd < 0 || ftruncate(physical.fd, static_cast<off_t>(bytes)) != 0) {
      if (physical.fd >= 0) close(physical.fd);
      device.ranges->release(*offset, bytes);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  device.used += bytes;
  const std::uint64_t id = s.next_physical_handle++;
  s.physical.emplace(id, physical);
  *handle = id;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle, int type,
                                                 unsigned long long flags) {
  SIM_BEGIN(cuMemExportToShareableHandle);
  auto physical = s.physical.find(handle);
  if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || physical == s.physical.end() ||
      physical->second.released)
    return CUDA_ERROR_INVALID_VALUE;
  if (physical->second.fd < 0 || physical->second.imported) return CUDA_ERROR_INVALID_VALUE;  // not created shareable
  const int fd = fcntl(physical->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* shareable, int type) {
  SIM_BEGIN(cuMemImportFromShareableHandle);
  SIM_CONTEXT();  // (the simulated descriptor does not say its device: the importer's is taken)
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(static_cast<int>(reinterpret_cast<std::intptr_t>(shareable)), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  struct stat status {};
  if (fstat(fd, &status) != 0 || status.st_size <= 0 || status.st_size % kVirtualGranularity) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  PhysicalMemory physical{context->device->ordinal, 0, static_cast<std::size_t>(status.st_size)};
  physical.fd = fd;
  physical.imported = true;
  const std::uint64_t id = s.next_physical_handle++;
  s.physical.emplace(id, physical);
  *handle = id;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_BEGIN(cuMemRelease);
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  if (it->second.mappings == 0) release_physical(s, it);
  return CUDA_SUCCESS;
}

// Maps the whole of a handle's memory (offset 0): all cuemm asks for.
SIM_EXPORT CUresult cuMemMap(CUdeviceptr pointer, std::size_t bytes, std::size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  SIM_BEGIN(cuMemMap);
  auto physical = s.physical.find(handle);
  if (physical == s.physical.end() || physical->second.released || offset != 0 || flags != 0 ||
      bytes != physical->second.size || pointer % kVirtualGranularity || !is_reserved(s, pointer, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  auto next = s.allocations.lower_bound(pointer);
  if ((next != s.allocations.end() && next->first < pointer + bytes) || s.find(pointer))
    return CUDA_ERROR_INVALID_VALUE;  // already mapped
  Device& device = *s.devices[physical->second.device];
  const bool own_memory = physical->second.fd >= 0;
  void* mapped = mmap(reinterpret_cast<void*>(pointer), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED,
                      own_memory ? physical->second.fd : device.memfd,
                      own_memory ? 0 : static_cast<off_t>(physical->second.arena_offset));
  if (mapped == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = pointer;
  allocation.size = bytes;
  allocation.kind = AllocationKind::VirtualMapping;
  allocation.context = current_context(s) ? current_context(s) : device.primary;
  allocation.device = device.ordinal;
  allocation.arena_offset = physical->second.arena_offset;
  allocation.arena_size = bytes;
  allocation.id = s.next_allocation_id++;
  allocation.physical = handle;
  ++physical->second.mappings;
  s.allocations.emplace(pointer, allocation);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr pointer, std::size_t bytes, const CUmemAccessDesc* descriptors,
                                   std::size_t count) {
  SIM_BEGIN(cuMemSetAccess);
  const Allocation* mapped = s.find(pointer, bytes);
  if (!descriptors || count == 0 || !mapped || mapped->kind != AllocationKind::VirtualMapping)
    return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (descriptors[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device_at(s, device))
      return CUDA_ERROR_INVALID_DEVICE;
    if (device != mapped->device && !s.peer_access) return CUDA_ERROR_INVALID_DEVICE;  // no peer-to-peer path
  }
  // The devices whose kernels may use each mapping in the range (checked at launch).
  for (auto it = s.allocations.find(mapped->base); it != s.allocations.end() && it->first < pointer + bytes; ++it) {
    for (std::size_t i = 0; i < count; ++i) {
      if (descriptors[i].flags == 0)
        it->second.granted.erase(descriptors[i].location.id);
      else
        it->second.granted.insert(descriptors[i].location.id);
    }
  }
  const int protection = descriptors[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                         : descriptors[0].flags == 0x1                               ? PROT_READ
                                                                                     : PROT_NONE;
  mprotect(reinterpret_cast<void*>(pointer), bytes, protection);
  return CUDA_SUCCESS;
}

// Unmaps whole mappings only, one or several side by side.
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr pointer, std::size_t bytes) {
  SIM_BEGIN(cuMemUnmap);
  std::uintptr_t end = pointer;
  for (auto it = s.allocations.find(pointer); end < pointer + bytes; it = s.allocations.find(end)) {
    if (it == s.allocations.end() || it->second.kind != AllocationKind::VirtualMapping) return CUDA_ERROR_INVALID_VALUE;
    end += it->second.size;
  }
  if (end != pointer + bytes) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = s.allocations.find(pointer); it != s.allocations.end() && it->first < end;) {
    auto next = std::next(it);
    release_allocation(s, it);
    it = next;
  }
  return CUDA_SUCCESS;
}

// --- Stream-ordered pools ------------------------------------------------------

namespace {
MemoryPool* find_pool(State& s, CUmemoryPool handle) {
  auto it = s.pools.find(reinterpret_cast<MemoryPool*>(handle));
  return it == s.pools.end() || it->second->destroyed ? nullptr : it->second.get();
}

void forget_pool_if_done(State& s, MemoryPool* pool) {
  if (!pool->destroyed || pool->used != 0) return;
  if (pool->imported_fd >= 0) close(pool->imported_fd);
  s.pools.erase(pool);
}
}  // namespace

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* out, const CUmemPoolProps* properties) {
  SIM_BEGIN(cuMemPoolCreate);
  if (!out || !properties || properties->alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      properties->location.type != CU_MEM_LOCATION_TYPE_DEVICE || (properties->handle_types & ~0x1))
    return CUDA_ERROR_INVALID_VALUE;
  const Device* device = device_at(s, properties->location.id);
  if (!device) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute_value(*device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == 0) return CUDA_ERROR_NOT_SUPPORTED;
  auto pool = std::make_unique<MemoryPool>();
  pool->device = properties->location.id;
  pool->handle_types = properties->handle_types;
  *out = reinterpret_cast<CUmemoryPool>(pool.get());
  s.pools.emplace(pool.get(), std::move(pool));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  SIM_BEGIN(cuMemPoolDestroy);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  pool->destroyed = true;  // as on a GPU: outstanding blocks stay valid until freed
  forget_pool_if_done(s, pool);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool handle, int attribute, void* value) {
  SIM_BEGIN(cuMemPoolSetAttribute);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  auto& number = *static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = number; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (number != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->used_high = pool->used;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool handle, int attribute, void* value) {
  SIM_BEGIN(cuMemPoolGetAttribute);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !value) return CUDA_ERROR_INVALID_VALUE;
  auto& number = *static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: number = pool->release_threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: number = pool->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: number = pool->used_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool handle, const CUmemAccessDesc* descriptors, std::size_t count) {
  SIM_BEGIN(cuMemPoolSetAccess);
  MemoryPool* pool = find_pool(s, handle);
  if (!pool || !descriptors || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (descriptors[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device_at(s, device))
      return CUDA_ERROR_INVALID_DEVICE;
    if (device == pool->device && descriptors[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;  // the pool's own device keeps its access
    if (device != pool->device && !s.peer_access) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const int device = descriptors[i].location.id;
    if (device == pool->device) continue;
    if (descriptors[i].flags == 0)
      pool->peers_granted.erase(device);
    else
      pool->peers_granted.insert(device);
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool handle, std::size_t) {
  SIM_BEGIN(cuMemPoolTrimTo);
  return find_pool(s, handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;  // nothing is kept to trim
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* pointer, std::size_t size, CUmemoryPool handle,
                                            CUstream stream_handle) {
  SIM_BEGIN(cuMemAllocFromPoolAsync);
  SIM_CONTEXT();
  MemoryPool* pool = find_pool(s, handle);
  if (!pointer || size == 0 || !pool) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, stream_handle, &error);
  if (!stream) return error;
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  if (pool->device != context->device->ordinal) return CUDA_ERROR_INVALID_DEVICE;
  if (pool->imported_fd >= 0) return CUDA_ERROR_INVALID_VALUE;  // imported pools hand out nothing
  // Allocated at once: at least as ordered as the stream asks. A real pool
  // reuses what streams freed earlier, in stream order; here that memory
  // comes back when the queued frees have run, so wait for them.
  // (Other threads may take what the wait gave back: try a few times.)
  CUresult result = allocate_device_memory(s, context, size, AllocationKind::Device, 0, pointer);
  for (int attempt = 0; attempt < 16 && result == CUDA_ERROR_OUT_OF_MEMORY; ++attempt) {
    synchronize_context(lock, context);
    if (!find_pool(s, handle)) return CUDA_ERROR_INVALID_VALUE;  // destroyed meanwhile
    result = allocate_device_memory(s, context, size, AllocationKind::Device, 0, pointer);
  }
  if (result != CUDA_SUCCESS) return result;
  Allocation& allocation = s.allocations.at(*pointer);
  allocation.pool = pool;
  pool->used += allocation.arena_size;
  pool->used_high = std::max(pool->used_high, pool->used);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream_handle) {
  SIM_BEGIN(cuMemFreeAsync);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || it->second.kind != AllocationKind::Device) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  auto stream = resolve_stream(s, stream_handle, &error);
  if (!stream) return error;
  if (const CUresult refused = refuse_on_a_capturing_stream(s, stream)) return refused;
  auto release = [](State& state_now, std::map<std::uintptr_t, Allocation>::iterator found) {
    if (MemoryPool* pool = found->second.pool) {
      pool->used -= found->second.arena_size;
      forget_pool_if_done(state_now, pool);
    }
    release_allocation(state_now, found);
  };
  // On an idle stream the block goes back at once, as a real pool hands it
  // to the stream's next allocation: deferred, a replay without GPU work saw
  // every block freed since the worker last ran as still in use (28 times
  // the live bytes on a training log).
  if (would_run_at_once(stream)) {
    release(s, it);
    return CUDA_SUCCESS;
  }
  // Otherwise once the stream's earlier work is done.
  submit(stream, [pointer, release] {
    State& state_now = state();
    std::lock_guard freeing(state_now.mutex);
    auto found = state_now.allocations.find(pointer);
    if (found == state_now.allocations.end()) return;
    release(state_now, found);
  });
  return CUDA_SUCCESS;
}

// --- Stream-ordered pools shared between processes ----------------------------------
// The shareable handle is a descriptor of the exporting process's device
// memory (its memfd); a block's export data says where in it the block lies.

namespace {
constexpr std::uint32_t kPoolExportMagic = 0x58504d50;  // "PMPX"
struct PoolExportPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t arena_offset;
  std::uint64_t size;
  std::uint64_t id;
};
static_assert(sizeof(PoolExportPayload) <= sizeof(CUmemPoolPtrExportData));

// Maps `size` bytes at `arena_offset` of another process's device memory,
// open here as `fd`, into this process as an IpcMapping of `context`; the
// caller says which kind of import it is. Null when the mapping fails.
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

}  // namespace

SIM_EXPORT CUresult cuMemPoolExportToShareableHandle(void* handle, CUmemoryPool handle_of_pool, int type,
                                                     unsigned long long flags) {
  SIM_BEGIN(cuMemPoolExportToShareableHandle);
  MemoryPool* pool = find_pool(s, handle_of_pool);
  if (!handle || !pool || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(pool->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || pool->imported_fd >= 0)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(s.devices[pool->device]->memfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(handle) = fd;
  pool->exported = true;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool* out, void* handle, int type,
                                                       unsigned long long flags) {
  SIM_BEGIN(cuMemPoolImportFromShareableHandle);
  SIM_CONTEXT();
  if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(static_cast<int>(reinterpret_cast<std::intptr_t>(handle)), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  auto pool = std::make_unique<MemoryPool>();
  pool->device = context->device->ordinal;
  pool->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  pool->imported_fd = fd;
  *out = reinterpret_cast<CUmemoryPool>(pool.get());
  s.pools.emplace(pool.get(), std::move(pool));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData* data, CUdeviceptr pointer) {
  SIM_BEGIN(cuMemPoolExportPointer);
  auto it = s.allocations.find(pointer);  // a block's start, as the driver wants
  // (The H100's driver exports no block of a pool before the pool itself.)
  if (!data || it == s.allocations.end() || !it->second.pool || !it->second.pool->exported)
    return CUDA_ERROR_INVALID_VALUE;
  const Allocation& allocation = it->second;
  const PoolExportPayload payload{kPoolExportMagic, static_cast<std::int32_t>(getpid()), allocation.device,
                                  allocation.arena_offset, allocation.size, allocation.id};
  std::memset(data->reserved, 0, sizeof data->reserved);
  std::memcpy(data->reserved, &payload, sizeof payload);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr* pointer, CUmemoryPool handle_of_pool,
                                           CUmemPoolPtrExportData* data) {
  SIM_BEGIN(cuMemPoolImportPointer);
  SIM_CONTEXT();
  MemoryPool* pool = find_pool(s, handle_of_pool);
  if (!pointer || !data || !pool || pool->imported_fd < 0) return CUDA_ERROR_INVALID_VALUE;
  PoolExportPayload payload;
  std::memcpy(&payload, data->reserved, sizeof payload);
  if (payload.magic != kPoolExportMagic) return CUDA_ERROR_INVALID_VALUE;
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_VALUE;  // a pool is imported by other processes
  Allocation* imported = map_exported_memory(s, context, pool->imported_fd, payload.arena_offset, payload.size,
                                             context->device->ordinal, payload.id, payload.pid);
  if (!imported) return CUDA_ERROR_INVALID_VALUE;
  imported->pool_import = true;
  *pointer = imported->base;
  return CUDA_SUCCESS;
}

// --- Host memory ---------------------------------------------------------------

namespace {
CUresult host_alloc(Fn entry, void** pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN_AS(entry);
  SIM_CONTEXT();
  if (!pointer || size == 0 || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t length = cuemm::util::round_up(size, page_size());
  void* memory = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation allocation;
  allocation.base = reinterpret_cast<std::uintptr_t>(memory);
  allocation.size = size;
  allocation.kind = AllocationKind::PinnedHost;
  allocation.context = context;
  allocation.device = context->device->ordinal;
  allocation.flags = flags;
  allocation.mapping_size = length;
  s.allocations.emplace(allocation.base, allocation);
  *pointer = memory;
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuMemHostAlloc(void** pointer, std::size_t size, unsigned flags) {
  return host_alloc(Fn::cuMemHostAlloc, pointer, size, flags);
}
SIM_EXPORT CUresult cuMemAllocHost_v2(void** pointer, std::size_t size) {
  return host_alloc(Fn::cuMemAllocHost, pointer, size, 0);
}

SIM_EXPORT CUresult cuMemFreeHost(void* pointer) {
  SIM_BEGIN(cuMemFreeHost);
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == s.allocations.end() || it->second.kind != AllocationKind::PinnedHost)
    return CUDA_ERROR_INVALID_VALUE;
  // It waits for the device, as cuMemFree does (measured on the H100: 50 ms
  // behind a 50 ms kernel on any stream; bench/probes/probe_free_stall.cpp).
  synchronize_context(lock, it->second.context);
  it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));  // (unlocked meanwhile)
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostRegister_v2(void* pointer, std::size_t size, unsigned flags) {
  SIM_BEGIN(cuMemHostRegister);
  SIM_CONTEXT();
  if (!pointer || size == 0 || (flags & ~0xFu)) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<std::uintptr_t>(pointer);
  // Overlap with anything already page-locked: check both neighbours.
  auto next = s.allocations.lower_bound(base);
  if (next != s.allocations.end() && next->first < base + size)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (s.find(base)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Allocation allocation;
  allocation.base = base;
  allocation.size = size;
  allocation.kind = AllocationKind::RegisteredHost;
  allocation.context = context;
  allocation.device = context->device->ordinal;
  allocation.flags = flags;
  s.allocations.emplace(base, allocation);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostUnregister(void* pointer) {
  SIM_BEGIN(cuMemHostUnregister);
  auto it = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == s.allocations.end() || it->second.kind != AllocationKind::RegisteredHost)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  release_allocation(s, it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* device_pointer, void* host_pointer,
                                                 unsigned flags) {
  SIM_BEGIN(cuMemHostGetDevicePointer);
  if (!device_pointer || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(reinterpret_cast<std::uintptr_t>(host_pointer));
  // With unified addressing every cuMemHostAlloc block is mapped; registered
  // memory only when registered with DEVICEMAP.
  const bool mapped = allocation && (allocation->kind == AllocationKind::PinnedHost ||
                                     (allocation->kind == AllocationKind::RegisteredHost &&
                                      (allocation->flags & CU_MEMHOSTREGISTER_DEVICEMAP)));
  if (!mapped) return CUDA_ERROR_INVALID_VALUE;
  *device_pointer = reinterpret_cast<CUdeviceptr>(host_pointer);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemHostGetFlags(unsigned* flags, void* pointer) {
  SIM_BEGIN(cuMemHostGetFlags);
  Allocation* allocation = s.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (!flags || !allocation || allocation->kind != AllocationKind::PinnedHost)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = allocation->flags;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr pointer) {
  SIM_BEGIN(cuPointerGetAttribute);
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(pointer);
  if (!allocation) return CUDA_ERROR_INVALID_VALUE;
  const bool host = allocation->kind == AllocationKind::PinnedHost ||
                    allocation->kind == AllocationKind::RegisteredHost;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(allocation->context);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<CUdeviceptr*>(data) = pointer;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = allocation->kind == AllocationKind::Managed ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = allocation->device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = allocation->base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<std::size_t*>(data) = allocation->size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// --- Copies and memsets ------------------------------------------------------------

#define SIM_CHECK_DEVICE_RANGE(pointer, bytes) \
  if (!device_accessible(s, pointer, bytes)) return CUDA_ERROR_INVALID_VALUE

SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyHtoD);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  if (bytes && !src) return CUDA_ERROR_INVALID_VALUE;
  return run_synchronously(s, lock, dst, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyDtoH);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  if (bytes && !dst) return CUDA_ERROR_INVALID_VALUE;
  return run_synchronously(s, lock, src, [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  SIM_BEGIN(cuMemcpyDtoD);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  return run_synchronously(s, lock, dst, [=] {
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  });
}

SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes,
                                         CUstream stream) {
  SIM_BEGIN(cuMemcpyHtoDAsync);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  if (bytes && !src) return CUDA_ERROR_INVALID_VALUE;
  return run_on_stream(s, stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  SIM_BEGIN(cuMemcpyDtoHAsync);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  if (bytes && !dst) return CUDA_ERROR_INVALID_VALUE;
  return run_on_stream(s, stream, [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
}

SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                                         CUstream stream) {
  SIM_BEGIN(cuMemcpyDtoDAsync);
  SIM_CHECK_DEVICE_RANGE(dst, bytes);
  SIM_CHECK_DEVICE_RANGE(src, bytes);
  return run_on_stream(s, stream, [=] {
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  });
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count) {
  SIM_BEGIN(cuMemsetD8);
  SIM_CHECK_DEVICE_RANGE(dst, count);
  const bool early = memset_returns_early(s, dst);
  return run_synchronously(
      s, lock, dst, [=] { std::memset(reinterpret_cast<void*>(dst), value, count); }, /*wait=*/!early);
}

SIM_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t count,
                                    CUstream stream) {
  SIM_BEGIN(cuMemsetD8Async);
  SIM_CHECK_DEVICE_RANGE(dst, count);
  return run_on_stream(s, stream, [=] { std::memset(reinterpret_cast<void*>(dst), value, count); });
}

namespace {
void fill32(CUdeviceptr dst, unsigned value, std::size_t count) {
  auto* words = reinterpret_cast<unsigned*>(dst);
  std::fill(words, words + count, value);
}
}  // namespace

SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, std::size_t count) {
  SIM_BEGIN(cuMemsetD32);
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  SIM_CHECK_DEVICE_RANGE(dst, count * 4);
  const bool early = memset_returns_early(s, dst);
  return run_synchronously(s, lock, dst, [=] { fill32(dst, value, count); }, /*wait=*/!early);
}

SIM_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, std::size_t count, CUstream stream) {
  SIM_BEGIN(cuMemsetD32Async);
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  SIM_CHECK_DEVICE_RANGE(dst, count * 4);
  return run_on_stream(s, stream, [=] { fill32(dst, value, count); });
}

// --- IPC ---------------------------------------------------------------------------

namespace {
// The 64 bytes of a simulated IPC handle.
struct IpcPayload {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t memfd;
  std::int32_t device;
  std::uint64_t arena_offset;
  std::uint64_t size;
  std::uint64_t id;
};
static_assert(sizeof(IpcPayload) <= kIpcHandleSize);
}  // namespace

SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  SIM_BEGIN(cuIpcGetMemHandle);
  SIM_CONTEXT();
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  Allocation* allocation = s.find(pointer);
  if (!allocation || allocation->kind != AllocationKind::Device) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload payload{kIpcMagic,
                     static_cast<std::int32_t>(getpid()),
                     s.devices[allocation->device]->memfd,
                     allocation->device,
                     allocation->arena_offset,
                     allocation->size,
                     allocation->id};
  std::memset(handle->reserved, 0, sizeof handle->reserved);
  std::memcpy(handle->reserved, &payload, sizeof payload);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned flags) {
  SIM_BEGIN(cuIpcOpenMemHandle);
  SIM_CONTEXT();
  if (!pointer || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return CUDA_ERROR_INVALID_VALUE;
  IpcPayload payload;
  std::memcpy(&payload, handle.reserved, sizeof payload);
  if (payload.magic != kIpcMagic || !device_at(s, payload.device)) return CUDA_ERROR_INVALID_VALUE;
  if (payload.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // own handles cannot be opened
  if (payload.device != context->device->ordinal && !s.peer_access)
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  for (auto& [base, allocation] : s.allocations) {
    if (allocation.kind == AllocationKind::IpcMapping && allocation.exporter_pid == payload.pid &&
        allocation.id == payload.id) {
      ++allocation.ipc_opens;
      *pointer = base;
      return CUDA_SUCCESS;
    }
  }
  const std::string path = "/proc/" + std::to_string(payload.pid) + "/fd/" + std::to_string(payload.memfd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporting process is gone
  Allocation* opened =
      map_exported_memory(s, context, fd, payload.arena_offset, payload.size, payload.device, payload.id, payload.pid);
  close(fd);
  if (!opened) return CUDA_ERROR_MAP_FAILED;
  opened->ipc_opens = 1;
  *pointer = opened->base;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr pointer) {
  SIM_BEGIN(cuIpcCloseMemHandle);
  auto it = s.allocations.find(pointer);
  if (it == s.allocations.end() || it->second.kind != AllocationKind::IpcMapping || it->second.pool_import)
    return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.ipc_opens == 0) release_allocation(s, it);
  return CUDA_SUCCESS;
}

// --- Streams and events -----------------------------------------------------------

SIM_EXPORT CUresult cuStreamCreate(CUstream* out, unsigned flags) {
  SIM_BEGIN(cuStreamCreate);
  SIM_CONTEXT();
  if (!out || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  auto stream = std::make_shared<SimStream>(context, flags);
  context->streams.insert(stream);
  s.streams.emplace(stream.get(), stream);
  *out = reinterpret_cast<CUstream>(stream.get());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream handle) {
  SIM_BEGIN(cuStreamDestroy);
  auto it = s.streams.find(reinterpret_cast<SimStream*>(handle));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto stream = it->second;
  s.captures.erase(stream.get());
  s.streams.erase(it);
  stream->context()->streams.erase(stream);
  lock.unlock();
  stream->shut_down();  // finishes queued work, as a GPU would after destroy returns
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  SIM_BEGIN(cuStreamSynchronize);
  CUresult error = CUDA_SUCCESS;
  auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  if (const CUresult refused = check_stream_use(s, stream)) return refused;
  // A marker on the stream carries the legacy-stream dependencies with it.
  const auto ticket = submit(stream, nullptr);
  lock.unlock();
  stream->wait_for(ticket);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamQuery(CUstream handle) {
  SIM_BEGIN(cuStreamQuery);
  CUresult error = CUDA_SUCCESS;
  auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  if (const CUresult refused = check_stream_use(s, stream)) return refused;
  if (!stream->is_complete(stream->last_ticket())) return CUDA_ERROR_NOT_READY;
  // The legacy default stream reads as busy while any blocking stream is, as
  // its ordering implies (measured on the H100: busy for a kernel on a
  // blocking stream, idle for one on a non-blocking stream).
  if (Context* context = stream->context(); stream == context->legacy) {
    for (const auto& other : context->streams)
      if (other->blocking() && !other->is_complete(other->last_ticket())) return CUDA_ERROR_NOT_READY;
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamAddCallback(CUstream handle, CUstreamCallback callback, void* user_data,
                                        unsigned flags) {
  SIM_BEGIN(cuStreamAddCallback);
  if (!callback || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return run_on_stream(s, handle, [=] { callback(handle, CUDA_SUCCESS, user_data); });
}

SIM_EXPORT CUresult cuEventCreate(CUevent* out, unsigned flags) {
  SIM_BEGIN(cuEventCreate);
  SIM_CONTEXT();
  if (!out || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
  auto event = std::make_shared<SimEvent>(context, flags);
  s.events.emplace(event.get(), event);
  *out = reinterpret_cast<CUevent>(event.get());
  return CUDA_SUCCESS;
}

namespace {
std::shared_ptr<SimEvent> find_event(State& s, CUevent handle) {
  auto it = s.events.find(reinterpret_cast<SimEvent*>(handle));
  return it == s.events.end() ? nullptr : it->second;
}
}  // namespace

SIM_EXPORT CUresult cuEventDestroy_v2(CUevent handle) {
  SIM_BEGIN(cuEventDestroy);
  if (s.events.erase(reinterpret_cast<SimEvent*>(handle)) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventRecord(CUevent handle, CUstream stream_handle) {
  SIM_BEGIN(cuEventRecord);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, stream_handle, &error);
  if (!stream) return error;
  if (Capture* capture = capture_of(s, stream)) {
    // A point in the capture for other streams to fork from or join at; nothing runs for it.
    std::lock_guard event_lock(event->mutex);
    event->capture = s.captures.at(stream.get());
    event->captured_on = stream.get();
    event->captured_at = capture->operations.size();
    return CUDA_SUCCESS;
  }
  std::uint64_t generation;
  {
    std::lock_guard event_lock(event->mutex);
    generation = ++event->recorded;
    event->context_points.clear();
    event->capture.reset();
  }
  return run_on_stream(s, stream_handle, [event, generation] {
    std::lock_guard event_lock(event->mutex);
    event->completed = std::max(event->completed, generation);
    event->time = std::chrono::steady_clock::now();
    event->done.notify_all();
  });
}

// Captures in `handle` all the work queued in `context_handle` now, on every
// stream (CUDA 12.5's cuCtxRecordEvent; measured on the H100: it reads busy
// for a kernel on a non-blocking stream, where the legacy stream reads idle).
SIM_EXPORT CUresult cuCtxRecordEvent(CUcontext context_handle, CUevent handle) {
  SIM_BEGIN(cuCtxRecordEvent);
  Context* context = reinterpret_cast<Context*>(context_handle);
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (const CUresult refused = check_captures(s, DuringCapture::whole_context)) return refused;
  auto event = find_event(s, handle);
  if (!event || event->context != context) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<SimStream::Dependency> points;
  for (auto& stream : all_streams_of(context)) points.push_back({stream, stream->last_ticket()});
  std::lock_guard event_lock(event->mutex);
  event->context_generation = ++event->recorded;
  event->context_points = std::move(points);
  event->settle_context_record();
  return CUDA_SUCCESS;
}

// The calling thread's capture mode: which calls the captures under way
// forbid it (check_captures).
SIM_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  SIM_BEGIN(cuThreadExchangeStreamCaptureMode);
  if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, thread_capture_mode);
  return CUDA_SUCCESS;
}

namespace {
// Waits, without the state lock, until a context-wide record's streams have
// reached their points, and settles it; nothing for a stream's record.
void await_context_record(const std::shared_ptr<SimEvent>& event, std::uint64_t generation) {
  std::vector<SimStream::Dependency> points;
  {
    std::lock_guard event_lock(event->mutex);
    if (event->context_generation != generation) return;
    points = event->context_points;
  }
  for (const auto& point : points) point.stream->wait_for(point.ticket);
  std::lock_guard event_lock(event->mutex);
  event->settle_context_record();
}
}  // namespace

SIM_EXPORT CUresult cuEventQuery(CUevent handle) {
  SIM_BEGIN(cuEventQuery);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  std::lock_guard event_lock(event->mutex);
  if (const auto captured = live_capture_of(*event)) {  // (a point in a capture, not an event yet)
    captured->invalidated = true;
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  event->settle_context_record();
  return event->completed >= event->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  SIM_BEGIN(cuEventSynchronize);
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  if (const CUresult refused = check_captures(s, DuringCapture::potentially_unsafe)) return refused;
  std::uint64_t target;
  {
    std::lock_guard event_lock(event->mutex);
    if (const auto captured = live_capture_of(*event)) {
      captured->invalidated = true;
      return CUDA_ERROR_CAPTURED_EVENT;
    }
    target = event->recorded;
  }
  lock.unlock();
  await_context_record(event, target);
  std::unique_lock event_lock(event->mutex);
  event->done.wait(event_lock, [&] { return event->completed >= target; });
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamWaitEvent(CUstream stream_handle, CUevent handle, unsigned flags) {
  SIM_BEGIN(cuStreamWaitEvent);
  (void)flags;
  auto event = find_event(s, handle);
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, stream_handle, &error);
  if (!stream) return error;
  std::shared_ptr<Capture> captured;
  SimStream* captured_on = nullptr;
  std::size_t captured_at = 0;
  std::uint64_t target;
  {
    std::lock_guard event_lock(event->mutex);
    captured = live_capture_of(*event);
    captured_on = event->captured_on;
    captured_at = event->captured_at;
    target = event->recorded;
  }
  Capture* mine = capture_of(s, stream);
  if (captured) {
    if (mine && mine != captured.get()) {
      mine->invalidated = true;  // (two captures may not depend on each other)
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (stream == stream->context()->legacy) {
      captured->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (!mine) s.captures[stream.get()] = captured;  // a fork: the stream joins the capture
    // The stream now depends on the capture's work up to the event: work
    // that the event's stream had not had joined back is joined into this
    // one, which must be joined back in turn unless it is the origin. (A
    // fork whose stream captures nothing needs no join.)
    const auto waited = captured->unjoined.find(captured_on);
    if (captured_on != stream.get() && waited != captured->unjoined.end() && waited->second <= captured_at) {
      if (stream.get() != captured->origin) {
        std::size_t& own = captured->unjoined[stream.get()];
        own = std::max(own, waited->second);
      }
      captured->unjoined.erase(waited);
    }
    return CUDA_SUCCESS;
  }
  if (Capture* capture = capture_of(s, stream)) {  // an event from outside the capture
    capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  return run_on_stream(s, stream_handle, [event, target] {
    await_context_record(event, target);
    std::unique_lock event_lock(event->mutex);
    event->done.wait(event_lock, [&] { return event->completed >= target; });
  });
}

// --- Graphs: captured from streams (see Stream capture) ----------------------------

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream handle, int mode) {
  SIM_BEGIN(cuStreamBeginCapture);
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  if (stream == stream->context()->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (capture_of(s, stream)) return CUDA_ERROR_ILLEGAL_STATE;
  auto capture = std::make_shared<Capture>();
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->origin = stream.get();
  s.captures[stream.get()] = std::move(capture);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream handle, CUgraph* out) {
  SIM_BEGIN(cuStreamEndCapture);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  const auto found = s.captures.find(stream.get());
  if (found == s.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  const std::shared_ptr<Capture> capture = found->second;
  if (capture->origin != stream.get()) {
    capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED && capture->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  *out = nullptr;
  // Ends for every stream of it, whatever the outcome.
  std::erase_if(s.captures, [&](const auto& entry) { return entry.second == capture; });
  if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (!capture->unjoined.empty()) return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  auto graph = std::make_unique<Graph>();
  graph->context = stream->context();
  graph->operations = std::move(capture->operations);
  *out = reinterpret_cast<CUgraph>(graph.get());
  s.graphs.emplace(graph.get(), std::move(graph));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream handle, int* status) {
  SIM_BEGIN(cuStreamIsCapturing);
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, handle, &error);
  if (!stream) return error;
  const auto found = s.captures.find(stream.get());
  *status = found == s.captures.end()      ? CU_STREAM_CAPTURE_STATUS_NONE
            : found->second->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                         : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph handle, unsigned long long flags) {
  SIM_BEGIN(cuGraphInstantiate);
  const auto found = s.graphs.find(reinterpret_cast<Graph*>(handle));
  if (!out || found == s.graphs.end() || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto executable = std::make_unique<Graph>(*found->second);
  *out = reinterpret_cast<CUgraphExec>(executable.get());
  s.executables.emplace(executable.get(), std::move(executable));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  SIM_BEGIN(cuGraphLaunch);
  const auto found = s.executables.find(reinterpret_cast<Graph*>(handle));
  if (found == s.executables.end()) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto stream = resolve_stream(s, stream_handle, &error);
  if (!stream) return error;
  if (stream->context() != found->second->context) return CUDA_ERROR_INVALID_CONTEXT;
  // (A copy of the operations: the executable may be destroyed while its launch is queued.)
  return queue_or_capture(s, stream, [operations = found->second->operations] {
    for (const auto& operation : operations) operation();
  });
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec handle) {
  SIM_BEGIN(cuGraphExecDestroy);
  return s.executables.erase(reinterpret_cast<Graph*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGraphDestroy(CUgraph handle) {
  SIM_BEGIN(cuGraphDestroy);
  return s.graphs.erase(reinterpret_cast<Graph*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

namespace {
CUresult elapsed_time(float* milliseconds, CUevent start_handle, CUevent end_handle) {
  SIM_BEGIN(cuEventElapsedTime);
  if (!milliseconds) return CUDA_ERROR_INVALID_VALUE;
  auto start = find_event(s, start_handle);
  auto end = find_event(s, end_handle);
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  std::scoped_lock event_locks(start->mutex, end->mutex);
  if (start->recorded == 0 || end->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
  start->settle_context_record();
  end->settle_context_record();
  if (start->completed < start->recorded || end->completed < end->recorded) return CUDA_ERROR_NOT_READY;
  *milliseconds = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) { return elapsed_time(ms, a, b); }
SIM_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) { return elapsed_time(ms, a, b); }

// --- Modules and launches ---------------------------------------------------------

namespace {
// Finds the names of the kernels a PTX text defines (".entry name(").
std::set<std::string> ptx_entries(const char* text) {
  std::set<std::string> entries;
  const std::string ptx(text);
  for (std::size_t at = ptx.find(".entry"); at != std::string::npos; at = ptx.find(".entry", at + 6)) {
    std::size_t begin = at + 6;
    while (begin < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[begin]))) ++begin;
    std::size_t end = begin;
    while (end < ptx.size() && (std::isalnum(static_cast<unsigned char>(ptx[end])) || ptx[end] == '_' ||
                                ptx[end] == '$' || ptx[end] == '.'))
      ++end;
    if (end > begin) entries.insert(ptx.substr(begin, end - begin));
  }
  return entries;
}

CUresult load_module(Fn entry, CUmodule* out, const void* image) {
  SIM_BEGIN_AS(entry);
  SIM_CONTEXT();
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  const char* text = static_cast<const char*>(image);
  if (std::memcmp(text, "\x7f" "ELF", 4) == 0) return CUDA_ERROR_NOT_SUPPORTED;  // cubins: no
  if (!std::strstr(text, ".version") || !std::strstr(text, ".target")) return CUDA_ERROR_INVALID_PTX;
  auto module = std::make_unique<Module>();
  module->context = context;
  module->entries = ptx_entries(text);
  *out = reinterpret_cast<CUmodule>(module.get());
  s.modules.emplace(module.get(), std::move(module));
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* out, const void* image) {
  return load_module(Fn::cuModuleLoadData, out, image);
}

SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule* out, const void* image, unsigned, int*, void**) {
  return load_module(Fn::cuModuleLoadDataEx, out, image);
}

SIM_EXPORT CUresult cuModuleUnload(CUmodule handle) {
  SIM_BEGIN(cuModuleUnload);
  auto it = s.modules.find(reinterpret_cast<Module*>(handle));
  if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& function : it->second->functions) s.functions.erase(function.second.get());
  s.modules.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetFunction(CUfunction* out, CUmodule handle, const char* name) {
  SIM_BEGIN(cuModuleGetFunction);
  auto it = s.modules.find(reinterpret_cast<Module*>(handle));
  if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  Module& module = *it->second;
  if (!module.entries.count(name)) return CUDA_ERROR_NOT_FOUND;
  auto& function = module.functions[name];
  if (!function) {
    function = std::make_unique<Function>(Function{&module, name});
    s.functions.emplace(function.get(), &module);
  }
  *out = reinterpret_cast<CUfunction>(function.get());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr*, std::size_t*, CUmodule handle, const char*) {
  SIM_BEGIN(cuModuleGetGlobal);
  if (!s.modules.count(reinterpret_cast<Module*>(handle))) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_ERROR_NOT_FOUND;  // module globals are not simulated
}

namespace {
// Whether kernels of `device` may use `memory`: its own device's memory; a peer's
// cuMemAlloc memory once peer access is enabled; a driver pool's and mapped
// memory only where granted (cuMemPoolSetAccess, cuMemSetAccess), as on a GPU.
// Host and managed memory, and memory opened from another process, every device may use.
bool reachable_from(const State& s, const Allocation& memory, int device) {
  switch (memory.kind) {
    case AllocationKind::Device:
      if (memory.device == device) return true;
      if (memory.pool) return memory.pool->peers_granted.count(device) != 0;
      return s.devices[device]->peers_enabled.count(memory.device) != 0;
    case AllocationKind::VirtualMapping: return memory.granted.count(device) != 0;
    default: return true;
  }
}
}  // namespace

SIM_EXPORT CUresult cuLaunchKernel(CUfunction handle, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream stream, void** params, void** extra) {
  SIM_BEGIN(cuLaunchKernel);
  auto* function = reinterpret_cast<Function*>(handle);
  if (!s.functions.count(function)) return CUDA_ERROR_INVALID_HANDLE;
  const EmulatedKernel* kernel = find_emulated_kernel(function->name);
  if (!kernel || extra) {
    std::fprintf(stderr, "cuemm simulated driver: kernel '%s' cannot run here (no host emulation)\n",
                 function->name.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!params && !kernel->parameter_sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
  CUresult error = CUDA_SUCCESS;
  const auto queue = resolve_stream(s, stream, &error);
  if (!queue) return error;
  const int device = queue->context()->device->ordinal;
  // Parameters are copied now: the caller may reuse its storage at once.
  std::vector<std::vector<char>> copies;
  for (std::size_t i = 0; i < kernel->parameter_sizes.size(); ++i) {
    const char* bytes = static_cast<const char*>(params[i]);
    copies.emplace_back(bytes, bytes + kernel->parameter_sizes[i]);
    std::uintptr_t address = 0;
    if (copies.back().size() != sizeof address) continue;
    std::memcpy(&address, bytes, sizeof address);
    if (const Allocation* memory = s.find(address); memory && !reachable_from(s, *memory, device)) {
      // A GPU faults in the kernel, and the error comes at the next synchronisation.
      std::fprintf(stderr,
                   "cuemm simulated driver: kernel '%s' on device %d was given %#llx, memory of device %d "
                   "that device %d may not use\n",
                   function->name.c_str(), device, static_cast<unsigned long long>(address), memory->device, device);
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  return queue_or_capture(s, queue, [kernel, copies = std::move(copies)] { kernel->run(copies); });
}

SIM_EXPORT CUresult cuFuncGetAttribute(int* value, int attribute, CUfunction handle) {
  SIM_BEGIN(cuFuncGetAttribute);
  if (!value || !s.functions.count(reinterpret_cast<Function*>(handle))) return CUDA_ERROR_INVALID_VALUE;
  *value = attribute == 0 ? 1024 : 0;  // MAX_THREADS_PER_BLOCK; sizes and registers read 0
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuFuncSetCacheConfig(CUfunction handle, int) {
  SIM_BEGIN(cuFuncSetCacheConfig);
  return s.functions.count(reinterpret_cast<Function*>(handle)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_EXPORT CUresult cuLinkCreate_v2(unsigned, int*, void**, void*) {
  SIM_BEGIN(cuLinkCreate);
  return CUDA_ERROR_NOT_SUPPORTED;  // no linker in the simulation
}

SIM_EXPORT CUresult cuProfilerStart() {
  SIM_ENTER(cuProfilerStart);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuProfilerStop() {
  SIM_ENTER(cuProfilerStop);
  return CUDA_SUCCESS;
}

// --- Control API ---------------------------------------------------------------------

SIM_EXPORT unsigned long long cuemmSimLiveAllocations(int kind) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  unsigned long long count = 0;
  for (const auto& [base, allocation] : s.allocations) {
    if (kind < 0 || static_cast<int>(allocation.kind) == kind) ++count;
  }
  return count;
}

SIM_EXPORT unsigned long long cuemmSimLiveStreams() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  unsigned long long count = 0;
  for (const auto& context : s.contexts) count += context->streams.size();
  return count;
}

SIM_EXPORT int cuemmSimSetDeviceAttribute(int ordinal, int attribute, int value) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device* device = device_at(s, ordinal);
  if (!device || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return 1;
  if (value < 0) {
    device->attribute_overrides.erase(attribute);
  } else {
    device->attribute_overrides[attribute] = value;
  }
  return 0;
}

SIM_EXPORT unsigned long long cuemmSimDeviceBytesInUse(int ordinal) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Device* device = device_at(s, ordinal);
  return device ? device->used : 0;
}
