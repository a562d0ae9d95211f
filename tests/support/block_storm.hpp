// block_storm.hpp: what the tests of threads that free each other's blocks
// share: the ranges handed out and not yet freed, each new one checked
// against them all, and the blocks one thread leaves for another to free.
//
//   cuemm::testing::LiveRanges live;
//   cuemm::testing::HandedOver<Block> handed_over;
//   live.add(address, size);                       // on allocation
//   live.remove(address);                          // before the free
//   Block block = cuemm::testing::take_one(mine, random);  // one of the thread's blocks
//   handed_over.leave(std::move(block));           // another thread frees it
//   if (auto theirs = handed_over.take()) free(*theirs);
//   EXPECT_EQ(live.overlaps(), 0);
//
// A pipeline (a loader thread feeding a compute thread) hands over whole
// batches through a BatchPipeline instead, which holds at most two.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace cuemm::testing {

// Address ranges handed out and not yet freed. Thread-safe.
class LiveRanges {
 public:
  // Records [address, address + size), counting it if it overlaps a live range.
  void add(std::uintptr_t address, std::size_t size) {
    std::lock_guard lock(mutex_);
    auto next = live_.lower_bound(address);
    if (next != live_.end() && next->first < address + size) overlaps_.fetch_add(1);
    if (next != live_.begin() && std::prev(next)->first + std::prev(next)->second > address) overlaps_.fetch_add(1);
    live_[address] = size;
  }
  // Before the range's free: after it, the allocator may hand it out again.
  void remove(std::uintptr_t address) {
    std::lock_guard lock(mutex_);
    live_.erase(address);
  }
  // New ranges that overlapped a live one: a block handed out twice.
  int overlaps() const { return overlaps_.load(); }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> live_;
  std::atomic<int> overlaps_{0};
};

// Blocks one thread leaves for another to free. Thread-safe.
template <typename Block>
class HandedOver {
 public:
  void leave(Block block) {
    std::lock_guard lock(mutex_);
    blocks_.push_back(std::move(block));
  }
  // The latest block left, if any.
  std::optional<Block> take() {
    std::lock_guard lock(mutex_);
    if (blocks_.empty()) return std::nullopt;
    std::optional<Block> block(std::move(blocks_.back()));
    blocks_.pop_back();
    return block;
  }
  // What is left once the threads are done.
  std::vector<Block> take_all() {
    std::lock_guard lock(mutex_);
    return std::exchange(blocks_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<Block> blocks_;
};

// Removes one of a thread's `blocks` (not empty), drawn by `random`, and returns it.
template <typename Block, typename Random>
Block take_one(std::vector<Block>& blocks, Random& random) {
  const std::size_t drawn = random() % blocks.size();
  Block block = std::move(blocks[drawn]);
  blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(drawn));
  return block;
}

// Batches handed from one thread to another, at most two waiting: push()
// waits for room, pop() for a batch, and returns none once close() was
// called and all were taken.
template <typename Batch>
class BatchPipeline {
 public:
  void push(Batch batch) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return waiting_.size() < 2; });
      waiting_.push_back(std::move(batch));
    }
    changed_.notify_all();
  }
  std::optional<Batch> pop() {
    std::optional<Batch> batch;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return closed_ || !waiting_.empty(); });
      if (waiting_.empty()) return batch;
      batch = std::move(waiting_.front());
      waiting_.pop_front();
    }
    changed_.notify_all();
    return batch;
  }
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> waiting_;
  bool closed_ = false;
};

}  // namespace cuemm::testing
