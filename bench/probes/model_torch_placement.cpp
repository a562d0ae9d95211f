// A model of where PyTorch's caching allocator places blocks (one stream, no
// GPU), run on `cuemm random --pattern training`'s workloads (seeds 1-8), to
// find which of its choices keep its footprint low where the pool's is not
// (docs/pool-measurements.md). The choices, from its documentation: requests
// rounded up to 512 bytes; those up to 1 MiB served from 2 MiB segments of a
// pool of their own; larger ones from segments of 20 MiB, or of their own
// size rounded up to 2 MiB past 10 MiB; a free block is the best fit, split
// when what is left is over 1 MiB (any size, for small blocks); free
// neighbours in a segment merge; nothing goes back to the driver. Peak
// reserved over peak live, per seed and their mean. Options put the pool's
// choices in instead, one at a time.
//
//   g++ -O2 -std=c++20 -Ibench -Iinclude bench/probes/model_torch_placement.cpp -o model && ./model per-layer
//   ./model WORKLOAD [OWN_FROM_MIB LARGE_SEGMENT_MIB SMALL_SEGMENT_MIB ONE_POOL SPARES RINGS SMALL_ARENA]
// WORKLOAD: varied, same or per-layer (training steps), or random:MAX_KIB:LIVE_MIB
// (RMM's random workload, 20,000 operations). The defaults are PyTorch's: 10
// (own segments past 10 MiB), 20, 2, 0 (small and large blocks in pools
// apart), 0 (see Settings::spares).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <deque>

#include "cuemm/managers/detail/size_classes.hpp"
#include "random_workload.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::size_t round_up(std::size_t size, std::size_t step) { return (size + step - 1) / step * step; }

struct Settings {
  std::size_t own_from = 10 * kMiB + 1;  // requests of at least this get a segment of their own size
  std::size_t large_segment = 20 * kMiB;
  std::size_t small_segment = 2 * kMiB;
  bool one_pool = false;  // small and large blocks in the same pool
  // 0: a freed segment of its own is a free block of the large pool, as any;
  // 1: it is a spare, for requests of its size (within an 8th) only, as the
  // pool's; 2: and spares go back before a new segment of its own passes the
  // footprint's peak; 3: the pool's other rules at a new peak too: before any
  // new segment passes it, spares and entirely free shared segments go back;
  // a request for a segment of its own is first carved from free shared
  // space; a shared segment about to grow takes over a spare that holds the
  // request (no larger than the growth).
  int spares = 0;
  // The pool's thread-cache rings: requests up to 1 MiB rounded to their
  // size class; a freed one waits in its class's ring (oldest reused first)
  // until a request of the class takes it or the footprint would grow.
  bool rings = false;
  // Small blocks from one mapped range (as the expandable pool's arena)
  // rather than from segments: their free space merges everywhere, and the
  // footprint holds only the 2 MiB pages that hold a block (free pages are
  // given back at once: the arena's best case). Large blocks keep the rules
  // above, in driver allocations of their own. 1: the best fit; 2: the best
  // fit that lays a block of up to a page within one page; 3: the best fit,
  // its pages kept once mapped.
  int small_arena = 0;
};

class Model {
 public:
  explicit Model(Settings settings) : settings_(settings) {}

  std::size_t allocate(std::size_t request) {
    const int size_class = settings_.rings ? cuemm::detail::size_class_of(request) : -1;
    if (size_class >= 0) {
      auto& ring = rings_[size_class];
      if (!ring.empty()) {
        const std::size_t address = ring.front();
        ring.pop_front();
        ring_bytes_ -= cuemm::detail::size_class_bytes(size_class);
        return address;
      }
      request = cuemm::detail::size_class_bytes(size_class);
    }
    const std::size_t address = allocate_block(request);
    if (size_class >= 0) class_of_[address] = size_class;
    return address;
  }

  std::size_t allocate_block(std::size_t request) {
    const std::size_t size = request < 512 ? 512 : round_up(request, 512);
    const bool large = size > kMiB;
    if (settings_.spares && size >= settings_.own_from) {
      const std::size_t segment = round_up(size, 2 * kMiB);
      auto spare = spare_.lower_bound({segment, 0});
      if (spare != spare_.end() && spare->first <= segment + segment / 8) {
        const std::size_t base = spare->second;
        spare_.erase(spare);
        return base;
      }
      if (passes_peak(segment)) flush_rings();
      if (settings_.spares == 3 && passes_peak(segment)) {
        if (auto carved = take_free_block(free_of(true), size, true)) return *carved;
        give_back_within_peak(segment);
      }
      if (settings_.spares == 2) give_back_spares_within_peak(segment);
      const std::size_t base = new_range(segment);
      own_[base] = segment;
      return base;
    }
    if (!large && settings_.small_arena) return allocate_in_arena(size);
    auto& free = free_of(large);
    if (auto address = take_free_block(free, size, large)) return *address;
    if (flush_rings()) {
      if (auto address = take_free_block(free, size, large)) return *address;
    }
    const std::size_t base = add_segment(size, large);
    free.insert({blocks_.at(base).size, base});
    return *take_free_block(free, size, large);
  }

  void release(std::size_t address) {
    if (auto cls = class_of_.find(address); cls != class_of_.end()) {
      rings_[cls->second].push_back(address);
      ring_bytes_ += cuemm::detail::size_class_bytes(cls->second);
      return;
    }
    release_block(address);
  }

  // Every ring's blocks back to the free blocks; whether there were any.
  bool flush_rings() {
    if (ring_bytes_ == 0) return false;
    for (auto& ring : rings_) {
      for (const std::size_t address : ring) {
        class_of_.erase(address);
        release_block(address);
      }
      ring.clear();
    }
    ring_bytes_ = 0;
    return true;
  }

  void release_block(std::size_t address) {
    if (auto own = own_.find(address); own != own_.end()) {
      spare_.insert({own->second, address});
      return;
    }
    auto block = blocks_.find(address);
    block->second.free = true;
    if (block->second.segment == arena_segment_) count_pages(address, block->second.size, -1);
    auto& free = free_of(large_segment_[block->second.segment]);
    auto next = std::next(block);
    if (next != blocks_.end() && next->second.free && next->second.segment == block->second.segment) {
      free.erase({next->second.size, next->first});
      block->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (block != blocks_.begin()) {
      auto previous = std::prev(block);
      if (previous->second.free && previous->second.segment == block->second.segment) {
        free.erase({previous->second.size, previous->first});
        previous->second.size += block->second.size;
        blocks_.erase(block);
        block = previous;
      }
    }
    free.insert({block->second.size, block->first});
  }

  std::size_t reserved() const { return reserved_; }

 private:
  struct Block {
    std::size_t size;
    int segment;
    bool free;
  };
  using FreeBlocks = std::set<std::pair<std::size_t, std::size_t>>;  // (size, address)

  bool passes_peak(std::size_t more) const { return reserved_ + more > peak_; }

  std::size_t allocate_in_arena(std::size_t size) {
    std::optional<std::size_t> address = take_from_arena(size);
    if (!address && flush_rings()) address = take_from_arena(size);
    if (!address) {
      if (arena_segment_ < 0) {
        arena_segment_ = static_cast<int>(large_segment_.size());
        large_segment_.push_back(false);
      }
      // The range's end moves on by whole pages, merging with a free block
      // that ends there.
      std::size_t base = arena_end_, bytes = round_up(size, kArenaPage);
      arena_end_ += bytes;
      if (auto last = blocks_.lower_bound(base); last != blocks_.begin()) {
        --last;
        if (last->second.segment == arena_segment_ && last->second.free) {
          small_free_.erase({last->second.size, last->first});
          base = last->first;
          bytes += last->second.size;
        }
      }
      blocks_[base] = {bytes, arena_segment_, true};
      small_free_.insert({bytes, base});
      address = take_from_arena(size);
    }
    count_pages(*address, blocks_.at(*address).size, +1);
    return *address;
  }

  std::optional<std::size_t> take_from_arena(std::size_t size) {
    if (settings_.small_arena != 2) return take_free_block(small_free_, size, false);
    for (auto it = small_free_.lower_bound({size, 0}); it != small_free_.end(); ++it) {
      const std::size_t base = it->second, bytes = it->first;
      std::size_t start = base;
      if (size <= kArenaPage && start % kArenaPage + size > kArenaPage) start = round_up(start, kArenaPage);
      if (start + size > base + bytes) continue;
      small_free_.erase(it);
      const int segment = blocks_.at(base).segment;
      if (start > base) {  // the head before the page stays free
        blocks_[base] = {start - base, segment, true};
        small_free_.insert({start - base, base});
      }
      blocks_[start] = {base + bytes - start, segment, true};
      small_free_.insert({base + bytes - start, start});
      return take_free_block(small_free_, size, false, start);
    }
    return std::nullopt;
  }

  // The footprint holds each arena page while any block on it is out.
  void count_pages(std::size_t address, std::size_t bytes, int sign) {
    const bool kept = settings_.small_arena == 3;  // pages, once mapped, stay
    for (std::size_t page = address / kArenaPage; page <= (address + bytes - 1) / kArenaPage; ++page) {
      if (kept && sign > 0 && !page_blocks_.count(page)) reserved_ += kArenaPage;
      const std::size_t before = page_blocks_[page];
      page_blocks_[page] = before + sign;
      if (kept) continue;
      if (before == 0) reserved_ += kArenaPage;
      if (page_blocks_[page] == 0) {
        reserved_ -= kArenaPage;
        page_blocks_.erase(page);
      }
    }
    peak_ = std::max(peak_, reserved_);
  }

  // The best fit of `free` for `size` bytes, split where enough is left
  // (over 1 MiB for a large request, 512 bytes for a small one).
  std::optional<std::size_t> take_free_block(FreeBlocks& free, std::size_t size, bool large,
                                             std::optional<std::size_t> at = std::nullopt) {
    auto best = at ? free.find({blocks_.at(*at).size, *at}) : free.lower_bound({size, 0});
    if (best == free.end()) return std::nullopt;
    const std::size_t address = best->second;
    Block& block = blocks_.at(address);
    free.erase(best);
    const std::size_t rest = block.size - size;
    if (large ? rest > kMiB : rest >= 512) {
      blocks_[address + size] = {rest, block.segment, true};
      free.insert({rest, address + size});
      block.size = size;
    }
    block.free = false;
    return address;
  }

  void give_back_spares_within_peak(std::size_t more) {
    while (!spare_.empty() && passes_peak(more)) {
      auto largest = std::prev(spare_.end());
      reserved_ -= largest->first;
      own_.erase(largest->second);
      spare_.erase(largest);
    }
  }

  // Spares, then entirely free shared segments (largest first), until
  // `more` bytes keep the footprint within its peak.
  void give_back_within_peak(std::size_t more) {
    give_back_spares_within_peak(more);
    for (FreeBlocks* free : {&large_free_, &small_free_}) {
      for (auto it = free->end(); it != free->begin() && passes_peak(more);) {
        --it;
        auto block = blocks_.find(it->second);
        const int segment = block->second.segment;
        if (segment == arena_segment_) continue;  // (its pages go back as they empty)
        const bool whole = (block == blocks_.begin() || std::prev(block)->second.segment != segment) &&
                           (std::next(block) == blocks_.end() || std::next(block)->second.segment != segment);
        if (!whole) continue;
        reserved_ -= it->first;
        blocks_.erase(block);
        it = free->erase(it);
      }
    }
  }

  FreeBlocks& free_of(bool large) { return large || settings_.one_pool ? large_free_ : small_free_; }

  // A new segment for a block of `size`, whole and free; returns its base.
  std::size_t add_segment(std::size_t size, bool large) {
    std::size_t segment = !large ? settings_.small_segment
                          : size < settings_.own_from ? settings_.large_segment
                                                      : round_up(size, 2 * kMiB);
    if (segment < size) segment = round_up(size, 2 * kMiB);
    if (settings_.spares == 3 && passes_peak(segment)) {
      auto spare = spare_.lower_bound({size, 0});
      if (spare != spare_.end() && spare->first <= segment) return adopt(spare, large);
      give_back_within_peak(segment);
    }
    return add_shared(new_range(segment), segment, large);
  }

  // Addresses for a new segment of `bytes`, which the footprint now holds.
  std::size_t new_range(std::size_t bytes) {
    const std::size_t base = next_base_;
    next_base_ += bytes + gap_;  // (segments never touch, so never merge)
    reserved_ += bytes;
    peak_ = std::max(peak_, reserved_);
    return base;
  }

  // [base, base + bytes) becomes a shared segment, whole and free; returns base.
  std::size_t add_shared(std::size_t base, std::size_t bytes, bool large) {
    blocks_[base] = {bytes, static_cast<int>(large_segment_.size()), true};
    large_segment_.push_back(large || settings_.one_pool);
    return base;
  }

  // A spare becomes a shared segment (whole and free); returns its base.
  std::size_t adopt(FreeBlocks::iterator spare, bool large) {
    const std::size_t base = spare->second, bytes = spare->first;
    spare_.erase(spare);
    own_.erase(base);
    return add_shared(base, bytes, large);
  }

  Settings settings_;
  std::array<std::deque<std::size_t>, cuemm::detail::kSizeClassCount> rings_;
  std::unordered_map<std::size_t, int> class_of_;  // blocks of a class, out or in a ring
  std::size_t ring_bytes_ = 0;
  std::map<std::size_t, Block> blocks_;  // by address
  FreeBlocks small_free_, large_free_;
  std::vector<bool> large_segment_;
  std::size_t next_base_ = std::size_t{1} << 40;
  std::size_t reserved_ = 0, peak_ = 0;
  std::map<std::size_t, std::size_t> own_;  // segments of their own (with spares): base -> bytes
  FreeBlocks spare_;                        // (bytes, base)
  static constexpr std::size_t gap_ = 64 * kMiB;
  static constexpr std::size_t kArenaPage = 2 * kMiB;  // what the range maps and gives back
  int arena_segment_ = -1;                         // small blocks' range, with small_arena
  std::size_t arena_end_ = std::size_t{1} << 50;  // (far past the segments' addresses)
  std::unordered_map<std::size_t, std::size_t> page_blocks_;  // arena page -> blocks out on it
};

}  // namespace

int main(int argc, char** argv) {
  using cuemm::workload::TrainingShapes;
  const std::string shapes = argc > 1 ? argv[1] : "per-layer";
  std::size_t random_max = 0, random_live = 0;
  if (shapes.rfind("random:", 0) == 0) {
    const auto colon = shapes.find(':', 7);
    random_max = std::stoull(shapes.substr(7, colon - 7)) << 10;
    random_live = std::stoull(shapes.substr(colon + 1)) << 20;
  }
  const TrainingShapes drawn = shapes == "varied" ? TrainingShapes::varied
                               : shapes == "same" ? TrainingShapes::same
                                                  : TrainingShapes::per_layer;
  Settings settings;
  if (argc > 2) settings.own_from = std::stoull(argv[2]) * kMiB;
  if (argc > 3) settings.large_segment = std::stoull(argv[3]) * kMiB;
  if (argc > 4) settings.small_segment = std::stoull(argv[4]) * kMiB;
  if (argc > 5) settings.one_pool = std::atoi(argv[5]) != 0;
  if (argc > 6) settings.spares = std::atoi(argv[6]);
  if (argc > 7) settings.rings = std::atoi(argv[7]) != 0;
  if (argc > 8) settings.small_arena = std::atoi(argv[8]);
  double sum = 0;
  for (unsigned seed = 1; seed <= 8; ++seed) {
    Model model(settings);
    std::unordered_map<std::uint64_t, std::size_t> addresses;
    std::size_t live = 0, peak_live = 0, peak_reserved = 0;
    const auto operations = random_max ? cuemm::workload::random_operations(random_max, 20000, random_live, seed)
                                       : cuemm::workload::training_operations(cuemm::workload::kTrainingLayers,
                                                                              cuemm::workload::kTrainingSteps, seed, drawn);
    for (const auto& operation : operations) {
      if (operation.allocate) {
        addresses[operation.id] = model.allocate(operation.size);
        live += operation.size;
      } else {
        model.release(addresses.at(operation.id));
        live -= operation.size;
      }
      peak_live = std::max(peak_live, live);
      peak_reserved = std::max(peak_reserved, model.reserved());
    }
    const double ratio = static_cast<double>(peak_reserved) / static_cast<double>(peak_live);
    std::printf("%.3f ", ratio);
    sum += ratio;
  }
  std::printf(" mean %.3f\n", sum / 8);
}
