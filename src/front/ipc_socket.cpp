// SharedHandle and its passage over a Unix socket (include/reservoir/ipc.hpp).
//
// Wire: a 12-byte header ("RSVS", byte count, descriptor count; little-endian u32s),
// the bytes, then the descriptors in batches of at most kBatch, each batch attached
// (SCM_RIGHTS) to one byte of data. Each part is one sendmsg, so a seqpacket socket
// keeps them apart and a stream socket receives them in order.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "reservoir/errors.hpp"
#include "reservoir/ipc.hpp"

namespace reservoir {

namespace {

constexpr char kMagic[4] = {'R', 'S', 'V', 'S'};
constexpr std::size_t kBatch = 200;  // below the kernel's SCM_MAX_FD (253)
constexpr std::uint32_t kMaxBytes = 64u << 20;
constexpr std::uint32_t kMaxFds = 1u << 20;

[[noreturn]] void io_error(const std::string& what, int err) {
  throw IoError("reservoir: " + what + (err ? std::string(": ") + std::strerror(err) : ""),
                "socket", err);
}

void send_all(int socket, const char* data, std::size_t size, const int* fds, std::size_t nfds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kBatch)];
  bool fds_sent = nfds == 0;
  while (size > 0 || !fds_sent) {
    iovec iov{const_cast<char*>(data), size};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error("sending a shared-memory handle failed", errno);
    }
    fds_sent = true;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Receives exactly size bytes; the descriptors that come with them are appended.
void receive_all(int socket, char* data, std::size_t size, std::vector<int>* fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kBatch)];
  while (size > 0) {
    iovec iov{data, size};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error("receiving a shared-memory handle failed", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const std::size_t at = fds->size();
      fds->resize(at + count);
      std::memcpy(fds->data() + at, CMSG_DATA(c), count * sizeof(int));
    }
    if (msg.msg_flags & MSG_CTRUNC)
      io_error("receiving a shared-memory handle: descriptors were dropped (MSG_CTRUNC)", 0);
    if (n == 0) io_error("receiving a shared-memory handle: the peer closed the socket", 0);
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void put(char* at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>(v >> (8 * i) & 0xff);
}
std::uint32_t get(const char* at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return v;
}

}  // namespace

SharedHandle::SharedHandle(std::string bytes, std::vector<int> fds)
    : bytes_(std::move(bytes)), fds_(std::move(fds)) {}

SharedHandle::~SharedHandle() {
  close_fds();
}

SharedHandle::SharedHandle(SharedHandle&& other) noexcept
    : bytes_(std::move(other.bytes_)), fds_(other.release_fds()) {}

SharedHandle& SharedHandle::operator=(SharedHandle&& other) noexcept {
  if (this != &other) {
    close_fds();
    bytes_ = std::move(other.bytes_);
    fds_ = other.release_fds();
  }
  return *this;
}

std::vector<int> SharedHandle::release_fds() noexcept {
  std::vector<int> out;
  out.swap(fds_);
  return out;
}

void SharedHandle::close_fds() noexcept {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  fds_.clear();
}

void send_shared(int socket, const SharedHandle& handle) {
  const std::string& bytes = handle.bytes();
  const std::vector<int>& fds = handle.fds();
  char header[12];
  std::memcpy(header, kMagic, 4);
  put(header + 4, static_cast<std::uint32_t>(bytes.size()));
  put(header + 8, static_cast<std::uint32_t>(fds.size()));
  send_all(socket, header, sizeof header, nullptr, 0);
  send_all(socket, bytes.data(), bytes.size(), nullptr, 0);
  for (std::size_t at = 0; at < fds.size(); at += kBatch) {
    const char one = 'f';
    send_all(socket, &one, 1, fds.data() + at, std::min(kBatch, fds.size() - at));
  }
}

SharedHandle receive_shared(int socket) {
  std::vector<int> fds;
  char header[12];
  receive_all(socket, header, sizeof header, &fds);
  auto fail = [&](const std::string& what) {
    for (int fd : fds) ::close(fd);
    io_error(what, 0);
  };
  if (std::memcmp(header, kMagic, 4) != 0)
    fail(
        "receiving a shared-memory handle: the stream does not start with one (send it with "
        "send_shared)");
  const std::uint32_t size = get(header + 4), count = get(header + 8);
  if (size > kMaxBytes || count > kMaxFds || !fds.empty())
    fail("receiving a shared-memory handle: malformed header");
  std::string bytes(size, '\0');
  receive_all(socket, bytes.data(), size, &fds);
  while (fds.size() < count) {
    const std::size_t before = fds.size();
    char one = 0;
    receive_all(socket, &one, 1, &fds);
    if (fds.size() == before) fail("receiving a shared-memory handle: descriptors are missing");
  }
  if (fds.size() != count) fail("receiving a shared-memory handle: too many descriptors");
  return SharedHandle(std::move(bytes), std::move(fds));
}

}  // namespace reservoir
