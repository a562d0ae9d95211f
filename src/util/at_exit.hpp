// at_exit.hpp: the last words of objects that live until the process ends.
//
// Contexts, and so their managers and adaptors, are never destroyed (the
// driver may be gone by the time static destructors run), so an adaptor's
// destructor never flushes its log or prints its leak report in a program
// that exits without resetting. Such objects register what they would say.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace cuemm::util {

// Calls `last_words(object)` at exit (std::atexit, once registered), if
// `object` is still alive then; a gone object is skipped. Only in the process
// that registered it: a child forked from it inherits the handler, and would
// write a log's buffered rows a second time.
template <typename T>
void at_exit_while_alive(const std::shared_ptr<T>& object, void (*last_words)(T&)) {
  struct Entry {
    std::weak_ptr<T> object;
    void (*last_words)(T&);
  };
  struct Registry {
    std::mutex mutex;
    std::vector<Entry> entries;
    pid_t process = ::getpid();
  };
  static auto* registry = new Registry;  // (never destroyed: the handler runs during exit)
  static std::once_flag registered;
  std::call_once(registered, [] {
    std::atexit([] {
      if (::getpid() != registry->process) return;
      std::lock_guard lock(registry->mutex);
      for (const Entry& entry : registry->entries) {
        if (auto alive = entry.object.lock()) entry.last_words(*alive);
      }
    });
  });
  std::lock_guard lock(registry->mutex);
  std::erase_if(registry->entries, [](const Entry& entry) { return entry.object.expired(); });
  registry->entries.push_back({object, last_words});
}

}  // namespace cuemm::util
