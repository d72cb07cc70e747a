// Sharing device memory with other processes (docs/ipc.md).
//
//   // the sender
//   reservoir::SharedHandle h = alloc.share(ptr);
//   reservoir::send_shared(socket, h);        // the bytes, and the descriptors (SCM_RIGHTS)
//   // the receiver
//   reservoir::SharedHandle h = reservoir::receive_shared(socket);
//   void* p = alloc.open(h);                  // the same memory, mapped in this process
//   ...                                       // reads and writes reach the sender's memory
//   alloc.close(p);
//
// A handle is versioned bytes, plus for a block of an expandable segment one file
// descriptor per physical page (exported with cuMemExportToShareableHandle), which
// must travel over a Unix socket: send_shared passes them with SCM_RIGHTS, which works
// in containers where pidfd_getfd (PyTorch's way) is not permitted. A cudaMalloc'd
// segment needs the bytes alone (any channel will do).
//
// The rule, as PyTorch's: the sender keeps the block allocated while any receiver
// uses it. Allocator::share(ptr, true) makes the allocator enforce it: a free of the
// block is held back until the sender calls unshare(ptr).
#pragma once

#include <string>
#include <vector>

#include "reservoir/export.hpp"

namespace reservoir {

// The bytes and descriptors of one share. Owns its descriptors (closed on
// destruction); move-only.
class RESERVOIR_API SharedHandle {
 public:
  SharedHandle() = default;
  // Takes ownership of fds.
  SharedHandle(std::string bytes, std::vector<int> fds);
  ~SharedHandle();
  SharedHandle(SharedHandle&& other) noexcept;
  SharedHandle& operator=(SharedHandle&& other) noexcept;
  SharedHandle(const SharedHandle&) = delete;
  SharedHandle& operator=(const SharedHandle&) = delete;

  const std::string& bytes() const noexcept { return bytes_; }
  const std::vector<int>& fds() const noexcept { return fds_; }
  // Hands the descriptors to the caller, who closes them.
  std::vector<int> release_fds() noexcept;

 private:
  void close_fds() noexcept;
  std::string bytes_;
  std::vector<int> fds_;
};

// Writes handle to a connected Unix socket (stream or seqpacket): a header, the
// bytes, then the descriptors in batches (SCM_RIGHTS). Throws IoError.
RESERVOIR_API void send_shared(int socket, const SharedHandle& handle);
// Reads what send_shared wrote. Throws IoError (closed socket, malformed stream,
// descriptors missing).
RESERVOIR_API SharedHandle receive_shared(int socket);

}  // namespace reservoir
