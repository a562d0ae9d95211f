// cuemm/cuemm.hpp: everything, for applications. Libraries should include
// only the headers they use.
#pragma once

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/memory/default_memory_manager.hpp"
#include "cuemm/memory/host_only_memory_manager.hpp"
#include "cuemm/memory/ipc_handle.hpp"
#include "cuemm/memory/memory_manager.hpp"
#include "cuemm/memory/memory_pointer.hpp"
#include "cuemm/memory/registry.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/runtime/device_array.hpp"
#include "cuemm/runtime/module.hpp"
#include "cuemm/runtime/stream.hpp"
#include "cuemm/driver/simulation.hpp"
#include "cuemm/managers/pinned_host_pool.hpp"
#include "cuemm/managers/pool_memory_manager.hpp"
