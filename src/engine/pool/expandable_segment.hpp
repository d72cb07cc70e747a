// ExpandableSegment: the physical side of an expandable segment — one reserved
// address range that grows by mapping pages (2 MiB for the small pool, 20 MiB for
// the large) and shrinks by unmapping whole free pages (the spec's Note
// [Expandable Segments]). The blocks that tile the range live in the owning
// StreamPool like any segment's; this class only knows which pages are backed.
//
// Growing a page takes three device steps (create physical memory, map it, grant
// access); a failed grow undoes every step it made. The undo calls can fail too: a
// page whose give-back failed is *held* — its memory is still the process's, so the
// engine counts it as reserved, and it is given back by a later retry.
//
// Invariants: base and page_size are multiples of the backend's granularity;
//   pages_ covers (at least) the pages below reach(); pages_[i] holds a handle iff
//     [base + i*page, base + (i+1)*page) is mapped with access granted (the pages
//     the engine's blocks may use);
//   mapped_bytes() == page_size * |{i : pages_[i]}|;
//   reach() == page_size * (1 + the highest i ever mapped), 0 before the first map:
//     it only grows, and every page mapped now lies below it (the engine registers
//     [base, base + reach()) in the segment map, not the whole reservation);
//   held_ lists the device memory whose give-back failed, none of it in pages_:
//     held_bytes() == page_size * |held_|; a held page with mapped == true still
//     occupies its address (nothing can be mapped there until it is given back);
//   after release() succeeded the segment owns nothing on the device;
//   asleep_ lists runs of pages put to sleep (sleep()), none of them in pages_ and no
//   two overlapping; each run's host copy is non-null iff it was offloaded:
//   asleep_bytes() == page_size * sum of their pages.
// Not thread-safe: used under the owning pool's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/pool/host_stash.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/errors.hpp"

namespace reservoir::detail {

// The device has no room for an expandable segment's range: the request that needed
// it is out of memory (the ladder may give other ranges back), not a device failure.
class NoAddressSpace : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

// The copies back of a wake on a stream (ExpandableSegment::wake): enqueued on stream,
// not waited for; the host copies they read, for the caller to free once work
// recorded on stream after them has completed.
struct WakeCopies {
  StreamHandle stream = 0;
  std::vector<void*> host;  // the host copies the enqueued copies read
  std::size_t bytes = 0;    // their size in all
};

class ExpandableSegment {
 public:
  // Reserves reserve_bytes (rounded up to pages) of address space. Throws
  // NoAddressSpace when the device's address space has no room for it (the driver's
  // out-of-memory answer), DeviceError when the device fails otherwise.
  // Offloads take their host copies from host_stash and give them back to it.
  ExpandableSegment(Backend& backend, HostStash& host_stash, int device, std::size_t page_size,
                    std::size_t reserve_bytes, std::vector<int> peers);
  // Gives back whatever release() did not (errors are ignored: teardown).
  ~ExpandableSegment();
  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  std::uintptr_t base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t page_size() const noexcept { return page_; }
  std::size_t mapped_bytes() const noexcept { return mapped_pages_ * page_; }
  // Bytes from base to the end of the furthest page ever mapped (never shrinks).
  std::size_t reach() const noexcept { return reach_; }
  // Device memory whose give-back failed: still held, counted as reserved.
  std::size_t held_bytes() const noexcept { return held_.size() * page_; }

  // Maps the pages covering [address, address + bytes); address is page-aligned.
  // Returns the bytes mapped from address (a page multiple >= bytes), or 0 when the
  // device is out of memory (nothing mapped then). Throws DeviceError otherwise,
  // with nothing mapped either. Retries the held pages first; a page of the range
  // that stays held makes it throw. Either way held_bytes() may change.
  // may_release_held: false during a CUDA graph capture, when no memory may go back to
  // the device (held pages are then left for a later map).
  std::size_t map(std::uintptr_t address, std::size_t bytes, bool may_release_held = true);
  // The whole pages inside [address, address + bytes): {first byte, length}.
  std::pair<std::uintptr_t, std::size_t> inner_pages(std::uintptr_t address,
                                                     std::size_t bytes) const;
  // Unmaps the whole pages inside [address, address + bytes) (the caller has
  // synchronized their users), in one device call for the whole run (a driver unmap
  // may span several whole mappings), then releases each page's memory. Returns the
  // range unmapped: all of inner_pages(), or nothing when the device refuses (then
  // *error says why). A page unmapped whose physical memory could not be released is
  // held (held_bytes() grows by it, *error says why).
  std::pair<std::uintptr_t, std::size_t> unmap(std::uintptr_t address, std::size_t bytes,
                                               std::string* error);
  // Retries giving back the held pages. Returns "" when none is left, else why not.
  std::string release_held();
  // Gives back the held pages, then the address range (pre: nothing mapped). Returns
  // "" when the segment owns nothing any more, else why not (retry later).
  std::string release();
  // The physical handles of the pages covering [address, address + bytes), all
  // mapped (an allocated block's), in order; *first gets the first page's address.
  std::vector<PhysicalHandle> handles(std::uintptr_t address, std::size_t bytes,
                                      std::uintptr_t* first) const;
  // Grants device read/write access to every mapped page, and to pages mapped later.
  // Throws DeviceError; device is then not a peer (a retry grants all pages again).
  void add_peer(int device);

  // ---- Sleep and wake (tagged memory, docs/sleep.md); the caller has synchronized
  // every user of the pages ----
  // Copies every mapped page to pinned host memory (offload), then unmaps the pages and
  // gives their memory back, keeping their places for wake(). Returns the bytes no
  // longer mapped. Throws DeviceError: a failed host allocation or copy changes
  // nothing; a failed unmap leaves the runs before it asleep (the caller wakes them).
  // A page whose memory the device would not take back is held, as by unmap().
  std::size_t sleep(bool offload);
  // Maps fresh memory at every page put to sleep and copies the offloaded contents
  // back: all or nothing. Returns false when the device is out of memory; throws
  // DeviceError. When it does not succeed nothing asleep is mapped and the host copies
  // are kept (a run whose undo the device refused is mapped again, awake).
  // With restoring, the copies are enqueued on restoring->stream (copy_to_device_async)
  // and not waited for: on success the host copies move to restoring->host, for the
  // caller to free once work recorded on that stream after them has completed.
  bool wake(WakeCopies* restoring = nullptr);
  std::size_t asleep_bytes() const noexcept { return asleep_pages_ * page_; }
  // The runs of mapped pages, and of pages asleep, in address order: {address, bytes}.
  std::vector<std::pair<std::uintptr_t, std::size_t>> mapped_ranges() const;
  std::vector<std::pair<std::uintptr_t, std::size_t>> asleep_ranges() const;
  std::size_t offloaded_bytes() const noexcept { return offloaded_pages_ * page_; }

 private:
  // Device memory whose give-back failed.
  struct Held {
    std::size_t page;       // index in the range
    PhysicalHandle handle;  // not released yet
    bool mapped;            // still mapped at page
  };
  struct Asleep {
    std::size_t first;  // page index
    std::size_t pages;
    void* host;  // the offloaded contents, or nullptr (discarded)
  };
  // The runs of mapped pages, in address order: {first page, pages}.
  std::vector<std::pair<std::size_t, std::size_t>> mapped_runs() const;
  std::string undo_wake(std::size_t runs);  // unmaps the first runs of asleep_ again
  void drop_asleep(std::size_t i);          // asleep_[i] is awake: its host copy freed
  void* page_address(std::size_t page) const {
    return reinterpret_cast<void*>(base_ + page * page_);
  }
  // Unmaps (when mapped) and releases one page; on failure holds it. "" or why not.
  std::string give_back(std::size_t page, PhysicalHandle handle, bool mapped);
  // Undoes a failed map(): gives back pages [first, end), of which [first,
  // mapped_end) were mapped. Returns the first undo failure ("" if none).
  std::string undo(std::size_t first, std::size_t end, std::size_t mapped_end);
  [[noreturn]] void fail(const std::string& what, const std::string& why,
                         const std::string& undo_failure) const;
  bool grant(std::size_t first_page, std::size_t end_page, const std::vector<int>& devices);

  Backend& backend_;
  HostStash& host_stash_;
  int device_;
  std::size_t page_;
  std::uintptr_t base_ = 0;
  std::size_t size_ = 0;
  bool released_ = false;  // release() gave the range back
  std::vector<std::optional<PhysicalHandle>> pages_;
  std::size_t mapped_pages_ = 0;
  std::size_t reach_ = 0;
  std::vector<Held> held_;
  std::vector<int> peers_;
  std::vector<Asleep> asleep_;
  std::size_t asleep_pages_ = 0, offloaded_pages_ = 0;
};

}  // namespace reservoir::detail
