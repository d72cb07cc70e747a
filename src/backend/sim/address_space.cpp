// Address-space bookkeeping for SimBackend: see address_space.hpp.
#include "backend/sim/address_space.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

// Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on the chain
// of temporaries "[" + hex(...) + ... once more of this file is inlined.
std::string range(std::uintptr_t p, std::size_t size) {
  std::string out = "[";
  out += hex(p);
  out += ", ";
  out += hex(p + size);
  out += ")";
  return out;
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
  if (fd_ >= 0) close(fd_);
  raw_ = nullptr;
  raw_size_ = begin_ = size_ = 0;
  fd_ = -1;
}

int make_memfd(std::size_t size) {
  const int fd = memfd_create("reservoir-sim", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool HostMapping::map(std::size_t size, std::size_t alignment, int prot, bool shared) {
  reset();
  alignment = std::max(alignment, page_size());
  // Over-map by the alignment so that an aligned start always fits inside.
  const std::size_t raw_size = align_up(size, page_size()) + alignment;
  void* raw = mmap(nullptr, raw_size, shared ? PROT_NONE : prot,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return false;
  raw_ = raw;
  raw_size_ = raw_size;
  begin_ = align_up(reinterpret_cast<std::uintptr_t>(raw), alignment);
  size_ = size;
  if (shared) {
    // The usable part becomes a view of a memfd, which other processes can map.
    fd_ = make_memfd(align_up(size, page_size()));
    if (fd_ < 0 || mmap(reinterpret_cast<void*>(begin_), align_up(size, page_size()), prot,
                        MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd_, 0) == MAP_FAILED) {
      reset();
      return false;
    }
  }
  return true;
}

void host_discard(std::uintptr_t start, std::size_t size, bool shared) {
  const std::size_t page = page_size();
  const std::uintptr_t lo = align_up(start, page);
  const std::uintptr_t hi = (start + size) & ~(static_cast<std::uintptr_t>(page) - 1);
  if (lo < hi) madvise(reinterpret_cast<void*>(lo), hi - lo, shared ? MADV_REMOVE : MADV_DONTNEED);
}

bool host_protect(std::uintptr_t start, std::size_t size, int prot) {
  return mprotect(reinterpret_cast<void*>(start), size, prot) == 0;
}

// ---- VirtualSpace --------------------------------------------------------------

VirtualSpace::VirtualSpace(bool host_backed, bool shared, std::size_t granularity, Placer placer)
    : host_backed_(host_backed),
      shared_(host_backed && shared),
      granularity_(granularity),
      placer_(std::move(placer)) {}
VirtualSpace::~VirtualSpace() {
  for (auto& [handle, physical] : physical_)
    if (physical.fd >= 0) close(physical.fd);
}

std::size_t VirtualSpace::erase(std::unordered_map<PhysicalHandle, Physical>::iterator it) {
  const std::size_t freed = it->second.imported ? 0 : it->second.size;
  if (it->second.fd >= 0) close(it->second.fd);
  physical_.erase(it);
  return freed;
}

std::string VirtualSpace::reserve(int device, std::size_t size, std::size_t alignment, void** ptr,
                                  bool* no_room) {
  *no_room = false;
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
      *no_room = errno == ENOMEM;
      return "sim: reserve_address_range: mmap of " + std::to_string(size) +
             " bytes failed: " + std::strerror(errno);
    }
    start = reservation.host.begin();
  } else {
    start = placer_.place(device, size, alignment);
    if (start == 0) {
      *no_room = true;
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
  Physical physical{device, size, 0, false, false, -1};
  if (shared_ && (physical.fd = make_memfd(size)) < 0) return 0;
  const PhysicalHandle handle = next_handle_++;
  physical_.emplace(handle, physical);
  return handle;
}

std::string VirtualSpace::export_fd(int device, PhysicalHandle handle, int* fd) {
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.released) {
    return "sim: export_shareable: unknown physical handle " + std::to_string(handle) +
           " (never created or already released)";
  }
  Physical& physical = it->second;
  if (physical.device != device) {
    return "sim: export_shareable: physical handle " + std::to_string(handle) + " belongs to " +
           dev(physical.device) + ", not " + dev(device);
  }
  if (physical.fd < 0 && (physical.fd = make_memfd(physical.size)) < 0) {
    return std::string("sim: export_shareable: memfd_create failed: ") + std::strerror(errno);
  }
  *fd = fcntl(physical.fd, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) return std::string("sim: export_shareable: dup failed: ") + std::strerror(errno);
  return "";
}

std::string VirtualSpace::import_fd(int device, int fd, PhysicalHandle* handle, std::size_t* size) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) {
    return "sim: import_shareable: " + std::to_string(fd) + " is not an open file descriptor";
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0 || bytes % granularity_ != 0) {
    return "sim: import_shareable: descriptor " + std::to_string(fd) + " holds " +
           std::to_string(bytes) + " bytes, not a multiple of the granularity " +
           std::to_string(granularity_) + " (not exported physical memory)";
  }
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return std::string("sim: import_shareable: dup failed: ") + std::strerror(errno);
  *handle = next_handle_++;
  *size = bytes;
  physical_.emplace(*handle, Physical{device, bytes, 0, false, true, own});
  return "";
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
    *freed = erase(it);
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
  if (host_backed_ && physical.fd >= 0) {
    // Shared memory: the pages are the memfd's, wherever (and in whichever process)
    // it is mapped.
    if (mmap(ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, physical.fd, 0) ==
        MAP_FAILED) {
      return "sim: map: mmap of " + range(p, size) + " failed: " + std::strerror(errno);
    }
  } else if (host_backed_ && !host_protect(p, size, PROT_READ | PROT_WRITE)) {
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
    if (host_backed_ && ph->second.fd >= 0) {
      // Back to the reservation's PROT_NONE pages; the memfd keeps the contents. Should
      // this fail, the old pages stay readable: nothing the books depend on.
      (void)mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    } else if (host_backed_) {
      // Contents need not survive an unmap; drop them so the pages go back to the host.
      host_discard(it->first, it->second.size);
      host_protect(it->first, it->second.size, PROT_NONE);
    }
    if (--ph->second.mappings == 0 && ph->second.released) *freed += erase(ph);
  }
  mappings_.erase(first, last);
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

std::string VirtualSpace::reach(int device, std::uintptr_t p, std::size_t size) const {
  auto it = mappings_.upper_bound(p);
  if (it == mappings_.begin() || std::prev(it)->first + std::prev(it)->second.size <= p) {
    return "none";
  }
  if (std::string problem = check_covered("access", p, size, false); !problem.empty()) {
    return problem;
  }
  for (it = std::prev(it); it != mappings_.end() && it->first < p + size; ++it) {
    const std::vector<int>& a = it->second.access;
    if (!std::binary_search(a.begin(), a.end(), device)) {
      return "the mapping at " + hex(it->first) + " does not grant " + dev(device) +
             " access (set_access)";
    }
  }
  return "";
}

std::vector<int> VirtualSpace::access(void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = mappings_.upper_bound(p);
  if (it == mappings_.begin()) return {};
  --it;
  return p - it->first < it->second.size ? it->second.access : std::vector<int>{};
}

}  // namespace reservoir::sim
