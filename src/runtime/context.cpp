#include "cuemm/runtime/context.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "cuemm/driver/driver.hpp"
#include "cuemm/memory/registry.hpp"
#include "cuemm/runtime/capture_scope.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/runtime/module.hpp"
#include "cuemm/runtime/stream.hpp"
#include "callback_failures.hpp"

namespace cuemm {

namespace detail {
Context* find_context(cuda::CUcontext handle);
}

Context::Context(Device& device, cuda::CUcontext handle)
    : device_(device), handle_(handle), deallocations_(10), memory_manager_(detail::create_memory_manager(*this)) {}

Context::~Context() { deallocations_.flush_all(); }

// Each entry into the memory manager first refuses in a forked child (Note [A
// child forked after the driver was loaded]): the manager there is a copy.
void Context::prepare_for_use() {
  driver::refuse_in_forked_child("initialize");
  memory_manager_->initialize();
}

void Context::reset() {
  driver::refuse_in_forked_child("reset");
  deallocations_.flush_all();
  memory_manager_->reset();
}

MemoryInfo Context::get_memory_info() {
  driver::refuse_in_forked_child("get_memory_info");
  return memory_manager_->get_memory_info();
}

std::shared_ptr<MemoryPointer> Context::memalloc(std::size_t size) {
  require_allocation_size(size, "memalloc");
  driver::refuse_in_forked_child("memalloc");
  if (capturing()) [[unlikely]] {
    if (auto reused = reuse_if_captured(size)) return reused;
    return keep_if_captured(memory_manager_->memalloc(size));
  }
  return memory_manager_->memalloc(size);
}

std::shared_ptr<MemoryPointer> Context::memhostalloc(std::size_t size, bool mapped, bool portable, bool wc) {
  require_allocation_size(size, "memhostalloc");
  driver::refuse_in_forked_child("memhostalloc");
  return keep_if_captured(memory_manager_->memhostalloc(size, mapped, portable, wc));
}

std::shared_ptr<MemoryPointer> Context::mempin(std::shared_ptr<const void> owner, void* pointer, std::size_t size,
                                               bool mapped) {
  if (!pointer) throw InvalidArgument("mempin: the pointer is null");
  require_allocation_size(size, "mempin");
  driver::refuse_in_forked_child("mempin");
  if (mapped && !device_.can_map_host_memory())
    throw InvalidArgument("mempin: device " + std::to_string(device_.id()) + " cannot map host memory");
  return keep_if_captured(memory_manager_->mempin(std::move(owner), pointer, size, mapped));
}

std::shared_ptr<MemoryPointer> Context::memallocmanaged(std::size_t size, bool attach_global) {
  require_allocation_size(size, "memallocmanaged");
  driver::refuse_in_forked_child("memallocmanaged");
  return keep_if_captured(memory_manager_->memallocmanaged(size, attach_global));
}

IpcHandle Context::get_ipc_handle(const std::shared_ptr<MemoryPointer>& memory) {
  if (!memory) throw InvalidArgument("get_ipc_handle: the memory pointer is null");
  driver::refuse_in_forked_child("get_ipc_handle");
  return memory_manager_->get_ipc_handle(memory);
}

CleanupGuard Context::defer_cleanup() {
  driver::refuse_in_forked_child("defer_cleanup");
  CleanupGuard guard = memory_manager_->defer_cleanup();
  guard.attach(deallocations_.defer());
  return guard;
}

std::shared_ptr<MemoryPointer> Context::open_ipc_handle(const cuda::CUipcMemHandle& handle, std::size_t size) {
  ScopedContext scope(*this);
  cuda::CUdeviceptr pointer = 0;
  CUEMM_CU(cuIpcOpenMemHandle, &pointer, handle, cuda::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return std::make_shared<MemoryPointer>(this, pointer, size, nullptr, [this, pointer] {
    ScopedContext close_scope(*this);
    CUEMM_CU(cuIpcCloseMemHandle, pointer);
  });
}

Stream Context::create_stream(bool non_blocking) {
  ScopedContext scope(*this);
  cuda::CUstream handle = nullptr;
  CUEMM_CU(cuStreamCreate, &handle, non_blocking ? cuda::CU_STREAM_NON_BLOCKING : cuda::CU_STREAM_DEFAULT);
  return Stream(this, handle, true);
}

Event Context::create_event(bool timing) {
  ScopedContext scope(*this);
  cuda::CUevent handle = nullptr;
  CUEMM_CU(cuEventCreate, &handle, timing ? cuda::CU_EVENT_DEFAULT : cuda::CU_EVENT_DISABLE_TIMING);
  return Event(this, handle);
}

Module Context::load_module(std::string_view image) {
  if (image.empty()) throw InvalidArgument("load_module: the image is empty");
  const std::string terminated(image);  // PTX must be NUL-terminated
  ScopedContext scope(*this);
  cuda::CUmodule handle = nullptr;
  CUEMM_CU(cuModuleLoadDataEx, &handle, terminated.c_str(), 0, nullptr, nullptr);
  return Module(this, handle);
}

void Context::synchronize() {
  ScopedContext scope(*this);
  CUEMM_CU(cuCtxSynchronize);
  detail::rethrow_callback_failure_of_context(handle_);
}

Context& current_context() {
  cuda::CUcontext handle = nullptr;
  CUEMM_CU(cuCtxGetCurrent, &handle);
  if (handle) {
    if (Context* context = detail::find_context(handle)) return *context;
    throw StateError("the CUDA context current on this thread was not made by cuemm (only primary contexts are)");
  }
  Context& context = Device::get(0).primary_context();
  CUEMM_CU(cuCtxPushCurrent, context.handle());
  return context;
}

ScopedContext::ScopedContext(const Context& context) {
  cuda::CUcontext current = nullptr;
  CUEMM_CU(cuCtxGetCurrent, &current);
  if (current != context.handle()) {
    CUEMM_CU(cuCtxPushCurrent, context.handle());
    pushed_ = true;
  }
  if (context.capturing()) [[unlikely]] {
    int mode = cuda::CU_STREAM_CAPTURE_MODE_RELAXED;
    relaxed_ = CUEMM_CU_RESULT(cuThreadExchangeStreamCaptureMode, &mode) == cuda::CUDA_SUCCESS;
    previous_capture_mode_ = mode;
  }
}

ScopedContext::~ScopedContext() {
  if (relaxed_) CUEMM_CU_RESULT(cuThreadExchangeStreamCaptureMode, &previous_capture_mode_);
  if (pushed_) CUEMM_CU_RESULT(cuCtxPopCurrent, nullptr);
}

CaptureScope* Context::innermost_scope_of_this_thread(bool* as_member, bool memberships) {
  const auto thread = std::this_thread::get_id();
  for (auto it = open_scopes_.rbegin(); it != open_scopes_.rend(); ++it) {
    const bool member = memberships && std::find(scope_members_.begin(), scope_members_.end(),
                                                 std::make_pair(thread, (*it)->id_)) != scope_members_.end();
    if ((*it)->thread_ != thread && !member) continue;
    if (as_member) *as_member = (*it)->thread_ != thread;
    return *it;
  }
  return nullptr;
}

bool Context::keep_for_capture(const std::function<std::shared_ptr<MemoryPointer>()>& make) {
  std::lock_guard lock(scopes_mutex_);
  bool member = false;
  CaptureScope* scope = innermost_scope_of_this_thread(&member);
  if (!scope) return false;
  scope->memory_->keep(make(), /*ordered=*/!member);
  return true;
}

std::shared_ptr<MemoryPointer> Context::reuse_if_captured(std::size_t size) {
  std::lock_guard lock(scopes_mutex_);
  bool member = false;
  CaptureScope* scope = innermost_scope_of_this_thread(&member);
  if (!scope || member || scope->reuse_ != CaptureScope::Reuse::in_capture_order) return nullptr;
  return scope->memory_->reuse(size);
}

void Context::let_go_for_capture(cuda::CUdeviceptr address, cuda::CUstream stream) {
  std::lock_guard lock(scopes_mutex_);
  if (CaptureScope* scope = innermost_scope_of_this_thread()) scope->memory_->let_go_on(address, stream);
}

std::shared_ptr<MemoryPointer> Context::reuse_for_capture(std::size_t size, cuda::CUstream stream) {
  std::lock_guard lock(scopes_mutex_);
  CaptureScope* scope = innermost_scope_of_this_thread();
  return scope ? scope->memory_->reuse(size, &stream) : nullptr;
}

CaptureScope::CaptureScope(Context& context, Reuse reuse, std::shared_ptr<GraphMemory> shared)
    : context_(context), reuse_(reuse), memory_(std::move(shared)) {
  if (!memory_) {
    memory_.reset(new GraphMemory(context));
  } else if (&memory_->context_ != &context) {
    throw InvalidArgument("CaptureScope: the shared GraphMemory holds blocks of another context (device " +
                          std::to_string(memory_->context_.device().id()) + "), not this one's (device " +
                          std::to_string(context.device().id()) + ")");
  }
  explicit_frees_before_ = memory_->blocks_freed_explicitly();  // (a shared memory's, reported by its scope)
  {
    std::lock_guard lock(context_.scopes_mutex_);
    id_ = context_.next_scope_id_++;
    context_.open_scopes_.push_back(this);
  }
  context_.captures_.fetch_add(1, std::memory_order_acq_rel);
}

CaptureScope* CaptureScope::of_this_thread(Context& context) {
  std::lock_guard lock(context.scopes_mutex_);
  return context.innermost_scope_of_this_thread(nullptr, /*memberships=*/false);
}

CaptureScope::Member::Member(CaptureScope& scope) : context_(scope.context_), scope_(scope.id_) {
  std::lock_guard lock(context_.scopes_mutex_);
  context_.scope_members_.emplace_back(thread_, scope_);
}

CaptureScope::Member::~Member() {
  std::lock_guard lock(context_.scopes_mutex_);
  // (Gone already where its scope closed first.)
  auto& members = context_.scope_members_;
  const auto entry = std::find(members.begin(), members.end(), std::make_pair(thread_, scope_));
  if (entry != members.end()) members.erase(entry);
}

CaptureScope::~CaptureScope() {
  context_.captures_.fetch_sub(1, std::memory_order_acq_rel);
  {
    std::lock_guard lock(context_.scopes_mutex_);
    std::erase(context_.open_scopes_, this);
    std::erase_if(context_.scope_members_, [&](const auto& member) { return member.second == id_; });
  }
  // A block freed with free() during the capture went back to its manager at
  // once: the graph's launches may write into memory that serves another.
  if (const std::size_t early = memory_->blocks_freed_explicitly() - explicit_frees_before_)
    std::fprintf(stderr,
                 "cuemm: %zu block(s) allocated during a graph capture were freed with free() before it ended; "
                 "the graph's launches may write into memory now given to others (drop the references instead, "
                 "and keep CaptureScope::memory() while the graph may be launched)\n",
                 early);
}

void GraphMemory::keep(std::shared_ptr<MemoryPointer> block, bool ordered) {
  std::lock_guard lock(mutex_);
  const std::size_t size = block->size();
  const bool device = block->kind() == MemoryKind::Device;
  const std::uintptr_t address = block->handle();
  ordered_.reserve(kept_.size() + 1);  // (so that the push_back below cannot throw)
  kept_.push_back(std::move(block));
  if (device) {
    const std::size_t index = kept_.size() - 1;
    auto by_size = device_blocks_by_size_.end();
    try {
      by_size = device_blocks_by_size_.emplace(size, index);
      device_block_at_[address] = index;
    } catch (...) {
      // (No index may name a block not kept.)
      if (by_size != device_blocks_by_size_.end()) device_blocks_by_size_.erase(by_size);
      kept_.pop_back();
      throw;
    }
  }
  ordered_.push_back(ordered);
  bytes_ += size;
}

std::shared_ptr<MemoryPointer> GraphMemory::reuse(std::size_t size, const cuda::CUstream* stream) {
  std::lock_guard lock(mutex_);
  // (Only this object hands out new references to a kept block, under the
  // lock: a count of one cannot grow meanwhile.)
  for (auto it = device_blocks_by_size_.lower_bound(size);
       it != device_blocks_by_size_.end() && it->first - size <= size; ++it) {
    std::shared_ptr<MemoryPointer>& block = kept_[it->second];
    if (block.use_count() != 1 || !block->is_alive()) continue;
    const auto freed_on = let_go_on_.find(it->second);
    if (stream && (freed_on == let_go_on_.end() || freed_on->second != *stream)) continue;
    if (!stream && !ordered_[it->second]) continue;  // (a member thread's: nothing orders it)
    auto view = block->view(0, size);
    if (freed_on != let_go_on_.end()) let_go_on_.erase(freed_on);  // (its next free says where it goes)
    ++reuses_;
    return view;
  }
  return nullptr;
}

void GraphMemory::let_go_on(std::uintptr_t address, cuda::CUstream stream) {
  std::lock_guard lock(mutex_);
  if (const auto found = device_block_at_.find(address); found != device_block_at_.end())
    let_go_on_[found->second] = stream;
}

std::size_t GraphMemory::reuses() const {
  std::lock_guard lock(mutex_);
  return reuses_;
}

std::size_t GraphMemory::blocks() const {
  std::lock_guard lock(mutex_);
  return kept_.size();
}

std::size_t GraphMemory::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

std::size_t GraphMemory::blocks_freed_by_the_program() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(std::count_if(kept_.begin(), kept_.end(), [](const auto& block) {
    return block.use_count() == 1 && block->is_alive();
  }));
}

std::size_t GraphMemory::blocks_freed_explicitly() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(
      std::count_if(kept_.begin(), kept_.end(), [](const auto& block) { return !block->is_alive(); }));
}

}  // namespace cuemm
