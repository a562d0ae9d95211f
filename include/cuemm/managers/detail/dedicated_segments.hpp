// cuemm/managers/detail/dedicated_segments.hpp: large blocks that each have
// a driver allocation of their own, and the spares kept for reuse.
//
// Note [Dedicated segments]
// A few large blocks placed in shared segments leave holes that later large
// requests do not fit: on RMM's random workload with sizes up to 64 MiB the
// pool reserved 1.3-1.6x the live bytes, whatever the fit policy, even in one
// contiguous region. So large blocks get a segment each,
// rounded up to the driver's 2 MiB pages, which wastes at most that rounding
// (1.07-1.10x on that workload). The pool's dedicated_size option sets the
// threshold (4 MiB unless changed: on the workload up to 4 MiB, means over
// seeds 1-8 on the simulated driver read 1.32 with 1 MiB, 1.38 with 2 MiB,
// whose 2 MiB pages round such blocks up by about 40% on average, 1.23 with 4 MiB
// and 1.24 with 8 MiB). A freed segment becomes a spare for
// a later request of the same size or up to 1/8 smaller. Spares stay while
// the pool is below its peak footprint; where growth would take it past its
// peak, the largest spares go back to the driver first, so spares never
// raise the peak (a new segment of its own at the peak gives them all back).
// Reusing a segment freed since the last seal costs a stream query, so a
// long loop of such requests rotates through a few segments instead,
// sealing once a rotation: it gets one more segment
// each time its queries have cost about as much as a new segment (at most 8
// idle, within 1/32 of the pool or 32 MiB); a short loop just seals.
// Where the shared segments would grow past the pool's peak footprint, they
// take over a spare instead (one no larger than their growth step), so that
// a program whose sizes change between phases does not reserve the next
// phase's blocks beside the last one's spares.
// (A thread with a cache rotates its own the same way: the pool's Note
// [Large blocks in the thread caches].)
//
// Not thread-safe: the owner locks. Knows nothing of CUDA: the owner takes the
// segments from the driver and gives back the ones handed out by take_*().
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace cuemm::detail {

class DedicatedSegments {
 public:
  static constexpr std::size_t kPage = std::size_t{2} << 20;
  static constexpr std::size_t kSmallGranularity = 256;
  static_assert(std::has_single_bit(kPage) && std::has_single_bit(kSmallGranularity));

  struct Segment {
    std::uintptr_t base;
    std::size_t size;
  };

  // The segment for a request of `size` bytes: whole 2 MiB pages, or 256-byte
  // steps below a page (which the driver packs into shared pages); 0 when
  // that overflows.
  static std::size_t segment_size(std::size_t size) noexcept {
    const std::size_t step = size < kPage ? kSmallGranularity : kPage;
    // (Steps are powers of two: a mask, not a 64-bit divide, which a loop
    // of large pairs paid twice a pair.)
    return size > SIZE_MAX - step ? 0 : (std::max<std::size_t>(size, 1) + step - 1) & ~(step - 1);
  }

  // A spare of `segment` to segment + segment/8 bytes, now in use; nullopt if none.
  std::optional<std::uintptr_t> take_spare(std::size_t segment);
  // The smallest spare of at least `size` bytes, left where it is; nullopt if none.
  std::optional<Segment> smallest_spare_of_at_least(std::size_t size) const;
  // Forgets a spare from smallest_spare_of_at_least(): its owner has taken it over.
  void forget_spare(const Segment& spare) noexcept;
  // Records a new segment in use. Throws std::bad_alloc and changes nothing
  // when out of host memory.
  void add(std::uintptr_t base, std::size_t size);
  // The size of the segment at `base`, in use or spare; 0 if there is none.
  std::size_t size_of(std::uintptr_t base) const noexcept;
  // A segment in use becomes a spare. Throws std::bad_alloc and changes
  // nothing when out of host memory.
  void make_spare(std::uintptr_t base);
  // Forgets a segment in use (the owner gives it back to the driver).
  void forget(std::uintptr_t base) noexcept;

  // Removes the largest spares until at most `keep` spare bytes remain.
  // Throws std::bad_alloc and changes nothing when out of host memory.
  std::vector<Segment> take_spares_over(std::size_t keep);
  // Calls release(segment) for every segment, then forgets everything: the
  // owner's reset, which allocates nothing on the way (the segments go back
  // even where the host is out of memory).
  template <class Release>
  void release_all(Release release) {
    for (const auto& [base, size] : sizes_) release(Segment{base, size});
    forget_all();
  }

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t spare_bytes() const noexcept { return spare_bytes_; }
  std::size_t count() const noexcept { return sizes_.size(); }
  std::size_t spare_count() const noexcept { return spares_.size(); }
  // Calls visit(base, size, spare) for every segment, in no order.
  template <class Visit>
  void for_each(Visit visit) const {
    std::unordered_set<std::uintptr_t> spare;
    for (const auto& entry : spares_) spare.insert(entry.second);
    for (const auto& [base, size] : sizes_) visit(base, size, spare.count(base) > 0);
  }
  std::size_t largest_spare() const noexcept { return spares_.empty() ? 0 : spares_.rbegin()->first; }

 private:
  void forget_all() noexcept;
  std::unordered_map<std::uintptr_t, std::size_t> sizes_;  // every segment: base -> size
  std::multimap<std::size_t, std::uintptr_t> spares_;      // size -> base
  std::size_t bytes_ = 0;
  std::size_t spare_bytes_ = 0;
};

}  // namespace cuemm::detail
