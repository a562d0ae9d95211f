// A model, not a manager: how far below the page-release bound could the
// expandable arena's footprint go if, where a request would map new pages,
// it could instead take the free ends of pages already mapped and map those
// pages again, side by side, at addresses of the block's own?
// (`bench/probes/probe_assembled_block.cpp` shows the driver allows one page
// at two addresses; docs/pool-measurements.md, "Blocks assembled from the
// free ends of pages", has the figures.)
//
// The arena of the model is an ideal one: a best fit in one range of
// addresses that never shrinks, a 2 MiB page mapped exactly while some byte
// of it is in use, no thread caches, no wait for the GPU. An assembled block
// is the free end of one mapped page (a free range from inside that page to
// its last byte), then whole new pages, then the free start of another
// mapped page; either end may be a new page instead. Its ends are taken out
// of the range as if allocated, so the best fit does not hand them out twice.
//
// Runs RMM's random workload (bench/random_workload.hpp) as `cuemm random`
// does, for seeds 1-8, under four policies: never assemble (the page-release
// bound), assemble only where the request would take the footprint past its
// peak, or within a slack (a fraction of the peak) of it, and assemble
// wherever that maps fewer new pages. Build and run (any machine; no GPU):
//   g++ -O2 -std=c++20 -Ibench -o /tmp/model_assembled_blocks bench/probes/model_assembled_blocks.cpp
//   /tmp/model_assembled_blocks 4 128 20000   # max size and live cap in MiB, operations
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "random_workload.hpp"

namespace {

constexpr std::size_t kPage = std::size_t{2} << 20;
constexpr std::size_t kEndless = std::size_t{1} << 50;

enum class Policy { never, at_peak, within_slack, always };

class Model {
 public:
  Model(Policy policy, std::size_t slack_divisor) : policy_(policy), slack_divisor_(slack_divisor) {}

  void allocate(std::uint64_t id, std::size_t size) {
    const std::size_t bytes = (size + 255) / 256 * 256;
    const std::size_t fit = best_fit(bytes);
    const std::size_t fit_new_pages = unmapped_pages_in(fit, fit + bytes);
    if (fit_new_pages > 0 && worth_assembling(fit_new_pages) && assemble(id, bytes, fit_new_pages)) return;
    take(fit, fit + bytes);
    blocks_[id] = {{{fit, fit + bytes}}, 0};
    note_footprint();
  }

  void free(std::uint64_t id) {
    const Block& block = blocks_.at(id);
    for (const auto& [begin, end] : block.pieces) give(begin, end);
    own_pages_ -= block.own_pages;
    blocks_.erase(id);
  }

  std::size_t peak_pages() const { return peak_pages_; }
  std::size_t assembled() const { return assembled_; }

 private:
  struct Block {
    std::vector<std::pair<std::size_t, std::size_t>> pieces;  // taken out of the range
    std::size_t own_pages;                                    // new pages mapped for it alone
  };

  std::size_t footprint() const { return used_in_page_.size() + own_pages_; }
  void note_footprint() { peak_pages_ = std::max(peak_pages_, footprint()); }

  bool worth_assembling(std::size_t new_pages) const {
    switch (policy_) {
      case Policy::never: return false;
      case Policy::at_peak: return footprint() + new_pages > peak_pages_;
      case Policy::within_slack: return footprint() + new_pages + peak_pages_ / slack_divisor_ > peak_pages_;
      case Policy::always: return true;
    }
    return false;
  }

  // The lowest of the smallest free ranges that hold `bytes` (the range's
  // endless free tail holds anything).
  std::size_t best_fit(std::size_t bytes) const {
    std::size_t chosen = 0, chosen_length = std::numeric_limits<std::size_t>::max();
    for (const auto& [begin, end] : free_)
      if (end - begin >= bytes && end - begin < chosen_length) chosen = begin, chosen_length = end - begin;
    return chosen;
  }

  std::size_t unmapped_pages_in(std::size_t begin, std::size_t end) const {
    std::size_t count = 0;
    for (std::size_t page = begin / kPage; page * kPage < end; ++page) count += !used_in_page_.count(page);
    return count;
  }
  bool mapped(std::size_t page) const { return used_in_page_.count(page) != 0; }

  // Assembles the block from a mapped page's free end and another's free
  // start where that maps fewer new pages than `fit_new_pages`; false if
  // no pair does.
  bool assemble(std::uint64_t id, std::size_t bytes, std::size_t fit_new_pages) {
    struct End {
      std::size_t address, length;
    };
    std::vector<End> tails, heads;  // a mapped page's free last bytes; its free first bytes
    for (const auto& [begin, end] : free_) {
      const std::size_t page = begin / kPage;
      if (begin % kPage && mapped(page) && end >= (page + 1) * kPage) tails.push_back({begin, (page + 1) * kPage - begin});
      if (end != kEndless && end % kPage && mapped(end / kPage) && begin <= end / kPage * kPage)
        heads.push_back({end / kPage * kPage, end % kPage});
    }
    // Fewest new pages; among those, the least left over of the head used.
    std::size_t best_new = fit_new_pages, best_leftover = std::numeric_limits<std::size_t>::max();
    const End* best_tail = nullptr;
    const End* best_head = nullptr;
    bool found = false;
    auto consider = [&](const End* tail, const End* head) {
      const std::size_t from_tail = tail ? tail->length : 0;
      if (from_tail > bytes) return;
      const std::size_t rest = bytes - from_tail, whole = rest / kPage, last = rest % kPage;
      std::size_t new_pages = whole, leftover = 0;
      if (head) {
        if (last == 0 || head->length < last) return;
        if (tail && tail->address / kPage == head->address / kPage) return;
        leftover = head->length - last;
      } else if (last) {
        ++new_pages;
      }
      if (new_pages < best_new || (found && new_pages == best_new && leftover < best_leftover)) {
        best_new = new_pages, best_leftover = leftover, best_tail = tail, best_head = head, found = true;
      }
    };
    for (const End& tail : tails) consider(&tail, nullptr);
    for (const End& head : heads) consider(nullptr, &head);
    for (const End& tail : tails)
      for (const End& head : heads) consider(&tail, &head);
    if (!found) return false;
    Block block{{}, best_new};
    std::size_t rest = bytes;
    if (best_tail) {
      take(best_tail->address, best_tail->address + best_tail->length);
      block.pieces.push_back({best_tail->address, best_tail->address + best_tail->length});
      rest -= best_tail->length;
    }
    if (best_head) {
      const std::size_t last = rest % kPage;
      take(best_head->address, best_head->address + last);
      block.pieces.push_back({best_head->address, best_head->address + last});
    }
    own_pages_ += block.own_pages;
    blocks_[id] = std::move(block);
    ++assembled_;
    note_footprint();
    return true;
  }

  void count_use(std::size_t begin, std::size_t end, bool taking) {
    for (std::size_t page = begin / kPage; page * kPage < end; ++page) {
      const std::size_t bytes = std::min(end, (page + 1) * kPage) - std::max(begin, page * kPage);
      if (taking) {
        used_in_page_[page] += bytes;
      } else if ((used_in_page_[page] -= bytes) == 0) {
        used_in_page_.erase(page);  // unmapped
      }
    }
  }
  void take(std::size_t begin, std::size_t end) {
    auto range = std::prev(free_.upper_bound(begin));
    const auto [free_begin, free_end] = *range;
    if (begin < free_begin || end > free_end) std::abort();
    free_.erase(range);
    if (free_begin < begin) free_[free_begin] = begin;
    if (end < free_end) free_[end] = free_end;
    count_use(begin, end, true);
  }
  void give(std::size_t begin, std::size_t end) {
    count_use(begin, end, false);
    auto after = free_.lower_bound(begin);
    if (after != free_.end() && after->first == end) end = after->second, after = free_.erase(after);
    if (after != free_.begin() && std::prev(after)->second == begin) begin = std::prev(after)->first, free_.erase(std::prev(after));
    free_[begin] = end;
  }

  Policy policy_;
  std::size_t slack_divisor_;  // the slack: this fraction of the peak
  std::map<std::size_t, std::size_t> free_{{0, kEndless}};  // free ranges: begin -> end
  std::unordered_map<std::size_t, std::size_t> used_in_page_;  // mapped pages: bytes in use
  std::unordered_map<std::uint64_t, Block> blocks_;
  std::size_t own_pages_ = 0, peak_pages_ = 0, assembled_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MAX_SIZE_MIB LIVE_MIB [OPERATIONS=20000] [SLACK_DIVISOR=32]\n", argv[0]);
    return 1;
  }
  const std::size_t max_size = std::stoull(argv[1]) << 20, live_cap = std::stoull(argv[2]) << 20;
  const std::size_t operations = argc > 3 ? std::stoull(argv[3]) : 20000;
  const std::size_t slack = argc > 4 ? std::stoull(argv[4]) : 32;
  if (max_size == 0 || live_cap < max_size || slack == 0) {
    std::fprintf(stderr, "the max size must be at least 1 MiB, the live cap at least the max size, the divisor not 0\n");
    return 1;
  }
  const std::pair<Policy, const char*> policies[] = {{Policy::never, "never (page-release bound)"},
                                                     {Policy::at_peak, "past the peak"},
                                                     {Policy::within_slack, "within the slack of the peak"},
                                                     {Policy::always, "wherever fewer new pages"}};
  std::printf("sizes up to %zu MiB, %zu MiB live, %zu operations, slack 1/%zu of the peak\n", max_size >> 20, live_cap >> 20,
              operations, slack);
  for (const auto& [policy, label] : policies) {
    double sum = 0, most = 0;
    std::size_t assembled = 0, allocations = 0;
    std::string ratios;
    for (unsigned seed = 1; seed <= 8; ++seed) {
      Model model(policy, slack);
      std::size_t live = 0, peak_live = 0;
      for (const auto& operation : cuemm::workload::random_operations(max_size, operations, live_cap, seed)) {
        if (operation.allocate) {
          model.allocate(operation.id, operation.size);
          peak_live = std::max(peak_live, live += operation.size);
          ++allocations;
        } else {
          model.free(operation.id);
          live -= operation.size;
        }
      }
      const double ratio = static_cast<double>(model.peak_pages() * kPage) / static_cast<double>(peak_live);
      sum += ratio, most = std::max(most, ratio), assembled += model.assembled();
      char cell[16];
      std::snprintf(cell, sizeof cell, " %.3f", ratio);
      ratios += cell;
    }
    std::printf("  %-30s mean %.3f max %.3f (%s); assembled %.2f%% of allocations\n", label, sum / 8, most,
                ratios.c_str() + 1, 100.0 * static_cast<double>(assembled) / static_cast<double>(allocations));
  }
}
