// address_map.hpp: a hash map from block addresses (never 0) to small values,
// in one flat array: no allocation per insert, as std::unordered_map's node,
// which was most of an adaptor's stream-ordered pair (a malloc and a free).
//
// Open addressing with linear probing; an erase shifts the entries after it
// back, so there are no tombstones and lookups stay short. Grows at half
// full. Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace cuemm::util {

template <typename Value>
class AddressMap {
 public:
  // Puts `value` at `address` (not 0), replacing what was there.
  void insert_or_assign(std::uintptr_t address, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    std::size_t at = home(address);
    while (slots_[at].address && slots_[at].address != address) at = (at + 1) & mask();
    if (!slots_[at].address) ++size_;
    slots_[at] = {address, value};
  }

  Value* find(std::uintptr_t address) noexcept {
    const std::size_t at = slot_of(address);
    return at == kNone ? nullptr : &slots_[at].value;
  }

  // Takes the value at `address` out; empty where there was none.
  std::optional<Value> take(std::uintptr_t address) noexcept {
    const std::size_t at = slot_of(address);
    if (at == kNone) return std::nullopt;
    Value value = std::move(slots_[at].value);
    erase_slot(at);
    return value;
  }

  // Takes out every entry whose value `drop` picks.
  template <typename Drop>
  void erase_if(Drop&& drop) noexcept {
    for (std::size_t at = 0; at < slots_.size();) {
      // (An erase moves a later entry of the run here, never to a slot
      // already looked at but from the run's wrapped start: look again.)
      if (slots_[at].address && drop(std::as_const(slots_[at].value)))
        erase_slot(at);
      else
        ++at;
    }
  }

  // Empties the map and gives its array back.
  void clear() noexcept {
    std::vector<Slot>().swap(slots_);
    size_ = 0;
  }
  std::size_t size() const noexcept { return size_; }

 private:
  struct Slot {
    std::uintptr_t address = 0;  // 0: empty
    Value value{};
  };

  static constexpr std::size_t kNone = ~std::size_t{0};

  std::size_t mask() const noexcept { return slots_.size() - 1; }
  std::size_t slot_of(std::uintptr_t address) const noexcept {
    if (slots_.empty()) return kNone;
    for (std::size_t at = home(address);; at = (at + 1) & mask()) {
      if (slots_[at].address == address) return at;
      if (!slots_[at].address) return kNone;
    }
  }
  // (Blocks are 256-byte aligned and often neighbours: mixed so that they spread.)
  std::size_t home(std::uintptr_t address) const noexcept {
    std::uint64_t h = address >> 8;
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return static_cast<std::size_t>(h) & mask();
  }

  void grow() {
    std::vector<Slot> old(slots_.empty() ? 16 : slots_.size() * 2);
    old.swap(slots_);
    size_ = 0;
    for (const Slot& slot : old)
      if (slot.address) insert_or_assign(slot.address, slot.value);
  }

  // Empties slot `hole`, moving back each later entry of the run that would
  // no longer be found past the hole.
  void erase_slot(std::size_t hole) noexcept {
    --size_;
    for (std::size_t at = (hole + 1) & mask(); slots_[at].address; at = (at + 1) & mask()) {
      const std::size_t wanted = home(slots_[at].address);
      // Whether `wanted` lies cyclically in (hole, at]: then it stays.
      const bool stays = hole <= at ? (hole < wanted && wanted <= at) : (hole < wanted || wanted <= at);
      if (stays) continue;
      slots_[hole] = std::move(slots_[at]);
      hole = at;
    }
    slots_[hole] = Slot{};
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace cuemm::util
