// IpcImports: the receiving side of IPC (the spec's ipcMemHandle_to_devptr). Memory
// another process shared is mapped once per shared segment or page range, however
// many of its blocks are opened and however often; each open counts, and the mapping
// is undone when the last one is closed. A cudaMalloc'd segment opens with the
// driver's IPC handle (cudaIpcOpenMemHandle, which allows one open per process: hence
// the cache); expandable pages are imported from their descriptors or fabric handles
// into a fresh address range, mapped and made accessible to the device and its peers.
// Opens in the process that shared the memory map nothing: they count against the
// original block (open_self).
//
// Invariants (under mutex_): by_key_[e.key] names e for every entry e of entries_;
//   e.opens >= 1; entries never overlap; every pointer open() returned for e lies in
//   [e.base, e.base + e.size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/ipc/ipc_handle.hpp"
#include "reservoir/backend.hpp"

namespace reservoir::detail {

class IpcImports {
 public:
  explicit IpcImports(Backend& backend) : backend_(backend) {}
  // Undoes every mapping still open (errors ignored: teardown).
  ~IpcImports();
  IpcImports(const IpcImports&) = delete;
  IpcImports& operator=(const IpcImports&) = delete;

  // The block of r in this process, mapped on device (peers: other devices that must
  // reach it). fds: the descriptors that came with an expandable share, one per page
  // (not consumed). Throws DeviceError (nothing mapped then).
  void* open(const ShareRecord& r, const std::vector<int>& fds, int device,
             const std::vector<int>& peers);
  // An open in the process that shared r: the original block, nothing mapped.
  void* open_self(const ShareRecord& r);
  // Lets go of one open of the memory holding ptr; false when none holds it.
  // Throws DeviceError when undoing the last mapping fails (the entry stays).
  bool close(void* ptr);
  // Grants peer access to every expandable mapping on device (enable_peer_access).
  void add_peer(int device, int peer);

  std::size_t mappings() const;
  // Opens of the mapping holding ptr (0 when none).
  std::size_t opens(void* ptr) const;

 private:
  struct Entry {
    std::string key;
    ShareRecord::Kind kind = ShareRecord::segment;
    bool self = false;  // open_self: nothing mapped
    int device = 0;
    std::uintptr_t base = 0;
    std::size_t size = 0;
    std::size_t page_size = 0;
    std::vector<PhysicalHandle> handles;  // expandable: imported, mapped in order
    std::size_t opens = 0;
  };
  Entry map_segment(const ShareRecord& r, int device);
  Entry map_pages(const ShareRecord& r, const std::vector<int>& fds, int device,
                  const std::vector<int>& peers);
  // Undoes e's mapping; "" or why not.
  std::string unmap(Entry& e);
  void* remember(Entry e, const ShareRecord& r);  // under mutex_
  // The mapping of key opened once more, or nullptr (under mutex_).
  void* reopen(const std::string& key, const ShareRecord& r);
  const Entry* holding(std::uintptr_t address) const;

  Backend& backend_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Entry> entries_;                 // by base
  std::unordered_map<std::string, std::uintptr_t> by_key_;  // key -> base
};

}  // namespace reservoir::detail
