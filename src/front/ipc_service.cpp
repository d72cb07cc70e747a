// Sharing blocks with other processes: see ipc_service.hpp.
#include "front/ipc_service.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::atomic<std::uint64_t> g_next_id{1};

// Closes descriptors exported so far when a share fails part way.
struct FdGuard {
  std::vector<int> fds;
  ~FdGuard() {
    for (int fd : fds) ::close(fd);
  }
};
}  // namespace

IpcService::IpcService(Backend& backend, CachingAllocator& core)
    : backend_(backend),
      core_(core),
      id_(g_next_id.fetch_add(1)),
      imports_(backend),
      peers_(static_cast<std::size_t>(std::max(core.device_count(), 1))) {}

SharedHandle IpcService::share(void* ptr, bool keep) {
  const SharedBlock b = core_.share(ptr);  // InvalidPointerError
  ShareRecord r;
  r.device = b.device;
  r.pid = static_cast<std::uint32_t>(getpid());
  r.allocator_id = id_;
  r.block = b.block;
  r.block_size = b.block_size;
  FdGuard exported;
  auto device_error = [&](const std::string& what) {
    throw DeviceError("reservoir: sharing " + format_pointer(ptr) + ": " + what +
                      " failed: " + backend_.last_error());
  };
  if (!b.expandable) {
    if (!backend_.has(kIpc))
      throw InvalidArgumentError(std::string("reservoir: cannot share ") + format_pointer(ptr) +
                                 ": the " + backend_.name() + " backend offers no IPC");
    r.kind = ShareRecord::segment;
    r.segment_size = b.segment_size;
    r.offset = b.block - b.segment;
    if (backend_.export_ipc(b.device, reinterpret_cast<void*>(b.segment), &r.ipc) !=
        DeviceStatus::ok)
      device_error("exporting its segment (cudaIpcGetMemHandle)");
  } else {
    const bool fds = backend_.has(kShareablePosixFd), fabric = backend_.has(kShareableFabric);
    if (!fds && !fabric)
      throw InvalidArgumentError(
          std::string("reservoir: cannot share ") + format_pointer(ptr) +
          ": it lies in an expandable segment, and the " + backend_.name() +
          " backend cannot export physical memory (no POSIX descriptors or fabric handles); "
          "allocate it with expandable_segments:False");
    r.kind = ShareRecord::expandable;
    r.page_size = b.page_size;
    r.offset = b.block - b.first_page;
    r.fds = fds;
    for (std::size_t i = 0; i < b.pages.size(); ++i) {
      r.page_ids.push_back(b.pages[i]);
      if (fds) {
        ShareableHandle h;
        if (backend_.export_shareable(b.device, b.pages[i], ShareableHandle::posix_fd, &h) !=
            DeviceStatus::ok)
          device_error("exporting page " + std::to_string(i) + " as a file descriptor");
        exported.fds.push_back(h.fd);
      }
      if (fabric) {
        // Where the system refuses fabric handles (no IMEX channel), descriptors suffice.
        ShareableHandle h;
        if (backend_.export_shareable(b.device, b.pages[i], ShareableHandle::fabric, &h) ==
            DeviceStatus::ok) {
          r.fabric_handles.emplace_back();
          std::copy(h.fabric_bytes, h.fabric_bytes + 64, r.fabric_handles.back().begin());
        } else if (!fds) {
          device_error("exporting page " + std::to_string(i) + " as a fabric handle");
        }
      }
    }
    r.fabric = fabric && r.fabric_handles.size() == r.page_ids.size();
    if (!r.fabric) r.fabric_handles.clear();
  }
  if (keep) {
    std::lock_guard<std::mutex> guard(mutex_);
    kept_.insert(b.block);
    holding_.store(true, std::memory_order_release);
  }
  std::vector<int> fds;
  fds.swap(exported.fds);
  return SharedHandle(encode(r), std::move(fds));
}

void* IpcService::open(const SharedHandle& handle, int device) {
  const ShareRecord r = decode(handle.bytes());  // InvalidArgumentError
  if (r.pid == static_cast<std::uint32_t>(getpid()) && r.allocator_id == id_)
    return imports_.open_self(r);
  std::vector<int> peers;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    peers = peers_[static_cast<std::size_t>(device)];
  }
  return imports_.open(r, handle.fds(), device, peers);
}

void IpcService::close(void* ptr) {
  if (!imports_.close(ptr))
    throw InvalidPointerError("reservoir: cannot close " + format_pointer(ptr) +
                              ": no shared memory opened with open() holds it");
}

bool IpcService::unshare(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (kept_.erase(address) == 0)
    throw InvalidPointerError("reservoir: cannot unshare " + format_pointer(ptr) +
                              ": it was not shared with keep (share(ptr, true))");
  const bool freed = freed_.erase(address) != 0;
  holding_.store(!kept_.empty(), std::memory_order_release);
  return freed;
}

bool IpcService::hold_free(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (kept_.count(address) == 0) return false;
  if (!freed_.insert(address).second)
    throw InvalidPointerError("reservoir: cannot free " + format_pointer(ptr) +
                              ": it was already freed (it is shared with keep and waits for "
                              "unshare); double free?");
  return true;
}

void IpcService::add_peer(int device, int peer) {
  imports_.add_peer(device, peer);
  std::lock_guard<std::mutex> guard(mutex_);
  auto& p = peers_[static_cast<std::size_t>(device)];
  if (std::find(p.begin(), p.end(), peer) == p.end()) p.push_back(peer);
}

}  // namespace reservoir::detail
