// driver_internals.hpp: what the simulated driver's files share.
//
// The simulated driver (libcuemm_simdriver.so) runs without a GPU. It exports
// the driver API under the symbol names libcuda exports (cuMemAlloc_v2 and so
// on), so any program that dlopens libcuda can load it instead: cuemm itself,
// or classic Numba through NUMBA_CUDA_DRIVER. sim/api/ holds the entry
// points, a file per part of the API; this header, driver_internals.cpp and
// capture_rules.cpp the state and the rules they share (sim_state.hpp the
// state's types, stream_engine.hpp the streams' worker threads).
//
// Configuration (read at cuInit):
//   CUEMM_SIM_DEVICES      number of devices (default 1; 0 makes cuInit fail)
//   CUEMM_SIM_MEMORY       bytes per device, with K/M/G/T suffixes (default 16G)
//   CUEMM_SIM_PEER_ACCESS  1 lets devices map each other's memory (default 0)
//   CUEMM_SIM_FAULTS       fault injection, see call_log.hpp
//
// What it does not do: execute PTX (see kernels.hpp), link modules, capture
// stream-ordered allocations (graph memory nodes: refused on a capturing
// stream), or keep an exported block alive after its owner frees it while
// another process has it open (on a GPU the driver would).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "call_log.hpp"
#include "kernels.hpp"
#include "sim_control.h"
#include "sim_state.hpp"
#include "util/byte_size.hpp"
#include "util/round_up.hpp"

namespace cuemm::sim {

inline constexpr std::size_t kDeviceAlignment = 512;       // what cuMemAlloc guarantees, and more
// The device's page, as the H100's driver deals in it: a device's memory is
// whole pages; cuMemAlloc of more than a page takes whole pages, and nothing
// else is placed in the last one's idle end, while smaller blocks share pages
// (bench/probes/probe_alloc_granularity.cpp: 2 MiB + 1 byte and 3 MiB take
// 4 MiB of its free memory, 4.2 and 6 MiB take 6; 32 blocks of 64 KiB take
// 2 MiB; Note [cuMemAlloc's shared pages]); a stream-ordered pool reserves
// and keeps whole pages; virtual memory maps them.
inline constexpr std::size_t kDevicePage = SharedPages::kPage;
inline constexpr std::size_t kPunchThreshold = 2u << 20;   // return pages of freed blocks this large
inline constexpr int kDriverVersion = 13000;
inline constexpr const char* kDeviceName = "cuemm simulated GPU";
inline constexpr std::uint32_t kIpcMagic = 0x4d495043;     // "CPIM"

std::size_t page_size();
// A byte count from the environment; unset, unparsable or zero keeps the default.
std::size_t bytes_from_environment(const char* variable, std::size_t fallback);

// --- Contexts (driver_internals.cpp) ---
// Per thread: the context stack, and the per-thread default stream of each context.
extern thread_local std::vector<Context*> context_stack;
// A thread's per-thread streams end with it, as the driver's do: kept, each
// would stay in its context's streams, which every operation on the legacy
// stream waits for (after 16-thread benchmarks had come and gone, a seal's
// query of the legacy stream took 50 ns a pair of the pool's 256 B pairs).
struct PerThreadStreams {
  std::map<Context*, std::shared_ptr<SimStream>> of_context;
  ~PerThreadStreams();
};
extern thread_local PerThreadStreams per_thread_streams;

bool is_live(State& s, Context* context);
Context* current_context(State& s);
Context* make_context(State& s, Device* device, bool primary);
Device* device_at(State& s, CUdevice ordinal);  // null where no such device
// cuDeviceGetAttribute's answer (sim/api/devices.cpp).
int attribute_value(const Device& device, int attribute);
// Frees everything a context owns (reset, destroy, or last release of a primary).
void destroy_resources(std::unique_lock<std::mutex>& lock, State& s, Context* context);
// Waits, without the state lock, until every stream of the context is idle.
void synchronize_context(std::unique_lock<std::mutex>& lock, Context* context);

// --- Memory (driver_internals.cpp) ---
// Device memory arena, created on first use of the device.
bool ensure_arena(Device& device);
CUresult allocate_device_memory(State& s, Context* context, std::size_t size, AllocationKind kind,
                                unsigned flags, CUdeviceptr* pointer);
// Addresses in the device arena (`footprint` bytes of it, at least `size`)
// and the allocation's record, for memory whose bytes are counted by the
// caller (the device's for cuMemAlloc, a stream-ordered pool's).
CUresult place_device_memory(State& s, Context* context, std::size_t size, std::size_t footprint,
                             AllocationKind kind, unsigned flags, CUdeviceptr* pointer);
// Whether `bytes` more fit the device's capacity, once the stream-ordered
// pools other than `except` have given back the memory they keep, as the
// H100's driver takes it back for an allocation that would run out.
bool make_room(State& s, Device& device, std::size_t bytes, const MemoryPool* except = nullptr);
// Gives a stream-ordered pool's kept memory back to its device down to
// `keep` bytes reserved (never below the bytes of its blocks, page-rounded).
void trim_pool(State& s, MemoryPool& pool, std::uint64_t keep);
// Forgets a destroyed pool once its last block is freed.
void forget_pool_if_done(State& s, MemoryPool* pool);
// What a synchronisation does to the device's pools: each keeps at most
// its release threshold.
void release_past_thresholds(State& s, int device);
// Gives the memory of a cuMemCreate handle back (an imported one's stays the exporter's).
void release_physical(State& s, std::map<std::uint64_t, PhysicalMemory>::iterator it);
// Returns the allocation's memory to where it came from and forgets it.
void release_allocation(State& s, std::map<std::uintptr_t, Allocation>::iterator it);
// Maps `size` bytes at `arena_offset` of another process's device memory,
// open here as `fd`, into this process as an IpcMapping of `context` (IPC
// handles and pools shared between processes). Null when the mapping fails.
Allocation* map_exported_memory(State& s, Context* context, int fd, std::uint64_t arena_offset, std::uint64_t size,
                                int device, std::uint64_t id, int exporter_pid);
// Device-accessible memory: device, managed, opened IPC, and page-locked host
// memory (which UVA maps into every context).
bool device_accessible(State& s, CUdeviceptr pointer, std::size_t size);

// --- Streams (driver_internals.cpp) ---
std::vector<std::shared_ptr<SimStream>> all_streams_of(Context* context);
// The stream a handle names in the current context: 0 and CU_STREAM_LEGACY
// are the legacy default stream, CU_STREAM_PER_THREAD this thread's stream.
std::shared_ptr<SimStream> resolve_stream(State& s, CUstream handle, CUresult* error);
// What work queued on `stream` now waits for, by the legacy default stream's
// implicit ordering.
std::vector<SimStream::Dependency> implicit_dependencies(const std::shared_ptr<SimStream>& stream);
// Queues an operation behind its implicit_dependencies() (a marker: see
// SimStream::enqueue).
std::uint64_t submit(const std::shared_ptr<SimStream>& stream, SimStream::Operation operation, bool marker = false);
// Whether work queued on `stream` now would run at once.
bool would_run_at_once(const std::shared_ptr<SimStream>& stream);
// Runs an operation on the legacy stream and, unless `wait` is false, waits
// for it: the synchronous copies and memsets.
CUresult run_synchronously(State& s, std::unique_lock<std::mutex>& lock, CUdeviceptr memory,
                           SimStream::Operation operation, bool wait = true);
// Whether a "synchronous" memset of `memory` returns before it ran.
bool memset_returns_early(State& s, CUdeviceptr memory);
// Queues `operation` on the stream `handle` names, or keeps it for its capture.
CUresult run_on_stream(State& s, CUstream handle, SimStream::Operation operation);
// The same, and waits until it has run (outside a capture): an async copy
// into pageable host memory, which CUDA returns from only once it is done.
CUresult run_on_stream_and_wait(State& s, std::unique_lock<std::mutex>& lock, CUstream handle,
                                SimStream::Operation operation);

// --- Stream capture (capture_rules.cpp) ---
extern thread_local int thread_capture_mode;  // cuThreadExchangeStreamCaptureMode

enum class DuringCapture {
  potentially_unsafe,   // cuMemAlloc, cuMemFree, cuEventQuery, cuEventSynchronize
  legacy_stream_query,  // cuStreamQuery and cuStreamSynchronize of the legacy stream
  legacy_stream_work,   // work queued on the legacy stream
  whole_context,        // cuCtxRecordEvent, cuCtxSynchronize: refused in every mode
};

// CUDA_SUCCESS where the call may go on; else the error, every capture that
// forbids it invalidated. `context`: the legacy stream's, for its rules.
CUresult check_captures(State& s, DuringCapture call, const Context* context = nullptr);
Capture* capture_of(State& s, const std::shared_ptr<SimStream>& stream);
// The capture under way that `event` was last recorded in; null where it was
// recorded outside one, or its capture has ended. Call with the event's mutex held.
std::shared_ptr<Capture> live_capture_of(const SimEvent& event);
// Queues `operation` on `stream`, or keeps it for the stream's capture; work
// on the legacy stream first meets the captures' rules.
CUresult queue_or_capture(State& s, const std::shared_ptr<SimStream>& stream, SimStream::Operation operation,
                          bool marker = false);
// Refuses a call that a capturing `stream` does not take, ending its capture.
CUresult refuse_on_a_capturing_stream(State& s, const std::shared_ptr<SimStream>& stream);
// A query or synchronisation of `stream`; of the legacy stream it meets the
// captures' rules.
CUresult check_stream_use(State& s, const std::shared_ptr<SimStream>& stream);

}  // namespace cuemm::sim

// --- The entry points' frame (sim/api/) ---

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// Most functions need cuInit first; the state lock is held as `lock`.
#define SIM_BEGIN(name) SIM_BEGIN_AS(::cuemm::sim::Fn::name)
#define SIM_BEGIN_AS(function)                    \
  if (::cuemm::sim::forked_after_init()) return CUDA_ERROR_NOT_INITIALIZED; \
  const ::cuemm::sim::DriverCall sim_driver_call; \
  if (const CUresult injected = CallLog::instance().enter(function)) return injected; \
  State& s = state();                             \
  std::unique_lock<std::mutex> lock(s.mutex);     \
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED

#define SIM_CONTEXT()                              \
  Context* context = current_context(s);           \
  if (!context) return CUDA_ERROR_INVALID_CONTEXT

#define SIM_DEVICE(ordinal)                       \
  Device* device = device_at(s, ordinal);         \
  if (!device) return CUDA_ERROR_INVALID_DEVICE

// `variable`: the stream `handle` names (resolve_stream), or the call returns its error.
#define SIM_STREAM(variable, handle)                                     \
  CUresult variable##_error = CUDA_SUCCESS;                              \
  auto variable = resolve_stream(s, handle, &variable##_error);          \
  if (!variable) return variable##_error
