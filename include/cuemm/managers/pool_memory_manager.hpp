// cuemm/managers/pool_memory_manager.hpp: a device memory pool (CUEMM_MEMORY_MANAGER=pool).
//
// Suballocates device memory from large driver allocations (segments). Requests
// up to 1 MiB are rounded to a size class (Note [Size classes]) and served from
// a per-thread cache without a lock; cache misses and requests under 4 MiB go
// to O(1) two-level segregated fit indexes (see TlsfBlockAllocator) under one
// lock, so neither path scans anything: one for the classes' blocks, in 2 MiB
// segments of their own (Note [Small blocks apart]), one for larger blocks.
// Blocks of 4 MiB and more get a segment of their own, kept as a spare when
// freed (Note [Dedicated segments]). Host memory comes from
// HostOnlyMemoryManager.
//
//   PoolOptions options;
//   options.initial_size = 1ull << 30;            // CUEMM_POOL_INITIAL_SIZE
//   options.maximum_size = 8ull << 30;            // CUEMM_POOL_MAXIMUM_SIZE
//   options.thread_cache_size = 256ull << 20;     // CUEMM_POOL_THREAD_CACHE_SIZE
//   cuemm::set_memory_manager([options](cuemm::Context* context) {
//     return std::make_unique<cuemm::PoolMemoryManager>(context, options);
//   });
//
// Note [Stream-safe reuse]
// The EMM interface passes no stream, so a block may be freed while queued GPU
// work still uses it. Each free is tagged with the open epoch; sealing an epoch
// opens the next one and then records an event for the whole context
// (cuCtxRecordEvent), which completes once all earlier work on every stream
// has run, as cuMemFree waits for. A block is handed out again only once its
// epoch's event has completed (at once when the GPU was idle). Epochs are
// sealed in batches: when a thread's cache has taken half its capacity of
// frees for a class since it last did so, when the shared quarantine holds
// more than 1/8 of the pool, or when the pool would otherwise grow, so the hot
// path makes no driver call. A driver before CUDA 12.5 has no such event: the
// event then goes on the legacy default stream, which completes only after
// earlier work on blocking streams (an idle legacy stream needs none), and
// work on non-blocking streams is not covered: synchronise it before freeing.
//
// Note [Stream-ordered reuse]
// allocate(size, stream) and deallocate(pointer, size, stream) follow
// cudaMallocAsync's rules: the block is ready for work on `stream` at once,
// and a free says that all work using the block is queued on `stream`. On the
// default streams (legacy, or the calling thread's per-thread stream) a freed
// block then needs no event: the thread keeps it (newest first) and hands it
// to its next request on either default stream, whose work the driver orders
// after the freeing work (the legacy stream and the per-thread streams wait
// for each other). No other thread gets it until it goes to the quarantine
// (when the thread's cache is full, flushed or its thread ends, or when a
// request would take the pool past its peak: the requesting thread's kept
// blocks of other sizes and every thread's large ones go, and are sealed),
// tagged with the open epoch as every other free. A free on any other
// stream is kept the same way for that stream's requests (Note [Same-stream
// reuse]) or goes to the quarantine: the next epoch's event covers that
// stream's work. (Before CUDA 12.5 it records an event there and makes the
// legacy stream wait for it, so that the legacy stream's event covers it,
// non-blocking streams too; two driver calls, and later legacy-stream work is
// ordered after the stream's.)
//
// Note [Same-stream reuse]
// A thread also keeps its frees on a stream of the program's for its next
// requests on that stream, as RMM, PyTorch and cudaMallocAsync do: a loop on
// one stream then holds one block rather than a ring of them waiting for
// seals, even while the GPU runs behind. The thread keeps the frees of up
// to four streams, each named by a tag, the stream's id (cuStreamGetId)
// rather than its handle: a destroyed stream's handle may come back for a
// new stream, whose work would not wait for the old one's. The ordered bins
// hold one stream's; three side streams (ThreadCache::SideStream) hold up
// to 16 blocks each of the others', so a thread that takes turns between a
// few streams (a copy stream and a compute stream, say, or a stream of its
// own and the default streams, which count as one) reuses on each.
// Frees on a further stream go to the quarantine, until a kept stream has
// seen no use in 64 of the thread's frees on others
// (Core::kOrderedStreamPatience): its blocks then go there too and the new
// stream takes its place, so a thread that moves on to other streams (or
// whose streams were destroyed) reuses there. Before the pool grows past
// its peak, a request gives back what the thread keeps for its own stream
// and for streams out of turn (none of its latest 16 requests and frees on
// kept streams), not for streams in turn, whose next requests would find
// them gone (ThreadCache::gives_back()); at the pool's maximum or the
// driver's limit, everything goes back. Same-stream reuse is skipped (the
// free goes to the quarantine, the request to the pool) while the stream is
// being captured into a graph: the graph's launches would use a block kept
// during the capture, and would not wait for the work of a block freed
// before it. So a request or free on a stream whose frees the thread keeps
// (or may: one with its handle), or a free that may take a place, asks the
// driver twice (the id; whether the stream is captured), 25-40 ns a call on
// the H200; other streams' make no call. Only where the seals
// cover every stream (cuCtxRecordEvent, CUDA 12.5): kept blocks go to the
// quarantine later, when their stream's work is no longer tied to them.
//
// Note [Large blocks in the thread caches]
// A thread also keeps the blocks beyond the size classes that it frees
// without a stream (those it took itself, so that it knows their size), each
// tagged with its epoch, and its next request that one fits (wasting at most
// 1/8) takes the oldest once its epoch is safe, sealing if need be: a loop of
// large requests then takes no lock, and threads that wait for a seal share
// one. Rather than seal, it takes an idle block of the size when the pool
// has one (a finished thread's, say); and a loop (8 requests in a row that
// found a held block) whose seals have cost about as much as a new block
// gets one more from the driver. A thread of random sizes is no loop: it
// waits for the seal, and at the pool's peak gives its held blocks back
// before the pool grows. So a loop rotates
// through a few (up to 64 within the thread cache's budget; beyond it, up to
// 4 blocks whatever their size, or 32 within 2 GiB and a 16th of the
// device's memory) and seals once a rotation. A thread holds up to two
// rotations, so loops that alternate between two sizes keep both. A request
// that nothing held fits gives the lone held blocks of other sizes back to
// the quarantine (held blocks that no request fits would sit idle), and one
// that would wait for the GPU gives back everything, for the pool to wait on.
// What limits many threads of large loops: each thread needs, once a
// rotation, a seal that began after its oldest block's free, and stream
// queries do not overlap, so threads queue for the seal in flight
// (docs/pool-measurements.md has the figures, and the ways of waiting tried).
//
// Note [Small blocks apart]
// Blocks up to 1 MiB (the size classes' requests) come from segments that
// hold no larger block, as PyTorch's small pool. The thread caches keep
// freed blocks for their class until a request of the class takes them or
// the pool would grow; among larger blocks, blocks kept that long split the
// free space that a larger request needed, so the pool grew beside it.
// Simulated driver, seeds 1-8, peak reserved over peak live, sharing the
// segments -> apart: training steps whose layers keep sizes of their own
// 1.25 -> 1.18, with round sizes 1.047 -> 1.019; RMM's random workloads
// within their noise (docs/pool-measurements.md). A small segment is one
// 2 MiB page where a request found no free block (a larger step reserved
// more: 4 MiB read 1.19 on those steps, and up to 256 KiB with 64 MiB live
// 1.25 rather than 1.18); where a loop's seals bought it
// (Growth::bought_by_seals), room for as many blocks as the loop's ring
// holds, at least 4, up to 64 MiB: the ring doubles with each purchase. (A
// loop of 1 MiB pairs, simulated: with room for 4 its ring sealed once per
// 128 pairs after 800,000 pairs and 33 segments, now after 100,000 and 7;
// 256 KiB pairs once per 256 after 100,000 rather than over 800,000; the
// seed workloads' reserved over live the same.) With an initial size, small
// segments are carved from the initial segment's free space first, so that
// the memory reserved up front serves every size; where a new small segment
// would take the pool past its peak, a small block takes a hole of the shared
// segments no larger than the largest request they grew for (a hole such
// requests could not use; a new segment's free end stays theirs): RMM's
// random workload up to 4 MiB with 512 and 128 MiB live, seeds 1-16,
// 1.19 -> 1.16 and 1.41 -> 1.37, the rest the same; at the driver's limit or
// the pool's maximum, any of their free space. Entirely free small segments
// go back (to the driver, or to the initial segment) with trim() and before
// an allocation fails. Not in the expandable arena, whose free pages go back
// anyway.
// PoolOptions::small_blocks_apart.
//
// Note [Rings set aside]
// In the expandable arena, a thread whose requests keep finding their size
// class's ring empty while its other rings hold blocks (128 such misses in a
// window with fewer than 256 frees into the rings: sizes that vary, not a
// loop, whose ring waiting for its seal is no such miss) sets its rings
// aside: what they hold, and its frees, go to the quarantine and so to the
// index, until it has missed 16,384 more requests; then it tries its rings
// again. A freed block kept in a ring stays apart from its free neighbours
// until a request of its class comes, so a queue's frees, neighbours one
// after another, never merge into a hole that its next block of another
// size fits. Simulated, seeds 1-8, the expandable pool's reserved over live
// (worst seed): queues up to 1 / 4 MiB 1.115 (1.128) / 1.134 (1.160) ->
// 1.041 (1.056) / 1.065 (1.092); per-layer training 1.178 (1.226) -> 1.143;
// RMM's workload up to 256 KiB with 64 MiB live 1.186 (1.399) -> 1.157
// (1.224), up to 4 MiB with 128 MiB live 1.246 (1.297) -> 1.198 (1.219) and
// with 512 MiB 1.100 -> 1.084; up to 1 MiB with 512 MiB live 1.116 (1.143)
// -> 1.134 (1.224), where requests still round to their class (without
// thread caches they do not: 1.10), the others within 0.01. Not for the
// cuMemAlloc segments, whose small segments keep such holes apart anyway
// (queues read 1.19 / 1.21 either way), and whose random workloads took up
// to 1.8x the time an operation (docs/pool-measurements.md).
//
// Out of memory: reclaim completed epochs, wait for pending ones, grow, and if
// the driver is out of memory, flush the thread caches, return empty segments
// and flush the host-side pending frees, then retry once before throwing
// OutOfMemory.
//
// defer_cleanup(): blocks still return to the pool at once; empty segments are
// not returned to the driver (trim() does nothing) until the guard ends.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuemm/managers/detail/tlsf_block_allocator.hpp"
#include "cuemm/memory/host_only_memory_manager.hpp"
#include "cuemm/memory/raw_device_allocator.hpp"
#include "cuemm/memory/stream_ordered_allocator.hpp"

namespace cuemm {
namespace detail {
class RawFreeChecker;
}

struct PoolOptions {
  std::size_t initial_size = 0;  // reserved at initialize(); 0 reserves nothing up front
  std::size_t maximum_size = 0;  // 0: no limit but the device's; else at least kSegmentGranularity
  // Bytes each thread may keep cached for reuse without a lock (large
  // blocks: also room for 4 of the size, or for 16 within 1 GiB; Note
  // [Large blocks in the thread caches]); 0 turns the per-thread caches off.
  // CUEMM_POOL_THREAD_CACHE_SIZE. A loop seals (a stream query) once per
  // half of its class's ring, and the ring holds this many bytes: on the
  // H100, 1 MiB pairs took 69 ns from one thread with 64 MiB, 46 with 128
  // MiB (10 -> 4.9 ns in aggregate from 16 threads), and 40-43 against 46-49
  // with 256 MiB (3.0-3.1 against 3.4-4.1 from 16), its seals 7.8 per 1000
  // pairs rather than 15.6. A cache's blocks go back to the pool when another
  // thread runs out of memory, and other threads' idle classes when the pool
  // would grow.
  std::size_t thread_cache_size = std::size_t{256} << 20;
  // Requests of this size and more get a driver allocation of their own
  // (Note [Dedicated segments]); in the expandable arena only where its last
  // 2 MiB page would leave at most an eighth of the block idle, the others
  // packed beside their neighbours (Note [Own segments in the arena], in
  // pool/core.hpp); CUEMM_POOL_DEDICATED_SIZE. 0 gives every
  // block its own, so every IPC handle has offset 0: for programs that open
  // raw handles without the offset (see docs/ipc-offsets.md).
  std::size_t dedicated_size = std::size_t{4} << 20;
  // One range of addresses, mapped page by page under the blocks handed out
  // (Note [Expandable arena]): less memory reserved for the same blocks, as
  // free space does not end at a segment's boundary and free pages go back
  // to the driver rather than the pool pass its peak (Note [Pages given
  // back]). Their IPC handles are cuemm's own (no cuIpcGetMemHandle), which
  // only cuemm opens. CUEMM_POOL_EXPANDABLE=1.
  bool expandable = false;
  // With `expandable`: where mapping a request's pages would take the pool
  // near its peak footprint (within a quarter of it) or past it, a block
  // larger than half a page is made of the free end of one mapped page and
  // the free start of another (with new pages between, for a larger block),
  // mapped again at addresses of its own (Note [Assembled blocks]); near the
  // peak, requests also take their good fit rather than a larger block whose
  // pages are mapped. Less memory at the peak for more driver calls (RMM's
  // workload up to 4 MiB with 128 MiB live, simulated: 1.235 -> 1.13
  // reserved over live; README, "Assembled blocks", has the H100's figures).
  // For programs short of memory. CUEMM_POOL_ASSEMBLE_BLOCKS=1.
  bool assemble_blocks = false;
  // At the pool's peak, a request for a segment of its own whose exact size
  // was asked for before is carved from a spare segment (best fit, in an
  // index of such spares) rather than the spares going back to the driver
  // and a new segment coming (Note [Recurring large sizes]). A training loop
  // whose phases hold different large sizes then reaches steps with no
  // driver call (each cuMemFree waits for the device), for a larger
  // footprint: on training steps whose layers keep sizes of their own, 1.3-1.55x
  // the live bytes rather than 1.15-1.3x, and no cuMemAlloc or cuMemFree after
  // the first steps rather than up to 15 a step (simulated driver). Sizes that
  // do not recur are unaffected. CUEMM_POOL_SPLIT_SPARES=1.
  bool split_spares = false;
  // Blocks up to 1 MiB in 2 MiB segments that hold no larger block (Note
  // [Small blocks apart]); CUEMM_POOL_SMALL_BLOCKS_APART=0 shares the
  // segments. Ignored with `expandable`.
  bool small_blocks_apart = true;
  // How far past its peak footprint the pool may grow, as a fraction of the
  // peak, rather than wait for a busy GPU: giving spares back waits for all
  // the GPU's queued work (cuMemFree does), as does waiting for freed blocks
  // (Note [Growth while the GPU is busy], in pool/core.hpp). Up to its peak
  // it grows rather than wait whatever this is. A wait forced while the GPU
  // is busy doubles it, up to twice this, until the GPU reads idle at such a
  // decision. 0 keeps the footprint within the peak, waiting where it must.
  // CUEMM_POOL_BUSY_OVERSHOOT.
  double busy_overshoot = 0.125;
  // Pinned and mapped host memory from a PinnedHostPool (CUEMM_PINNED_HOST_POOL=0 turns it off),
  // which keeps this many bytes of released blocks once idle (CUEMM_PINNED_MAXIMUM_CACHED).
  bool pinned_host_pool = true;
  std::size_t pinned_maximum_cached = PinnedHostPoolOptions{}.maximum_cached_bytes;
  // Checks each raw deallocate() against a record of the blocks that the raw
  // allocate() handed out: a second free, a pointer the pool did not hand out
  // (or handed out before a reset()), or a size other than the one asked
  // for is reported on stderr, counted in PoolStatistics::rejected_frees and
  // not freed. Off by default: the record takes a lock at each raw
  // allocation and free. (Without it a misaligned pointer is still refused;
  // memalloc's pointers free themselves once, either way.)
  // CUEMM_POOL_CHECK_FREES=1.
  bool check_frees = false;
  static PoolOptions from_environment();
  // InvalidArgument naming the option where no pool could work with these
  // (a maximum under one segment, an initial size over the maximum, an
  // overshoot out of range) or where one would be ignored (assembled blocks
  // without `expandable`). The constructor checks; so does `cuemm info`.
  void check() const;
};

struct PoolStatistics {
  std::size_t reserved_bytes = 0;     // taken from the driver
  std::size_t in_use_bytes = 0;       // in blocks handed out (rounded sizes)
  std::size_t quarantined_bytes = 0;  // freed, waiting for the GPU (see Note [Stream-safe reuse])
  std::size_t cached_bytes = 0;       // freed into the per-thread caches (stream-ordered frees too)
  std::size_t segments = 0;
  std::size_t free_blocks = 0;
  // Epochs sealed so far, two driver calls each (an event recorded for the
  // context and queried; Note [Stream-safe reuse]): what the stream-less
  // interface pays for reuse; a loop pays one per rotation.
  std::size_t seals = 0;
  // Driver calls so far that took memory (a segment's cuMemAlloc, or an
  // expandable arena's cuMemCreate and map) and that gave it back: what a
  // workload pays the driver (0.1 ms or so a call) once the pool stops
  // finding blocks of its own, as with large sizes that vary (Note
  // [Dedicated segments]).
  std::size_t driver_allocations = 0;
  std::size_t driver_frees = 0;
  // Spare segments of their own that became shared segments where those
  // would otherwise have grown past the pool's peak (Note [Dedicated
  // segments]): growth that cost neither memory nor a driver call.
  std::size_t spares_taken_over = 0;
  // With PoolOptions::assemble_blocks: blocks made so far of the free ends of
  // mapped pages (Note [Assembled blocks]), each instead of mapping more pages.
  std::size_t blocks_assembled = 0;
  // Waits for the GPU's queued work that the pool did not make: where it
  // would have given spares back (cuMemFree waits for all of it) or waited
  // for freed blocks, it grew instead, within its peak or
  // PoolOptions::busy_overshoot past it (Note [Growth while the GPU is
  // busy], in pool/core.hpp).
  std::size_t gpu_waits_avoided = 0;
  // Large blocks freed by a thread that did not take them, while another
  // worked in the pool, queued for it rather than waiting for the pool's
  // lock (Note [Large frees from another thread], in pool/core.hpp).
  std::size_t queued_large_frees = 0;
  // Blocks of the size classes queued so: the frees of a class that their
  // thread does not ask for, once another thread has taken back what its
  // cache kept of it (Note [Classes a thread frees for others]).
  std::size_t queued_small_frees = 0;
  // Raw deallocate()s refused: a pointer no block starts at (see PoolOptions::check_frees).
  std::size_t rejected_frees = 0;
};

// One of the pool's driver allocations, as PoolMemoryManager::segments()
// lists them: where the pool's free bytes lie, which its totals do not say.
// Free means free in the pool's index; blocks that threads' caches keep or
// that wait for the GPU (PoolStatistics::cached_bytes, quarantined_bytes)
// count as held.
struct PoolSegment {
  enum class Kind {
    shared,        // the shared segments of blocks above the small classes
    small,         // small blocks apart (Note [Small blocks apart]); those carved
                   // from the initial segment lie inside it, which counts them held
    own,           // a large block's segment of its own, in use or spare (Note [Dedicated segments])
    split_spares,  // spares split for recurring sizes (PoolOptions::split_spares)
    arena,         // the expandable pool's one range (PoolOptions::expandable)
  };
  Kind kind = Kind::shared;
  std::uintptr_t address = 0;
  std::size_t size = 0;          // its addresses
  std::size_t mapped_bytes = 0;  // device memory under them: less than size only in the arena
  std::size_t free_bytes = 0;
  std::size_t free_blocks = 0;
  std::size_t largest_free_block = 0;
};
const char* to_string(PoolSegment::Kind kind) noexcept;

class PoolMemoryManager : public HostOnlyMemoryManager, public RawDeviceAllocator, public StreamOrderedAllocator {
 public:
  // Blocks are multiples of this (and the returned pointers aligned to it).
  static constexpr std::size_t kBlockGranularity = 256;
  // Segments are multiples of this: the driver maps device memory in 2 MiB pages.
  static constexpr std::size_t kSegmentGranularity = std::size_t{2} << 20;
  // The most PoolOptions::busy_overshoot may be: four times the peak.
  static constexpr double kLargestBusyOvershoot = 4.0;

  explicit PoolMemoryManager(Context* context, PoolOptions options = PoolOptions::from_environment());
  ~PoolMemoryManager() override;

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override;
  // RawDeviceAllocator: memalloc's memory without its pointer object (for adaptors).
  Allocation allocate_raw(std::size_t size) override;

  // The raw interface, without a MemoryPointer (as RMM's and PyTorch's):
  // `size` bytes of device memory, 256-byte aligned, in this pool's context.
  cuda::CUdeviceptr allocate(std::size_t size);
  // Gives back a block from allocate(); `size` must be the size it was asked
  // with, and the block must not have been freed, nor the pool reset, since
  // (PoolOptions::check_frees checks all three).
  void deallocate(cuda::CUdeviceptr pointer, std::size_t size) noexcept;
  // Stream-ordered (Note [Stream-ordered reuse]): as RMM's allocate and
  // deallocate on a stream, and PyTorch's raw_alloc and raw_delete on its
  // current stream. A block from either allocate() may be freed by either
  // deallocate().
  // (StreamOrderedAllocator's; final, so calls through the pool's own type
  // are direct.)
  cuda::CUdeviceptr allocate(std::size_t size, cuda::CUstream stream) final;
  void deallocate(cuda::CUdeviceptr pointer, std::size_t size, cuda::CUstream stream) noexcept final;

  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) override;
  // Driver free memory plus the pool's free bytes; the device total. Under a
  // maximum size, at most what the maximum leaves, and at most the maximum.
  MemoryInfo get_memory_info() override;

  // Returns every entirely free segment to the driver (after reclaiming
  // completed epochs); returns the bytes released.
  std::size_t trim();
  PoolStatistics statistics() const;
  // Every segment, by address, with its free space: what a fragmented pool
  // looks like (`cuemm replay --segments`, Python's cuemm.segments()). Walks
  // every block under the pool's lock, which requests then wait for (1-2 ms
  // with 131,072 blocks, 52,774 of them free, on the simulated driver's
  // host): a diagnostic, not for a program's hot path.
  std::vector<PoolSegment> segments() const;
  const PoolOptions& options() const noexcept { return options_; }

  struct Core;  // implementation: the state the pointers' finalizers reach; see src/managers/pool/core.hpp

 protected:
  void on_initialize() override;
  void on_reset() override;
  CleanupGuard on_defer_cleanup() override;

 private:
  // The raw interface's paths off its fast one (stream: null for the
  // stream-less forms): allocate() with the record or during a capture, and
  // deallocate() when the pointer is misaligned, there is a record (which
  // refuses and reports a free that no live block matches), or blocks are
  // kept for a capture.
  [[gnu::noinline]] cuda::CUdeviceptr allocate_off_the_fast_path(std::size_t size, const cuda::CUstream* stream);
  [[gnu::noinline, gnu::cold]] void deallocate_off_the_fast_path(cuda::CUdeviceptr pointer, std::size_t size,
                                                                 const cuda::CUstream* stream) noexcept;
  static cuda::CUdeviceptr allocate_unrecorded(Core& core, std::size_t size, cuda::CUstream stream);
  static void deallocate_unchecked(Core& core, cuda::CUdeviceptr pointer, std::size_t size,
                                   cuda::CUstream stream) noexcept;
  // The raw interface during a graph capture (CaptureScope): a block that a
  // capturing thread allocates is kept by its scope's GraphMemory (freed at
  // once where that fails), and its raw free only drops the program's
  // reference to it. A stream-ordered free lets the thread's later requests
  // on that stream take the block again (stream order makes it safe, as
  // for the driver's graph allocations): reused_captured_raw_block().
  bool capture_under_way() const noexcept;
  [[gnu::noinline, gnu::cold]] void keep_captured_raw_block(cuda::CUdeviceptr address, std::size_t size);
  // A block let go on `stream` during the thread's capture that holds
  // `size` bytes, now the program's again; 0 where none.
  cuda::CUdeviceptr reused_captured_raw_block(std::size_t size, cuda::CUstream stream);
  // The program's reference to a kept block at `address`, until its raw free.
  void hold_for_the_program(cuda::CUdeviceptr address, const std::shared_ptr<MemoryPointer>& block);
  // True where `pointer` was such a block (and its reference is dropped);
  // `stream`: that of a stream-ordered free.
  bool let_go_of_captured_raw_block(cuda::CUdeviceptr pointer, std::size_t size,
                                    const cuda::CUstream* stream) noexcept;

  // The core that serves requests. Requests read it without a lock while a
  // reset() may replace it (Note [Resets under way], in pool/core.hpp):
  // cores are never deleted, so the pointer stays valid.
  Core& core() const noexcept { return *current_core_.load(std::memory_order_acquire); }
  // Runs `allocate` (on a core, returning an address) on the current core;
  // returns the core that served it (a successor where a reset retired that
  // core meanwhile) and the address.
  template <typename Allocate>
  std::pair<Core*, std::uintptr_t> on_current_core(Allocate&& allocate);
  // StateError for an instance made without a context (to read its version).
  void refuse_without_a_context() const;
  // memalloc's and allocate_raw()'s block, whose holder frees it into the
  // core returned (Numba's retry after a flush included).
  std::pair<Core*, std::uintptr_t> allocate_for_a_holder(std::size_t size, int size_class);

  PoolOptions options_;
  std::shared_ptr<Core> core_;  // owns the current core; replaced under reset_mutex_
  std::atomic<Core*> current_core_;
  // The core the next reset() puts in place, made ahead, so that a reset
  // still succeeds where the host has run out of memory (an adaptor above
  // has forgotten its blocks by then). Under reset_mutex_.
  std::shared_ptr<Core> next_core_;
  std::mutex reset_mutex_;
  // Read beside core_ on the raw interface's fast path: the context (or
  // null), asked at each allocation whether a graph is being captured, and
  // whether any raw block is kept for a capture, asked at each free.
  Context* const core_context_;
  std::atomic<bool> has_captured_raw_{false};
  std::unique_ptr<detail::RawFreeChecker> free_checker_;  // with options_.check_frees
  std::atomic<std::size_t> rejected_frees_{0};
  std::mutex captured_raw_mutex_;
  std::unordered_map<cuda::CUdeviceptr, std::shared_ptr<MemoryPointer>> captured_raw_;
};

}  // namespace cuemm
