// replay_command.hpp: `cuemm replay` and `cuemm random`, allocations and frees
// from a log or a generated workload replayed against a manager, and `cuemm
// plot`, a log's live memory over time as SVG.
#pragma once

#include <string>
#include <vector>

namespace cuemm::tool {

// Runs `cuemm replay` (`command` "replay") or `cuemm random` ("random") with
// the arguments after the command's name; returns the exit status.
int replay_command(const std::string& command, std::vector<std::string> args);

// Runs `cuemm plot LOG.csv OUT.svg`; returns the exit status.
int plot_command(const std::vector<std::string>& args);

}  // namespace cuemm::tool
