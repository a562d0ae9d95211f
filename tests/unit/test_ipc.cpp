// IPC handles: serialisation, errors, and opening in another process, directly
// and staged through a second device. Run with CUEMM_SIM_DEVICES=2 on the
// simulated driver so the staged path is exercised without two GPUs.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "support/test_support.hpp"

extern char** environ;

using namespace cuemm;
using cuemm::testing::throws;
using cuemm::testing::why_devices_are_not_peers;

namespace {

struct ChildRun {
  int status = -1;    // its exit status; -1 if it did not exit
  std::string error;  // what it wrote to stderr
};

// Runs the importing process (tests/helpers/ipc_child.cpp) to its end.
ChildRun run_child(const IpcHandle& handle, int device, std::size_t count, std::uint32_t first, const char* mode) {
  const std::string hex = handle.to_hex();
  const std::string device_text = std::to_string(device);
  const std::string count_text = std::to_string(count);
  const std::string first_text = std::to_string(first);
  const char* path = CUEMM_IPC_CHILD_PATH;
  std::vector<char*> args = {const_cast<char*>(path), const_cast<char*>(hex.c_str()),
                             const_cast<char*>(device_text.c_str()), const_cast<char*>(count_text.c_str()),
                             const_cast<char*>(first_text.c_str()), const_cast<char*>(mode), nullptr};
  ChildRun run;
  std::FILE* error_file = std::tmpfile();
  if (!error_file) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fileno(error_file), STDERR_FILENO);
  pid_t pid = 0;
  const bool spawned = posix_spawn(&pid, path, &actions, nullptr, args.data(), environ) == 0;
  posix_spawn_file_actions_destroy(&actions);
  if (spawned) {
    int status = 0;
    waitpid(pid, &status, 0);
    run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::rewind(error_file);
    for (int c; (c = std::fgetc(error_file)) != EOF;) run.error += static_cast<char>(c);
  }
  std::fclose(error_file);
  return run;
}

// Whether the importing process found every value and exited with 0; a
// failure quotes what it said.
::testing::AssertionResult child_succeeds(const IpcHandle& handle, int device, std::size_t count, std::uint32_t first,
                                          const char* mode) {
  const ChildRun run = run_child(handle, device, count, first, mode);
  if (run.status == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "ipc_child exited with " << run.status << ": " << run.error;
}

// `memory` as `count` words holding first, first + 1, ... (what the child checks).
DeviceArray<std::uint32_t> counting_array(std::shared_ptr<MemoryPointer> memory, std::size_t count,
                                          std::uint32_t first) {
  std::vector<std::uint32_t> values(count);
  std::iota(values.begin(), values.end(), first);
  DeviceArray<std::uint32_t> array(std::move(memory), count);
  array.copy_to_device(values);
  return array;
}

// Why the staged path cannot run here; empty when it can.
std::string why_no_staging() {
  if (Device::count() < 2) return "needs two devices (the simulated driver gives two with CUEMM_SIM_DEVICES=2)";
  if (Device::get(1).can_access_peer(Device::get(0))) return "device 1 can map device 0's memory, so no staging happens";
  return "";
}

// Whether `array`'s words read first + 1000, first + 1001, ...: the child's kernel ran on them.
::testing::AssertionResult holds_the_childs_sums(const DeviceArray<std::uint32_t>& array, std::uint32_t first) {
  const std::vector<std::uint32_t> after = array.copy_to_host();
  for (std::size_t i = 0; i < after.size(); ++i) {
    if (after[i] != first + 1000 + i)
      return ::testing::AssertionFailure() << "word " << i << " reads " << after[i] << ": the child's write is not visible";
  }
  return ::testing::AssertionSuccess();
}

// An async manager whose pool is created exportable: its blocks have cuemm's
// handles, whose pool descriptor the child takes from this process.
std::unique_ptr<AsyncMemoryManager> exportable_async_manager(Context& context) {
  AsyncOptions options;
  options.exportable = true;
  options.pinned_host_pool = false;
  auto manager = std::make_unique<AsyncMemoryManager>(&context, options);
  manager->initialize();
  return manager;
}

class Ipc : public ::testing::Test {
 protected:
  Context& context = current_context();
};

}  // namespace

TEST_F(Ipc, HandlesSurviveSerialisation) {
  auto memory = context.memalloc(1 << 16);
  auto view = memory->view(4096, 8192);
  IpcHandle handle = context.get_ipc_handle(view);
  EXPECT_EQ(handle.offset(), 4096u);
  EXPECT_EQ(handle.size(), 4096u);
  ASSERT_TRUE(handle.source_info().has_value());
  EXPECT_EQ(*handle.source_info(), context.device().identity());
  IpcHandle copy = IpcHandle::from_hex(handle.to_hex());
  EXPECT_EQ(copy.base(), nullptr);
  EXPECT_EQ(copy.offset(), handle.offset());
  EXPECT_EQ(copy.size(), handle.size());
  EXPECT_EQ(copy.source_info(), handle.source_info());
  EXPECT_EQ(0, std::memcmp(copy.handle().reserved, handle.handle().reserved, cuda::kIpcHandleSize));
}

TEST_F(Ipc, MalformedBytesAreRefusedByLength) {
  EXPECT_TRUE(throws<InvalidArgument>([&] { IpcHandle::from_bytes(std::vector<std::uint8_t>(10, 0)); }, "10 bytes"));
  EXPECT_THROW(IpcHandle::from_hex("zz"), InvalidArgument);
  EXPECT_THROW(IpcHandle::from_hex("abc"), InvalidArgument);
  // A handle of mapped pieces is as long as its pieces say.
  const MappedExport mapped{123, {{1, 2u << 20}, {2, 2u << 20}}};
  std::vector<std::uint8_t> bytes = IpcHandle(nullptr, mapped, 4096).to_bytes();
  EXPECT_EQ(IpcHandle::from_bytes(bytes).mapped_export()->pieces.size(), 2u);
  bytes.pop_back();
  EXPECT_TRUE(throws<InvalidArgument>([&] { IpcHandle::from_bytes(bytes); },
                                      "mapped pieces has " + std::to_string(bytes.size()) + " bytes"));
}

// Bytes that parse but describe no block that could exist are refused by what is wrong.
TEST_F(Ipc, ImpossibleBlocksAreRefusedWhenRead) {
  const cuda::CUipcMemHandle driver_handle{};
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  EXPECT_TRUE(throws<InvalidArgument>(
      [&] { IpcHandle::from_bytes(IpcHandle(nullptr, driver_handle, most, std::nullopt, 2).to_bytes()); },
      "offset 2 plus its 18446744073709551615 bytes overflow"));
  const MappedExport empty_piece{123, {{1, 2u << 20}, {2, 0}}};
  EXPECT_TRUE(throws<InvalidArgument>([&] { IpcHandle::from_bytes(IpcHandle(nullptr, empty_piece, 4096).to_bytes()); },
                                      "mapped piece 1 of 0 bytes"));
  const MappedExport overflowing{123, {{1, 2u << 20}, {2, most}}};
  EXPECT_TRUE(throws<InvalidArgument>([&] { IpcHandle::from_bytes(IpcHandle(nullptr, overflowing, 4096).to_bytes()); },
                                      "overflows the pieces' total"));
  const MappedExport one_piece{123, {{1, 2u << 20}}};
  EXPECT_TRUE(throws<InvalidArgument>(
      [&] { IpcHandle::from_bytes(IpcHandle(nullptr, one_piece, 2u << 20, std::nullopt, 4096).to_bytes()); },
      "(offset 4096, 2097152 bytes) ends past its mapped pieces (2097152 bytes)"));
  EXPECT_NO_THROW(
      IpcHandle::from_bytes(IpcHandle(nullptr, one_piece, (2u << 20) - 4096, std::nullopt, 4096).to_bytes()));
}

// A handle that claims more than the exporter allocated (damaged, or forged
// from another's bytes) does not open: the importer would read past the memory.
TEST_F(Ipc, AHandleClaimingMoreThanTheExportersAllocationDoesNotOpen) {
  auto memory = context.memalloc(4096);
  const IpcHandle real = context.get_ipc_handle(memory);
  ASSERT_TRUE(real.has_driver_handle());
  const IpcHandle claiming(nullptr, real.handle(), std::size_t{64} << 20, real.source_info(), real.offset());
  const ChildRun run = run_child(claiming, context.device().id(), 16, 0, "direct");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.error.find("(67108864 bytes)) ends past the exporter's allocation"), std::string::npos) << run.error;
  EXPECT_TRUE(child_succeeds(real, context.device().id(), 0, 0, "direct")) << "the real handle still opens";
}

TEST_F(Ipc, TheExportingProcessCannotOpenItsOwnHandle) {
  auto memory = context.memalloc(4096);
  IpcHandle handle = context.get_ipc_handle(memory);
  EXPECT_THROW(handle.open(context), StateError);
  IpcHandle rebuilt = IpcHandle::from_bytes(handle.to_bytes());
  EXPECT_TRUE(throws<StateError>([&] { rebuilt.open(context); }, "exported by this process"));
  EXPECT_FALSE(rebuilt.is_open());
}

TEST_F(Ipc, ClosingAnUnopenedHandleIsAnError) {
  auto memory = context.memalloc(4096);
  IpcHandle handle = context.get_ipc_handle(memory);
  EXPECT_TRUE(throws<StateError>([&] { handle.close(); }, "not opened"));
}

// Memory already freed is not exported, whichever manager gave it: its
// bytes may be another block's by now, which the other process would read.
TEST_F(Ipc, FreedMemoryIsNotExported) {
  PoolOptions expandable;
  expandable.expandable = true;
  std::vector<std::unique_ptr<BaseMemoryManager>> managers;
  managers.push_back(std::make_unique<DefaultMemoryManager>(&context));
  managers.push_back(std::make_unique<PoolMemoryManager>(&context, PoolOptions{}));
  managers.push_back(std::make_unique<PoolMemoryManager>(&context, expandable));
  managers.push_back(exportable_async_manager(context));
  for (auto& manager : managers) {
    manager->initialize();
    auto memory = manager->memalloc(4096);
    auto view = memory->view(256, 512);
    memory->free();
    EXPECT_TRUE(throws<StateError>([&] { manager->get_ipc_handle(memory); }, "was already freed"));
    EXPECT_TRUE(throws<StateError>([&] { manager->get_ipc_handle(view); }, "was already freed"));
  }
}

// A pointer to memory the driver does not know is refused by address.
TEST_F(Ipc, ExportingMemoryTheDriverDoesNotKnowNamesTheAddress) {
  auto foreign = std::make_shared<MemoryPointer>(&context, 0x3000, 256);
  EXPECT_TRUE(throws<CudaError>([&] { context.get_ipc_handle(foreign); }, "0x3000 is not device memory"));
}

TEST_F(Ipc, AnotherProcessReadsAndWritesTheSharedMemory) {
  const std::size_t count = 4096;
  auto memory = context.memalloc(count * sizeof(std::uint32_t) + 8192);
  auto shared = memory->view(8192);  // a non-zero offset, as a pool's blocks have
  DeviceArray<std::uint32_t> array = counting_array(shared, count, 100);
  IpcHandle handle = context.get_ipc_handle(shared);
  ASSERT_TRUE(child_succeeds(handle, context.device().id(), count, 100, "direct"));
  EXPECT_TRUE(holds_the_childs_sums(array, 100));
}

// A stream-ordered pool created exportable: the child takes the pool's
// descriptor from this process and imports the block.
TEST_F(Ipc, AnotherProcessReadsAndWritesAnExportableStreamOrderedPoolsBlock) {
  auto manager = exportable_async_manager(context);
  const std::size_t count = 4096;
  auto memory = manager->memalloc(count * sizeof(std::uint32_t) + 4096);
  auto shared = memory->view(4096);
  DeviceArray<std::uint32_t> array = counting_array(shared, count, 300);
  IpcHandle handle = manager->get_ipc_handle(shared);
  ASSERT_TRUE(handle.pool_export());
  ASSERT_TRUE(child_succeeds(handle, context.device().id(), count, 300, "direct"));
  ASSERT_TRUE(holds_the_childs_sums(array, 300));
  // A second handle of the same pool reuses the offered descriptor.
  auto other = manager->memalloc(1024 * sizeof(std::uint32_t));
  counting_array(other, 1024, 5);
  IpcHandle second = manager->get_ipc_handle(other);
  EXPECT_EQ(second.pool_export()->token, handle.pool_export()->token);
  EXPECT_TRUE(child_succeeds(second, context.device().id(), 1024, 5, "direct"));
}

TEST_F(Ipc, AStreamOrderedPoolsHandleWhoseExporterHasExitedSaysSo) {
  // A process that has come and gone.
  pid_t gone = 0;
  char* args[] = {const_cast<char*>("/bin/true"), nullptr};
  ASSERT_EQ(posix_spawn(&gone, "/bin/true", nullptr, nullptr, args, environ), 0);
  waitpid(gone, nullptr, 0);
  PoolExport exported;
  std::memset(exported.data.reserved, 0, sizeof exported.data.reserved);
  exported.pid = gone;
  exported.token = 1;
  IpcHandle handle = IpcHandle::from_bytes(IpcHandle(nullptr, exported, 4096).to_bytes());
  EXPECT_TRUE(throws<StateError>([&] { handle.open(context); }, "cannot reach process " + std::to_string(gone)));
  EXPECT_FALSE(handle.is_open());
}

// A device that can access the source device maps the memory itself, as
// Numba's IpcHandle does, rather than get a copy: its kernels write the
// exporter's memory (Note [Peer access]). One test for each kind of handle.
TEST_F(Ipc, APeerDeviceOpensADriverHandleDirectly) {
  if (const std::string why = why_devices_are_not_peers(); !why.empty()) GTEST_SKIP() << why;
  const std::size_t count = 1000;
  auto memory = context.memalloc(count * sizeof(std::uint32_t) + 512);
  DeviceArray<std::uint32_t> array = counting_array(memory->view(512), count, 20);
  ASSERT_TRUE(child_succeeds(context.get_ipc_handle(memory->view(512)), 1, count, 20, "direct"));
  EXPECT_TRUE(holds_the_childs_sums(array, 20));
}

TEST_F(Ipc, APeerDeviceOpensAnExportableStreamOrderedPoolsBlockDirectly) {
  if (const std::string why = why_devices_are_not_peers(); !why.empty()) GTEST_SKIP() << why;
  auto manager = exportable_async_manager(context);
  const std::size_t count = 1000;
  auto memory = manager->memalloc(count * sizeof(std::uint32_t));
  DeviceArray<std::uint32_t> array = counting_array(memory, count, 30);
  ASSERT_TRUE(child_succeeds(manager->get_ipc_handle(memory), 1, count, 30, "direct"));
  EXPECT_TRUE(holds_the_childs_sums(array, 30));
}

TEST_F(Ipc, AnExportableStreamOrderedPoolsBlockOpensStagedOnADeviceThatCannotMapIt) {
  if (const std::string why = why_no_staging(); !why.empty()) GTEST_SKIP() << why;
  auto manager = exportable_async_manager(context);
  const std::size_t count = 1000;
  auto memory = manager->memalloc(count * sizeof(std::uint32_t));
  counting_array(memory, count, 11);
  EXPECT_TRUE(child_succeeds(manager->get_ipc_handle(memory), 1, count, 11, "staged"));
}

TEST_F(Ipc, ADeviceThatCannotMapTheSourceOpensAStagedCopy) {
  if (const std::string why = why_no_staging(); !why.empty()) GTEST_SKIP() << why;
  const std::size_t count = 1000;
  auto memory = context.memalloc(count * sizeof(std::uint32_t) + 512);
  auto shared = memory->view(512);
  counting_array(shared, count, 7);
  IpcHandle handle = context.get_ipc_handle(shared);
  EXPECT_TRUE(child_succeeds(handle, 1, count, 7, "staged"));
}

namespace {
// An expandable pool whose second block spans two of its arena's mappings
// (Note [Expandable arena]): 0.5 MiB of the first, 1.5 MiB of the next.
struct ArenaStraddle {
  std::unique_ptr<PoolMemoryManager> pool;
  std::shared_ptr<MemoryPointer> first, second;
  explicit ArenaStraddle(Context& context) {
    PoolOptions options;
    options.expandable = true;
    options.thread_cache_size = 0;  // every block from the index
    options.pinned_host_pool = false;
    pool = std::make_unique<PoolMemoryManager>(&context, options);
    pool->initialize();
    first = pool->memalloc(1536 << 10);
    second = pool->memalloc(2 << 20);
  }
};
}  // namespace

TEST_F(Ipc, AnotherProcessReadsAndWritesAnExpandablePoolsBlockAcrossTwoMappings) {
  ArenaStraddle arena(context);
  const std::size_t count = (2 << 20) / sizeof(std::uint32_t);
  DeviceArray<std::uint32_t> array = counting_array(arena.second, count, 40);
  IpcHandle handle = arena.pool->get_ipc_handle(arena.second);
  ASSERT_TRUE(handle.mapped_export());
  ASSERT_EQ(handle.mapped_export()->pieces.size(), 2u);
  ASSERT_TRUE(child_succeeds(handle, context.device().id(), count, 40, "direct"));
  EXPECT_TRUE(holds_the_childs_sums(array, 40));
}

TEST_F(Ipc, AnExpandablePoolsBlockOpensStagedOnADeviceThatCannotMapIt) {
  if (const std::string why = why_no_staging(); !why.empty()) GTEST_SKIP() << why;
  ArenaStraddle arena(context);
  const std::size_t count = (2 << 20) / sizeof(std::uint32_t);
  counting_array(arena.second, count, 9);
  EXPECT_TRUE(child_succeeds(arena.pool->get_ipc_handle(arena.second), 1, count, 9, "staged"));
}

TEST_F(Ipc, APeerDeviceOpensAnExpandablePoolsBlockDirectly) {
  if (const std::string why = why_devices_are_not_peers(); !why.empty()) GTEST_SKIP() << why;
  ArenaStraddle arena(context);
  const std::size_t count = (2 << 20) / sizeof(std::uint32_t);
  DeviceArray<std::uint32_t> array = counting_array(arena.second, count, 40);
  ASSERT_TRUE(child_succeeds(arena.pool->get_ipc_handle(arena.second), 1, count, 40, "direct"));
  EXPECT_TRUE(holds_the_childs_sums(array, 40));
}

// Unmapping withdraws a mapping's descriptor: a handle kept past the block
// and the trim that unmapped it no longer opens (and the child says why).
TEST_F(Ipc, AnExpandablePoolsHandleNoLongerOpensOnceItsMemoryIsUnmapped) {
  ArenaStraddle arena(context);
  std::vector<std::uint8_t> bytes = arena.pool->get_ipc_handle(arena.second).to_bytes();
  arena.second.reset();
  ASSERT_GE(arena.pool->trim(), std::size_t{2} << 20) << "the second mapping was not unmapped";
  const ChildRun stale = run_child(IpcHandle::from_bytes(bytes), context.device().id(), 16, 0, "direct");
  EXPECT_NE(stale.status, 0);
  EXPECT_NE(stale.error.find("its memory was unmapped since"), std::string::npos) << stale.error;
  // The first mapping is still there, and still shared.
  const std::size_t count = 1000;
  counting_array(arena.first, count, 3);
  EXPECT_TRUE(child_succeeds(arena.pool->get_ipc_handle(arena.first), context.device().id(), count, 3, "direct"));
}
