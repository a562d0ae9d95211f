// cuemm/memory/ipc_handle.hpp: sharing device memory with another process.
//
// A memory manager's get_ipc_handle() returns an IpcHandle: the driver's
// 64-byte handle of the allocation that contains the memory, the offset of the
// memory inside that allocation (non-zero for a pool's suballocation), its
// size, and the identity of the device it lives on. to_bytes() serialises it;
// the receiving process rebuilds it with from_bytes() and open()s it:
//
//   // exporter                                // importer
//   auto handle = context.get_ipc_handle(mem);  auto handle = IpcHandle::from_bytes(bytes);
//   send(handle.to_bytes());                    auto mem = handle.open(cuemm::current_context());
//                                               ...; handle.close();
//
// open() maps the memory directly when the importer's device is the source
// device or can access its memory (a peer, as Numba's IpcHandle decides), and
// otherwise stages it: the source device maps it and a copy is made in a fresh
// allocation from the importing context's memory manager.
//
// Two kinds of memory have no such driver handle. A block of a stream-ordered
// pool created exportable: its handle carries the block's export data
// (cuMemPoolExportPointer) and the exporting process's pid, from which open()
// takes the pool's descriptor. Memory made by cuMemCreate and mapped side by
// side (the pool's expandable arena): its handle names the pieces that hold
// it, and open() takes each piece's descriptor and maps them side by side.
// Descriptors go through a Unix socket: processes of the same user only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuemm/driver/cuda_api.hpp"

namespace cuemm {

class Context;
class MemoryPointer;

// Where a device sits on the PCI bus: stable across processes, unlike ordinals.
struct DeviceIdentity {
  int pci_domain_id = 0;
  int pci_bus_id = 0;
  int pci_device_id = 0;
  bool operator==(const DeviceIdentity&) const = default;
  std::string to_string() const;
};

// A block of an exportable stream-ordered pool, as the exporting process names it.
struct PoolExport {
  cuda::CUmemPoolPtrExportData data;  // from cuMemPoolExportPointer
  std::int32_t pid = 0;               // the exporting process
  std::uint64_t token = 0;            // names the pool's descriptor there (see src/memory/descriptor_passing.hpp)
};

// The pieces of cuMemCreate memory that hold a block, side by side, as the
// exporting process names them; the handle's offset is from the first's start.
struct MappedExport {
  struct Piece {
    std::uint64_t token = 0;  // names the piece's descriptor there
    std::uint64_t size = 0;   // bytes (a multiple of the driver's granularity)
  };
  std::int32_t pid = 0;  // the exporting process
  std::vector<Piece> pieces;
};

class IpcHandle {
 public:
  // base: the exported memory (kept alive while the handle lives); null in an
  // importing process. offset: where the memory starts inside the allocation
  // the driver handle names.
  IpcHandle(std::shared_ptr<MemoryPointer> base, const cuda::CUipcMemHandle& handle, std::size_t size,
            std::optional<DeviceIdentity> source_info = std::nullopt, std::size_t offset = 0);
  // A block of an exportable stream-ordered pool: the driver handle is all zeros.
  IpcHandle(std::shared_ptr<MemoryPointer> base, const PoolExport& exported, std::size_t size,
            std::optional<DeviceIdentity> source_info = std::nullopt, std::size_t offset = 0);
  // Memory mapped from shareable pieces: the driver handle is all zeros.
  IpcHandle(std::shared_ptr<MemoryPointer> base, MappedExport exported, std::size_t size,
            std::optional<DeviceIdentity> source_info = std::nullopt, std::size_t offset = 0);
  IpcHandle(IpcHandle&&) noexcept;
  IpcHandle& operator=(IpcHandle&&) noexcept;
  IpcHandle(const IpcHandle&) = delete;
  IpcHandle& operator=(const IpcHandle&) = delete;
  ~IpcHandle();

  const std::shared_ptr<MemoryPointer>& base() const noexcept { return base_; }
  const cuda::CUipcMemHandle& handle() const noexcept { return handle_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t offset() const noexcept { return offset_; }
  const std::optional<DeviceIdentity>& source_info() const noexcept { return source_info_; }
  const std::optional<PoolExport>& pool_export() const noexcept { return pool_export_; }
  const std::optional<MappedExport>& mapped_export() const noexcept { return mapped_export_; }
  // Whether handle() is the driver's (cuIpcGetMemHandle), which anything that
  // speaks CUDA IPC can open; otherwise only cuemm's open() can.
  bool has_driver_handle() const noexcept { return !pool_export_ && !mapped_export_; }

  // Serialised form (the handle, size, offset and source; never the base).
  std::vector<std::uint8_t> to_bytes() const;
  static IpcHandle from_bytes(const std::vector<std::uint8_t>& bytes);
  std::string to_hex() const;
  static IpcHandle from_hex(const std::string& text);

  // The shared memory, `size()` bytes, in `context`. StateError when already
  // open or when this process exported the handle.
  std::shared_ptr<MemoryPointer> open(Context& context);
  // Unmaps memory opened directly (a staged copy is freed when its last
  // reference goes). StateError when not open.
  void close();
  bool is_open() const noexcept { return opened_ != nullptr; }
  bool is_staged() const noexcept { return staged_; }

 private:
  std::shared_ptr<MemoryPointer> open_direct(Context& context);
  std::shared_ptr<MemoryPointer> open_staged(Context& context);
  // The exported allocation, mapped into `context` (its start, offset_ + size_ bytes).
  std::shared_ptr<MemoryPointer> map_into(Context& context);

  std::shared_ptr<MemoryPointer> base_;
  cuda::CUipcMemHandle handle_;
  std::size_t size_;
  std::optional<DeviceIdentity> source_info_;
  std::size_t offset_;
  std::optional<PoolExport> pool_export_;
  std::optional<MappedExport> mapped_export_;
  std::shared_ptr<MemoryPointer> opened_;  // the mapping (direct) or the copy (staged)
  bool staged_ = false;
};

}  // namespace cuemm
