#include "cuemm/memory/ipc_handle.hpp"

#include <unistd.h>

#include <array>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include "cuemm/driver/driver.hpp"
#include "cuemm/error.hpp"
#include "cuemm/memory/memory_pointer.hpp"
#include "cuemm/runtime/context.hpp"
#include "cuemm/runtime/device.hpp"
#include "cuemm/threading/blocking_hook.hpp"
#include "driver/mapping.hpp"
#include "memory/descriptor_passing.hpp"
#include "util/scoped_descriptor.hpp"

namespace cuemm {
namespace {

using HandleBytes = std::array<char, cuda::kIpcHandleSize>;

// Driver handles this process exported: the driver refuses to open them here,
// and we say so clearly first.
struct ExportedHandles {
  BlockingAwareMutex mutex;
  std::set<HandleBytes> handles;
};
ExportedHandles& exported() {
  static ExportedHandles* table = new ExportedHandles();
  return *table;
}
HandleBytes bytes_of(const cuda::CUipcMemHandle& handle) {
  HandleBytes bytes;
  std::memcpy(bytes.data(), handle.reserved, bytes.size());
  return bytes;
}

constexpr char kMagic[8] = {'C', 'U', 'E', 'M', 'M', 'I', 'P', 'C'};
// Version 2 added the stream-ordered pool's export (a kind byte, its data, pid
// and token); version 3 the mapped pieces, and a length that depends on the kind.
constexpr std::uint32_t kFormatVersion = 3;
enum class Kind : std::uint8_t { DriverHandle = 0, PoolBlock = 1, MappedPieces = 2 };
// Magic, version, driver handle, size, offset, source (a flag and three ids), kind.
constexpr std::size_t kCommonSize = 8 + 4 + cuda::kIpcHandleSize + 8 + 8 + 1 + 3 * 4 + 1;
constexpr std::size_t kPoolBlockSize = sizeof(cuda::CUmemPoolPtrExportData) + 4 + 8;  // data, pid, token
constexpr std::size_t kPieceSize = 8 + 8;                                             // token, size
// More pieces than any device has memory for is a malformed handle, not an allocation to try.
constexpr std::uint32_t kMostPieces = 1u << 20;

template <typename T>
void put(std::vector<std::uint8_t>& out, const T& value) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}
template <typename T>
T take(const std::uint8_t*& cursor) {
  T value;
  std::memcpy(&value, cursor, sizeof(T));
  cursor += sizeof(T);
  return value;
}

// The exporter's pieces, imported and mapped side by side into addresses of
// this process, readable and writable by their device `source` and its peers,
// as in the exporter's arena (Note [Peer access]); `context` is source's or a
// peer's. The mapping keeps the memory: each imported handle is released once mapped.
std::shared_ptr<MemoryPointer> map_pieces(Context& context, const MappedExport& exported, int source) {
  ScopedContext scope(context);
  const std::vector<cuda::CUmemAccessDesc> access = driver::read_write_access_with_peers(source);
  std::size_t total = 0;
  for (const MappedExport::Piece& piece : exported.pieces) total += piece.size;
  cuda::CUdeviceptr base = 0;
  CUEMM_CU_ALLOC(total, cuMemAddressReserve, &base, total, 0, 0, 0);
  // Unmaps the pieces mapped so far (their sizes, from `base`) and frees the addresses.
  auto undo = [base, total](const std::vector<std::size_t>& sizes) noexcept {
    std::size_t at = 0;
    for (std::size_t size : sizes) {
      CUEMM_CU_RESULT(cuMemUnmap, base + at, size);
      at += size;
    }
    CUEMM_CU_RESULT(cuMemAddressFree, base, total);
  };
  std::vector<std::size_t> mapped;
  try {
    std::size_t at = 0;
    for (const MappedExport::Piece& piece : exported.pieces) {
      cuda::CUmemGenericAllocationHandle handle = 0;
      {
        const util::ScopedDescriptor descriptor(detail::take_descriptor(exported.pid, piece.token));
        CUEMM_CU(cuMemImportFromShareableHandle, &handle,
                 reinterpret_cast<void*>(static_cast<std::intptr_t>(descriptor.get())),
                 cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      }
      const driver::MappingResult result = driver::map_read_write(base + at, piece.size, handle, access);
      CUEMM_CU_RESULT(cuMemRelease, handle);  // the mapping, if made, keeps the memory
      driver::check(result.result, result.call);
      mapped.push_back(piece.size);
      at += piece.size;
    }
  } catch (...) {
    undo(mapped);
    throw;
  }
  return std::make_shared<MemoryPointer>(&context, base, total, nullptr, [&context, undo, mapped] {
    ScopedContext close_scope(context);
    undo(mapped);
  });
}

}  // namespace

std::string DeviceIdentity::to_string() const {
  return "{pci_domain_id: " + std::to_string(pci_domain_id) + ", pci_bus_id: " + std::to_string(pci_bus_id) +
         ", pci_device_id: " + std::to_string(pci_device_id) + "}";
}

IpcHandle::IpcHandle(std::shared_ptr<MemoryPointer> base, const cuda::CUipcMemHandle& handle, std::size_t size,
                     std::optional<DeviceIdentity> source_info, std::size_t offset)
    : base_(std::move(base)), handle_(handle), size_(size), source_info_(source_info), offset_(offset) {
  if (base_) {
    auto& table = exported();
    std::lock_guard lock(table.mutex);
    table.handles.insert(bytes_of(handle_));
  }
}

IpcHandle::IpcHandle(std::shared_ptr<MemoryPointer> base, const PoolExport& exported, std::size_t size,
                     std::optional<DeviceIdentity> source_info, std::size_t offset)
    : base_(std::move(base)), handle_{}, size_(size), source_info_(source_info), offset_(offset),
      pool_export_(exported) {}

IpcHandle::IpcHandle(std::shared_ptr<MemoryPointer> base, MappedExport exported, std::size_t size,
                     std::optional<DeviceIdentity> source_info, std::size_t offset)
    : base_(std::move(base)), handle_{}, size_(size), source_info_(source_info), offset_(offset),
      mapped_export_(std::move(exported)) {}

IpcHandle::IpcHandle(IpcHandle&&) noexcept = default;
IpcHandle& IpcHandle::operator=(IpcHandle&&) noexcept = default;
IpcHandle::~IpcHandle() = default;

std::vector<std::uint8_t> IpcHandle::to_bytes() const {
  std::vector<std::uint8_t> out;
  out.reserve(kCommonSize + kPoolBlockSize);
  out.insert(out.end(), kMagic, kMagic + sizeof kMagic);
  put(out, kFormatVersion);
  out.insert(out.end(), handle_.reserved, handle_.reserved + cuda::kIpcHandleSize);
  put(out, static_cast<std::uint64_t>(size_));
  put(out, static_cast<std::uint64_t>(offset_));
  put(out, static_cast<std::uint8_t>(source_info_ ? 1 : 0));
  const DeviceIdentity source = source_info_.value_or(DeviceIdentity{});
  put(out, static_cast<std::int32_t>(source.pci_domain_id));
  put(out, static_cast<std::int32_t>(source.pci_bus_id));
  put(out, static_cast<std::int32_t>(source.pci_device_id));
  if (pool_export_) {
    put(out, Kind::PoolBlock);
    out.insert(out.end(), pool_export_->data.reserved, pool_export_->data.reserved + sizeof pool_export_->data.reserved);
    put(out, pool_export_->pid);
    put(out, pool_export_->token);
  } else if (mapped_export_) {
    put(out, Kind::MappedPieces);
    put(out, mapped_export_->pid);
    put(out, static_cast<std::uint32_t>(mapped_export_->pieces.size()));
    for (const MappedExport::Piece& piece : mapped_export_->pieces) {
      put(out, piece.token);
      put(out, piece.size);
    }
  } else {
    put(out, Kind::DriverHandle);
  }
  return out;
}

IpcHandle IpcHandle::from_bytes(const std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < kCommonSize || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw InvalidArgument("not a serialised cuemm IPC handle (" + std::to_string(bytes.size()) +
                          " bytes; expected at least " + std::to_string(kCommonSize) + " starting with CUEMMIPC)");
  }
  const std::uint8_t* cursor = bytes.data() + sizeof kMagic;
  const auto version = take<std::uint32_t>(cursor);
  if (version != kFormatVersion)
    throw InvalidArgument("IPC handle format version " + std::to_string(version) + " is not supported (expected " +
                          std::to_string(kFormatVersion) + ")");
  cuda::CUipcMemHandle handle;
  std::memcpy(handle.reserved, cursor, cuda::kIpcHandleSize);
  cursor += cuda::kIpcHandleSize;
  const auto size = take<std::uint64_t>(cursor);
  const auto offset = take<std::uint64_t>(cursor);
  if (offset > std::numeric_limits<std::uint64_t>::max() - size) {
    throw InvalidArgument("serialised cuemm IPC handle: its block's offset " + std::to_string(offset) + " plus its " +
                          std::to_string(size) + " bytes overflow");
  }
  const bool has_source = take<std::uint8_t>(cursor) != 0;
  DeviceIdentity source;
  source.pci_domain_id = take<std::int32_t>(cursor);
  source.pci_bus_id = take<std::int32_t>(cursor);
  source.pci_device_id = take<std::int32_t>(cursor);
  const auto source_info = has_source ? std::optional(source) : std::nullopt;
  const auto kind = take<Kind>(cursor);
  const std::size_t left = bytes.size() - kCommonSize;
  auto require_left = [&](std::size_t expected, const char* what) {
    if (left != expected) {
      throw InvalidArgument("serialised cuemm IPC handle of " + std::string(what) + " has " +
                            std::to_string(bytes.size()) + " bytes; expected " + std::to_string(kCommonSize + expected));
    }
  };
  switch (kind) {
    case Kind::DriverHandle:
      require_left(0, "a driver handle");
      return IpcHandle(nullptr, handle, size, source_info, offset);
    case Kind::PoolBlock: {
      require_left(kPoolBlockSize, "a stream-ordered pool's block");
      PoolExport pool;
      std::memcpy(pool.data.reserved, cursor, sizeof pool.data.reserved);
      cursor += sizeof pool.data.reserved;
      pool.pid = take<std::int32_t>(cursor);
      pool.token = take<std::uint64_t>(cursor);
      return IpcHandle(nullptr, pool, size, source_info, offset);
    }
    case Kind::MappedPieces: {
      if (left < 8) require_left(8, "mapped pieces");
      MappedExport mapped;
      mapped.pid = take<std::int32_t>(cursor);
      const auto count = take<std::uint32_t>(cursor);
      if (count == 0 || count > kMostPieces)
        throw InvalidArgument("serialised cuemm IPC handle names " + std::to_string(count) + " mapped pieces");
      require_left(8 + std::size_t{count} * kPieceSize, "mapped pieces");
      mapped.pieces.resize(count);
      std::uint64_t total = 0;
      for (MappedExport::Piece& piece : mapped.pieces) {
        piece.token = take<std::uint64_t>(cursor);
        piece.size = take<std::uint64_t>(cursor);
        if (piece.size == 0 || piece.size > std::numeric_limits<std::uint64_t>::max() - total) {
          throw InvalidArgument("serialised cuemm IPC handle: mapped piece " +
                                std::to_string(&piece - mapped.pieces.data()) + " of " + std::to_string(piece.size) +
                                " bytes is empty or overflows the pieces' total");
        }
        total += piece.size;
      }
      if (offset + size > total) {
        throw InvalidArgument("serialised cuemm IPC handle: its block (offset " + std::to_string(offset) + ", " +
                              std::to_string(size) + " bytes) ends past its mapped pieces (" + std::to_string(total) +
                              " bytes)");
      }
      return IpcHandle(nullptr, std::move(mapped), size, source_info, offset);
    }
  }
  throw InvalidArgument("serialised cuemm IPC handle of unknown kind " +
                        std::to_string(static_cast<unsigned>(kind)));
}

std::string IpcHandle::to_hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  for (std::uint8_t byte : to_bytes()) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

IpcHandle IpcHandle::from_hex(const std::string& text) {
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw InvalidArgument("IPC handle text has a non-hex character '" + std::string(1, c) + "'");
  };
  if (text.size() % 2) throw InvalidArgument("IPC handle text has an odd length (" + std::to_string(text.size()) + ")");
  std::vector<std::uint8_t> bytes;
  for (std::size_t i = 0; i < text.size(); i += 2)
    bytes.push_back(static_cast<std::uint8_t>(digit(text[i]) * 16 + digit(text[i + 1])));
  return from_bytes(bytes);
}

std::shared_ptr<MemoryPointer> IpcHandle::open(Context& context) {
  if (opened_) throw StateError("IpcHandle is already opened (close it before opening it again)");
  const std::int32_t exporter = pool_export_ ? pool_export_->pid : mapped_export_ ? mapped_export_->pid : 0;
  if (exporter == getpid()) {
    throw StateError("this IPC handle was exported by this process (pid " + std::to_string(getpid()) +
                     "); only another process can open it");
  }
  if (has_driver_handle()) {
    auto& table = exported();
    std::lock_guard lock(table.mutex);
    if (table.handles.count(bytes_of(handle_))) {
      throw StateError("this IPC handle was exported by this process (pid " + std::to_string(getpid()) +
                       "); only another process can open it");
    }
  }
  // As Numba's IpcHandle: a device maps its own memory and a peer's it can
  // access (Note [Peer access]); any other device gets a copy staged through the source.
  if (!source_info_ || *source_info_ == context.device().identity() ||
      context.device().can_access_peer(Device::from_identity(*source_info_)))
    return open_direct(context);
  return open_staged(context);
}

std::shared_ptr<MemoryPointer> IpcHandle::map_into(Context& context) {
  // The memory's own device: `context`'s, or one whose memory it can access.
  // (A driver handle needs none: the driver opens it for a peer.)
  auto source = [&] { return source_info_ ? Device::from_identity(*source_info_).id() : context.device().id(); };
  if (mapped_export_) return map_pieces(context, *mapped_export_, source());
  if (!pool_export_) {
    // A damaged or forged handle may claim more than the exporter's allocation.
    std::shared_ptr<MemoryPointer> opened = context.open_ipc_handle(handle_, offset_ + size_);
    cuda::CUdeviceptr base = 0;
    std::size_t allocation = 0;  // (0 where the driver does not say)
    {
      ScopedContext scope(context);
      CUEMM_CU_RESULT(cuMemGetAddressRange, &base, &allocation, opened->device_pointer());
    }
    if (allocation != 0 && offset_ + size_ > allocation) {
      throw InvalidArgument("IpcHandle: its block (offset " + std::to_string(offset_) + ", " + describe_bytes(size_) +
                            ") ends past the exporter's allocation (" + describe_bytes(allocation) + ")");
    }
    return opened;
  }
  const int source_device = source();  // (before the import: nothing to undo if it throws)
  // The pool's descriptor from the exporter; the driver keeps what it needs of it.
  const util::ScopedDescriptor descriptor(detail::take_descriptor(pool_export_->pid, pool_export_->token));
  ScopedContext scope(context);
  cuda::CUmemoryPool pool = nullptr;
  CUEMM_CU(cuMemPoolImportFromShareableHandle, &pool,
           reinterpret_cast<void*>(static_cast<std::intptr_t>(descriptor.get())),
           cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cuda::CUdeviceptr pointer = 0;
  PoolExport exported = *pool_export_;
  cuda::CUresult result = cuda::CUDA_SUCCESS;
  if (context.device().id() != source_device) {  // a peer reaches a pool's blocks only where granted
    const std::vector<cuda::CUmemAccessDesc> access = driver::read_write_access({context.device().id()});
    if ((result = CUEMM_CU_RESULT(cuMemPoolSetAccess, pool, access.data(), access.size()))) {
      CUEMM_CU_RESULT(cuMemPoolDestroy, pool);
      driver::check(result, "cuMemPoolSetAccess");
    }
  }
  if ((result = CUEMM_CU_RESULT(cuMemPoolImportPointer, &pointer, pool, &exported.data))) {
    CUEMM_CU_RESULT(cuMemPoolDestroy, pool);
    driver::check(result, "cuMemPoolImportPointer");
  }
  // Freed in this process before the pool that holds it goes.
  return std::make_shared<MemoryPointer>(&context, pointer, offset_ + size_, nullptr, [&context, pointer, pool] {
    ScopedContext close_scope(context);
    CUEMM_CU(cuMemFree, pointer);
    CUEMM_CU(cuMemPoolDestroy, pool);
  });
}

std::shared_ptr<MemoryPointer> IpcHandle::open_direct(Context& context) {
  std::shared_ptr<MemoryPointer> opened = map_into(context);
  std::shared_ptr<MemoryPointer> block = opened->view(offset_, offset_ + size_);  // (closes it if this throws)
  opened_ = std::move(opened);
  staged_ = false;
  return block;
}

// The importing device cannot map the source device's memory: map it on the
// source device and copy it into memory from the importing context's manager.
// The copy is not owned by the handle (the manager owns it).
std::shared_ptr<MemoryPointer> IpcHandle::open_staged(Context& context) {
  Context& source = Device::from_identity(*source_info_).primary_context();
  auto mapping = map_into(source);
  auto copy = context.memalloc(size_);
  {
    ScopedContext scope(context);
    CUEMM_CU(cuMemcpyDtoD, copy->device_pointer(), mapping->device_pointer() + offset_, size_);
  }
  mapping->free();  // unmaps on the source device
  opened_ = copy;
  staged_ = true;
  return copy;
}

void IpcHandle::close() {
  if (!opened_) throw StateError("IpcHandle not opened (nothing to close)");
  auto opened = std::move(opened_);
  if (!staged_) opened->free();  // cuIpcCloseMemHandle, or cuMemFree of a pool's block
  staged_ = false;
}

}  // namespace cuemm
