// sim_state.hpp: the simulated driver's devices, contexts and allocation table.
//
// Device memory: each device owns an arena, a memfd of CUEMM_SIM_MEMORY bytes
// mapped MAP_SHARED|MAP_NORESERVE, so pages exist only once touched (capacity
// can exceed host RAM) and another process can map the same pages for IPC
// through /proc/<pid>/fd/<fd>. Device pointers are the arena's host addresses:
// one unified address space, as on a real GPU with UVA, so copies are memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"
#include "shared_pages.hpp"
#include "stream_engine.hpp"
#include "util/range_allocator.hpp"

namespace cuemm::sim {

using namespace cuemm::cuda;

enum class AllocationKind { Device = 0, Managed = 1, PinnedHost = 2, RegisteredHost = 3, IpcMapping = 4, VirtualMapping = 5 };
inline constexpr int kAllocationKinds = 6;

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  AllocationKind kind = AllocationKind::Device;
  Context* context = nullptr;
  int device = 0;
  unsigned flags = 0;
  std::size_t arena_offset = 0;  // Device, Managed: where the block sits in the arena
  std::size_t arena_size = 0;    // rounded size taken from the arena
  std::optional<std::size_t> shared_page_offset;  // Device from cuMemAlloc, at most a page: in Device::shared_pages
  std::size_t mapping_size = 0;  // PinnedHost, IpcMapping: length of the mmap
  void* mapping = nullptr;       // IpcMapping: page-aligned start of the mmap
  std::uint64_t id = 0;          // IpcMapping: exporter's allocation id
  int exporter_pid = 0;          // IpcMapping
  int ipc_opens = 0;             // IpcMapping: opens not yet closed
  bool pool_import = false;      // IpcMapping: from cuMemPoolImportPointer (freed by cuMemFree)
  struct MemoryPool* pool = nullptr;  // Device memory from cuMemAllocFromPoolAsync
  std::uint64_t physical = 0;         // VirtualMapping: the cuMemCreate handle mapped here
  std::set<int> granted;              // VirtualMapping: the devices cuMemSetAccess let use it
};

// Device memory from cuMemCreate: a range of the device's arena, mapped into
// reserved addresses by cuMemMap. Gone once released and no longer mapped.
// Memory created shareable lives in a memfd of its own instead (the arena's
// range still counts it against the device's capacity), so that its
// descriptor can go to another process; there it is imported (no range).
struct PhysicalMemory {
  int device = 0;
  std::size_t arena_offset = 0;
  std::size_t size = 0;
  int mappings = 0;
  bool released = false;
  int fd = -1;            // shareable or imported: the memory's own memfd
  bool imported = false;  // cuMemImportFromShareableHandle: another process's memory
};

// A stream-ordered pool. It reserves device memory in steps of 32 MiB and
// keeps what its blocks free (counted against the device) until a
// synchronisation trims it to the release threshold, cuMemPoolTrimTo trims
// it, or another allocation on the device would run out without it: what
// bench/probes/probe_pool_reserve.cpp measured on the H100. Its kept bytes
// are a count, not places: a block's addresses come from the device arena,
// so any kept bytes serve any request (the H100's pool remaps its pages),
// and the arena's freed pages go back to the host as a cuMemFree's do.
struct MemoryPool {
  int device = 0;
  int handle_types = 0;
  std::uint64_t release_threshold = 0;
  std::uint64_t used = 0, used_high = 0;
  std::uint64_t reserved = 0, reserved_high = 0;  // used, and the freed bytes kept
  bool destroyed = false;  // forgotten once its last block is freed
  int imported_fd = -1;    // imported (cuMemPoolImportFromShareableHandle): the exporter's device memory
  bool exported = false;   // cuMemPoolExportToShareableHandle has run: its blocks may be exported
  std::set<int> peers_granted;  // cuMemPoolSetAccess: other devices that may use its blocks
};

struct Device {
  int ordinal = 0;
  std::size_t capacity = 0;
  int memfd = -1;
  char* arena = nullptr;
  std::unique_ptr<util::RangeAllocator> ranges;
  std::size_t used = 0;
  SharedPages shared_pages;  // the pages that cuMemAlloc's small blocks share (counted in `used`)
  Context* primary = nullptr;
  std::set<int> peers_enabled;  // devices whose cuMemAlloc memory this one's kernels may use
  std::map<int, int> attribute_overrides;  // set by tests: a device without a feature (cuemmSimSetDeviceAttribute)
};

struct Module {
  Context* context = nullptr;
  std::set<std::string> entries;
  std::map<std::string, std::unique_ptr<struct Function>> functions;
};

struct Function {
  Module* module = nullptr;
  std::string name;
};

struct Context {
  static constexpr std::uint32_t kMagic = 0x43545853;  // "SXTC"
  std::uint32_t magic = kMagic;
  Device* device = nullptr;
  bool primary = false;
  int retains = 0;
  unsigned flags = 0;
  std::shared_ptr<SimStream> legacy;
  std::set<std::shared_ptr<SimStream>> streams;  // created and per-thread streams
};

// A stream capture under way (cuStreamBeginCapture): the work queued on its
// streams is kept for a graph instead of run. Other streams join it by
// waiting for an event recorded on one of its streams, and must be joined
// back (the origin, or another of its streams, waits for an event recorded
// after their last work) before it ends. Its operations are kept in the
// order they were queued, which respects every dependency among them: a
// graph's launch runs them in that order.
struct Capture {
  int mode = 0;  // CU_STREAM_CAPTURE_MODE_*
  std::thread::id thread;
  SimStream* origin = nullptr;
  bool invalidated = false;
  std::vector<SimStream::Operation> operations;
  // Streams besides the origin whose latest work has not been joined back:
  // the number of operations captured up to and including it.
  std::map<SimStream*, std::size_t> unjoined;
};

// A captured graph (CUgraph), or one instantiated (CUgraphExec): its
// operations, run in order on the stream it is launched on.
struct Graph {
  Context* context = nullptr;
  std::vector<SimStream::Operation> operations;
};

struct State {
  std::mutex mutex;
  bool initialized = false;
  bool peer_access = false;
  std::vector<std::unique_ptr<Device>> devices;
  std::set<Context*> contexts;  // live, for handle validation
  std::vector<std::unique_ptr<Context>> context_storage;
  std::map<std::uintptr_t, Allocation> allocations;  // keyed by base address
  std::map<SimStream*, std::shared_ptr<SimStream>> streams;
  std::map<SimEvent*, std::shared_ptr<SimEvent>> events;
  std::map<Module*, std::unique_ptr<Module>> modules;
  std::map<Function*, Module*> functions;
  std::map<MemoryPool*, std::unique_ptr<MemoryPool>> pools;
  std::map<std::uintptr_t, std::size_t> reservations;  // cuMemAddressReserve: base -> bytes
  std::map<std::uint64_t, PhysicalMemory> physical;    // cuMemCreate handles
  std::map<SimStream*, std::shared_ptr<Capture>> captures;  // by stream: its origin and the streams joined to it
  std::map<Graph*, std::unique_ptr<Graph>> graphs;
  std::map<Graph*, std::unique_ptr<Graph>> executables;
  std::uint64_t next_physical_handle = 1;
  std::uint64_t next_allocation_id = 1;

  // The allocation that contains [address, address + size), or nullptr.
  Allocation* find(std::uintptr_t address, std::size_t size = 1);
};

// The process-wide state. Never destroyed: stream workers may outlive static
// destruction at exit.
State& state();

// Whether this process is a child forked after cuInit succeeded (in the
// parent). As libcuda, the driver then refuses every call that needs cuInit,
// cuInit too, with CUDA_ERROR_NOT_INITIALIZED: the state and its locks are the
// parent's copy, and its stream workers are not in the child.
bool forked_after_init() noexcept;
// Registers what sets it (cuInit, once it succeeds).
void watch_for_forks();

}  // namespace cuemm::sim
