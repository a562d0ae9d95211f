// byte_size.hpp: "512M", "2GiB", "1073741824" -> bytes. Shared by the library
// (pool options) and the simulated driver (CUEMM_SIM_MEMORY). Also plain
// whole numbers, as logs and the tool's options write them.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace cuemm::util {

// Decimal digits, optionally with a fraction ("1.5G"), then optionally a
// binary suffix K, M, G or T, itself optionally followed by B or iB.
// nullopt for anything else: signs, exponents, hexadecimal, "inf", spaces,
// and counts of 2^64 bytes or more (which would not fit a size_t).
inline std::optional<std::size_t> parse_byte_size(const std::string& text) {
  const char* const begin = text.c_str();
  const char* end = begin;
  while (*end >= '0' && *end <= '9') ++end;
  const char* const whole_end = end;
  if (*end == '.') {
    ++end;
    while (*end >= '0' && *end <= '9') ++end;
  }
  const char* const number_end = end;
  // At least one digit, before or after the point.
  if (number_end - begin == (*whole_end == '.' ? 1 : 0)) return std::nullopt;
  int shift = 0;
  switch (*end | 0x20) {
    case 'k': shift = 10; ++end; break;
    case 'm': shift = 20; ++end; break;
    case 'g': shift = 30; ++end; break;
    case 't': shift = 40; ++end; break;
    default: break;
  }
  if (shift && (*end | 0x20) == 'i') ++end;  // "MiB"
  if ((*end | 0x20) == 'b') ++end;           // "MB", "MiB", "512B"
  if (*end != '\0') return std::nullopt;
  if (whole_end == number_end) {  // a whole number: exact, whatever its size
    std::size_t whole = 0;
    const auto [parsed_end, error] = std::from_chars(begin, whole_end, whole);
    if (error != std::errc() || parsed_end != whole_end) return std::nullopt;
    if (shift && whole > (SIZE_MAX >> shift)) return std::nullopt;
    return whole << shift;
  }
  const double bytes = std::strtod(std::string(begin, number_end).c_str(), nullptr) * static_cast<double>(1ull << shift);
  if (!(bytes < 18446744073709551616.0)) return std::nullopt;  // 2^64
  return static_cast<std::size_t>(bytes);
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
