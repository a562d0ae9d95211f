// Helpers shared by the tests: driver checks, a recording plugin, test kernels.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuemm/cuemm.hpp"
#include "cuemm/managers/detail/reuse_epochs.hpp"

namespace cuemm::testing {

// Tests that need what only the simulated driver has skip on the real one,
// saying what: `what` completes "needs the simulated driver's ..." (its call
// counters, fault injection, made-up device attributes, record of what is
// allocated, or seals that complete as soon as they are made).
#define CUEMM_REQUIRE_SIMULATION(what)                                                                    \
  do {                                                                                                    \
    if (!::cuemm::simulation::active())                                                                   \
      GTEST_SKIP() << "needs the simulated driver's " what " (running on "                               \
                   << ::cuemm::driver::Driver::get().library_path() << ")";                              \
  } while (0)

// A simulated device that answers `value` for an attribute (one without a
// feature: 0) while this lives; CUEMM_REQUIRE_SIMULATION("made-up device attributes") first.
class SimulatedDeviceAttribute {
 public:
  SimulatedDeviceAttribute(int device, cuda::DeviceAttribute attribute, int value)
      : device_(device), attribute_(attribute) {
    simulation::set_device_attribute(device, attribute, value);
  }
  ~SimulatedDeviceAttribute() { simulation::set_device_attribute(device_, attribute_, -1); }
  SimulatedDeviceAttribute(const SimulatedDeviceAttribute&) = delete;
  SimulatedDeviceAttribute& operator=(const SimulatedDeviceAttribute&) = delete;

 private:
  int device_;
  cuda::DeviceAttribute attribute_;
};

// An environment variable set (or, with nullptr, unset) while this lives; its
// earlier value comes back after. (ctest runs some suites under settings of
// its own: tests/CMakeLists.txt.)
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* earlier = std::getenv(name)) earlier_ = earlier;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedVariable() { earlier_ ? setenv(name_, earlier_->c_str(), 1) : unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> earlier_;
};

// The error that `call` throws as `Expected`, or nothing if it returns (an
// exception of another type propagates, and the test fails with it).
template <typename Expected, typename Call>
std::optional<Expected> caught(Call&& call) {
  try {
    std::forward<Call>(call)();
  } catch (const Expected& error) {
    return error;
  }
  return std::nullopt;
}

// Whether `call` throws `Expected` whose message names each of `fragments`:
//   EXPECT_TRUE(throws<InvalidArgument>([&] { pool.memalloc(huge); }, "1.00 PiB"));
// A failure says that nothing was thrown, or which fragment the message lacks.
template <typename Expected, typename Call, typename... Fragments>
::testing::AssertionResult throws(Call&& call, const Fragments&... fragments) {
  const std::optional<Expected> error = caught<Expected>(std::forward<Call>(call));
  if (!error) return ::testing::AssertionFailure() << "nothing was thrown";
  const std::string message = error->what();
  for (const std::string_view fragment : std::array<std::string_view, sizeof...(Fragments)>{fragments...}) {
    if (message.find(fragment) == std::string::npos)
      return ::testing::AssertionFailure() << "the message \"" << message << "\" does not name \"" << fragment << '"';
  }
  return ::testing::AssertionSuccess() << message;
}

// Why device 1 cannot use device 0's memory here; empty when it can (the
// tests of peers: Note [Peer access]).
inline std::string why_devices_are_not_peers() {
  if (Device::count() < 2)
    return "needs two devices (the simulated driver gives two that are peers with CUEMM_SIM_DEVICES=2 "
           "CUEMM_SIM_PEER_ACCESS=1)";
  if (!Device::get(1).can_access_peer(Device::get(0)))
    return "device 1 cannot access device 0's memory (the simulated driver's devices are peers with "
           "CUEMM_SIM_PEER_ACCESS=1)";
  return "";
}

inline std::string test_kernels_ptx() {
  std::ifstream file(CUEMM_TEST_KERNELS_PTX);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A kernel held on `stream` until the test lets it go, then filling `count`
// words at `out` with `value`: the GPU reads busy for as long as a test
// needs, however slowly a loaded machine runs the test's steps. (A kernel
// that spins for a fixed time may end before them: on a CI machine a 300 ms
// one ended before the pool's decision that it was there for.) It ends by
// itself after kMostHeld, so that a failing test cannot hang. Look up the
// kernels to launch while one is held before it: a driver that loads kernels
// lazily (CUDA 12.2's default) may wait for the GPU to load one.
class HeldKernel {
 public:
  static constexpr std::chrono::seconds kMostHeld{10};

  HeldKernel(Context& context, const Stream& stream, cuda::CUdeviceptr out = 0, std::uint32_t value = 0,
             std::uint64_t count = 0)
      : stream_(stream), module_(context.load_module(test_kernels_ptx())) {
    ScopedContext scope(context);
    // The gate straight from the driver, so that no manager under test sees it.
    CUEMM_CU(cuMemHostAlloc, &gate_, sizeof(std::uint32_t),
             cuda::CU_MEMHOSTALLOC_DEVICEMAP | cuda::CU_MEMHOSTALLOC_PORTABLE);
    *static_cast<volatile std::uint32_t*>(gate_) = 0;
    cuda::CUdeviceptr gate_address = 0;
    CUEMM_CU(cuMemHostGetDevicePointer, &gate_address, gate_, 0u);
    module_.function("cuemm_held_fill_u32")
        .launch({1}, {32}, stream, gate_address, out, value, count,
                std::uint64_t{std::chrono::nanoseconds(kMostHeld).count()});
  }
  ~HeldKernel() {
    let_go();
    try {
      stream_.synchronize();
      CUEMM_CU(cuMemFreeHost, gate_);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "a held kernel did not end: " << error.what();
    }
  }
  HeldKernel(const HeldKernel&) = delete;
  HeldKernel& operator=(const HeldKernel&) = delete;

  void let_go() noexcept { __atomic_store_n(static_cast<std::uint32_t*>(gate_), 1u, __ATOMIC_RELEASE); }
  bool finished() const { return stream_.query(); }

  // Runs `call`, letting the kernel go `delay` after the call began: a call
  // that waits for the kernel then returns once it has finished, and one that
  // does not returns with the kernel still held. Whether the kernel had
  // finished when `call` returned; it is let go either way.
  template <typename Call>
  bool waited_for_by(Call&& call, std::chrono::milliseconds delay = std::chrono::milliseconds(250)) {
    std::mutex mutex;
    std::condition_variable returned;
    bool done = false;
    std::thread letting_go([&] {
      std::unique_lock lock(mutex);
      returned.wait_for(lock, delay, [&] { return done; });
      let_go();
    });
    struct JoinOnExit {
      std::function<void()> join;
      ~JoinOnExit() { join(); }
    } join_on_exit{[&] {
      {
        std::lock_guard lock(mutex);
        done = true;
      }
      returned.notify_one();
      letting_go.join();
    }};
    std::forward<Call>(call)();
    return finished();
  }

 private:
  const Stream& stream_;
  // Kept until the kernel has ended: a module must not be unloaded under a
  // running kernel of its own (with it unloaded, two pool tests on the
  // H100 stalled for the whole kMostHeld).
  Module module_;
  void* gate_ = nullptr;
};

// Whether the pools' seals cover every stream: the driver records events for
// a whole context (cuCtxRecordEvent, CUDA 12.5). A driver before 12.5 lacks
// the call, and the simulated one refuses it where CUEMM_SIM_FAULTS says so
// (run-tests.sh runs the pools' tests so, as on such a driver); the seals
// then cover the legacy stream's work only. Asks ReuseEpochs itself, as the
// pools do.
inline bool context_events_work(Context& context) {
  detail::ReuseEpochs epochs(&context);
  const bool every_stream = epochs.covers_every_stream();
  epochs.retire();  // (its probe's event)
  return every_stream;
}

// Makes the next `times` seals of the pools' reuse epochs fail as they do
// while a graph is being captured (simulated driver): neither an event (for
// the context, or on the legacy stream, which reads busy) nor the fallback
// synchronisation. simulation::clear_faults() ends it early.
inline void refuse_the_next_seals(std::uint64_t times) {
  for (const char* call : {"cuCtxRecordEvent", "cuEventRecord", "cuCtxSynchronize"})
    simulation::inject_fault(call, 1, cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, times);
  simulation::inject_fault("cuStreamQuery", 1, cuda::CUDA_ERROR_NOT_READY, times);
}

// The driver calls that start a seal of the pools' reuse epochs (simulated
// driver): cuCtxRecordEvent where seals cover every stream, else a query of
// the legacy stream (ReuseEpochs).
inline std::uint64_t seal_calls() {
  return simulation::call_count("cuCtxRecordEvent") + simulation::call_count("cuStreamQuery");
}

// The stream-safety race every pooling manager must win: a held kernel
// (one on a non-blocking stream with `non_blocking`) is to write 7 into A, A
// is released, and B of the same size is allocated and written with 9 from
// the host on another stream; only then is the kernel let go, unless the
// manager waited for it. `count` 32-bit words each (the default: 1 MiB).
// With `released_by_another_thread`, a thread that has used the manager
// before releases A after this thread allocated it (a loader's block dropped
// by the compute thread).
struct ReuseRace {
  bool b_intact;  // B still holds the nines once the kernel has finished
  cuda::CUdeviceptr a;
  cuda::CUdeviceptr b;
};
inline ReuseRace run_reuse_race(Context& context, BaseMemoryManager& manager, std::uint64_t count = 1 << 18,
                                bool non_blocking = false, bool released_by_another_thread = false) {
  Stream kernel_stream = context.create_stream(non_blocking);
  Stream copy_stream = context.create_stream();
  std::shared_ptr<MemoryPointer> a;
  std::latch releaser_ready(1), release_a(1);
  std::thread releaser;
  if (released_by_another_thread) {
    releaser = std::thread([&] {
      ScopedContext scope(context);
      manager.memalloc(256).reset();  // (whatever the manager sets up for a thread, before A)
      releaser_ready.count_down();
      release_a.wait();
      a.reset();
    });
    releaser_ready.wait();
  }
  a = manager.memalloc(count * 4);
  const auto a_address = a->device_pointer();
  std::shared_ptr<MemoryPointer> b;
  const std::vector<std::uint32_t> nines(count, 9u);
  {
    HeldKernel kernel(context, kernel_stream, a_address, 7u, count);
    if (released_by_another_thread) {
      release_a.count_down();
      releaser.join();
    } else {
      a.reset();
    }
    kernel.waited_for_by([&] {
      b = manager.memalloc(count * 4);
      DeviceArray<std::uint32_t>(b, count).copy_to_device(nines, copy_stream);
      copy_stream.synchronize();
    });
  }
  return {DeviceArray<std::uint32_t>(b, count).copy_to_host() == nines, a_address, b->device_pointer()};
}

// What a RecordingManager saw, shared so tests can read it after the context
// owns the manager.
struct ManagerLog {
  std::mutex mutex;
  std::vector<std::string> events;
  std::atomic<int> finalized{0};
  void add(const std::string& event) {
    std::lock_guard lock(mutex);
    events.push_back(event);
  }
  std::vector<std::string> snapshot() {
    std::lock_guard lock(mutex);
    return events;
  }
  int count(const std::string& event) {
    std::lock_guard lock(mutex);
    int n = 0;
    for (const auto& e : events) n += e == event;
    return n;
  }
};

inline std::shared_ptr<ManagerLog>& recording_log() {
  static auto log = std::make_shared<ManagerLog>();
  return log;
}

// A device-only plugin that records every call. It hands out distinct fake
// addresses and never calls the driver for device memory, so any cuMemAlloc or
// cuMemFree seen while it is in use was made by the runtime itself.
class RecordingManager : public HostOnlyMemoryManager {
 public:
  explicit RecordingManager(Context* context) : HostOnlyMemoryManager(context) {}

  std::shared_ptr<MemoryPointer> memalloc(std::size_t size) override {
    log_->add("memalloc");
    if (!initialized_) log_->add("memalloc-before-initialize");
    // Addresses handed out are fake but distinct; no device memory is touched.
    const std::uintptr_t address = next_.fetch_add((size + 255) / 256 * 256);
    auto log = log_;
    return std::make_shared<MemoryPointer>(&context(), address, size, nullptr, [log] {
      log->finalized.fetch_add(1);
      log->add("finalize");
    });
  }
  IpcHandle get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) override {
    log_->add("get_ipc_handle");
    cuda::CUipcMemHandle handle{};
    return IpcHandle(memory, handle, memory->size(), std::nullopt, 0);
  }
  MemoryInfo get_memory_info() override {
    log_->add("get_memory_info");
    return {1234, 5678};
  }

 protected:
  void on_initialize() override {
    initialized_ = true;
    log_->add("initialize");
  }
  void on_reset() override { log_->add("reset"); }
  CleanupGuard on_defer_cleanup() override {
    log_->add("defer_cleanup");
    auto log = log_;
    return CleanupGuard([log] { log->add("defer_cleanup_end"); });
  }

 private:
  std::shared_ptr<ManagerLog> log_ = recording_log();
  std::atomic<std::uintptr_t> next_{0x7f0000000000};
  bool initialized_ = false;
};

}  // namespace cuemm::testing
