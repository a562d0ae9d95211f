// cuemm/runtime/capture_scope.hpp: telling the managers that a CUDA graph is
// being captured, and keeping the memory that the graph's work uses.
//
// No capture survives an event recorded for the whole context or a
// synchronisation of it, which the pools' seals use (so that a freed block
// waits for the work queued before its free, on every stream); in the
// default (global) capture mode, allocations and frees from any thread end
// it too (bench/probes/probe_capture.cpp). Open a scope before
// cuStreamBeginCapture and close it after cuStreamEndCapture:
//
//   std::shared_ptr<cuemm::GraphMemory> memory;
//   {
//     cuemm::CaptureScope capture(context);
//     cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
//     auto scratch = context.memalloc(size);   // any thread may allocate and free
//     ... kernels on `stream` that use `scratch` ...
//     scratch.reset();                         // kept: the graph's launches use it
//     cuStreamEndCapture(stream, &graph);
//     memory = capture.memory();
//   }
//   ... launch the graph as often as needed; destroy it, then memory.reset() ...
//
// Meanwhile the pools seal nothing: blocks that other threads free during
// the scope are reused only after it, and the pools grow rather than wait
// for the GPU. Every manager's driver calls run with the thread's capture
// mode relaxed (ScopedContext).
//
// A graph's launches write the addresses that its capture saw, so a block
// that the program freed during the capture must not serve anyone else while
// the graph may still be launched: the scope keeps every block that its own
// thread allocates through the context (memalloc, memhostalloc, mempin,
// memallocmanaged) or through a PoolMemoryManager's raw interface, whose
// deallocate() then only lets go, while it is open, freed or not, in its
// GraphMemory. Hold that as long as the graph may be launched;
// the blocks the program has freed go back to their manager when its last
// reference goes (after the graph's last launch was queued: the managers'
// usual stream safety covers the launches still running). Drop references
// rather than call MemoryPointer::free(), which releases a block at once
// whatever keeps it (the scope reports such frees on stderr). A scope whose
// memory() nobody took gives them back when it closes. Other threads'
// allocations are not kept (their work is not the capture's), unless such a
// thread records into the capture too and says so with a CaptureScope::Member
// (below): its blocks are then kept as well.
//
// Within the capture, a block let go is reused only where the program says
// that it is safe: the stream-less interface does not say which of the
// capture's streams used it. With CaptureScope::Reuse::in_capture_order,
// the capture's uses of the thread's blocks are ordered as the thread let
// them go (all on one stream, say, as PyTorch's private pools assume): a
// later device request of the thread then takes the smallest device block
// let go that holds it and wastes at most half of it (a view of it), so the
// capture holds about its scratch blocks' peak rather than their sum. A
// member thread's blocks serve no stream-less request (nothing orders its
// work after the scope's thread's), and its own stream-less requests take
// none. A stream-ordered free says which stream used a block: a block that a
// thread of the scope frees through a pool's raw interface on a stream
// serves the scope's later requests on that stream in either mode (stream
// order puts the graph's later work there after the block's last use, as for
// the driver's own graph allocations); a request on another stream or
// without one does not take it.
// Graphs that are only ever launched one after another on one stream may
// share their memory: open the next capture's scope with the GraphMemory of
// the one before, and its requests reuse what that graph let go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuemm/memory/memory_pointer.hpp"
#include "cuemm/runtime/context.hpp"

namespace cuemm {

// The blocks that a capture's thread allocated while its CaptureScope was open.
class GraphMemory {
 public:
  std::size_t blocks() const;
  std::size_t bytes() const;
  // Of those, the ones the program has let go: only this object keeps them.
  std::size_t blocks_freed_by_the_program() const;
  // Those freed with MemoryPointer::free(), which releases at once whatever
  // keeps a reference: their memory went back to its manager (the scope says
  // so on stderr when it closes).
  std::size_t blocks_freed_explicitly() const;
  // Requests that a block let go served (CaptureScope::Reuse::in_capture_order).
  std::size_t reuses() const;

 private:
  friend class Context;
  friend class CaptureScope;
  // `ordered`: let go in the order of the scope's own thread's work (so that
  // a stream-less request of it may take it), not a member thread's.
  void keep(std::shared_ptr<MemoryPointer> block, bool ordered = true);
  // A view of `size` bytes of the smallest device block let go that holds
  // them and wastes at most half; with `stream`, of one let go on that
  // stream only (let_go_on). Null where none does.
  std::shared_ptr<MemoryPointer> reuse(std::size_t size, const cuda::CUstream* stream = nullptr);
  // Notes that the kept device block at `address` is being let go on
  // `stream` by a stream-ordered free (nothing where no block kept here
  // starts there).
  void let_go_on(std::uintptr_t address, cuda::CUstream stream);

  explicit GraphMemory(const Context& context) : context_(context) {}

  const Context& context_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<MemoryPointer>> kept_;
  std::multimap<std::size_t, std::size_t> device_blocks_by_size_;  // size -> index in kept_
  std::unordered_map<std::uintptr_t, std::size_t> device_block_at_;  // address -> index in kept_
  std::unordered_map<std::size_t, cuda::CUstream> let_go_on_;        // index in kept_ -> stream of its free
  std::vector<bool> ordered_;                                        // by index in kept_: see keep()
  std::size_t bytes_ = 0;
  std::size_t reuses_ = 0;
};

class CaptureScope {
 public:
  enum class Reuse {
    never,             // every request of the scope's thread gets a block of its own
    in_capture_order,  // a block let go serves the thread's later requests (see above)
  };
  // `shared`: the memory of an earlier capture of `context` to keep this
  // one's blocks in too (and, reusing, to take blocks from); InvalidArgument
  // if it is another context's.
  explicit CaptureScope(Context& context, Reuse reuse = Reuse::never, std::shared_ptr<GraphMemory> shared = nullptr);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

  // What this scope's thread allocated through the context so far (and will
  // until the scope closes): keep it while the graph may be launched.
  std::shared_ptr<GraphMemory> memory() const { return memory_; }

  // The innermost scope of `context` that the calling thread opened; null
  // where it has none open (capture_graph's recording has one: pass it to the
  // threads that record with it).
  static CaptureScope* of_this_thread(Context& context);

  // While it lives, what the calling thread allocates through the scope's
  // context is the scope's too: for a thread that records work into the same
  // capture (on a stream forked from it). Ends with the scope at the latest,
  // after which the thread's allocations are its own again.
  class Member {
   public:
    explicit Member(CaptureScope& scope);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

   private:
    Context& context_;
    const std::uint64_t scope_;
    const std::thread::id thread_ = std::this_thread::get_id();
  };

 private:
  friend class Context;
  Context& context_;
  const Reuse reuse_;
  const std::thread::id thread_ = std::this_thread::get_id();
  std::uint64_t id_ = 0;  // (members name it: a later scope may have this one's address)
  std::shared_ptr<GraphMemory> memory_;
  std::size_t explicit_frees_before_ = 0;
};

}  // namespace cuemm
