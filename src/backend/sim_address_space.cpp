// Address-space bookkeeping for SimBackend: see sim_address_space.hpp.
#include "backend/sim_address_space.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

namespace reservoir::sim {

namespace {

std::uintptr_t align_up(std::uintptr_t value, std::size_t alignment) {
  return (value + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1);
}

std::size_t page_size() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::string range(std::uintptr_t p, std::size_t size) {
  return "[" + hex(p) + ", " + hex(p + size) + ")";
}

std::string dev(int device) {
  return "device " + std::to_string(device);
}

}  // namespace

std::string hex(std::uintptr_t value) {
  char buffer[2 + 2 * sizeof(value) + 1];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

// ---- Host mappings -------------------------------------------------------------

HostMapping::~HostMapping() {
  reset();
}

HostMapping::HostMapping(HostMapping&& other) noexcept
    : raw_(std::exchange(other.raw_, nullptr)),
      raw_size_(std::exchange(other.raw_size_, 0)),
      begin_(std::exchange(other.begin_, 0)),
      size_(std::exchange(other.size_, 0)) {}

HostMapping& HostMapping::operator=(HostMapping&& other) noexcept {
  if (this != &other) {
    reset();
    raw_ = std::exchange(other.raw_, nullptr);
    raw_size_ = std::exchange(other.raw_size_, 0);
    begin_ = std::exchange(other.begin_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void HostMapping::reset() noexcept {
  if (raw_ != nullptr) munmap(raw_, raw_size_);
  raw_ = nullptr;
  raw_size_ = begin_ = size_ = 0;
}

bool HostMapping::map(std::size_t size, std::size_t alignment, int prot) {
  reset();
  alignment = std::max(alignment, page_size());
  // Over-map by the alignment so that an aligned start always fits inside.
  const std::size_t raw_size = align_up(size, page_size()) + alignment;
  void* raw = mmap(nullptr, raw_size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return false;
  raw_ = raw;
  raw_size_ = raw_size;
  begin_ = align_up(reinterpret_cast<std::uintptr_t>(raw), alignment);
  size_ = size;
  return true;
}

void host_discard(std::uintptr_t start, std::size_t size) {
  const std::size_t page = page_size();
  const std::uintptr_t lo = align_up(start, page);
  const std::uintptr_t hi = (start + size) & ~(static_cast<std::uintptr_t>(page) - 1);
  if (lo < hi) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

bool host_protect(std::uintptr_t start, std::size_t size, int prot) {
  return mprotect(reinterpret_cast<void*>(start), size, prot) == 0;
}

// ---- VirtualSpace --------------------------------------------------------------

VirtualSpace::VirtualSpace(bool host_backed, std::size_t granularity, Placer placer)
    : host_backed_(host_backed), granularity_(granularity), placer_(std::move(placer)) {}

std::string VirtualSpace::reserve(int device, std::size_t size, std::size_t alignment, void** ptr) {
  const std::string g = std::to_string(granularity_);
  if (size == 0 || size % granularity_ != 0) {
    return "sim: reserve_address_range: size " + std::to_string(size) +
           " is not a positive multiple of the granularity " + g;
  }
  if (alignment % granularity_ != 0 || (alignment & (alignment - 1)) != 0) {
    return "sim: reserve_address_range: alignment " + std::to_string(alignment) +
           " is not a power-of-two multiple of the granularity " + g;
  }
  alignment = std::max(alignment, granularity_);
  Reservation reservation{device, size, {}};
  std::uintptr_t start = 0;
  if (host_backed_) {
    if (!reservation.host.map(size, alignment, PROT_NONE)) {
      return "sim: reserve_address_range: mmap of " + std::to_string(size) +
             " bytes failed: " + std::strerror(errno);
    }
    start = reservation.host.begin();
  } else {
    start = placer_.place(device, size, alignment);
    if (start == 0) {
      return "sim: reserve_address_range: " + dev(device) + " has no free address range of " +
             std::to_string(size) + " bytes";
    }
  }
  reservations_.emplace(start, std::move(reservation));
  *ptr = reinterpret_cast<void*>(start);
  return "";
}

std::string VirtualSpace::release(int device, void* ptr, std::size_t size) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = reservations_.find(p);
  if (it == reservations_.end() || it->second.device != device) {
    return "sim: release_address_range: " + hex(p) + " is not the start of a reservation of " +
           dev(device);
  }
  if (it->second.size != size) {
    return "sim: release_address_range: size " + std::to_string(size) +
           " differs from the reservation at " + hex(p) + " (" + std::to_string(it->second.size) +
           " bytes)";
  }
  auto mapped = mappings_.lower_bound(p);
  if (mapped != mappings_.end() && mapped->first < p + size) {
    return "sim: release_address_range: " + range(p, size) + " still has a mapping at " +
           hex(mapped->first);
  }
  if (!host_backed_) placer_.unplace(device, p);
  reservations_.erase(it);  // a host-backed one is munmapped here
  return "";
}

PhysicalHandle VirtualSpace::create(int device, std::size_t size) {
  const PhysicalHandle handle = next_handle_++;
  physical_.emplace(handle, Physical{device, size, 0, false});
  return handle;
}

std::string VirtualSpace::release_physical(int device, PhysicalHandle handle, std::size_t* freed) {
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.released) {
    return "sim: release_physical: unknown physical handle " + std::to_string(handle) +
           " (never created or already released)";
  }
  if (it->second.device != device) {
    return "sim: release_physical: physical handle " + std::to_string(handle) + " belongs to " +
           dev(it->second.device) + ", not " + dev(device);
  }
  *freed = 0;
  if (it->second.mappings == 0) {
    *freed = it->second.size;
    physical_.erase(it);
  } else {
    it->second.released = true;  // freed by the unmap of its last mapping
  }
  return "";
}

const VirtualSpace::Reservation* VirtualSpace::reservation_of(int device, std::uintptr_t p,
                                                              std::size_t size) const {
  auto it = reservations_.upper_bound(p);
  if (it == reservations_.begin()) return nullptr;
  --it;  // the last reservation starting at or before p
  const Reservation& r = it->second;
  if (r.device != device || p - it->first > r.size || size > r.size - (p - it->first)) {
    return nullptr;
  }
  return &r;
}

std::string VirtualSpace::map(int device, void* ptr, std::size_t size, PhysicalHandle handle) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto ph = physical_.find(handle);
  if (ph == physical_.end() || ph->second.released) {
    return "sim: map: unknown physical handle " + std::to_string(handle) +
           " (never created or already released)";
  }
  Physical& physical = ph->second;
  if (physical.device != device) {
    return "sim: map: physical handle " + std::to_string(handle) + " belongs to " +
           dev(physical.device) + ", not " + dev(device);
  }
  if (size != physical.size) {
    return "sim: map: size " + std::to_string(size) + " differs from physical handle " +
           std::to_string(handle) + " (" + std::to_string(physical.size) + " bytes)";
  }
  if (p % granularity_ != 0) {
    return "sim: map: " + hex(p) + " is not a multiple of the granularity " +
           std::to_string(granularity_);
  }
  if (reservation_of(device, p, size) == nullptr) {
    return "sim: map: " + range(p, size) + " is not inside a reservation of " + dev(device);
  }
  auto next = mappings_.lower_bound(p);
  if (next != mappings_.end() && next->first < p + size) {
    return "sim: map: " + range(p, size) + " overlaps the mapping at " + hex(next->first);
  }
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > p) {
      return "sim: map: " + range(p, size) + " overlaps the mapping at " + hex(prev->first);
    }
  }
  if (host_backed_ && !host_protect(p, size, PROT_READ | PROT_WRITE)) {
    return "sim: map: mprotect of " + range(p, size) + " failed: " + std::strerror(errno);
  }
  mappings_.emplace(p, Mapping{size, handle, {}});
  ++physical.mappings;
  return "";
}

std::string VirtualSpace::check_covered(const char* op, std::uintptr_t p, std::size_t size,
                                        bool exact) const {
  const std::string what = std::string("sim: ") + op + ": " + range(p, size);
  auto it = mappings_.upper_bound(p);
  if (it == mappings_.begin() || std::prev(it)->first + std::prev(it)->second.size <= p) {
    return what + " is not mapped (nothing mapped at " + hex(p) + ")";
  }
  --it;
  if (exact && it->first != p) {
    return what + " starts inside the mapping at " + hex(it->first) + ", not at its start";
  }
  std::uintptr_t end = it->first + it->second.size;  // covered so far: [p, end)
  while (end < p + size) {
    ++it;
    if (it == mappings_.end() || it->first != end) {
      return what + " is not mapped from " + hex(end);
    }
    end += it->second.size;
  }
  if (exact && end != p + size) {
    return what + " ends inside the mapping at " + hex(it->first);
  }
  return "";
}

std::string VirtualSpace::unmap(int device, void* ptr, std::size_t size, std::size_t* freed) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (std::string problem = check_covered("unmap", p, size, true); !problem.empty()) {
    return problem;
  }
  const auto first = mappings_.find(p);
  const auto last = mappings_.lower_bound(p + size);
  for (auto it = first; it != last; ++it) {
    const int owner = physical_.at(it->second.handle).device;
    if (owner != device) {
      return "sim: unmap: the mapping at " + hex(it->first) + " belongs to " + dev(owner) +
             ", not " + dev(device);
    }
  }
  *freed = 0;
  for (auto it = first; it != last; ++it) {
    auto ph = physical_.find(it->second.handle);
    if (--ph->second.mappings == 0 && ph->second.released) {
      *freed += ph->second.size;
      physical_.erase(ph);
    }
  }
  mappings_.erase(first, last);
  if (host_backed_) {
    // Contents need not survive an unmap; drop them so the pages go back to the host.
    host_discard(p, size);
    host_protect(p, size, PROT_NONE);
  }
  return "";
}

std::string VirtualSpace::set_access(int device, void* ptr, std::size_t size, const int* devices,
                                     int count, int device_count) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  if (devices == nullptr || count <= 0) return "sim: set_access: no device given";
  for (int i = 0; i < count; ++i) {
    if (devices[i] < 0 || devices[i] >= device_count) {
      return "sim: set_access: device " + std::to_string(devices[i]) +
             " does not exist (device_count " + std::to_string(device_count) + ")";
    }
  }
  if (std::string problem = check_covered("set_access", p, size, false); !problem.empty()) {
    return problem;
  }
  auto it = std::prev(mappings_.upper_bound(p));
  for (; it != mappings_.end() && it->first < p + size; ++it) {
    const int owner = physical_.at(it->second.handle).device;
    if (owner != device) {
      return "sim: set_access: the mapping at " + hex(it->first) + " belongs to " + dev(owner) +
             ", not " + dev(device);
    }
  }
  for (it = std::prev(mappings_.upper_bound(p)); it != mappings_.end() && it->first < p + size;
       ++it) {
    std::vector<int>& access = it->second.access;
    access.insert(access.end(), devices, devices + count);
    std::sort(access.begin(), access.end());
    access.erase(std::unique(access.begin(), access.end()), access.end());
  }
  return "";
}

std::size_t VirtualSpace::reservations(int device) const {
  return static_cast<std::size_t>(
      std::count_if(reservations_.begin(), reservations_.end(),
                    [device](const auto& entry) { return entry.second.device == device; }));
}

std::vector<int> VirtualSpace::access(void* ptr) const {
  auto it = mappings_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == mappings_.end() ? std::vector<int>{} : it->second.access;
}

}  // namespace reservoir::sim
