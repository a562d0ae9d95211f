// The driver layer: errors carry the code, its name and the call.
#include "support/test_support.hpp"

using namespace cuemm;

TEST(Driver, LoadsOnceAndSaysWhichDriver) {
  const auto& driver = driver::Driver::get();
  EXPECT_TRUE(driver::Driver::is_loaded());
  EXPECT_FALSE(driver.library_path().empty());
  EXPECT_GE(driver.version(), 11000);
  EXPECT_EQ(&driver, &driver::Driver::get());
  EXPECT_NE(driver.api().cuMemAlloc, nullptr);
}

TEST(Driver, ErrorsNameTheCodeAndTheCall) {
  const CudaError error(cuda::CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD");
  EXPECT_STREQ(error.what(), "[CUDA_ERROR_INVALID_VALUE] Call to cuMemcpyHtoD results in CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(error.code(), 1);
  EXPECT_EQ(error.call(), "cuMemcpyHtoD");
  EXPECT_EQ(error_name(12345), "CUDA_ERROR_12345");
  const OutOfMemory oom("cuMemAlloc", 3u << 30);
  EXPECT_STREQ(oom.what(),
               "[CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY "
               "(requested 3.00 GiB (3221225472 bytes))");
}

TEST(Driver, AFailingCallThrowsItsResult) {
  CUEMM_REQUIRE_SIMULATION();
  current_context();
  simulation::inject_fault("cuMemAlloc", 1, cuda::CUDA_ERROR_OUT_OF_MEMORY);
  cuda::CUdeviceptr pointer = 0;
  try {
    CUEMM_CU(cuMemAlloc, &pointer, 64);
    FAIL();
  } catch (const OutOfMemory& error) {
    EXPECT_STREQ(error.what(),
                 "[CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY");
  }
  simulation::inject_fault("cuMemGetInfo", 2, cuda::CUDA_ERROR_INVALID_CONTEXT, 2);
  std::size_t free = 0, total = 0;
  EXPECT_NO_THROW(CUEMM_CU(cuMemGetInfo, &free, &total));
  EXPECT_THROW(CUEMM_CU(cuMemGetInfo, &free, &total), CudaError);
  EXPECT_THROW(CUEMM_CU(cuMemGetInfo, &free, &total), CudaError);
  EXPECT_NO_THROW(CUEMM_CU(cuMemGetInfo, &free, &total));
  EXPECT_THROW(simulation::call_count("cuNoSuchFunction"), InvalidArgument);
}

TEST(Driver, TheSimulationCountsCalls) {
  CUEMM_REQUIRE_SIMULATION();
  current_context();
  simulation::reset_call_counts();
  std::size_t free = 0, total = 0;
  for (int i = 0; i < 3; ++i) CUEMM_CU(cuMemGetInfo, &free, &total);
  EXPECT_EQ(simulation::call_count("cuMemGetInfo"), 3u);
  EXPECT_EQ(simulation::call_count("cuMemAlloc"), 0u);
}
