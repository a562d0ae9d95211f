// info_command.hpp: `cuemm info`, the version, driver, devices, manager,
// adaptors and settings a process would run with (a bad setting is an
// error), and `cuemm settings`, every setting there is.
#pragma once

#include <string>
#include <vector>

namespace cuemm::tool {

// Runs `cuemm info` with the arguments after the command's name; returns the exit status.
int info_command(const std::vector<std::string>& args);

// Runs `cuemm settings`: each variable cuemm reads, what it sets, the bundled
// managers it is an option of, and its value in this environment.
int settings_command(const std::vector<std::string>& args);

}  // namespace cuemm::tool
