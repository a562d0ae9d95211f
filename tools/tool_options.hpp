// tool_options.hpp: the cuemm tool's command-line options ("--name value"),
// taken out of the argument list as they are read, so that what is left over
// is the command's operands (or a mistake, which the caller reports).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "cuemm/error.hpp"
#include "util/byte_size.hpp"

namespace cuemm::tool {

// An option given twice is a mistake rather than a choice between its values.
inline void refuse_a_second(const std::vector<std::string>& args, const std::string& name) {
  for (const auto& arg : args)
    if (arg == name) throw InvalidArgument(name + " is given more than once");
}

inline std::string option(std::vector<std::string>& args, const std::string& name, const std::string& fallback) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      if (i + 1 == args.size()) throw InvalidArgument(name + " needs a value");
      std::string value = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
      refuse_a_second(args, name);
      return value;
    }
  }
  return fallback;
}

// Whether the bare flag `name` was given (it is taken out).
inline bool flag(std::vector<std::string>& args, const std::string& name) {
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (*it == name) {
      args.erase(it);
      refuse_a_second(args, name);
      return true;
    }
  }
  return false;
}

// After a command has taken its options: what is left was not understood
// (an option of another command, a misspelling, or an operand too many).
inline void refuse_leftovers(const std::vector<std::string>& args, const std::string& command) {
  if (args.empty()) return;
  std::string words;
  for (const auto& arg : args) words += (words.empty() ? "'" : " '") + arg + "'";
  throw InvalidArgument(command + ": not understood: " + words + " (cuemm --help lists the options)");
}

inline std::size_t parse_bytes(const std::string& name, const std::string& text) {
  const auto bytes = util::parse_byte_size(text);
  if (!bytes) throw InvalidArgument(name + " must be a byte count such as 64M (got '" + text + "')");
  return *bytes;
}

inline std::size_t parse_count(const std::string& name, const std::string& text) {
  const auto count = util::parse_whole_number(text);
  if (!count) throw InvalidArgument(name + " must be a whole number (got '" + text + "')");
  return *count;
}

inline std::size_t bytes_option(std::vector<std::string>& args, const std::string& name, const std::string& fallback) {
  return parse_bytes(name, option(args, name, fallback));
}

inline std::size_t count_option(std::vector<std::string>& args, const std::string& name, const std::string& fallback) {
  return parse_count(name, option(args, name, fallback));
}

// The same, where 0 would mean no work at all: an error that names the option.
inline std::size_t positive_count_option(std::vector<std::string>& args, const std::string& name,
                                         const std::string& fallback) {
  const std::size_t count = count_option(args, name, fallback);
  if (count == 0) throw InvalidArgument(name + " must be at least 1 (got 0)");
  return count;
}
inline std::size_t positive_bytes_option(std::vector<std::string>& args, const std::string& name,
                                         const std::string& fallback) {
  const std::size_t bytes = bytes_option(args, name, fallback);
  if (bytes == 0) throw InvalidArgument(name + " must be at least 1 byte (got 0)");
  return bytes;
}

// A time in seconds, above 0 and at most a minute.
inline double seconds_option(std::vector<std::string>& args, const std::string& name, const std::string& fallback) {
  const std::string text = option(args, name, fallback);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end || !(value > 0) || value > 60)
    throw InvalidArgument(name + " must be a time above 0 and at most 60 seconds (got '" + text + "')");
  return value;
}

// "a,b,c" -> {"a", "b", "c"}; an empty item is an error that names the option.
inline std::vector<std::string> list_option(std::vector<std::string>& args, const std::string& name,
                                            const std::string& fallback) {
  const std::string text = option(args, name, fallback);
  std::vector<std::string> items;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = text.find(',', begin);
    items.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (items.back().empty()) throw InvalidArgument(name + " must be a comma-separated list (got '" + text + "')");
    if (end == std::string::npos) return items;
    begin = end + 1;
  }
}

}  // namespace cuemm::tool
