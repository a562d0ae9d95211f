#include "kernels.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>

namespace cuemm::sim {
namespace {

template <typename T>
T parameter(const std::vector<std::vector<char>>& parameters, std::size_t index) {
  T value;
  std::memcpy(&value, parameters.at(index).data(), sizeof(T));
  return value;
}

void fill_u32(std::uint32_t* out, std::uint32_t value, std::uint64_t count) {
  for (std::uint64_t i = 0; i < count; ++i) out[i] = value;
}

const std::map<std::string, EmulatedKernel>& registry() {
  static const std::map<std::string, EmulatedKernel> kernels = {
      // cuemm_fill_u32(uint32_t* out, uint32_t value, uint64_t count)
      {"cuemm_fill_u32",
       {{8, 4, 8},
        [](const auto& p) {
          fill_u32(parameter<std::uint32_t*>(p, 0), parameter<std::uint32_t>(p, 1),
                   parameter<std::uint64_t>(p, 2));
        }}},
      // cuemm_add_u32(uint32_t* data, uint32_t value, uint64_t count)
      {"cuemm_add_u32",
       {{8, 4, 8},
        [](const auto& p) {
          auto* data = parameter<std::uint32_t*>(p, 0);
          const auto value = parameter<std::uint32_t>(p, 1);
          const auto count = parameter<std::uint64_t>(p, 2);
          for (std::uint64_t i = 0; i < count; ++i) data[i] += value;
        }}},
      // cuemm_spin_fill_u32(uint32_t* out, uint32_t value, uint64_t count,
      //                     uint64_t spin_ns): busy for spin_ns, then fills.
      {"cuemm_spin_fill_u32",
       {{8, 4, 8, 8},
        [](const auto& p) {
          std::this_thread::sleep_for(std::chrono::nanoseconds(parameter<std::uint64_t>(p, 3)));
          fill_u32(parameter<std::uint32_t*>(p, 0), parameter<std::uint32_t>(p, 1),
                   parameter<std::uint64_t>(p, 2));
        }}},
      // cuemm_held_fill_u32(const volatile uint32_t* gate, uint32_t* out,
      //                     uint32_t value, uint64_t count, uint64_t most_ns):
      // busy until *gate is non-zero or most_ns pass, then fills.
      {"cuemm_held_fill_u32",
       {{8, 8, 4, 8, 8},
        [](const auto& p) {
          const auto* gate = parameter<const std::uint32_t*>(p, 0);
          const auto deadline =
              std::chrono::steady_clock::now() + std::chrono::nanoseconds(parameter<std::uint64_t>(p, 4));
          while (__atomic_load_n(gate, __ATOMIC_ACQUIRE) == 0 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          fill_u32(parameter<std::uint32_t*>(p, 1), parameter<std::uint32_t>(p, 2),
                   parameter<std::uint64_t>(p, 3));
        }}},
  };
  return kernels;
}

}  // namespace

const EmulatedKernel* find_emulated_kernel(const std::string& name) {
  const auto& kernels = registry();
  auto it = kernels.find(name);
  return it == kernels.end() ? nullptr : &it->second;
}

}  // namespace cuemm::sim
