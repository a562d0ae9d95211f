// sim/api/contexts.cpp: the simulated driver's primary and created contexts,
// the context stack, peer access.
#include "../driver_internals.hpp"

using namespace cuemm::sim;

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* out, CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxRetain);
  SIM_DEVICE(ordinal);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!device->primary) device->primary = make_context(s, device, true);
  ++device->primary->retains;
  *out = reinterpret_cast<CUcontext>(device->primary);
  return CUDA_SUCCESS;
}

namespace {
CUresult primary_release(CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxRelease);
  SIM_DEVICE(ordinal);
  Context* primary = device->primary;
  if (!primary || primary->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // The last release destroys the context's resources; the handle stays usable
  // (a later retain revives it), which is more lenient than a GPU.
  if (--primary->retains == 0) destroy_resources(lock, s, primary);
  return CUDA_SUCCESS;
}
CUresult primary_reset(CUdevice ordinal) {
  SIM_BEGIN(cuDevicePrimaryCtxReset);
  SIM_DEVICE(ordinal);
  if (device->primary) destroy_resources(lock, s, device->primary);
  device->peers_enabled.clear();
  return CUDA_SUCCESS;
}
CUresult primary_set_flags(CUdevice ordinal, unsigned flags) {
  SIM_BEGIN(cuDevicePrimaryCtxSetFlags);
  SIM_DEVICE(ordinal);
  if (!device->primary) device->primary = make_context(s, device, true);
  device->primary->flags = flags;
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return primary_release(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return primary_release(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return primary_reset(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { return primary_reset(d); }
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned f) { return primary_set_flags(d, f); }
SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { return primary_set_flags(d, f); }

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice ordinal, unsigned* flags, int* active) {
  SIM_BEGIN(cuDevicePrimaryCtxGetState);
  SIM_DEVICE(ordinal);
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  *flags = device->primary ? device->primary->flags : 0;
  *active = device->primary && device->primary->retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* out, unsigned flags, CUdevice ordinal) {
  SIM_BEGIN(cuCtxCreate);
  SIM_DEVICE(ordinal);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Context* context = make_context(s, device, false);
  context->flags = flags;
  context->retains = 1;
  context_stack.push_back(context);
  *out = reinterpret_cast<CUcontext>(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext handle) {
  SIM_BEGIN(cuCtxDestroy);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!is_live(s, context) || context->primary) return CUDA_ERROR_INVALID_CONTEXT;
  destroy_resources(lock, s, context);
  s.contexts.erase(context);
  std::erase(context_stack, context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext* out) {
  SIM_BEGIN(cuCtxGetCurrent);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUcontext>(current_context(s));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext handle) {
  SIM_BEGIN(cuCtxSetCurrent);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!context) {
    if (!context_stack.empty()) context_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_stack.empty()) {
    context_stack.push_back(context);
  } else {
    context_stack.back() = context;
  }
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext handle) {
  SIM_BEGIN(cuCtxPushCurrent);
  auto* context = reinterpret_cast<Context*>(handle);
  if (!is_live(s, context)) return CUDA_ERROR_INVALID_CONTEXT;
  context_stack.push_back(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* out) {
  SIM_BEGIN(cuCtxPopCurrent);
  if (context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (out) *out = reinterpret_cast<CUcontext>(context_stack.back());
  context_stack.pop_back();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice* out) {
  SIM_BEGIN(cuCtxGetDevice);
  SIM_CONTEXT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = context->device->ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize() {
  SIM_BEGIN(cuCtxSynchronize);
  SIM_CONTEXT();
  if (const CUresult refused = check_captures(s, DuringCapture::whole_context)) return refused;
  const int device = context->device->ordinal;
  synchronize_context(lock, context);
  release_past_thresholds(s, device);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer_handle, unsigned flags) {
  SIM_BEGIN(cuCtxEnablePeerAccess);
  SIM_CONTEXT();
  auto* peer = reinterpret_cast<Context*>(peer_handle);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!is_live(s, peer)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!s.peer_access || peer->device == context->device) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (!context->device->peers_enabled.insert(peer->device->ordinal).second)
    return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}
