// TraceFile: an append-only text file that is always complete on disk and is never
// lost at exit. The trace recorder writes its lines through one.
//
//   - Lines collect in a buffer that is written out when full, when a second has
//     passed since the last write-out, on flush() and on close. A ".gz" file gets
//     one complete gzip member per write-out: concatenated members are one valid
//     gzip file (zlib's gzread, gzip -d and Python's gzip read them all), so at any
//     moment — a crash or SIGKILL included — the file holds a readable trace.
//   - At process exit (return from main, exit(), Python's interpreter shutdown) an
//     atexit handler writes out every open file and switches it to write-through:
//     lines appended later (frees from static destructors) are written at once.
//   - SIGTERM, SIGINT and SIGHUP, where their action is the default one when the
//     first file opens, write out every buffer (no allocation: zlib's state and the
//     output buffer exist already) and then kill the process as the default would.
//     A handler installed by the program keeps priority (Python's SIGINT handler,
//     which raises KeyboardInterrupt and then exits normally).
//   - A fork child detaches from every open file (closes its copy of the
//     descriptor, drops its buffer): the parent's file stays whole.
//
// Thread-safe: one lock per file. Write errors stop the file (reported once on
// stderr): a full disk must not become an allocator failure.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace reservoir::detail {

class TraceFile {
 public:
  // Creates (truncates) path, gzip-compressed when it ends in ".gz", and writes
  // header to it at once. Throws IoError naming the path and the OS reason.
  TraceFile(const std::string& path, std::string_view header);
  ~TraceFile();  // writes out and closes
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // Appends text (whole lines). Caller serializes appends with its own lock or
  // relies on this file's.
  void append(std::string_view text);
  void flush();
  const std::string& path() const;
  // False once a write failed or a fork child detached: appends are dropped.
  bool writing() const;

  // What the exit handler does (callable by tests): writes out every open file and
  // makes each write later appends at once.
  static void write_out_all_for_exit();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace reservoir::detail
