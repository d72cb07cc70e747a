// ExpandableSegment: the physical side of an expandable segment — one reserved
// address range that grows by mapping pages (2 MiB for the small pool, 20 MiB for
// the large) and shrinks by unmapping whole free pages (the spec's Note
// [Expandable Segments]). The blocks that tile the range live in the owning
// StreamPool like any segment's; this class only knows which pages are backed.
//
// Invariants: base and page_size are multiples of the backend's granularity;
//   pages_[i] holds a physical handle iff [base + i*page, base + (i+1)*page) is mapped;
//   mapped_bytes() == page_size * |{i : pages_[i]}|.
// Not thread-safe: used under the owning pool's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

class ExpandableSegment {
 public:
  // Reserves reserve_bytes (rounded up to pages) of address space. Throws
  // DeviceError when the device cannot reserve it.
  ExpandableSegment(Backend& backend, int device, std::size_t page_size, std::size_t reserve_bytes,
                    std::vector<int> peers);
  // Unmaps every page and releases the range (errors are ignored: teardown).
  ~ExpandableSegment();
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  std::uintptr_t base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t page_size() const noexcept { return page_; }
  std::size_t mapped_bytes() const noexcept { return mapped_pages_ * page_; }

  // Maps the pages covering [address, address + bytes); address is page-aligned.
  // Returns the bytes mapped from address (a page multiple >= bytes), or 0 when the
  // device is out of memory (nothing mapped then). Throws DeviceError otherwise.
  std::size_t map(std::uintptr_t address, std::size_t bytes);
  // The whole pages inside [address, address + bytes): {first byte, length}.
  std::pair<std::uintptr_t, std::size_t> inner_pages(std::uintptr_t address,
                                                     std::size_t bytes) const;
  // Unmaps the whole pages inside [address, address + bytes) (the caller has
  // synchronized their users). Returns the range unmapped: all of inner_pages(), or,
  // when the device fails part way, the leading part that was (then *error says why).
  std::pair<std::uintptr_t, std::size_t> unmap(std::uintptr_t address, std::size_t bytes,
                                               std::string* error);
  // Grants device read/write access to every mapped page, and to pages mapped later.
  void add_peer(int device);

 private:
  void set_access(std::size_t first_page, std::size_t end_page);
  Backend& backend_;
  int device_;
  std::size_t page_;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  std::vector<std::optional<PhysicalHandle>> pages_;
  std::size_t mapped_pages_ = 0;
  std::vector<int> peers_;
};

}  // namespace reservoir::detail
