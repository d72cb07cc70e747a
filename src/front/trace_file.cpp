// TraceFile: an append-only file that is complete on disk at every write-out and
// written out at exit, on termination signals, and never by a fork child (see the
// header for the rules).
//
// Every open file is on one intrusive list (g_open, under g_open_lock) so that the
// atexit, signal and fork handlers can reach it. The list and its lock are plain
// globals with constant initialization: they exist before any constructor runs and
// are never destroyed, so handlers running during static destruction still work.
#include "front/trace_file.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "reservoir/errors.hpp"
#include "util/lock.hpp"

namespace reservoir::detail {

namespace {

// Bytes of text collected before a write-out. A gzip member per 256 KiB costs
// about 20 bytes of header and trailer, and a lost buffer is at most this much.
constexpr std::size_t kBufferBytes = std::size_t{256} << 10;
// A buffer older than this is written out with the next line: a killed process
// loses at most the last second of events (before its last event).
constexpr std::chrono::steady_clock::duration kMaxAge = std::chrono::seconds(1);
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

std::string os_reason(int error) {
  return error != 0 ? std::strerror(error) : "unknown error";
}

}  // namespace

// Invariant (under lock): 0 <= used <= kBufferBytes; fd < 0 => used == 0 and
// nothing is written again; gzip => out holds deflateBound(kBufferBytes) bytes.
struct TraceFile::Impl {
  std::string path;
  Lock lock;
  int fd = -1;
  bool gzip = false;
  bool failed = false;         // a write failed: stop, warn once
  bool write_through = false;  // after the exit handler: every append written at once
  std::unique_ptr<char[]> buffer{new char[kBufferBytes]};
  std::size_t used = 0;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  z_stream zs{};
  bool zs_ready = false;
  std::unique_ptr<unsigned char[]> out;
  std::size_t out_capacity = 0;
  Impl* prev = nullptr;  // g_open list
  Impl* next = nullptr;

  // Writes all of [data, data + n) to fd, across short writes and EINTR. Uses only
  // write(2): callable from a signal handler.
  bool write_all(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  // Caller holds lock. The buffer as one complete gzip member (or as is), then
  // emptied; returns 0 or the errno of the failure (EIO for a zlib failure).
  // Allocates nothing and prints nothing: safe in the signal handler.
  int write_out_quietly() {
    if (fd < 0 || failed) {
      used = 0;
      return 0;
    }
    if (used == 0) return 0;
    bool ok;
    if (gzip) {
      deflateReset(&zs);
      zs.next_in = reinterpret_cast<unsigned char*>(buffer.get());
      zs.avail_in = static_cast<unsigned>(used);
      zs.next_out = out.get();
      zs.avail_out = static_cast<unsigned>(out_capacity);
      // out_capacity = deflateBound(kBufferBytes): one call always finishes.
      errno = EIO;
      ok = deflate(&zs, Z_FINISH) == Z_STREAM_END &&
           write_all(out.get(), out_capacity - zs.avail_out);
    } else {
      ok = write_all(buffer.get(), used);
    }
    const int error = ok ? 0 : (errno != 0 ? errno : EIO);
    used = 0;
    last_write = std::chrono::steady_clock::now();
    if (!ok) failed = true;
    return error;
  }

  // Caller holds lock. A failure stops the file and is reported once on stderr.
  void write_out() {
    const bool was_failed = failed;
    const int error = write_out_quietly();
    if (error != 0 && !was_failed)
      std::fprintf(stderr, "reservoir: trace recording to '%s' stopped: write failed: %s\n",
                   path.c_str(), os_reason(error).c_str());
  }

  // Caller holds lock.
  void append(std::string_view text) {
    if (fd < 0 || failed) return;
    if (used + text.size() > kBufferBytes) write_out();
    if (text.size() > kBufferBytes) {  // never for trace lines; kept correct anyway
      for (std::size_t at = 0; at < text.size(); at += kBufferBytes) {
        append(text.substr(at, kBufferBytes));
      }
      return;
    }
    std::memcpy(buffer.get() + used, text.data(), text.size());
    used += text.size();
    if (write_through || std::chrono::steady_clock::now() - last_write >= kMaxAge) write_out();
  }

  // Caller holds lock. A fork child's copy: close the child's descriptor only.
  void detach() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    used = 0;
  }
};

namespace {

Lock g_open_lock;
TraceFile::Impl* g_open = nullptr;  // every open file, newest first

void on_exit() {
  TraceFile::write_out_all_for_exit();
}

// Writes out what it can without waiting: a file whose lock is held (the signal
// arrived inside an append on this or another thread) keeps its buffer.
void on_signal(int sig) {
  const int saved_errno = errno;
  if (g_open_lock.try_lock()) {
    for (TraceFile::Impl* f = g_open; f != nullptr; f = f->next) {
      if (!f->lock.try_lock()) continue;
      f->write_out_quietly();
      f->lock.unlock();
    }
    g_open_lock.unlock();
  }
  errno = saved_errno;
  // Die of the signal as the default action would: it is blocked while this handler
  // runs, so it is delivered, with the default action, when the handler returns.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Fork: no file may be mid-write in the child's copy, and the child must never write
// to the parent's files (a shared offset would interleave two streams).
void before_fork() {
  g_open_lock.lock();
  for (TraceFile::Impl* f = g_open; f != nullptr; f = f->next) f->lock.lock();
}
void after_fork_in_parent() {
  for (TraceFile::Impl* f = g_open; f != nullptr; f = f->next) f->lock.unlock();
  g_open_lock.unlock();
}
void after_fork_in_child() {
  for (TraceFile::Impl* f = g_open; f != nullptr; f = f->next) {
    f->detach();
    f->lock.unlock();
  }
  g_open_lock.unlock();
}

// Once per process, at the first open file.
void install_process_handlers() {
  std::atexit(on_exit);
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  for (int sig : kSignals) {
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) continue;
    struct sigaction ours {};
    ours.sa_handler = on_signal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART;
    sigaction(sig, &ours, nullptr);
  }
}

void link(TraceFile::Impl* f) {
  static std::once_flag handlers;
  std::call_once(handlers, install_process_handlers);
  std::lock_guard<Lock> guard(g_open_lock);
  f->next = g_open;
  if (g_open != nullptr) g_open->prev = f;
  g_open = f;
}

void unlink(TraceFile::Impl* f) {
  std::lock_guard<Lock> guard(g_open_lock);
  if (f->prev != nullptr) f->prev->next = f->next;
  if (f->next != nullptr) f->next->prev = f->prev;
  if (g_open == f) g_open = f->next;
  f->prev = f->next = nullptr;
}

}  // namespace

TraceFile::TraceFile(const std::string& path, std::string_view header)
    : impl_(std::make_unique<Impl>()) {
  Impl& f = *impl_;
  f.path = path;
  f.gzip = ends_with(path, ".gz");
  if (f.gzip) {
    // windowBits 15 + 16: a gzip wrapper around each member.
    if (deflateInit2(&f.zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
        Z_OK)
      throw IoError("reservoir: cannot start compressing the trace file '" + path +
                        "': zlib could not initialize (out of host memory?)",
                    path, 0);
    f.zs_ready = true;
    f.out_capacity = deflateBound(&f.zs, kBufferBytes);
    f.out.reset(new unsigned char[f.out_capacity]);
  }
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (f.fd < 0) {
    const int error = errno;
    if (f.zs_ready) deflateEnd(&f.zs);
    throw IoError(
        "reservoir: cannot open the trace file '" + path + "' for writing: " + os_reason(error),
        path, error);
  }
  // The header goes out now: from here on the file is a valid (empty) trace, and a
  // disk that cannot take even that is reported to the caller.
  std::memcpy(f.buffer.get(), header.data(), header.size());
  f.used = header.size();
  if (const int error = f.write_out_quietly(); error != 0) {
    ::close(f.fd);
    if (f.zs_ready) deflateEnd(&f.zs);
    throw IoError("reservoir: cannot write the trace file '" + path + "': " + os_reason(error),
                  path, error);
  }
  link(&f);
}

TraceFile::~TraceFile() {
  Impl& f = *impl_;
  unlink(&f);
  std::lock_guard<Lock> guard(f.lock);
  f.write_out();
  if (f.fd >= 0 && ::close(f.fd) != 0 && !f.failed)
    std::fprintf(stderr, "reservoir: closing trace file '%s' failed (%s); it may be incomplete\n",
                 f.path.c_str(), os_reason(errno).c_str());
  f.fd = -1;
  if (f.zs_ready) deflateEnd(&f.zs);
}

void TraceFile::append(std::string_view text) {
  std::lock_guard<Lock> guard(impl_->lock);
  impl_->append(text);
}

void TraceFile::flush() {
  std::lock_guard<Lock> guard(impl_->lock);
  impl_->write_out();
}

const std::string& TraceFile::path() const {
  return impl_->path;
}

bool TraceFile::writing() const {
  std::lock_guard<Lock> guard(impl_->lock);
  return impl_->fd >= 0 && !impl_->failed;
}

void TraceFile::write_out_all_for_exit() {
  std::lock_guard<Lock> guard(g_open_lock);
  for (Impl* f = g_open; f != nullptr; f = f->next) {
    std::lock_guard<Lock> file_guard(f->lock);
    f->write_out();
    f->write_through = true;
  }
}

}  // namespace reservoir::detail
