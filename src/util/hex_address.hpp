// hex_address.hpp: an address as error messages print it ("0x7f2c40000000").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace cuemm::util {

inline std::string hex_address(std::uintptr_t address) {
  char text[2 + 16 + 1];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace cuemm::util
