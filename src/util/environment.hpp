// environment.hpp: the library's settings from environment variables (the
// simulated driver, which has no cuemm errors, reads its own).
#pragma once

#include <cstdio>
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

// "0" or "1" from `variable`; nullopt when unset or empty, InvalidArgument
// naming the variable for anything else.
inline std::optional<bool> flag_from_environment(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return std::nullopt;
  const std::string value(text);
  if (value != "0" && value != "1")
    throw InvalidArgument(std::string(variable) + " must be 0 or 1 (got '" + value + "')");
  return value == "1";
}

// A count such as "10" from `variable` (digits only, within size_t:
// parse_whole_number); nullopt when unset or empty, InvalidArgument naming
// the variable for anything else.
inline std::optional<std::size_t> count_from_environment(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return std::nullopt;
  const auto count = parse_whole_number(text);
  if (!count) throw InvalidArgument(std::string(variable) + " must be a count such as 10 (got '" + text + "')");
  return *count;
}

// A fraction such as "0.125" from `variable`, at least 0 and at most
// `largest`; nullopt when unset or empty, InvalidArgument naming the
// variable for anything else.
inline std::optional<double> fraction_from_environment(const char* variable, double largest) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (*end != '\0' || !(value >= 0 && value <= largest)) {  // (also refuses NaN)
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", largest);
    throw InvalidArgument(std::string(variable) + " must be a fraction from 0 to " + bound + " such as 0.125 (got '" +
                          text + "')");
  }
  return value;
}

}  // namespace cuemm::util
