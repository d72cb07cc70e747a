#include "engine/expandable_segment.hpp"

#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
[[noreturn]] void device_error(Backend& backend, const std::string& what) {
  throw DeviceError("reservoir: " + what + " failed: " + backend.last_error());
}
}  // namespace

ExpandableSegment::ExpandableSegment(Backend& backend, int device, std::size_t page_size,
                                     std::size_t reserve_bytes, std::vector<int> peers)
    : backend_(backend), device_(device), page_(page_size), peers_(std::move(peers)) {
  std::size_t pages = (reserve_bytes + page_ - 1) / page_;
  if (pages == 0) pages = 1;
  size_ = pages * page_;
  void* ptr = nullptr;
  if (backend_.reserve_address_range(device_, size_, page_ <= (2u << 20) ? page_ : (2u << 20),
                                     &ptr) != DeviceStatus::ok)
    device_error(backend_, "reserving " + format_size(size_) +
                               " of address space for an expandable segment on device " +
                               std::to_string(device_) +
                               " (lower it with expandable_segments_reserve)");
  base_ = reinterpret_cast<std::uintptr_t>(ptr);
  pages_.resize(pages);
}

ExpandableSegment::~ExpandableSegment() {
  for (std::size_t i = 0; i < pages_.size(); ++i) {
    if (!pages_[i]) continue;
    (void)backend_.unmap(device_, reinterpret_cast<void*>(base_ + i * page_), page_);
    (void)backend_.release_physical(device_, *pages_[i]);
  }
  (void)backend_.release_address_range(device_, reinterpret_cast<void*>(base_), size_);
}

std::size_t ExpandableSegment::map(std::uintptr_t address, std::size_t bytes) {
  const std::size_t first = (address - base_) / page_;
  const std::size_t end = (address - base_ + bytes + page_ - 1) / page_;
  std::size_t created = first;
  for (; created < end; ++created) {
    if (pages_[created]) break;  // stop at an already-mapped page (never happens by contract)
    PhysicalHandle handle = 0;
    DeviceStatus st = backend_.create_physical(device_, page_, &handle);
    if (st != DeviceStatus::ok) {
      // Undo this call's pages: a failed map leaves nothing behind.
      for (std::size_t i = first; i < created; ++i) {
        (void)backend_.release_physical(device_, *pages_[i]);
        pages_[i].reset();
      }
      if (st == DeviceStatus::out_of_memory) return 0;
      device_error(backend_, "creating a " + format_size(page_) + " physical page on device " +
                                 std::to_string(device_));
    }
    pages_[created] = handle;
  }
  for (std::size_t i = first; i < created; ++i) {
    if (backend_.map(device_, reinterpret_cast<void*>(base_ + i * page_), page_, *pages_[i]) !=
        DeviceStatus::ok) {
      std::string why = backend_.last_error();
      for (std::size_t j = first; j < i; ++j)
        (void)backend_.unmap(device_, reinterpret_cast<void*>(base_ + j * page_), page_);
      for (std::size_t j = first; j < created; ++j) {
        (void)backend_.release_physical(device_, *pages_[j]);
        pages_[j].reset();
      }
      throw DeviceError("reservoir: mapping a page of an expandable segment on device " +
                        std::to_string(device_) + " failed: " + why);
    }
  }
  try {
    set_access(first, created);
  } catch (...) {
    // Nothing stays mapped from a failed call.
    for (std::size_t i = first; i < created; ++i) {
      (void)backend_.unmap(device_, reinterpret_cast<void*>(base_ + i * page_), page_);
      (void)backend_.release_physical(device_, *pages_[i]);
      pages_[i].reset();
    }
    throw;
  }
  mapped_pages_ += created - first;
  return (created - first) * page_;
}

void ExpandableSegment::set_access(std::size_t first_page, std::size_t end_page) {
  if (first_page >= end_page) return;
  std::vector<int> devices{device_};
  devices.insert(devices.end(), peers_.begin(), peers_.end());
  if (backend_.set_access(device_, reinterpret_cast<void*>(base_ + first_page * page_),
                          (end_page - first_page) * page_, devices.data(),
                          static_cast<int>(devices.size())) != DeviceStatus::ok)
    device_error(backend_,
                 "granting access to an expandable segment on device " + std::to_string(device_));
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
  for (std::size_t i = first; i < end; ++i) {
    if (backend_.unmap(device_, reinterpret_cast<void*>(base_ + i * page_), page_) !=
        DeviceStatus::ok) {
      *error = "unmapping a page of an expandable segment on device " + std::to_string(device_) +
               ": " + backend_.last_error();
      return {start, (i - first) * page_};
    }
    (void)backend_.release_physical(device_, *pages_[i]);
    pages_[i].reset();
    --mapped_pages_;
  }
  return {start, length};
}

void ExpandableSegment::add_peer(int device) {
  peers_.push_back(device);
  std::size_t run = 0;
  for (std::size_t i = 0; i <= pages_.size(); ++i) {
    bool mapped = i < pages_.size() && pages_[i].has_value();
    if (mapped) continue;
    if (run < i) {
      std::vector<int> one{device};
      if (backend_.set_access(device_, reinterpret_cast<void*>(base_ + run * page_),
                              (i - run) * page_, one.data(), 1) != DeviceStatus::ok)
        device_error(backend_, "granting peer access to an expandable segment");
    }
    run = i + 1;
  }
}

}  // namespace reservoir::detail
