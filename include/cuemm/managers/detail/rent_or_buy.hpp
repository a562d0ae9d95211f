// cuemm/managers/detail/rent_or_buy.hpp: when a loop should get one more
// block instead of paying a seal to reuse one it already has.
//
// Reusing a block freed since the last seal costs a seal (a stream query); a
// new block costs a driver allocation once, and memory for as long as it is
// kept. Paying seals until they have cost as much as the block would have,
// then buying it, never spends more than twice the better choice in hindsight
// (the ski-rental rule): a short loop keeps sealing, a long one rotates
// through a few blocks and seals once a rotation.
//
//   if (rental.buys(kSealsWorthASegment) && room_for_one_more) { rental.bought(); grow(); }
//   else { rental.rent(); seal(); }
//
// Not thread-safe: its owner's lock (or thread) guards it.
#pragma once

#include <cstddef>

namespace cuemm::detail {

class RentOrBuy {
 public:
  // Whether the seals paid since the last purchase add up to `price` seals.
  bool buys(std::size_t price) const noexcept { return seals_paid_ >= price; }
  void rent() noexcept { ++seals_paid_; }
  void bought() noexcept { seals_paid_ = 0; }

 private:
  std::size_t seals_paid_ = 0;
};

}  // namespace cuemm::detail
