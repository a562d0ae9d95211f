// thread_slots.hpp: one object per (owner, thread), found with one thread-local load.
//
// The pool's thread caches, the statistics adaptor's counters and the pinned
// pool's fronts are each "this thread's part of that owner", looked up on
// every allocation. The part used last sits in a trivial initial-exec
// thread_local, so the hot path is one load and a compare (a thread_local
// with a destructor in a shared library costs a call into the dynamic linker
// per access: a third of a cached pair, measured). The rest sit in a
// per-thread directory whose destructor, when the thread ends, hands each
// part back to its owner if the owner still exists.
//
// The owner is held by a shared_ptr (enable_shared_from_this) and provides
//   std::uint64_t thread_slots_id() const;   // unique for the process, never reused
//   Slot* make_thread_slot();                // the owner keeps it; may throw
//   void thread_slot_done(Slot*) noexcept;   // its thread has ended
//
// and may provide
//   bool thread_slots_retired() const;       // true: its slots may go at once
// for owners kept past their use (a pool's retired core, kept until exit):
// a thread gives back its slot of such an owner at its next lookup of
// another, rather than at its end, and the directory does not grow with them.
//
//   Slot* mine = ThreadSlots<Owner, Slot>::of_this_thread(owner);  // null late in the thread's exit
//   Slot* last = ThreadSlots<Owner, Slot>::of_this_thread_if_last(owner);  // null unless used last
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace cuemm::util {

// Ids for owners of thread slots: unique, never reused, never 0.
inline std::uint64_t next_thread_slots_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <typename Owner, typename Slot>
class ThreadSlots {
 public:
  // The calling thread's slot of `owner`, made on its first use; null once the
  // thread's directory has gone (other thread_locals' destructors run later).
  static Slot* of_this_thread(Owner& owner) {
    if (Slot* last = of_this_thread_if_last(owner)) [[likely]]
      return last;
    return find_or_make(owner);
  }
  // The same where it is the slot used last, else null (nothing is made):
  // for fast paths that fall back to of_this_thread(). (The last slot is
  // never null: an owner's id is never 0, the id of `last_` once cleared.)
  static Slot* of_this_thread_if_last(const Owner& owner) noexcept {
    return last_.id == owner.thread_slots_id() ? last_.slot : nullptr;
  }

 private:
  struct Last {
    std::uint64_t id;
    Slot* slot;
  };
  struct Directory {
    std::vector<std::pair<std::weak_ptr<Owner>, Slot*>> entries;
    ~Directory() {
      last_ = {0, nullptr};
      gone_ = true;
      for (auto& [owner, slot] : entries)
        if (auto alive = owner.lock()) alive->thread_slot_done(slot);
    }
  };

  [[gnu::noinline]] static Slot* find_or_make(Owner& owner) {
    if (gone_) return nullptr;
    thread_local Directory directory;
    Slot* found = nullptr;
    for (auto it = directory.entries.begin(); it != directory.entries.end();) {
      const auto alive = it->first.lock();
      if (!alive) {
        it = directory.entries.erase(it);  // its owner is gone
        continue;
      }
      if (alive.get() == &owner) {
        found = it->second;
      } else if (retired(*alive)) {
        if (last_.slot == it->second) last_ = {0, nullptr};
        alive->thread_slot_done(it->second);
        it = directory.entries.erase(it);
        continue;
      }
      ++it;
    }
    if (!found) {
      // Room first, so that the slot, once made, is recorded. Doubling: one
      // more each time reallocated at every new owner, and the freed
      // buffers, each a little smaller than the next, were never reused
      // (10,000 pool resets held 1.3 GB).
      if (directory.entries.size() == directory.entries.capacity())
        directory.entries.reserve(std::max<std::size_t>(8, 2 * directory.entries.capacity()));
      found = owner.make_thread_slot();
      directory.entries.emplace_back(owner.weak_from_this(), found);
    }
    last_ = {owner.thread_slots_id(), found};
    return found;
  }

  static bool retired(const Owner& owner) noexcept {
    if constexpr (requires { owner.thread_slots_retired(); })
      return owner.thread_slots_retired();
    else
      return false;
  }

  [[gnu::tls_model("initial-exec")]] static inline thread_local Last last_{0, nullptr};
  [[gnu::tls_model("initial-exec")]] static inline thread_local bool gone_ = false;
};

// What an owner keeps of the slots it made: those of living threads, which
// it reads across, and those of threads that ended, kept for the next thread
// rather than freed (threads come and go at a program's pace). The owner
// holds its own lock around every call, and empties a slot before retire().
template <typename Slot>
struct SlotsOfThreads {
  std::vector<std::unique_ptr<Slot>> living;
  std::vector<std::unique_ptr<Slot>> spares;

  // For make_thread_slot(): a spare, or a new slot; may throw.
  Slot* make() {
    living.reserve(living.size() + 1);
    if (spares.empty()) {
      living.push_back(std::make_unique<Slot>());
    } else {
      living.push_back(std::move(spares.back()));
      spares.pop_back();
    }
    return living.back().get();
  }
  // For thread_slot_done(): `slot` among the spares. False, nothing moved,
  // for a slot that is not a living one, or without memory to keep it spare
  // (it then stays with the living ones).
  bool retire(Slot* slot) noexcept {
    const auto it = std::find_if(living.begin(), living.end(), [&](const auto& one) { return one.get() == slot; });
    if (it == living.end()) return false;
    try {
      spares.push_back(std::move(*it));
    } catch (...) {
      return false;
    }
    living.erase(it);
    return true;
  }
};

}  // namespace cuemm::util
