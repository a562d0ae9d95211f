// main() for test programs whose tests each need a process of their own: the
// process's first context, its first manager made, or the driver not yet
// loaded. Run as usual, the program runs every test that its flags select in
// a child process of its own (itself again, filtered to that test), so that
// any selection, order (--gtest_shuffle) or repetition (--gtest_repeat) of
// them holds. A child is marked by CUEMM_TEST_IN_OWN_PROCESS and runs its one
// test as gtest_main would.
#include <gtest/gtest.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr const char* kChildMark = "CUEMM_TEST_IN_OWN_PROCESS";

// Runs `arguments` (the program first) with the child's mark set; its exit
// status, or -1 where it could not start or did not exit.
int run_child(const std::vector<std::string>& arguments, std::string* output = nullptr) {
  std::vector<char*> argv;
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  int pipe_ends[2] = {-1, -1};
  if (output && pipe(pipe_ends) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (output) {
    posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_ends[0]);
  }
  setenv(kChildMark, "1", 1);
  pid_t child = 0;
  const int spawned = posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  unsetenv(kChildMark);
  if (output) {
    close(pipe_ends[1]);
    char buffer[4096];
    for (ssize_t read_bytes; (read_bytes = read(pipe_ends[0], buffer, sizeof buffer)) > 0;)
      output->append(buffer, static_cast<std::size_t>(read_bytes));
    close(pipe_ends[0]);
  }
  if (spawned != 0) return -1;
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// The tests the flags select, as "Suite.Name", in the program's order
// (gtest lists them with the filter applied).
std::vector<std::string> selected_tests(const std::string& program) {
  const std::string filter = ::testing::GTEST_FLAG(filter);
  std::string listing;
  if (run_child({program, "--gtest_list_tests", "--gtest_filter=" + filter}, &listing) != 0) return {};
  std::vector<std::string> names;
  std::istringstream lines(listing);
  std::string suite;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const std::string name = line.substr(0, line.find(' ', line.find_first_not_of(' ')));
    if (line[0] != ' ') {
      suite = name;  // "Suite."
    } else {
      names.push_back(suite + name.substr(name.find_first_not_of(' ')));
    }
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // (A listing runs nothing: as gtest_main would.)
  if (getenv(kChildMark) || ::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();

  const std::string program = argv[0];
  std::vector<std::string> tests = selected_tests(program);
  if (tests.empty()) {
    std::printf("no test selected (or the listing failed)\n");
    return ::testing::GTEST_FLAG(filter) == "*" ? 1 : 0;
  }
  const int repeat = std::max(1, static_cast<int>(::testing::GTEST_FLAG(repeat)));
  std::mt19937 shuffle_order(static_cast<unsigned>(::testing::GTEST_FLAG(random_seed)));
  std::vector<std::string> failed;
  for (int round = 0; round < repeat; ++round) {
    if (::testing::GTEST_FLAG(shuffle)) std::shuffle(tests.begin(), tests.end(), shuffle_order);
    for (const std::string& test : tests) {
      std::fflush(stdout);
      std::vector<std::string> arguments = {program, "--gtest_filter=" + test};
      if (::testing::GTEST_FLAG(brief)) arguments.push_back("--gtest_brief=1");
      if (run_child(arguments) != 0) failed.push_back(test);
    }
  }
  std::printf("%zu test run(s), each in a process of its own: %zu failed\n", tests.size() * repeat, failed.size());
  for (const std::string& test : failed) std::printf("  failed: %s\n", test.c_str());
  return failed.empty() ? 0 : 1;
}
