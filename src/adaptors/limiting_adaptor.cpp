#include "cuemm/adaptors/limiting_adaptor.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "cuemm/error.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "util/own_lines.hpp"
#include "util/thread_slots.hpp"

namespace cuemm {

// Note [Credit kept by each thread]
// One count of the bytes in use, which every allocation and release changed
// with a compare-and-swap, cost a cache-line transfer each: 16 threads of
// pairs through the pool took 161-298 ns a pair together on the H200, 0.5-0.8x
// one thread's throughput. Instead `granted` counts the bytes in use plus the
// credit that threads keep: a release adds its bytes to its thread's credit,
// and the thread's next requests draw on that credit before `granted`. So a
// loop of pairs never touches the shared line, and `granted` never exceeds
// the cap. A thread keeps up to kKeptCredit, or twice the block at hand if
// that is more (as the statistics adaptor publishes its counts); the rest
// goes back at once. A request that `granted` cannot serve takes back every
// thread's credit before it is refused, so credit another thread keeps never
// makes a request fail that the bytes in use would let through. Other
// threads take a credit back with an exchange, so its owner changes it with
// atomic read-modify-writes too, on lines of its own (util::kOwnLines).
struct LimitingAdaptor::Cap : AllocationObserver, std::enable_shared_from_this<Cap> {
  static constexpr std::size_t kKeptCredit = std::size_t{4} << 20;
  struct alignas(util::kOwnLines) Credit {
    std::atomic<std::size_t> bytes{0};
  };

  const std::size_t limit;
  const std::uint64_t id = util::next_thread_slots_id();
  alignas(64) std::atomic<std::size_t> granted{0};  // in use, plus the threads' credit; at most `limit`
  mutable BlockingAwareMutex mutex;                 // credits
  util::SlotsOfThreads<Credit> credits;             // finished threads' spares are empty

  explicit Cap(std::size_t limit_) : limit(limit_) {}

  void before_allocation(MemoryKind kind, std::size_t size) override {
    if (!counted(kind)) return;
    Credit* own = credit_or_null();
    if (own && draw(*own, size)) [[likely]]
      return;
    if (own) give_back_to_cap(own->bytes.exchange(0));  // (too little: all of it, then the rest from the cap)
    if (reserve(size)) return;
    take_back_credits();
    if (reserve(size)) return;
    throw OutOfMemory("LimitingAdaptor", size,
                      "the limit is " + describe_bytes(limit) + " and " + describe_bytes(in_use()) + " are in use");
  }
  void allocation_failed(MemoryKind kind, std::size_t size) noexcept override {
    if (counted(kind)) credit(size);
  }
  void released(const AllocationRecord& record) noexcept override {
    if (counted(record.kind)) credit(record.size);
  }
  // Nothing in use, and no credit (with the gate closed: Note [Counting across a reset]).
  void reset() noexcept override {
    std::lock_guard lock(mutex);
    for (const auto& one : credits.living) one->bytes.store(0);
    granted = 0;
  }
  bool wants_times_and_call_sites() const noexcept override { return false; }

  std::size_t in_use() const noexcept {
    std::lock_guard lock(mutex);
    std::size_t credit = 0;
    for (const auto& one : credits.living) credit += one->bytes.load(std::memory_order_relaxed);
    const std::size_t all = granted.load();
    return all > credit ? all - credit : 0;
  }

  // For util::ThreadSlots.
  std::uint64_t thread_slots_id() const noexcept { return id; }
  Credit* make_thread_slot() {
    std::lock_guard lock(mutex);
    return credits.make();
  }
  void thread_slot_done(Credit* credit) noexcept {
    std::lock_guard lock(mutex);
    give_back_to_cap(credit->bytes.exchange(0));
    credits.retire(credit);
  }

 private:
  static bool counted(MemoryKind kind) { return kind == MemoryKind::Device || kind == MemoryKind::Managed; }

  // The calling thread's credit; null without memory for a new thread's, or
  // late in the thread's exit (then it counts on `granted` alone).
  Credit* credit_or_null() noexcept {
    try {
      return util::ThreadSlots<Cap, Credit>::of_this_thread(*this);
    } catch (...) {
      return nullptr;
    }
  }
  // `size` bytes from the thread's credit, if it has them.
  static bool draw(Credit& own, std::size_t size) noexcept {
    std::size_t have = own.bytes.load(std::memory_order_relaxed);
    while (have >= size) {
      if (own.bytes.compare_exchange_weak(have, have - size)) return true;
    }
    return false;
  }
  // `size` more bytes granted, unless that passes the cap.
  bool reserve(std::size_t size) noexcept {
    std::size_t before = granted.load();
    do {
      if (size > limit || before > limit - size) return false;
    } while (!granted.compare_exchange_weak(before, before + size));
    return true;
  }
  // Never below 0, whatever happens: a wrapped count would refuse every
  // request after. (A release never finds its bytes forgotten by a reset:
  // Note [Counting across a reset].)
  void give_back_to_cap(std::size_t size) noexcept {
    if (size == 0) return;
    std::size_t before = granted.load();
    while (!granted.compare_exchange_weak(before, before - std::min(before, size))) {
    }
  }
  // Released bytes: the thread's credit, up to what it keeps.
  void credit(std::size_t size) noexcept {
    Credit* own = credit_or_null();
    if (!own) return give_back_to_cap(size);
    const std::size_t now = own->bytes.fetch_add(size) + size;
    const std::size_t kept = std::max(kKeptCredit, 2 * size);
    if (now <= kept) [[likely]]
      return;
    // The excess goes back (what another thread took back meanwhile is gone already).
    std::size_t have = own->bytes.load();
    while (have > kept && !own->bytes.compare_exchange_weak(have, kept)) {
    }
    if (have > kept) give_back_to_cap(have - kept);
  }
  // Every thread's credit back to the cap, before a request is refused.
  void take_back_credits() noexcept {
    std::lock_guard lock(mutex);
    for (const auto& one : credits.living) give_back_to_cap(one->bytes.exchange(0));
  }
};

LimitingAdaptor::LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::size_t limit)
    : LimitingAdaptor(context, std::move(upstream), std::make_shared<Cap>(limit)) {}

LimitingAdaptor::LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                 std::shared_ptr<Cap> cap)
    : ManagerAdaptor(context, std::move(upstream), cap), cap_(std::move(cap)) {}

std::size_t LimitingAdaptor::limit() const noexcept { return cap_->limit; }
std::size_t LimitingAdaptor::in_use() const noexcept { return cap_->in_use(); }

MemoryInfo LimitingAdaptor::get_memory_info() {
  const std::size_t used = std::min(cap_->in_use(), cap_->limit);
  return within_cap(ManagerAdaptor::get_memory_info(), cap_->limit, cap_->limit - used);
}

}  // namespace cuemm
