// bench_command.hpp: `cuemm bench`, allocate+free pairs through the managers.
#pragma once

#include <string>
#include <vector>

namespace cuemm::tool {

// Runs `cuemm bench` with the arguments after the command's name; returns the exit status.
int bench_command(std::vector<std::string> args);

// The command's usage lines.
extern const char* const kBenchUsage;

}  // namespace cuemm::tool
