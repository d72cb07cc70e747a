// Encoding and decoding the shareable handle: see ipc_handle.hpp.
#include "engine/ipc/ipc_handle.hpp"

#include <cstring>

#include "reservoir/errors.hpp"

namespace reservoir::detail {

namespace {

constexpr char kMagic[4] = {'R', 'S', 'V', 'H'};
constexpr std::size_t kHeader = 48;
constexpr std::uint16_t kFlagFds = 1, kFlagFabric = 2;
// A handle names at most this many pages (1 TiB of 2 MiB pages): a bound for hostile
// input, far beyond any real block.
constexpr std::uint64_t kMaxPages = std::uint64_t{1} << 19;

class Writer {
 public:
  void bytes(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  template <typename T>
  void integer(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i) & 0xff));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  void bytes(void* p, std::size_t n) {
    need(n);
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  template <typename T>
  T integer() {
    need(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      v |= std::uint64_t{static_cast<unsigned char>(in_[at_ + i])} << (8 * i);
    at_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::size_t left() const { return in_.size() - at_; }

 private:
  void need(std::size_t n) const {
    if (in_.size() - at_ < n)
      throw InvalidArgumentError("reservoir: the shared-memory handle is truncated (" +
                                 std::to_string(in_.size()) + " bytes)");
  }
  std::string_view in_;
  std::size_t at_ = 0;
};

// The shared range: a segment, or the pages and their ids.
void write_range(Writer& w, const ShareRecord& r) {
  if (r.kind == ShareRecord::segment) {
    w.integer<std::uint64_t>(r.segment_size);
    w.bytes(r.ipc.bytes, sizeof r.ipc.bytes);
  } else {
    w.integer<std::uint64_t>(r.page_size);
    w.integer<std::uint64_t>(r.page_ids.size());
    for (std::uint64_t id : r.page_ids) w.integer<std::uint64_t>(id);
  }
}

}  // namespace

std::string ShareRecord::key() const {
  Writer w;
  w.integer<char>(kind);
  w.integer<std::int32_t>(device);
  w.integer<std::uint32_t>(pid);
  w.integer<std::uint64_t>(allocator_id);
  write_range(w, *this);
  return w.take();
}

std::string encode(const ShareRecord& r) {
  Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.integer<std::uint8_t>(kShareFormatVersion);
  w.integer<char>(r.kind);
  w.integer<std::uint16_t>((r.fds ? kFlagFds : 0) | (r.fabric ? kFlagFabric : 0));
  w.integer<std::int32_t>(r.device);
  w.integer<std::uint32_t>(r.pid);
  w.integer<std::uint64_t>(r.allocator_id);
  w.integer<std::uint64_t>(r.block);
  w.integer<std::uint64_t>(r.offset);
  w.integer<std::uint64_t>(r.block_size);
  write_range(w, r);
  if (r.kind == ShareRecord::expandable && r.fabric)
    for (const auto& f : r.fabric_handles) w.bytes(f.data(), f.size());
  return w.take();
}

ShareRecord decode(std::string_view bytes) {
  if (bytes.size() < 5 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw InvalidArgumentError("reservoir: not a Reservoir shared-memory handle (" +
                               std::to_string(bytes.size()) +
                               " bytes; a handle comes from Allocator::share / reservoir.share)");
  Reader in(bytes);
  char magic[4];
  in.bytes(magic, sizeof magic);
  const auto version = in.integer<std::uint8_t>();
  if (version > kShareFormatVersion || version == 0)
    throw InvalidArgumentError(
        "reservoir: the shared-memory handle has format version " + std::to_string(version) +
        ", but this Reservoir reads versions up to " + std::to_string(kShareFormatVersion) +
        (version == 0 ? " (version 0 is not a valid handle)"
                      : ": the sending process runs a newer Reservoir; upgrade the receiving "
                        "process to the same version"));
  if (bytes.size() < kHeader)
    throw InvalidArgumentError("reservoir: the shared-memory handle is truncated (" +
                               std::to_string(bytes.size()) + " bytes, the header alone is " +
                               std::to_string(kHeader) + ")");
  ShareRecord r;
  const char kind = in.integer<char>();
  if (kind != ShareRecord::segment && kind != ShareRecord::expandable)
    throw InvalidArgumentError(std::string("reservoir: the shared-memory handle has an unknown "
                                           "kind '") +
                               kind + "' (expected 'c' or 'e')");
  r.kind = static_cast<ShareRecord::Kind>(kind);
  const auto flags = in.integer<std::uint16_t>();
  r.fds = (flags & kFlagFds) != 0;
  r.fabric = (flags & kFlagFabric) != 0;
  r.device = in.integer<std::int32_t>();
  r.pid = in.integer<std::uint32_t>();
  r.allocator_id = in.integer<std::uint64_t>();
  r.block = in.integer<std::uint64_t>();
  r.offset = in.integer<std::uint64_t>();
  r.block_size = in.integer<std::uint64_t>();
  std::uint64_t range = 0;
  if (r.kind == ShareRecord::segment) {
    r.segment_size = in.integer<std::uint64_t>();
    in.bytes(r.ipc.bytes, sizeof r.ipc.bytes);
    range = r.segment_size;
  } else {
    r.page_size = in.integer<std::uint64_t>();
    const auto pages = in.integer<std::uint64_t>();
    if (pages == 0 || pages > kMaxPages || r.page_size == 0 || r.page_size % 4096 != 0)
      throw InvalidArgumentError("reservoir: the shared-memory handle names " +
                                 std::to_string(pages) + " pages of " +
                                 std::to_string(r.page_size) + " bytes (malformed)");
    for (std::uint64_t i = 0; i < pages; ++i) r.page_ids.push_back(in.integer<std::uint64_t>());
    if (r.fabric) {
      r.fabric_handles.resize(pages);
      for (auto& f : r.fabric_handles) in.bytes(f.data(), f.size());
    }
    if (!r.fds && !r.fabric)
      throw InvalidArgumentError(
          "reservoir: the shared-memory handle of expandable pages carries neither file "
          "descriptors nor fabric handles (malformed)");
    range = pages * r.page_size;
  }
  if (in.left() != 0)
    throw InvalidArgumentError("reservoir: the shared-memory handle has " +
                               std::to_string(in.left()) + " stray bytes at its end (malformed)");
  if (r.block_size == 0 || r.offset > range || r.block_size > range - r.offset)
    throw InvalidArgumentError("reservoir: the shared-memory handle's block (offset " +
                               std::to_string(r.offset) + ", " + std::to_string(r.block_size) +
                               " bytes) does not lie in its shared range of " +
                               std::to_string(range) + " bytes (malformed)");
  return r;
}

}  // namespace reservoir::detail
