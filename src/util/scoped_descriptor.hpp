// util/scoped_descriptor.hpp: a file descriptor closed when it goes out of scope.
#pragma once

#include <unistd.h>

namespace cuemm::util {

class ScopedDescriptor {
 public:
  explicit ScopedDescriptor(int fd) noexcept : fd_(fd) {}
  ~ScopedDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedDescriptor(const ScopedDescriptor&) = delete;
  ScopedDescriptor& operator=(const ScopedDescriptor&) = delete;
  int get() const noexcept { return fd_; }
  // Hands the descriptor on: it is no longer closed here.
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace cuemm::util
