#include "cuemm/threading/blocking_hook.hpp"

#include "threading/wait_while.hpp"

namespace cuemm {

namespace {
thread_local BlockingHook* current_hook = nullptr;
}

ScopedBlockingHook::ScopedBlockingHook(BlockingHook& hook) noexcept : previous_(current_hook) {
  current_hook = &hook;
}

ScopedBlockingHook::~ScopedBlockingHook() { current_hook = previous_; }

void before_blocking() noexcept {
  if (BlockingHook* hook = current_hook) [[unlikely]]
    hook->before_blocking();
}

// Each thread reads on one line, given in turn as threads first read (out of
// line, so that every library and plugin that locks one of these agrees).
BlockingAwareSharedMutex::Readers& BlockingAwareSharedMutex::this_threads_readers() noexcept {
  static std::atomic<std::size_t> threads{0};
  thread_local const std::size_t line = threads.fetch_add(1, std::memory_order_relaxed) % kReaderLines;
  return readers_[line];
}

// (A reader counts itself in, then looks for a writer; a writer says it is
// there, then looks for readers: sequentially consistent, so that one of the
// two always sees the other.)
void BlockingAwareSharedMutex::lock_shared() {
  Readers& readers = this_threads_readers();
  readers.count.fetch_add(1, std::memory_order_seq_cst);
  if (!writer_.load(std::memory_order_seq_cst)) [[likely]]
    return;
  wait_for_the_writer(readers);
}

bool BlockingAwareSharedMutex::try_lock_shared() noexcept {
  Readers& readers = this_threads_readers();
  readers.count.fetch_add(1, std::memory_order_seq_cst);
  if (!writer_.load(std::memory_order_seq_cst)) return true;
  readers.count.fetch_sub(1, std::memory_order_release);
  return false;
}

void BlockingAwareSharedMutex::unlock_shared() noexcept {
  this_threads_readers().count.fetch_sub(1, std::memory_order_release);
}

void BlockingAwareSharedMutex::wait_for_the_writer(Readers& readers) {
  do {
    readers.count.fetch_sub(1, std::memory_order_release);  // (out again, so that the writer may go on)
    before_blocking();
    {
      std::unique_lock gate(gate_);
      opened_.wait(gate, [this] { return !writer_.load(std::memory_order_seq_cst); });
    }
    readers.count.fetch_add(1, std::memory_order_seq_cst);
  } while (writer_.load(std::memory_order_seq_cst));
}

bool BlockingAwareSharedMutex::readers_gone() const noexcept {
  for (const Readers& readers : readers_)
    if (readers.count.load(std::memory_order_seq_cst) != 0) return false;
  return true;
}

void BlockingAwareSharedMutex::lock() {
  writers_.lock();
  writer_.store(true, std::memory_order_seq_cst);
  if (readers_gone()) [[likely]]
    return;
  before_blocking();
  // Readers hold it across a driver call, and nothing tells a writer when
  // the last one leaves.
  detail::wait_while([this] { return !readers_gone(); });
}

bool BlockingAwareSharedMutex::try_lock() {
  if (!writers_.try_lock()) return false;
  writer_.store(true, std::memory_order_seq_cst);
  if (readers_gone()) return true;
  open_to_readers();
  writers_.unlock();
  return false;
}

void BlockingAwareSharedMutex::unlock() {
  open_to_readers();
  writers_.unlock();
}

void BlockingAwareSharedMutex::open_to_readers() noexcept {
  {
    // (Under the gate, so that a reader between its look and its wait does not miss the news.)
    std::lock_guard gate(gate_);
    writer_.store(false, std::memory_order_seq_cst);
  }
  opened_.notify_all();
}

}  // namespace cuemm
