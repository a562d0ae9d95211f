// Choosing the manager with CUEMM_MEMORY_MANAGER: bad choices fail clearly at
// the first context and leave nothing behind, a good one is used, and
// set_memory_manager() is then ignored. Each test runs in a process of its
// own (support/test_per_process_main.cpp), whose first context it makes.
#include <cstdlib>

#include "support/test_support.hpp"

using namespace cuemm;

namespace {
std::string plugin_error_for(const char* choice) {
  setenv("CUEMM_MEMORY_MANAGER", choice, 1);
  try {
    Device::get(0).primary_context();
  } catch (const PluginError& error) {
    return error.what();
  }
  return "no PluginError";
}
}  // namespace

TEST(PluginLoading, AnUnknownNameListsTheBundledManagers) {
  const std::string message = plugin_error_for("no-such-manager");
  EXPECT_NE(message.find("'no-such-manager'"), std::string::npos) << message;
  EXPECT_NE(message.find("default"), std::string::npos) << message;
}

TEST(PluginLoading, AMissingLibraryNamesThePathAndTheReason) {
  const std::string message = plugin_error_for("/nonexistent/libplugin.so");
  EXPECT_NE(message.find("/nonexistent/libplugin.so"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
}

TEST(PluginLoading, ALibraryWithoutTheFactoryIsNamed) {
  const std::string message = plugin_error_for(CUEMM_SIM_DRIVER_PATH);
  EXPECT_NE(message.find("does not export cuemm_create_memory_manager"), std::string::npos) << message;
}

TEST(PluginLoading, AVersionTwoPluginIsRefusedNamingBothVersions) {
  const std::string message = plugin_error_for(CUEMM_VERSION_TWO_PLUGIN_PATH);
  EXPECT_NE(message.find("version 2"), std::string::npos) << message;
  EXPECT_NE(message.find("version 1"), std::string::npos) << message;
}

TEST(PluginLoading, FailedAttemptsLeftNoContextBehind) {
  if (!simulation::active()) GTEST_SKIP() << "reads the simulated driver's primary-context state";
  for (const char* choice : {"no-such-manager", "/nonexistent/libplugin.so", CUEMM_SIM_DRIVER_PATH,
                             CUEMM_VERSION_TWO_PLUGIN_PATH})
    EXPECT_NE(plugin_error_for(choice), "no PluginError") << choice;
  EXPECT_GT(simulation::call_count("cuDevicePrimaryCtxRetain"), 0u) << "no attempt reached the device";
  EXPECT_EQ(simulation::call_count("cuDevicePrimaryCtxRetain"), simulation::call_count("cuDevicePrimaryCtxRelease"));
}

TEST(PluginLoading, AValidPluginServesEveryAllocation) {
  setenv("CUEMM_MEMORY_MANAGER", CUEMM_COUNTING_PLUGIN_PATH, 1);
  Context& context = current_context();
  EXPECT_EQ(memory_manager_name(), std::string("plugin:") + CUEMM_COUNTING_PLUGIN_PATH);
  EXPECT_EQ(dynamic_cast<DefaultMemoryManager*>(&context.memory_manager()), nullptr);
  std::vector<std::uint16_t> values(500, 77);
  auto array = to_device(values);
  EXPECT_EQ(array.copy_to_host(), values);
}

TEST(PluginLoading, SetMemoryManagerIsIgnoredWhileTheVariableIsSet) {
  setenv("CUEMM_MEMORY_MANAGER", CUEMM_COUNTING_PLUGIN_PATH, 1);
  EXPECT_NO_THROW(set_memory_manager<DefaultMemoryManager>()) << "should warn and be ignored, not fail";
  EXPECT_EQ(memory_manager_name(), std::string("plugin:") + CUEMM_COUNTING_PLUGIN_PATH);
}
