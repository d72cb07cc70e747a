// Address-space bookkeeping for SimBackend (internal): anonymous host mappings and the
// virtual-memory books (reservations, physical allocations, mappings). Where a
// synthetic reservation lies is the placement model's choice (placement.hpp).
// None of it locks: SimBackend calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::sim {

// "0x7f0000000000": how messages name an address.
std::string hex(std::uintptr_t value);

// An anonymous mapping (MAP_NORESERVE), whose usable part starts at a multiple of
// alignment: private, or shared memory (a memfd the mapping owns, which other
// processes can map). Unmapped (and the memfd closed) on destruction. Move-only.
class HostMapping {
 public:
  HostMapping() = default;
  ~HostMapping();
  HostMapping(HostMapping&& other) noexcept;
  HostMapping& operator=(HostMapping&& other) noexcept;
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  // Maps size usable bytes with protection prot (PROT_*); false when mmap fails.
  bool map(std::size_t size, std::size_t alignment, int prot, bool shared = false);
  std::uintptr_t begin() const { return begin_; }
  std::size_t size() const { return size_; }
  int fd() const { return fd_; }  // shared: the memfd (offset 0 at begin()), else -1

 private:
  void reset() noexcept;
  void* raw_ = nullptr;  // what mmap returned; raw_size_ bytes
  std::size_t raw_size_ = 0;
  std::uintptr_t begin_ = 0;
  std::size_t size_ = 0;
  int fd_ = -1;
};

// A memfd of size bytes (sparse: no memory until written), or -1.
int make_memfd(std::size_t size);

// Drops the contents of the whole pages inside [start, start + size) (madvise
// DONTNEED); partial pages at either end are left alone, since a neighbouring
// live range may share them.
// With shared, the shared memory's backing pages are freed too (MADV_REMOVE).
void host_discard(std::uintptr_t start, std::size_t size, bool shared = false);
// mprotect of [start, start + size), which must be page aligned.
bool host_protect(std::uintptr_t start, std::size_t size, int prot);

// The virtual-memory books of all devices. Each call checks its preconditions and
// returns "" on success or the message of the error (state then unchanged). It does
// no capacity accounting: it reports the physical bytes that became free.
//
// Invariants:
//   - reservations_ never overlap one another, nor any segment (the placement model
//     hands out disjoint ranges, or they are separate host mappings);
//   - every mapping lies inside one reservation of the same device, mappings never
//     overlap, and mapping.size == physical_[mapping.handle].size;
//   - physical_[h].mappings counts the mappings of h; an entry is erased once it is
//     released and has no mapping left (its bytes are then free again, unless it was
//     imported: then they were never this device's);
//   - physical_[h].fd is a memfd holding h's bytes when shared (host_backed) or once
//     h was exported (synthetic: sparse, no data), else -1; an imported handle always
//     has one.
class VirtualSpace {
 public:
  // Where device d's synthetic reservations go (unused when host_backed): place returns
  // the start of size bytes at a multiple of alignment, or 0; unplace gives it back.
  struct Placer {
    std::function<std::uintptr_t(int device, std::size_t size, std::size_t alignment)> place;
    std::function<void(int device, std::uintptr_t start)> unplace;
  };
  // shared (host_backed only): physical memory is a memfd per handle, mapped shared.
  VirtualSpace(bool host_backed, bool shared, std::size_t granularity, Placer placer);
  ~VirtualSpace();

  // *no_room: the error is that the window (or the host) has no room left, which a
  // driver answers as out of memory.
  std::string reserve(int device, std::size_t size, std::size_t alignment, void** ptr,
                      bool* no_room);
  std::string release(int device, void* ptr, std::size_t size);
  // 0 when shared memory could not be made (host_backed shared only).
  PhysicalHandle create(int device, std::size_t size);
  // A new descriptor of handle's memory (made on first export when synthetic).
  std::string export_fd(int device, PhysicalHandle handle, int* fd);
  // A handle for the memory behind fd (another process's export); *size its bytes.
  std::string import_fd(int device, int fd, PhysicalHandle* handle, std::size_t* size);
  // Whether device may reach [p, p + size) through mappings: "" (yes), "none" (no
  // mapping at p), or why not.
  std::string reach(int device, std::uintptr_t p, std::size_t size) const;
  // *freed: bytes that are free again (0 while the handle is still mapped).
  std::string release_physical(int device, PhysicalHandle handle, std::size_t* freed);
  std::string map(int device, void* ptr, std::size_t size, PhysicalHandle handle);
  // *freed: bytes of released handles whose last mapping this removed.
  std::string unmap(int device, void* ptr, std::size_t size, std::size_t* freed);
  std::string set_access(int device, void* ptr, std::size_t size, const int* devices, int count,
                         int device_count);

  // The devices set_access granted on the mapping that starts at ptr (for tests).
  std::vector<int> access(void* ptr) const;
  std::size_t reservations() const { return reservations_.size(); }
  std::size_t reservations(int device) const;
  std::size_t mappings() const { return mappings_.size(); }

 private:
  struct Reservation {
    int device = 0;
    std::size_t size = 0;
    HostMapping host;  // host_backed only: the PROT_NONE range itself
  };
  struct Physical {
    int device = 0;
    std::size_t size = 0;
    int mappings = 0;       // how many live mappings use this handle
    bool released = false;  // release_physical was called
    bool imported = false;  // import_fd: another process's memory
    int fd = -1;            // see the invariants
  };
  // Erases a released, unmapped handle; returns the bytes freed on its device.
  std::size_t erase(std::unordered_map<PhysicalHandle, Physical>::iterator it);
  struct Mapping {
    std::size_t size = 0;
    PhysicalHandle handle = 0;
    std::vector<int> access;  // devices set_access granted, sorted, unique
  };

  // The reservation holding all of [p, p + size) on device, or nullptr.
  const Reservation* reservation_of(int device, std::uintptr_t p, std::size_t size) const;
  // Checks that [p, p + size) is covered by adjacent mappings; "" or the problem.
  // With exact, the range must also start and end on mapping boundaries.
  std::string check_covered(const char* op, std::uintptr_t p, std::size_t size, bool exact) const;

  bool host_backed_;
  bool shared_;
  std::size_t granularity_;
  Placer placer_;
  std::map<std::uintptr_t, Reservation> reservations_;  // keyed by start
  std::unordered_map<PhysicalHandle, Physical> physical_;
  std::map<std::uintptr_t, Mapping> mappings_;  // keyed by start
  PhysicalHandle next_handle_ = 1;
};

}  // namespace reservoir::sim
