// environment.hpp: the library's settings from environment variables (the
// simulated driver, which has no cuemm errors, reads its own).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "cuemm/error.hpp"
#include "util/byte_size.hpp"

namespace cuemm::util {

// "512M", "2G", "1073741824" from `variable`; nullopt when unset or empty,
// InvalidArgument naming the variable when it is not a byte count.
inline std::optional<std::size_t> byte_size_from_environment(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return std::nullopt;
  const auto bytes = parse_byte_size(text);
  if (!bytes)
    throw InvalidArgument(std::string(variable) + " must be a byte count such as 512M or 2G (got '" + text + "')");
  return *bytes;
}

}  // namespace cuemm::util
