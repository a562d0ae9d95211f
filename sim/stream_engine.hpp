// stream_engine.hpp: in-order asynchronous execution for simulated streams.
//
// Each stream owns one worker thread that runs its operations in FIFO order,
// so work really is asynchronous to the caller (a freed block can still be in
// use by a pending "kernel", as on a GPU). Ordering between streams is expressed
// as dependencies on another stream's ticket: the operation waits until that
// stream has completed the ticket. The legacy default stream's implicit
// synchronisation is built from such dependencies by the driver front end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace cuemm::sim {

struct Context;

class SimStream {
 public:
  using Operation = std::function<void()>;
  struct Dependency {
    std::shared_ptr<SimStream> stream;
    std::uint64_t ticket;
  };

  SimStream(Context* context, unsigned flags) : context_(context), flags_(flags), id_(next_id()) {}
  ~SimStream() { shut_down(); }
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  Context* context() const { return context_; }
  bool blocking() const { return (flags_ & 0x1u) == 0; }
  // cuStreamGetId's: no two streams of the process share one, as the driver's.
  std::uint64_t id() const { return id_; }

  // Queues an operation that first waits for every dependency. Returns the
  // operation's ticket. A `marker` (an event's record) runs once its ticket
  // counts as complete, so that whoever sees it run finds the stream's work up
  // to it complete, as on a GPU (else a query of the stream right after a
  // wait for the event could still read it busy).
  std::uint64_t enqueue(Operation operation, std::vector<Dependency> dependencies = {}, bool marker = false) {
    std::unique_lock lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    queue_.push_back({std::move(operation), std::move(dependencies), marker});
    const std::uint64_t ticket = ++enqueued_;
    wake_.notify_all();
    return ticket;
  }

  std::uint64_t last_ticket() const {
    std::lock_guard lock(mutex_);
    return enqueued_;
  }
  bool is_complete(std::uint64_t ticket) const {
    std::lock_guard lock(mutex_);
    return completed_ >= ticket;
  }
  void wait_for(std::uint64_t ticket) const {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return completed_ >= ticket; });
  }
  void synchronize() const { wait_for(last_ticket()); }

  // Drains the queue and stops the worker. Safe to call twice.
  void shut_down() {
    {
      std::unique_lock lock(mutex_);
      if (!worker_.joinable()) return;
      stopping_ = true;
      wake_.notify_all();
    }
    worker_.join();
  }

 private:
  struct Queued {
    Operation operation;
    std::vector<Dependency> dependencies;
    bool marker = false;
  };

  void run() {
    for (;;) {
      Queued next;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      for (auto& dependency : next.dependencies) dependency.stream->wait_for(dependency.ticket);
      if (next.operation && !next.marker) next.operation();
      {
        std::lock_guard lock(mutex_);
        ++completed_;
      }
      done_.notify_all();
      if (next.operation && next.marker) next.operation();
    }
  }

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> issued{0};
    return ++issued;
  }

  Context* context_;
  unsigned flags_;
  std::uint64_t id_;
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;
  mutable std::condition_variable done_;
  std::deque<Queued> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// An event completes when its stream reaches the point where it was
// recorded; one recorded for a whole context (cuCtxRecordEvent), once every
// stream has reached the point where it stood at the record. Either way the
// event reads its streams' tickets, so that it and they never disagree (a
// stream's query right after a wait for its event reads idle).
struct Capture;

struct SimEvent {
  explicit SimEvent(Context* context, unsigned flags) : context(context), flags(flags) {}
  Context* context;
  unsigned flags;
  std::mutex mutex;
  std::condition_variable done;
  std::uint64_t recorded = 0;   // generation of the latest record
  std::uint64_t completed = 0;  // generation the stream has reached
  std::chrono::steady_clock::time_point time{};
  // Last recorded on a capturing stream: the capture, the stream and how
  // many operations the capture held then (a wait for it joins that point).
  std::weak_ptr<Capture> capture;
  SimStream* captured_on = nullptr;
  std::size_t captured_at = 0;
  // The latest record's generation and the streams' points it waits for:
  // one for a stream's record (whose marker on the stream settles it once
  // reached), every stream's for a context-wide one (whoever looks settles it).
  std::uint64_t points_generation = 0;
  std::vector<SimStream::Dependency> points;

  // Completes the latest record once its streams have all reached their
  // points. Call with `mutex` held.
  void settle() {
    if (points_generation == 0 || points_generation != recorded || completed >= recorded) return;
    for (const auto& point : points)
      if (!point.stream->is_complete(point.ticket)) return;
    completed = recorded;
    time = std::chrono::steady_clock::now();
    points.clear();
    done.notify_all();
  }
};

}  // namespace cuemm::sim
