#include "cuemm/adaptors/limiting_adaptor.hpp"

#include <algorithm>

#include "cuemm/error.hpp"
#include "cuemm/memory/default_memory_manager.hpp"

namespace cuemm {

namespace {
bool counted(MemoryKind kind) { return kind == MemoryKind::Device || kind == MemoryKind::Managed; }
}  // namespace

struct LimitingAdaptor::Cap : AllocationObserver {
  std::size_t limit;
  std::atomic<std::size_t> in_use{0};
  explicit Cap(std::size_t limit_) : limit(limit_) {}

  void before_allocation(MemoryKind kind, std::size_t size) override {
    if (!counted(kind)) return;
    // Reserve with a compare-and-swap, so that racing threads cannot pass the
    // cap together and in_use() never reads above it.
    std::size_t before = in_use.load();
    do {
      if (size > limit || before > limit - size)
        throw OutOfMemory("LimitingAdaptor", size,
                          "the limit is " + describe_bytes(limit) + " and " + describe_bytes(before) + " are in use");
    } while (!in_use.compare_exchange_weak(before, before + size));
  }
  void allocation_failed(MemoryKind kind, std::size_t size) noexcept override {
    if (counted(kind)) give_back(size);
  }
  void released(const AllocationRecord& record) noexcept override {
    if (counted(record.kind)) give_back(record.size);
  }
  // Never below 0, whatever happens: a wrapped count would refuse every
  // request after. (A release never finds its bytes forgotten by a reset:
  // Note [Counting across a reset].)
  void give_back(std::size_t size) noexcept {
    std::size_t before = in_use.load();
    while (!in_use.compare_exchange_weak(before, before - std::min(before, size))) {
    }
  }
  void reset() noexcept override { in_use = 0; }
  bool wants_times_and_call_sites() const noexcept override { return false; }
};

LimitingAdaptor::LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream, std::size_t limit)
    : LimitingAdaptor(context, std::move(upstream), std::make_shared<Cap>(limit)) {}

LimitingAdaptor::LimitingAdaptor(Context* context, std::unique_ptr<BaseMemoryManager> upstream,
                                 std::shared_ptr<Cap> cap)
    : ManagerAdaptor(context, std::move(upstream), cap), cap_(std::move(cap)) {}

std::size_t LimitingAdaptor::limit() const noexcept { return cap_->limit; }
std::size_t LimitingAdaptor::in_use() const noexcept { return cap_->in_use.load(); }

MemoryInfo LimitingAdaptor::get_memory_info() {
  const std::size_t used = std::min(cap_->in_use.load(), cap_->limit);
  return within_cap(ManagerAdaptor::get_memory_info(), cap_->limit, cap_->limit - used);
}

}  // namespace cuemm
