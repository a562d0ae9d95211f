// descriptor_passing.hpp: handing file descriptors to other processes of the
// same user, for IPC handles whose driver handle is a descriptor (a
// stream-ordered pool's, or memory made by cuMemCreate). Bytes can be sent
// any way; a descriptor must go through a Unix socket, so the exporting
// process answers requests for the descriptors it offers on an abstract
// socket named after its pid.
//
//   // exporter                                  // importer (another process)
//   auto token = offer_descriptor(fd);            int fd = take_descriptor(pid, token);
//   send(pid, token);                             ...; close(fd);
//
// Only processes of the same effective user are answered. The answering
// thread starts with the first offer and lives until the process exits (a
// forked child that offers starts its own).
#pragma once

#include <cstdint>

namespace cuemm::detail {

// Offers `fd` until withdrawn or the process ends, and owns it from now on
// (it is closed when withdrawn, or at once if the offer fails); returns the
// token that names it. Throws StateError with the system's reason on failure.
std::uint64_t offer_descriptor(int fd);

// Stops offering the descriptor of `token` (once what it names is gone);
// unknown tokens are ignored.
void withdraw_descriptor(std::uint64_t token) noexcept;

// A new descriptor for the one that process `pid` offers as `token` (the
// caller closes it). Throws StateError naming the process and the reason.
int take_descriptor(int pid, std::uint64_t token);

}  // namespace cuemm::detail
