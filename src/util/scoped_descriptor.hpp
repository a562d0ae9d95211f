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

 private:
  int fd_;
};

}  // namespace cuemm::util
