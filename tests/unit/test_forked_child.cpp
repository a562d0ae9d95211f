// A child forked after the driver was loaded (Note [A child forked after the
// driver was loaded], cuemm/driver/driver.hpp): CUDA refuses it, and cuemm
// refuses it at once, with an error that names the fork, rather than hand it
// the parent's cached blocks or wait on a lock that a parent's thread held
// when it forked. Under every bundled manager (ctest runs this program once
// for each), on the simulated driver as on libcuda.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

using namespace cuemm;

// Which sanitizer the build has: GCC 12 names it with __SANITIZE_ADDRESS__ /
// __SANITIZE_THREAD__, clang 14 only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define CUEMM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUEMM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CUEMM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUEMM_TEST_TSAN 1
#endif
#endif

// ThreadSanitizer runtimes older than LLVM 19 (whose fork handling, PR
// #96600, locks the stack depot; GCC's libsanitizer before GCC 15) leave a
// child forked while another thread records an allocation's stack spinning on
// the depot's allocator lock in its first malloc (google/sanitizers#1400).
#if defined(CUEMM_TEST_TSAN) && ((defined(__clang__) && __clang_major__ < 19) || (!defined(__clang__) && __GNUC__ < 15))
#define CUEMM_TEST_TSAN_FORK_UNSAFE 1
#endif

namespace {

// What a child found wrong, one line each; its exit status 0 only if nothing.
class ChildChecks {
 public:
  template <typename Call>
  void expect_refused(const char* what, Call&& call) {
    try {
      call();
      failures_ += std::string(what) + ": not refused\n";
    } catch (const CudaError& error) {
      const std::string message = error.what();
      if (error.code() != cuda::CUDA_ERROR_NOT_INITIALIZED)
        failures_ += std::string(what) + ": code " + error_name(error.code()) + ": " + message + "\n";
      if (message.find("forked") == std::string::npos)
        failures_ += std::string(what) + ": the message does not name the fork: " + message + "\n";
    } catch (const std::exception& error) {
      failures_ += std::string(what) + ": not a CudaError: " + error.what() + "\n";
    }
  }
  void expect(bool condition, const std::string& what) {
    if (!condition) failures_ += what + "\n";
  }
  // Ends the child: its findings down `pipe`, exit status 1 where there are any.
  [[noreturn]] void report(int pipe) {
    if (!failures_.empty()) (void)!::write(pipe, failures_.data(), failures_.size());
    ::_exit(failures_.empty() ? 0 : 1);
  }

 private:
  std::string failures_;
};

// Runs `child` in a forked child (which ends it with ChildChecks::report);
// returns what it reported, or why it did not end well. A child that waits
// past `limit` is killed and says so: a hang is a failure, not a stuck test.
template <typename Child>
std::string in_forked_child(Child&& child, std::chrono::seconds limit = std::chrono::seconds(30)) {
  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0) return "pipe() failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork() failed";
  if (pid == 0) {
    ::close(pipe_ends[0]);
    ChildChecks checks;
    child(checks);
    checks.report(pipe_ends[1]);
  }
  ::close(pipe_ends[1]);
  std::string said;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  bool ended = false;
  while (!ended) {
    pollfd readable{pipe_ends[0], POLLIN, 0};
    if (::poll(&readable, 1, 100) > 0) {
      char buffer[512];
      const ssize_t got = ::read(pipe_ends[0], buffer, sizeof buffer);
      if (got > 0) said.append(buffer, static_cast<std::size_t>(got));
    }
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!ended && std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(pipe_ends[0]);
      return said + "the child still ran after " + std::to_string(limit.count()) + " s (it waits: killed)";
    }
  }
  for (char buffer[512];;) {  // what it wrote last
    const ssize_t got = ::read(pipe_ends[0], buffer, sizeof buffer);
    if (got <= 0) break;
    said.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(pipe_ends[0]);
  if (WIFSIGNALED(status)) return said + "the child died of signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0 && said.empty()) return "the child exited with " + std::to_string(WEXITSTATUS(status));
  return said;
}

class ForkedChild : public ::testing::Test {
 protected:
  Context& context = current_context();
};

}  // namespace

TEST_F(ForkedChild, EveryEntryIntoTheManagerIsRefusedAtOnceWithAnErrorThatNamesTheFork) {
  // A block freed just before the fork, which a cache would hand out again,
  // and blocks the child inherits still held.
  context.memalloc(4096).reset();
  std::shared_ptr<MemoryPointer> held = context.memalloc(4096);
  std::shared_ptr<MemoryPointer> pinned = context.memhostalloc(4096, false, false, false);
  std::vector<char> host(8192);
  const std::string found = in_forked_child([&](ChildChecks& checks) {
    checks.expect_refused("memalloc", [&] { (void)context.memalloc(4096); });
    checks.expect_refused("memhostalloc", [&] { (void)context.memhostalloc(4096, true, false, false); });
    checks.expect_refused("mempin", [&] { (void)context.mempin(nullptr, host.data(), host.size(), false); });
    checks.expect_refused("memallocmanaged", [&] { (void)context.memallocmanaged(4096, true); });
    checks.expect_refused("get_ipc_handle", [&] { (void)context.get_ipc_handle(held); });
    checks.expect_refused("get_memory_info", [&] { (void)context.get_memory_info(); });
    checks.expect_refused("defer_cleanup", [&] { (void)context.defer_cleanup(); });
    checks.expect_refused("reset", [&] { context.reset(); });
    checks.expect_refused("prepare_for_use", [&] { context.prepare_for_use(); });
    // The driver refuses the child too, and its errors name the fork as well.
    checks.expect_refused("current_context", [&] { (void)current_context(); });
    checks.expect_refused("a stream", [&] { (void)context.create_stream(); });
    // The parent's blocks are dropped in the child: nothing to give back, no wait.
    held.reset();
    pinned.reset();
    checks.expect(driver::in_forked_child(), "in_forked_child() is false in the child");
  });
  EXPECT_EQ(found, "");
  // The parent goes on as before.
  EXPECT_FALSE(driver::in_forked_child());
  EXPECT_EQ(held->size(), 4096u);
  auto again = context.memalloc(4096);
  EXPECT_NE(again->device_pointer(), 0u);
}

// Threads of the parent allocate and free while it forks: a child forked with
// one of them inside the manager (its lock held, a cache half-updated) still
// gets its refusal, and drops its inherited block, at once.
TEST_F(ForkedChild, AChildForkedWhileOtherThreadsAllocateDoesNotWaitForThem) {
#ifdef CUEMM_TEST_ASAN
  // GCC 12's AddressSanitizer takes no allocator lock around fork(), as
  // glibc's malloc does: a child forked while a thread holds one waits in its
  // first malloc (seen: the refusal's message, 2 of 10 runs), before any cuemm
  // code could answer. The plain build runs it.
  GTEST_SKIP() << "AddressSanitizer's allocator is not fork-safe: a child forked while another thread "
                  "allocates may wait in malloc";
#endif
#ifdef CUEMM_TEST_TSAN_FORK_UNSAFE
  // Seen at 4a53bcc under GCC 12's ThreadSanitizer, the adaptors' variant,
  // in 3 of about 155 runs of 20 forks: the child spun in the malloc of
  // __cxa_allocate_exception, on __sanitizer::traceAllocator (the runtime's
  // StackDepotPut), before the refusal could be thrown.
  GTEST_SKIP() << "this ThreadSanitizer runtime does not lock its stack depot around fork(): a child forked "
                  "while another thread allocates may spin in its first malloc (google/sanitizers#1400)";
#endif
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::shared_ptr<MemoryPointer>> blocks(8);
      for (std::size_t i = 0; !stop.load(std::memory_order_relaxed); ++i)
        blocks[i % blocks.size()] = context.memalloc((std::size_t{256} << (i % 13)) + 256 * t);
    });
  }
  std::shared_ptr<MemoryPointer> held = context.memalloc(1 << 20);
  std::string found;
  for (int round = 0; round < 20 && found.empty(); ++round) {
    found = in_forked_child(
        [&](ChildChecks& checks) {
          checks.expect_refused("memalloc", [&] { (void)context.memalloc(1 << 20); });
          held.reset();
        },
        std::chrono::seconds(20));
  }
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(found, "");
}
