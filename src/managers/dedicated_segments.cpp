#include "cuemm/managers/detail/dedicated_segments.hpp"

#include <iterator>

namespace cuemm::detail {

std::optional<std::uintptr_t> DedicatedSegments::take_spare(std::size_t segment) {
  auto it = spares_.lower_bound(segment);
  if (it == spares_.end() || it->first > segment + segment / 8) return std::nullopt;
  const std::uintptr_t base = it->second;
  spare_bytes_ -= it->first;
  spares_.erase(it);
  return base;
}

std::optional<DedicatedSegments::Segment> DedicatedSegments::smallest_spare_of_at_least(std::size_t size) const {
  auto it = spares_.lower_bound(size);
  if (it == spares_.end()) return std::nullopt;
  return Segment{it->second, it->first};
}

void DedicatedSegments::forget_spare(const Segment& spare) noexcept {
  auto [first, last] = spares_.equal_range(spare.size);
  for (auto it = first; it != last; ++it) {
    if (it->second != spare.base) continue;
    spares_.erase(it);
    sizes_.erase(spare.base);
    spare_bytes_ -= spare.size;
    bytes_ -= spare.size;
    return;
  }
}

void DedicatedSegments::add(std::uintptr_t base, std::size_t size) {
  sizes_.emplace(base, size);
  bytes_ += size;
}

std::size_t DedicatedSegments::size_of(std::uintptr_t base) const noexcept {
  auto it = sizes_.find(base);
  return it == sizes_.end() ? 0 : it->second;
}

void DedicatedSegments::make_spare(std::uintptr_t base) {
  const std::size_t size = size_of(base);
  if (size == 0) return;
  spares_.emplace(size, base);
  spare_bytes_ += size;
}

void DedicatedSegments::forget(std::uintptr_t base) noexcept {
  auto it = sizes_.find(base);
  if (it == sizes_.end()) return;
  bytes_ -= it->second;
  sizes_.erase(it);
}

std::vector<DedicatedSegments::Segment> DedicatedSegments::take_spares_over(std::size_t keep) {
  std::vector<Segment> taken;
  if (spare_bytes_ <= keep) return taken;
  // (Room for all first: a push_back that threw midway would lose the spares taken before it.)
  taken.reserve(spares_.size());
  while (spare_bytes_ > keep) {
    auto largest = std::prev(spares_.end());
    taken.push_back({largest->second, largest->first});
    spare_bytes_ -= largest->first;
    bytes_ -= largest->first;
    sizes_.erase(largest->second);
    spares_.erase(largest);
  }
  return taken;
}

void DedicatedSegments::forget_all() noexcept {
  sizes_.clear();
  spares_.clear();
  bytes_ = spare_bytes_ = 0;
}

}  // namespace cuemm::detail
