// The settings cuemm reads, and the misspelt ones it names rather than
// ignoring without a word.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace {

using cuemm::UnknownSetting;
using cuemm::testing::ScopedVariable;

const UnknownSetting* find(const std::vector<UnknownSetting>& unknown, const std::string& name) {
  for (const auto& setting : unknown)
    if (setting.name == name) return &setting;
  return nullptr;
}

// First: the process's first manager is where the warning comes, once.
TEST(Settings, TheFirstManagerMadeWarnsOnceOfEachMisspeltSetting) {
  ScopedVariable misspelt("CUEMM_POOL_INITAL_SIZE", "8G");
  testing::internal::CaptureStderr();
  cuemm::make_bundled_memory_manager("default", nullptr);
  cuemm::make_bundled_memory_manager("pool", nullptr);
  cuemm::warn_of_unknown_settings();
  const std::string warnings = testing::internal::GetCapturedStderr();
  const std::string line =
      "cuemm: CUEMM_POOL_INITAL_SIZE is not a setting cuemm reads (did you mean CUEMM_POOL_INITIAL_SIZE?); it is "
      "ignored\n";
  std::size_t times = 0;
  for (auto at = warnings.find(line); at != std::string::npos; at = warnings.find(line, at + 1)) ++times;
  EXPECT_EQ(times, 1u) << warnings;
}

TEST(Settings, AMisspellingIsNamedWithTheSettingItResembles) {
  ScopedVariable a("CUEMM_MEMORY_MANGER", "pool"), b("CUEMM_DRVER", "sim"), c("CUEMM_ASYNC_EXPORTABL", "1");
  const auto unknown = cuemm::unknown_settings();
  ASSERT_NE(find(unknown, "CUEMM_MEMORY_MANGER"), nullptr);
  EXPECT_EQ(find(unknown, "CUEMM_MEMORY_MANGER")->resembles, "CUEMM_MEMORY_MANAGER");
  ASSERT_NE(find(unknown, "CUEMM_DRVER"), nullptr);
  EXPECT_EQ(find(unknown, "CUEMM_DRVER")->resembles, "CUEMM_DRIVER");
  ASSERT_NE(find(unknown, "CUEMM_ASYNC_EXPORTABL"), nullptr);
  EXPECT_EQ(find(unknown, "CUEMM_ASYNC_EXPORTABL")->resembles, "CUEMM_ASYNC_EXPORTABLE");
}

TEST(Settings, AnyOtherNameInAFamilyOfSettingsIsUnknown) {
  ScopedVariable a("CUEMM_POOL_SIZE", "1G"), b("CUEMM_LIMIT_BYTES", "1G");
  const auto unknown = cuemm::unknown_settings();
  ASSERT_NE(find(unknown, "CUEMM_POOL_SIZE"), nullptr);
  ASSERT_NE(find(unknown, "CUEMM_LIMIT_BYTES"), nullptr);
  EXPECT_EQ(find(unknown, "CUEMM_LIMIT_BYTES")->resembles, "CUEMM_LIMIT");
}

TEST(Settings, EverySettingAndOthersNamesAreLeftAlone) {
  for (const cuemm::Setting& setting : cuemm::settings()) {
    ScopedVariable known(setting.name, "1");
    EXPECT_EQ(find(cuemm::unknown_settings(), setting.name), nullptr) << setting.name;
  }
  // A build's, a script's or a test's own variables are not settings spelt wrong.
  ScopedVariable a("CUEMM_COMMIT", "abc"), b("CUEMM_GPU_TESTS_ONLY", "1"), c("CUEMM_SIM_DRIVER_PATH", "/x"),
      d("CUEMM_TOOL", "cuemm"), e("NUMBA_CUDA_MEMORY_MANAGER", "cuemm");
  for (const char* name : {"CUEMM_COMMIT", "CUEMM_GPU_TESTS_ONLY", "CUEMM_SIM_DRIVER_PATH", "CUEMM_TOOL"})
    EXPECT_EQ(find(cuemm::unknown_settings(), name), nullptr) << name;
}

TEST(Settings, AnotherManagersOptionsAreNamedAndTheChosenOnesAreNot) {
  ScopedVariable a("CUEMM_POOL_INITIAL_SIZE", "1G"), b("CUEMM_ASYNC_EXPORTABLE", "1"),
      c("CUEMM_PINNED_HOST_POOL", "0"), d("CUEMM_LIMIT", "1G");
  using Names = std::vector<std::string>;
  // (In the table's order; the limit and the pinned pool's switch apply to more than one manager.)
  EXPECT_EQ(cuemm::settings_for_other_managers("pool"), Names{"CUEMM_ASYNC_EXPORTABLE"});
  EXPECT_EQ(cuemm::settings_for_other_managers("async"), Names{"CUEMM_POOL_INITIAL_SIZE"});
  EXPECT_EQ(cuemm::settings_for_other_managers("default"),
            (Names{"CUEMM_POOL_INITIAL_SIZE", "CUEMM_PINNED_HOST_POOL", "CUEMM_ASYNC_EXPORTABLE"}));
  EXPECT_EQ(cuemm::settings_for_other_managers("/opt/plugins/libmine.so"),
            (Names{"CUEMM_POOL_INITIAL_SIZE", "CUEMM_PINNED_HOST_POOL", "CUEMM_ASYNC_EXPORTABLE"}));
  ScopedVariable empty("CUEMM_POOL_MAXIMUM_SIZE", "");  // (set empty, as unset: not named)
  EXPECT_EQ(cuemm::settings_for_other_managers("async"), Names{"CUEMM_POOL_INITIAL_SIZE"});
}

// The table's word on whose option a setting is, held to what the managers
// read: a bad value is an error in each manager the table names, and only there.
TEST(Settings, EachManagersOptionIsReadByThatManagerAndNoOther) {
  const std::map<std::string, std::function<void()>> read_options{
      {"pool", [] { cuemm::PoolOptions::from_environment(); }},
      {"async", [] { cuemm::AsyncOptions::from_environment(); }},
  };
  for (const cuemm::Setting& setting : cuemm::settings()) {
    if (!setting.managers) continue;
    ScopedVariable bad(setting.name, "bogus");
    const auto managers = setting.manager_names();
    for (const auto& [manager, read] : read_options) {
      const bool its_option = std::find(managers.begin(), managers.end(), manager) != managers.end();
      EXPECT_EQ(cuemm::testing::throws<cuemm::InvalidArgument>(read, setting.name), its_option)
          << setting.name << " under the " << manager << " manager";
    }
  }
}

// What a context's first allocation would refuse, refused before any is made.
TEST(Settings, AManagersSettingsAreCheckedWithoutMakingAnythingOnADevice) {
  using cuemm::check_memory_manager_settings;
  using cuemm::testing::throws;
  using cuemm::InvalidArgument;
  for (const char* manager : {"default", "pool", "async"}) EXPECT_NO_THROW(check_memory_manager_settings(manager));
  {
    ScopedVariable bad("CUEMM_POOL_MAXIMUM_SIZE", "lots");
    EXPECT_TRUE(throws<InvalidArgument>([] { check_memory_manager_settings("pool"); }, "CUEMM_POOL_MAXIMUM_SIZE"));
    EXPECT_NO_THROW(check_memory_manager_settings("async"));  // (not its setting)
  }
  {
    ScopedVariable bad("CUEMM_MAX_PENDING_DEALLOCS_RATIO", "2");
    for (const char* manager : {"default", "pool", "async"})
      EXPECT_TRUE(throws<InvalidArgument>([&] { check_memory_manager_settings(manager); },
                                          "CUEMM_MAX_PENDING_DEALLOCS_RATIO"))
          << manager;
  }
  {
    ScopedVariable twice("CUEMM_ADAPTORS", "tracking,tracking");
    EXPECT_TRUE(throws<InvalidArgument>([] { check_memory_manager_settings("default"); }, "'tracking' is named twice"));
  }
  {
    ScopedVariable limit("CUEMM_ADAPTORS", "limit"), no_cap("CUEMM_LIMIT", nullptr);
    EXPECT_TRUE(throws<InvalidArgument>([] { check_memory_manager_settings("default"); }, "CUEMM_LIMIT"));
  }
  EXPECT_TRUE(throws<InvalidArgument>([] { check_memory_manager_settings("sparkly"); }, "sparkly"));
}

// Numba's CUDA_DEALLOCS_COUNT and _RATIO, as every manager's deferral reads them.
TEST(Settings, TheDeferralsCountAndRatioAreReadOrRefusedByName) {
  using cuemm::DeallocationPolicy;
  using cuemm::testing::throws;
  {
    ScopedVariable count("CUEMM_MAX_PENDING_DEALLOCS_COUNT", "25"), ratio("CUEMM_MAX_PENDING_DEALLOCS_RATIO", "0.5");
    EXPECT_EQ(DeallocationPolicy::from_environment().max_pending_count, 25u);
    EXPECT_EQ(DeallocationPolicy::from_environment().max_pending_ratio, 0.5);
  }
  for (const char* bad : {"-1", "ten", "1e3", " 5", "99999999999999999999999"}) {
    ScopedVariable count("CUEMM_MAX_PENDING_DEALLOCS_COUNT", bad);
    EXPECT_TRUE(throws<cuemm::InvalidArgument>([] { DeallocationPolicy::from_environment(); },
                                               "CUEMM_MAX_PENDING_DEALLOCS_COUNT", bad))
        << bad;
  }
  for (const char* bad : {"1.5", "-0.1", "nan", "half"}) {
    ScopedVariable ratio("CUEMM_MAX_PENDING_DEALLOCS_RATIO", bad);
    EXPECT_TRUE(throws<cuemm::InvalidArgument>([] { DeallocationPolicy::from_environment(); },
                                               "CUEMM_MAX_PENDING_DEALLOCS_RATIO", bad))
        << bad;
  }
}

TEST(Settings, EveryManagersNameInTheTableIsABundledManager) {
  const auto bundled = cuemm::bundled_memory_managers();
  for (const cuemm::Setting& setting : cuemm::settings()) {
    if (!setting.managers) continue;
    EXPECT_FALSE(setting.manager_names().empty()) << setting.name;
    for (std::string_view name : setting.manager_names())
      EXPECT_NE(std::find(bundled.begin(), bundled.end(), name), bundled.end()) << setting.name << ": " << name;
  }
}

TEST(Settings, EachSettingHasAMeaning) {
  ASSERT_FALSE(cuemm::settings().empty());
  for (const cuemm::Setting& setting : cuemm::settings()) {
    EXPECT_TRUE(std::string(setting.name).starts_with("CUEMM_")) << setting.name;
    EXPECT_FALSE(std::string(setting.meaning).empty()) << setting.name;
  }
}

}  // namespace
