// The receiving side's cache of IPC mappings: see ipc_imports.hpp.
#include "engine/ipc/ipc_imports.hpp"

#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
[[noreturn]] void device_error(const std::string& what, Backend& backend, int device) {
  throw DeviceError("reservoir: " + what + " on device " + std::to_string(device) +
                    " failed: " + backend.last_error());
}
}  // namespace

IpcImports::~IpcImports() {
  for (auto& [base, e] : entries_) (void)unmap(e);
}

const IpcImports::Entry* IpcImports::holding(std::uintptr_t address) const {
  auto it = entries_.upper_bound(address);
  if (it == entries_.begin()) return nullptr;
  --it;
  return address - it->first < it->second.size ? &it->second : nullptr;
}

void* IpcImports::reopen(const std::string& key, const ShareRecord& r) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  Entry& e = entries_.at(it->second);
  ++e.opens;
  return reinterpret_cast<void*>(e.base + r.offset);
}

void* IpcImports::remember(Entry e, const ShareRecord& r) {
  const std::uintptr_t base = e.base;
  e.opens = 1;
  by_key_.emplace(e.key, base);
  entries_.emplace(base, std::move(e));
  return reinterpret_cast<void*>(base + r.offset);
}

IpcImports::Entry IpcImports::map_segment(const ShareRecord& r, int device) {
  void* base = nullptr;
  if (backend_.open_ipc(device, r.ipc, &base) != DeviceStatus::ok)
    device_error("opening the shared segment (cudaIpcOpenMemHandle)", backend_, device);
  Entry e;
  e.kind = ShareRecord::segment;
  e.device = device;
  e.base = reinterpret_cast<std::uintptr_t>(base);
  e.size = r.segment_size;
  return e;
}

IpcImports::Entry IpcImports::map_pages(const ShareRecord& r, const std::vector<int>& fds,
                                        int device, const std::vector<int>& peers) {
  Entry e;
  e.kind = ShareRecord::expandable;
  e.device = device;
  e.page_size = r.page_size;
  e.size = r.page_ids.size() * r.page_size;
  std::size_t granularity = 0;
  if (backend_.granularity(device, &granularity) != DeviceStatus::ok)
    device_error("reading the mapping granularity", backend_, device);
  if (granularity == 0 || r.page_size % granularity != 0)
    throw InvalidArgumentError("reservoir: the shared pages (" + format_size(r.page_size) +
                               " each) are not a multiple of device " + std::to_string(device) +
                               "'s mapping granularity (" + format_size(granularity) + ")");
  void* base = nullptr;
  if (backend_.reserve_address_range(device, e.size, granularity, &base) != DeviceStatus::ok)
    device_error("reserving " + format_size(e.size) + " of address space for shared pages",
                 backend_, device);
  e.base = reinterpret_cast<std::uintptr_t>(base);
  std::size_t mapped = 0;
  try {
    for (std::size_t i = 0; i < r.page_ids.size(); ++i) {
      ShareableHandle shared;
      if (r.fds) {
        shared.kind = ShareableHandle::posix_fd;
        shared.fd = fds[i];
      } else {
        shared.kind = ShareableHandle::fabric;
        std::copy(r.fabric_handles[i].begin(), r.fabric_handles[i].end(), shared.fabric_bytes);
      }
      PhysicalHandle h = 0;
      if (backend_.import_shareable(device, shared, &h) != DeviceStatus::ok)
        device_error("importing shared page " + std::to_string(i), backend_, device);
      e.handles.push_back(h);
      void* at = reinterpret_cast<void*>(e.base + i * r.page_size);
      if (backend_.map(device, at, r.page_size, h) != DeviceStatus::ok)
        device_error("mapping shared page " + std::to_string(i), backend_, device);
      ++mapped;
    }
    std::vector<int> access{device};
    for (int p : peers)
      if (p != device) access.push_back(p);
    if (backend_.set_access(device, base, e.size, access.data(), static_cast<int>(access.size())) !=
        DeviceStatus::ok)
      device_error("granting access to the shared pages", backend_, device);
  } catch (...) {
    // Undo what was made; what the device refuses to undo is lost to this process.
    for (std::size_t i = 0; i < mapped; ++i)
      (void)backend_.unmap(device, reinterpret_cast<void*>(e.base + i * r.page_size), r.page_size);
    for (PhysicalHandle h : e.handles) (void)backend_.release_physical(device, h);
    (void)backend_.release_address_range(device, base, e.size);
    throw;
  }
  return e;
}

void* IpcImports::open(const ShareRecord& r, const std::vector<int>& fds, int device,
                       const std::vector<int>& peers) {
  const std::string key = r.key();
  std::lock_guard<std::mutex> guard(mutex_);
  if (void* p = reopen(key, r)) return p;
  if (r.kind == ShareRecord::expandable && r.fds && fds.size() != r.page_ids.size())
    throw InvalidArgumentError("reservoir: the shared-memory handle names " +
                               std::to_string(r.page_ids.size()) + " pages but came with " +
                               std::to_string(fds.size()) +
                               " file descriptors: send it with send_shared (SCM_RIGHTS)");
  Entry e =
      r.kind == ShareRecord::segment ? map_segment(r, device) : map_pages(r, fds, device, peers);
  e.key = key;
  return remember(std::move(e), r);
}

void* IpcImports::open_self(const ShareRecord& r) {
  const std::string key = r.key();
  std::lock_guard<std::mutex> guard(mutex_);
  if (void* p = reopen(key, r)) return p;
  Entry e;
  e.key = key;
  e.kind = r.kind;
  e.self = true;
  e.device = r.device;
  e.base = r.block - r.offset;  // the shared range as the sender has it
  e.size = r.kind == ShareRecord::segment ? r.segment_size : r.page_ids.size() * r.page_size;
  return remember(std::move(e), r);
}

std::string IpcImports::unmap(Entry& e) {
  if (e.self) return "";
  if (e.kind == ShareRecord::segment) {
    return backend_.close_ipc(e.device, reinterpret_cast<void*>(e.base)) == DeviceStatus::ok
               ? ""
               : backend_.last_error();
  }
  std::string problem;
  for (std::size_t i = 0; i < e.handles.size(); ++i)
    if (backend_.unmap(e.device, reinterpret_cast<void*>(e.base + i * e.page_size), e.page_size) !=
            DeviceStatus::ok &&
        problem.empty())
      problem = backend_.last_error();
  for (PhysicalHandle h : e.handles)
    if (backend_.release_physical(e.device, h) != DeviceStatus::ok && problem.empty())
      problem = backend_.last_error();
  if (problem.empty() && backend_.release_address_range(e.device, reinterpret_cast<void*>(e.base),
                                                        e.size) != DeviceStatus::ok)
    problem = backend_.last_error();
  e.handles.clear();
  return problem;
}

bool IpcImports::close(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Entry* found = holding(reinterpret_cast<std::uintptr_t>(ptr));
  if (!found) return false;
  Entry& e = entries_.at(found->base);
  if (--e.opens > 0) return true;
  const std::string problem = unmap(e);
  by_key_.erase(e.key);
  const int device = e.device;
  entries_.erase(e.base);
  if (!problem.empty())
    throw DeviceError("reservoir: unmapping shared memory at " + format_pointer(ptr) +
                      " on device " + std::to_string(device) + " failed: " + problem);
  return true;
}

void IpcImports::add_peer(int device, int peer) {
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& [base, e] : entries_) {
    if (e.self || e.device != device || e.kind != ShareRecord::expandable) continue;
    if (backend_.set_access(device, reinterpret_cast<void*>(base), e.size, &peer, 1) !=
        DeviceStatus::ok)
      device_error("granting device " + std::to_string(peer) + " access to shared pages", backend_,
                   device);
  }
}

std::size_t IpcImports::mappings() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::size_t n = 0;
  for (const auto& [base, e] : entries_) n += e.self ? 0 : 1;
  return n;
}

std::size_t IpcImports::opens(void* ptr) const {
  std::lock_guard<std::mutex> guard(mutex_);
  const Entry* e = holding(reinterpret_cast<std::uintptr_t>(ptr));
  return e ? e->opens : 0;
}

}  // namespace reservoir::detail
