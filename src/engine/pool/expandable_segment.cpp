#include "engine/pool/expandable_segment.hpp"

#include <algorithm>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

ExpandableSegment::ExpandableSegment(Backend& backend, HostStash& host_stash, int device,
                                     std::size_t page_size, std::size_t reserve_bytes,
                                     std::vector<int> peers)
    : backend_(backend),
      host_stash_(host_stash),
      device_(device),
      page_(page_size),
      peers_(std::move(peers)) {
  std::size_t pages = (reserve_bytes + page_ - 1) / page_;
  if (pages == 0) pages = 1;
  size_ = pages * page_;
  void* ptr = nullptr;
  const DeviceStatus status = backend_.reserve_address_range(
      device_, size_, page_ <= (2u << 20) ? page_ : (2u << 20), &ptr);
  if (status != DeviceStatus::ok) {
    const std::string what =
        "reservoir: reserving " + format_size(size_) +
        " of address space for an expandable segment on device " + std::to_string(device_) +
        " (lower it with expandable_segments_reserve) failed: " + backend_.last_error();
    if (status == DeviceStatus::out_of_memory) throw NoAddressSpace(what);
    throw DeviceError(what);
  }
  base_ = reinterpret_cast<std::uintptr_t>(ptr);
  // pages_ grows with map() (to reach()), not to the reservation's tens of thousands.
}

ExpandableSegment::~ExpandableSegment() {
  // Teardown (the engine is going away): errors are ignored, nothing is recorded.
  for (const Asleep& a : asleep_) host_stash_.give(a.host);
  // Each run of mapped pages is unmapped in one call, then its pages released.
  for (const auto& [first, count] : mapped_runs()) {
    (void)backend_.unmap(device_, page_address(first), count * page_);
    for (std::size_t i = first; i < first + count; ++i)
      (void)backend_.release_physical(device_, *pages_[i]);
  }
  for (const Held& h : held_) {
    if (h.mapped) (void)backend_.unmap(device_, page_address(h.page), page_);
    (void)backend_.release_physical(device_, h.handle);
  }
  if (!released_)
    (void)backend_.release_address_range(device_, reinterpret_cast<void*>(base_), size_);
}

std::vector<std::pair<std::size_t, std::size_t>> ExpandableSegment::mapped_runs() const {
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t i = 0; i < pages_.size();) {
    if (!pages_[i]) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < pages_.size() && pages_[end]) ++end;
    runs.emplace_back(i, end - i);
    i = end;
  }
  return runs;
}

std::vector<std::pair<std::uintptr_t, std::size_t>> ExpandableSegment::mapped_ranges() const {
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  for (const auto& [first, count] : mapped_runs())
    out.emplace_back(base_ + first * page_, count * page_);
  return out;
}

std::vector<std::pair<std::uintptr_t, std::size_t>> ExpandableSegment::asleep_ranges() const {
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  for (const Asleep& a : asleep_) out.emplace_back(base_ + a.first * page_, a.pages * page_);
  return out;
}

std::string ExpandableSegment::give_back(std::size_t page, PhysicalHandle handle, bool mapped) {
  // held_ has room reserved by the caller: recording a failure never allocates.
  if (mapped && backend_.unmap(device_, page_address(page), page_) != DeviceStatus::ok) {
    held_.push_back(Held{page, handle, true});
    return "unmapping the page at " + format_pointer(page_address(page)) + ": " +
           backend_.last_error();
  }
  if (backend_.release_physical(device_, handle) != DeviceStatus::ok) {
    held_.push_back(Held{page, handle, false});
    return "releasing the physical memory of the page at " + format_pointer(page_address(page)) +
           ": " + backend_.last_error();
  }
  return "";
}

std::string ExpandableSegment::undo(std::size_t first, std::size_t end, std::size_t mapped_end) {
  std::string failure;
  for (std::size_t i = first; i < end; ++i) {
    const PhysicalHandle handle = *pages_[i];
    pages_[i].reset();
    std::string why = give_back(i, handle, i < mapped_end);
    if (failure.empty()) failure = std::move(why);
  }
  return failure;
}

void ExpandableSegment::fail(const std::string& what, const std::string& why,
                             const std::string& undo_failure) const {
  std::string message =
      "reservoir: " + what + " on device " + std::to_string(device_) + " failed: " + why;
  if (!undo_failure.empty())
    message += "; undoing it failed too (" + undo_failure +
               "): that memory stays reserved until empty_cache() gives it back";
  throw DeviceError(message);
}

bool ExpandableSegment::grant(std::size_t first_page, std::size_t end_page,
                              const std::vector<int>& devices) {
  if (first_page >= end_page) return true;
  return backend_.set_access(device_, page_address(first_page), (end_page - first_page) * page_,
                             devices.data(), static_cast<int>(devices.size())) == DeviceStatus::ok;
}

std::size_t ExpandableSegment::map(std::uintptr_t address, std::size_t bytes,
                                   bool may_release_held) {
  const std::size_t first = (address - base_) / page_;
  const std::size_t end = (address - base_ + bytes + page_ - 1) / page_;
  if (!held_.empty()) {
    const std::string why =
        may_release_held ? release_held() : std::string("a capture is under way");
    for (const Held& h : held_)
      if (h.mapped && h.page >= first && h.page < end)
        fail("mapping a page of an expandable segment",
             "the page at " + format_pointer(page_address(h.page)) +
                 " is still mapped after an earlier failure (" + why + ")",
             "");
  }
  held_.reserve(held_.size() + (end - first));  // undo() records failures without allocating
  if (pages_.size() < end) pages_.resize(end);
  std::size_t created = first;
  for (; created < end; ++created) {
    if (pages_[created]) break;  // stop at an already-mapped page (never happens by contract)
    PhysicalHandle handle = 0;
    const DeviceStatus st = backend_.create_physical(device_, page_, &handle);
    if (st != DeviceStatus::ok) {
      const std::string why = backend_.last_error();
      const std::string undo_failure = undo(first, created, first);
      if (st == DeviceStatus::out_of_memory) return 0;  // held pages stay counted
      fail("creating a " + format_size(page_) + " physical page", why, undo_failure);
    }
    pages_[created] = handle;
  }
  for (std::size_t i = first; i < created; ++i) {
    if (backend_.map(device_, page_address(i), page_, *pages_[i]) != DeviceStatus::ok) {
      const std::string why = backend_.last_error();
      fail("mapping a page of an expandable segment", why, undo(first, created, i));
    }
  }
  std::vector<int> devices{device_};
  devices.insert(devices.end(), peers_.begin(), peers_.end());
  if (!grant(first, created, devices)) {
    const std::string why = backend_.last_error();
    fail("granting access to an expandable segment", why, undo(first, created, created));
  }
  mapped_pages_ += created - first;
  reach_ = std::max(reach_, created * page_);
  return (created - first) * page_;
}

std::pair<std::uintptr_t, std::size_t> ExpandableSegment::inner_pages(std::uintptr_t address,
                                                                      std::size_t bytes) const {
  const std::size_t first = (address - base_ + page_ - 1) / page_;
  const std::size_t end = (address - base_ + bytes) / page_;
  if (first >= end) return {address, 0};
  return {base_ + first * page_, (end - first) * page_};
}

std::pair<std::uintptr_t, std::size_t> ExpandableSegment::unmap(std::uintptr_t address,
                                                                std::size_t bytes,
                                                                std::string* error) {
  auto [start, length] = inner_pages(address, bytes);
  if (length == 0) return {start, 0};
  const std::size_t first = (start - base_) / page_;
  const std::size_t end = first + length / page_;
  held_.reserve(held_.size() + (end - first));
  // One call for the run: on a GPU each driver call costs microseconds of host time.
  if (backend_.unmap(device_, page_address(first), length) != DeviceStatus::ok) {
    *error = "unmapping " + format_size(length) + " of an expandable segment on device " +
             std::to_string(device_) + ": " + backend_.last_error();
    return {start, 0};
  }
  std::string release_failure;
  for (std::size_t i = first; i < end; ++i) {
    const PhysicalHandle handle = *pages_[i];
    pages_[i].reset();
    --mapped_pages_;
    std::string why = give_back(i, handle, false);  // on failure the page is held
    if (release_failure.empty()) release_failure = std::move(why);
  }
  if (!release_failure.empty())
    *error = release_failure + " (device " + std::to_string(device_) +
             "; that memory stays reserved until empty_cache() gives it back)";
  return {start, length};
}

std::string ExpandableSegment::release_held() {
  std::vector<Held> retry;
  retry.swap(held_);
  held_.reserve(retry.size());  // give_back records failures without allocating
  std::string failure;
  for (const Held& h : retry) {
    std::string why = give_back(h.page, h.handle, h.mapped);
    if (failure.empty()) failure = std::move(why);
  }
  if (failure.empty()) return "";
  return "giving back " + format_size(held_bytes()) + " held by an expandable segment on device " +
         std::to_string(device_) + ": " + failure;
}

std::string ExpandableSegment::release() {
  RESERVOIR_ASSERT(mapped_pages_ == 0);
  std::string why = release_held();
  if (!why.empty() || released_) return why;
  if (backend_.release_address_range(device_, reinterpret_cast<void*>(base_), size_) !=
      DeviceStatus::ok)
    return "releasing the " + format_size(size_) +
           " address range of an expandable segment on device " + std::to_string(device_) + ": " +
           backend_.last_error();
  released_ = true;
  return "";
}

void ExpandableSegment::add_peer(int device) {
  // A peer has access to every mapped page (pages mapped later include it).
  if (std::find(peers_.begin(), peers_.end(), device) != peers_.end()) return;
  const std::vector<int> one{device};
  std::size_t run = 0;
  for (std::size_t i = 0; i <= pages_.size(); ++i) {
    const bool mapped = i < pages_.size() && pages_[i].has_value();
    if (mapped) continue;
    if (!grant(run, i, one))
      throw DeviceError("reservoir: granting device " + std::to_string(device) +
                        " access to an expandable segment on device " + std::to_string(device_) +
                        " failed: " + backend_.last_error());
    run = i + 1;
  }
  peers_.push_back(device);
}

std::size_t ExpandableSegment::sleep(bool offload) {
  std::vector<Asleep> runs;
  for (const auto& [first, count] : mapped_runs()) runs.push_back(Asleep{first, count, nullptr});
  auto free_copies = [&](std::size_t from) {
    for (std::size_t r = from; r < runs.size(); ++r) host_stash_.give(runs[r].host);
  };
  // Every copy first: a failure there changes nothing.
  if (offload)
    for (Asleep& r : runs) {
      const std::size_t bytes = r.pages * page_;
      std::string what;
      if (host_stash_.take(bytes, &r.host) != DeviceStatus::ok) {
        r.host = nullptr;
        what = "allocating " + format_size(bytes) + " of pinned host memory";
      } else if (backend_.copy_to_host(device_, r.host, page_address(r.first), bytes) !=
                 DeviceStatus::ok) {
        what = "copying " + format_size(bytes) + " at " + format_pointer(page_address(r.first)) +
               " to host memory";
      }
      if (!what.empty()) {
        const std::string why = backend_.last_error();
        free_copies(0);
        fail(what + " to put it to sleep", why, "");
      }
    }
  std::size_t slept = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    std::string error;
    const auto [start, length] =
        unmap(base_ + runs[r].first * page_, runs[r].pages * page_, &error);
    (void)start;
    if (length == 0) {
      free_copies(r);
      throw DeviceError("reservoir: putting an expandable segment to sleep failed: " + error);
    }
    asleep_.push_back(runs[r]);
    asleep_pages_ += runs[r].pages;
    if (runs[r].host) offloaded_pages_ += runs[r].pages;
    slept += length;
    // A page the device would not take back is held (counted reserved by the caller).
  }
  return slept;
}

void ExpandableSegment::drop_asleep(std::size_t i) {
  if (asleep_[i].host) {
    host_stash_.give(asleep_[i].host);  // kept for the next offload
    offloaded_pages_ -= asleep_[i].pages;
  }
  asleep_pages_ -= asleep_[i].pages;
  asleep_.erase(asleep_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::string ExpandableSegment::undo_wake(std::size_t runs) {
  std::string failure;
  for (std::size_t r = runs; r-- > 0;) {
    std::string error;
    const auto [start, length] =
        unmap(base_ + asleep_[r].first * page_, asleep_[r].pages * page_, &error);
    (void)start;
    if (length == 0) {
      // Still mapped: awake after all, with its contents if they were kept.
      if (asleep_[r].host)
        (void)backend_.copy_to_device(device_, page_address(asleep_[r].first), asleep_[r].host,
                                      asleep_[r].pages * page_);
      drop_asleep(r);
    }
    if (failure.empty()) failure = std::move(error);
  }
  return failure;
}

bool ExpandableSegment::wake(WakeCopies* restoring) {
  for (std::size_t r = 0; r < asleep_.size(); ++r) {
    std::size_t mapped = 0;
    try {
      mapped = map(reinterpret_cast<std::uintptr_t>(page_address(asleep_[r].first)),
                   asleep_[r].pages * page_);
    } catch (const DeviceError& e) {
      const std::string undo_failure = undo_wake(r);
      if (undo_failure.empty()) throw;
      throw DeviceError(std::string(e.what()) + "; undoing the wake failed too (" + undo_failure +
                        ")");
    }
    if (mapped == 0) {  // out of memory: what this wake mapped goes back
      const std::string undo_failure = undo_wake(r);
      if (!undo_failure.empty())
        throw DeviceError("reservoir: waking an expandable segment on device " +
                          std::to_string(device_) + " ran out of memory, and undoing it failed (" +
                          undo_failure + ")");
      return false;
    }
  }
  for (std::size_t r = 0; r < asleep_.size(); ++r) {
    if (!asleep_[r].host) continue;
    const std::size_t bytes = asleep_[r].pages * page_;
    void* at = page_address(asleep_[r].first);
    const DeviceStatus st =
        restoring
            ? backend_.copy_to_device_async(device_, at, asleep_[r].host, bytes, restoring->stream)
            : backend_.copy_to_device(device_, at, asleep_[r].host, bytes);
    if (st != DeviceStatus::ok) {
      const std::string why = backend_.last_error();
      // Copies enqueued before still write pages the undo unmaps.
      if (restoring) (void)backend_.synchronize_stream(device_, restoring->stream);
      fail("copying " + format_size(bytes) + " back to " + format_pointer(at) + " to wake it", why,
           undo_wake(asleep_.size()));
    }
  }
  if (restoring)  // the enqueued copies still read them: the caller frees them later
    for (Asleep& a : asleep_)
      if (a.host) {
        restoring->host.push_back(a.host);
        restoring->bytes += a.pages * page_;
        offloaded_pages_ -= a.pages;
        a.host = nullptr;
      }
  while (!asleep_.empty()) drop_asleep(asleep_.size() - 1);
  return true;
}

std::vector<PhysicalHandle> ExpandableSegment::handles(std::uintptr_t address, std::size_t bytes,
                                                       std::uintptr_t* first) const {
  const std::size_t begin = (address - base_) / page_;
  const std::size_t end = (address + bytes - base_ + page_ - 1) / page_;
  std::vector<PhysicalHandle> out;
  for (std::size_t i = begin; i < end && i < pages_.size(); ++i) {
    RESERVOIR_CHECK(pages_[i].has_value(), "an allocated block lies on an unmapped page");
    out.push_back(*pages_[i]);
  }
  *first = base_ + begin * page_;
  return out;
}

}  // namespace reservoir::detail
