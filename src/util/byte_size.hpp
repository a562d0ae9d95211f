// byte_size.hpp: "512M", "2GiB", "1073741824" -> bytes. Shared by the library
// (pool options) and the simulated driver (CUEMM_SIM_MEMORY). Also plain
// whole numbers, as logs and the tool's options write them.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>

namespace cuemm::util {

// Binary suffixes K, M, G, T, optionally followed by B or iB; nullopt for
// anything else (including negative numbers).
inline std::optional<std::size_t> parse_byte_size(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  if (end == begin || number < 0) return std::nullopt;
  double scale = 1;
  switch (*end | 0x20) {
    case 'k': scale = 1024.0; ++end; break;
    case 'm': scale = 1024.0 * 1024; ++end; break;
    case 'g': scale = 1024.0 * 1024 * 1024; ++end; break;
    case 't': scale = 1024.0 * 1024 * 1024 * 1024; ++end; break;
    default: break;
  }
  if ((*end | 0x20) == 'i') ++end;  // "MiB"
  if ((*end | 0x20) == 'b') ++end;  // "MB", "MiB"
  if (*end != '\0') return std::nullopt;
  return static_cast<std::size_t>(number * scale);
}

// Digits only, the whole text; nullopt for anything else (std::stoull takes
// "-5" as 2^64 - 5 and "12abc" as 12).
inline std::optional<std::size_t> parse_whole_number(const std::string& text) {
  std::size_t number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return number;
}

// The other way: bytes as a value of the largest binary unit it reaches
// (1536 -> 1.5 KiB), for messages and tables to print as they need.
struct ScaledBytes {
  double value;
  const char* unit;  // "B", "KiB", ... "PiB"
};
inline ScaledBytes scale_byte_size(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return {value, kUnits[unit]};
}

}  // namespace cuemm::util
