// SimBackend's IPC: segment handles (export_ipc / open_ipc / close_ipc) and shareable
// physical memory (export_shareable / import_shareable). See sim_backend.hpp.
//
// A segment handle carries the exporter's process, backend instance, segment and, for
// shared memory, the memfd that holds the device's segments (its descriptor number
// and inode). Opening maps a view of that memfd: in the exporting process (another
// backend), or in a forked child, which inherited the descriptor; a process that did
// not inherit it reads /proc/PID/fd/N where the system allows it. Synthetic handles
// open at fresh synthetic addresses (no data). Physical memory is exported as a memfd
// descriptor, a real one, so it travels between processes like a CUDA one.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backend/sim/state.hpp"

namespace reservoir {

using namespace sim;

namespace {

constexpr char kMagic[4] = {'R', 'S', 'I', 'M'};

// What a simulated IpcHandle holds (56 of its 64 bytes).
struct Wire {
  char magic[4];
  std::uint32_t pid;
  std::uint64_t instance;
  std::int32_t device;
  std::int32_t fd;     // shared memory: the exporter's memfd of the device's segments
  std::uint64_t base;  // the segment in the exporter
  std::uint64_t size;
  std::uint64_t offset;  // shared memory: where base is in the memfd
  std::uint64_t inode;   // shared memory: the memfd's inode
};
static_assert(sizeof(Wire) <= sizeof(IpcHandle::bytes), "a simulated handle fits");

std::uint64_t inode_of(int fd) {
  struct stat st {};
  return fd >= 0 && fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

// A descriptor of the exporter's memfd in this process ("" on success, else why not).
std::string reach_memfd(const Wire& w, int* fd, bool* owned) {
  *owned = false;
  if (w.fd >= 0 && inode_of(w.fd) == w.inode) {  // this process, or a forked child
    *fd = w.fd;
    return "";
  }
  const std::string path = "/proc/" + std::to_string(w.pid) + "/fd/" + std::to_string(w.fd);
  const int opened = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (opened < 0) {
    return "sim: open_ipc: process " + std::to_string(w.pid) +
           "'s simulated device memory is not reachable from here (" + path + ": " +
           std::strerror(errno) + "); the simulated device shares memory with forked children";
  }
  if (inode_of(opened) != w.inode) {
    close(opened);
    return "sim: open_ipc: " + path + " is no longer the exporter's device memory";
  }
  *fd = opened;
  *owned = true;
  return "";
}

}  // namespace

DeviceStatus SimBackend::export_ipc(int device, void* base, IpcHandle* handle) {
  State& s = *state_;
  if (!has(kIpc))
    return unsupported(
        "sim: export_ipc: host-backed memory is private (set SimOptions::shared_memory)");
  return s.call(device, SimOp::export_ipc, [&](State::Device& d) {
    const auto start = reinterpret_cast<std::uintptr_t>(base);
    auto it = d.live.find(start);
    if (handle == nullptr || it == d.live.end()) {
      return error("sim: export_ipc: " + hex(start) +
                   " is not the start of a live segment of device " + std::to_string(device));
    }
    Wire w{};
    std::memcpy(w.magic, kMagic, sizeof kMagic);
    w.pid = static_cast<std::uint32_t>(getpid());
    w.instance = s.id;
    w.device = device;
    w.fd = -1;
    w.base = start;
    w.size = it->second;
    if (s.options.shared_memory) {
      const HostMapping& h = s.host[static_cast<std::size_t>(device)];
      w.fd = h.fd();
      w.offset = start - h.begin();
      w.inode = inode_of(h.fd());
    }
    *handle = IpcHandle{};
    std::memcpy(handle->bytes, &w, sizeof w);
    ++s.counters.ipc_exports;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::open_ipc(int device, const IpcHandle& handle, void** ptr) {
  State& s = *state_;
  if (!has(kIpc))
    return unsupported(
        "sim: open_ipc: host-backed memory is private (set SimOptions::shared_memory)");
  return s.call(device, SimOp::open_ipc, [&](State::Device&) {
    Wire w{};
    std::memcpy(&w, handle.bytes, sizeof w);
    if (std::memcmp(w.magic, kMagic, sizeof kMagic) != 0 || w.size == 0 || ptr == nullptr)
      return error("sim: open_ipc: not a handle of a simulated device");
    if (w.instance == s.id && w.pid == static_cast<std::uint32_t>(getpid()))
      return error(
          "sim: open_ipc: the handle was exported by this backend (CUDA opens no handle "
          "in the process that exported it)");
    const std::string key =
        std::to_string(w.pid) + ":" + std::to_string(w.instance) + ":" + std::to_string(w.base);
    if (s.open_keys.count(key) != 0)
      return error(
          "sim: open_ipc: the handle is already open here (CUDA opens a handle once "
          "per process and device)");
    State::OpenIpc o{device, static_cast<std::size_t>(w.size), key, nullptr, 0};
    std::uintptr_t start = 0;
    if (!s.options.host_backed) {
      start = s.imports.reserve(round_up(o.size, kSmallAlignment), kLargeAlignment);
      if (start == 0) return error("sim: open_ipc: no address range left for IPC mappings");
    } else {
      int fd = -1;
      bool owned = false;
      if (std::string why = reach_memfd(w, &fd, &owned); !why.empty()) return error(why);
      const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      const std::size_t first = w.offset / page * page;
      o.view_bytes = round_up(w.offset - first + o.size, page);
      void* view = mmap(nullptr, o.view_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                        static_cast<off_t>(first));
      const int err = errno;
      if (owned) close(fd);
      if (view == MAP_FAILED)
        return error(std::string("sim: open_ipc: mmap of the exporter's memory failed: ") +
                     std::strerror(err));
      o.view = view;
      start = reinterpret_cast<std::uintptr_t>(view) + (w.offset - first);
    }
    s.opened.emplace(start, o);
    s.open_keys.insert(key);
    ++s.counters.ipc_opens;
    *ptr = reinterpret_cast<void*>(start);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::close_ipc(int device, void* ptr) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    auto it = s.opened.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.opened.end() || it->second.device != device)
      return error("sim: close_ipc: " + hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                   " is not an IPC mapping open on device " + std::to_string(device));
    if (it->second.view != nullptr) {
      munmap(it->second.view, it->second.view_bytes);
    } else {
      s.imports.release(it->first);
    }
    s.open_keys.erase(it->second.key);
    s.opened.erase(it);
    ++s.counters.ipc_closes;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::export_shareable(int device, PhysicalHandle handle,
                                          ShareableHandle::Kind kind, ShareableHandle* out) {
  State& s = *state_;
  if (kind == ShareableHandle::fabric)
    return unsupported("sim: export_shareable: fabric handles are not simulated");
  if (!has(kShareablePosixFd))
    return unsupported(
        "sim: export_shareable: needs virtual memory and memory another process can reach "
        "(synthetic, or host_backed with shared_memory)");
  return s.call(device, SimOp::export_shareable, [&](State::Device&) {
    if (out == nullptr) return error("sim: export_shareable: null out");
    int fd = -1;
    if (std::string problem = s.vm.export_fd(device, handle, &fd); !problem.empty())
      return error(problem);
    *out = ShareableHandle{};
    out->kind = ShareableHandle::posix_fd;
    out->fd = fd;
    ++s.counters.shareable_exports;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::import_shareable(int device, const ShareableHandle& shared,
                                          PhysicalHandle* handle) {
  State& s = *state_;
  if (shared.kind != ShareableHandle::posix_fd)
    return unsupported("sim: import_shareable: only POSIX file descriptors are simulated");
  if (!has(kShareablePosixFd))
    return unsupported("sim: import_shareable: this simulated device shares no memory");
  return s.call(device, SimOp::import_shareable, [&](State::Device&) {
    if (handle == nullptr) return error("sim: import_shareable: null handle");
    std::size_t size = 0;
    if (std::string problem = s.vm.import_fd(device, shared.fd, handle, &size); !problem.empty())
      return error(problem);
    ++s.counters.shareable_imports;
    return DeviceStatus::ok;
  });
}

}  // namespace reservoir
