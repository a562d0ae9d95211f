#include "call_log.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "sim_control.h"

namespace cuemm::sim {
namespace {

constexpr const char* kFunctionNames[] = {
#define CUEMM_SIM_NAME(name) #name,
    CUEMM_SIM_FUNCTIONS(CUEMM_SIM_NAME)
#undef CUEMM_SIM_NAME
};

}  // namespace

CallLog& CallLog::instance() {
  static CallLog* log = new CallLog();  // never destroyed: used until exit
  return *log;
}

int CallLog::index_of(std::string_view name) {
  for (int i = 0; i < kFunctionCount; ++i) {
    if (name == kFunctionNames[i]) return i;
  }
  return -1;
}

// CUEMM_SIM_FAULTS="cuMemAlloc:3:2,cuMemHostAlloc:1:2:5": the 3rd cuMemAlloc
// of the process fails with 2; cuMemHostAlloc calls 1 to 5 fail with 2.
CallLog::CallLog() {
  const char* spec = std::getenv("CUEMM_SIM_FAULTS");
  if (spec == nullptr) return;
  std::stringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    std::stringstream fields(entry);
    std::string name, nth, result, times = "1";
    std::getline(fields, name, ':');
    std::getline(fields, nth, ':');
    std::getline(fields, result, ':');
    std::getline(fields, times, ':');
    const int index = index_of(name);
    if (index < 0 || nth.empty() || result.empty()) {
      std::fprintf(stderr, "cuemm simulated driver: ignoring CUEMM_SIM_FAULTS entry '%s' "
                   "(expected function:nth:result[:times] with a known function)\n", entry.c_str());
      continue;
    }
    process_faults_.push_back({index, std::stoull(nth), std::stoi(result), std::stoull(times)});
    armed_ = true;
  }
}

void CallLog::inject(int index, unsigned long long nth, cuda::CUresult result,
                     unsigned long long times) {
  std::lock_guard lock(mutex_);
  faults_.push_back({index, counts_[index].load() + nth, result, times});
  armed_ = true;
}

void CallLog::clear() {
  std::lock_guard lock(mutex_);
  faults_.clear();
  armed_ = !process_faults_.empty();
}

cuda::CUresult CallLog::check_faults(int index, unsigned long long call) {
  std::lock_guard lock(mutex_);
  for (auto* faults : {&faults_, &process_faults_}) {
    for (auto& fault : *faults) {
      if (fault.function == index && call >= fault.first_call && fault.remaining > 0) {
        --fault.remaining;
        return fault.result;
      }
    }
  }
  return cuda::CUDA_SUCCESS;
}

}  // namespace cuemm::sim

using cuemm::sim::CallLog;

extern "C" {

__attribute__((visibility("default"))) int cuemmSimIsSimulated(void) { return 1; }

__attribute__((visibility("default"))) unsigned long long cuemmSimCallCount(const char* function) {
  const int index = function ? CallLog::index_of(function) : -1;
  return index < 0 ? ~0ull : CallLog::instance().count(index);
}

__attribute__((visibility("default"))) void cuemmSimResetCallCounts(void) {
  CallLog::instance().reset_counts();
}

__attribute__((visibility("default"))) int cuemmSimInjectFault(const char* function,
                                                               unsigned long long nth, int result,
                                                               unsigned long long times) {
  const int index = function ? CallLog::index_of(function) : -1;
  if (index < 0) return 1;
  CallLog::instance().inject(index, nth, result, times);
  return 0;
}

__attribute__((visibility("default"))) void cuemmSimClearFaults(void) {
  CallLog::instance().clear();
}

}  // extern "C"
