#include "cuemm/threading/blocking_hook.hpp"

namespace cuemm {

namespace {
thread_local BlockingHook* current_hook = nullptr;
}

ScopedBlockingHook::ScopedBlockingHook(BlockingHook& hook) noexcept : previous_(current_hook) {
  current_hook = &hook;
}

ScopedBlockingHook::~ScopedBlockingHook() { current_hook = previous_; }

void before_blocking() noexcept {
  if (BlockingHook* hook = current_hook) [[unlikely]]
    hook->before_blocking();
}

}  // namespace cuemm
