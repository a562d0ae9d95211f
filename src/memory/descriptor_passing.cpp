#include "memory/descriptor_passing.hpp"

#include <sys/socket.h>
#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "cuemm/error.hpp"
#include "util/scoped_descriptor.hpp"

namespace cuemm::detail {
namespace {

// An abstract socket (no file to clean up): "\0cuemm-descriptors-PID".
sockaddr_un address_of(int pid, socklen_t& length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = "cuemm-descriptors-" + std::to_string(pid);
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

std::string system_error(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Neither side waits for ever on the other: a stalled peer costs one timeout.
void limit_waits(int socket_fd, int seconds) {
  const timeval limit{seconds, 0};
  setsockopt(socket_fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  setsockopt(socket_fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
}

class DescriptorServer {
 public:
  static DescriptorServer& instance() {
    static DescriptorServer* server = new DescriptorServer();  // answers until exit
    return *server;
  }

  std::uint64_t offer(int fd) {
    util::ScopedDescriptor owned(fd);  // closed here if the offer fails
    std::lock_guard lock(mutex_);
    start_if_needed();
    const std::uint64_t token = next_token_++;
    offered_[token] = owned.get();
    owned.release();
    return token;
  }

  void withdraw(std::uint64_t token) noexcept {
    std::lock_guard lock(mutex_);
    if (auto it = offered_.find(token); it != offered_.end()) {
      close(it->second);
      offered_.erase(it);
    }
  }

 private:
  // Listens once per process: a forked child has the parent's table but not its thread or socket.
  void start_if_needed() {
    if (listening_pid_ == getpid()) return;
    const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (listener < 0) throw StateError(system_error("offering a descriptor to other processes (socket)"));
    socklen_t length = 0;
    const sockaddr_un address = address_of(getpid(), length);
    if (bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0 || listen(listener, 16) != 0) {
      const std::string reason = system_error("offering a descriptor to other processes (bind)");
      close(listener);
      throw StateError(reason);
    }
    std::thread([this, listener] { serve(listener); }).detach();
    listening_pid_ = getpid();
  }

  void serve(int listener) {
    for (;;) {
      const int client = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      const util::ScopedDescriptor closed_after(client);
      limit_waits(client, 1);
      answer(client);
    }
  }

  // One request: an 8-byte token in, one status byte out, with the descriptor when it is known.
  void answer(int client) {
    ucred peer{};
    socklen_t peer_length = sizeof peer;
    std::uint64_t token = 0;
    if (getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &peer_length) != 0 || peer.uid != geteuid() ||
        recv(client, &token, sizeof token, 0) != static_cast<ssize_t>(sizeof token)) {
      return;  // another user's process, or a malformed request: no answer
    }
    int fd = -1;
    {
      // A copy: the offer may be withdrawn (and its descriptor closed) while this answer goes out.
      std::lock_guard lock(mutex_);
      if (auto it = offered_.find(token); it != offered_.end()) fd = fcntl(it->second, F_DUPFD_CLOEXEC, 0);
    }
    const util::ScopedDescriptor sent_copy(fd);
    char status = fd >= 0 ? 1 : 0;
    iovec data{&status, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    if (fd >= 0) {
      message.msg_control = control;
      message.msg_controllen = sizeof control;
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
    }
    sendmsg(client, &message, MSG_NOSIGNAL);
  }

  std::mutex mutex_;
  std::map<std::uint64_t, int> offered_;
  std::uint64_t next_token_ = 1;
  int listening_pid_ = 0;
};

}  // namespace

std::uint64_t offer_descriptor(int fd) { return DescriptorServer::instance().offer(fd); }

void withdraw_descriptor(std::uint64_t token) noexcept { DescriptorServer::instance().withdraw(token); }

int take_descriptor(int pid, std::uint64_t token) {
  const std::string from = "process " + std::to_string(pid);
  const int connection = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (connection < 0) throw StateError(system_error(("taking a descriptor from " + from + " (socket)").c_str()));
  const util::ScopedDescriptor closed_at_return(connection);
  limit_waits(connection, 10);
  socklen_t length = 0;
  const sockaddr_un address = address_of(pid, length);
  if (connect(connection, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    throw StateError(system_error(("cannot reach " + from +
                                   ", which exported the handle (has it exited, or is it in another network "
                                   "namespace?); connect")
                                      .c_str()));
  }
  if (send(connection, &token, sizeof token, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof token))
    throw StateError(system_error(("taking a descriptor from " + from + " (send)").c_str()));
  char status = 0;
  iovec data{&status, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const ssize_t received = recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
  if (received != 1) {
    throw StateError(from + " did not answer for its descriptor (a process of another user cannot take it)");
  }
  const cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (status != 1 || !header || header->cmsg_type != SCM_RIGHTS) {
    throw StateError(from + " offers no descriptor with token " + std::to_string(token) +
                     " (its memory was unmapped since, or the handle is not from that process's current run)");
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(header), sizeof fd);
  return fd;
}

}  // namespace cuemm::detail
