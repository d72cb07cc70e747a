// The shareable handle's format (docs/ipc.md): what Allocator::share() returns as
// bytes, and what Allocator::open() reads, in this or another process.
//
//   offset  size  field
//   0       4     magic "RSVH"
//   4       1     format version (kShareFormatVersion)
//   5       1     kind: 'c' (a cudaMalloc'd segment) or 'e' (pages of an expandable segment)
//   6       2     flags: bit 0 descriptors travel beside the bytes (one per page, in
//                 order), bit 1 fabric handles follow the page list
//   8       4     device index in the sender
//   12      4     sender's process id
//   16      8     sender's allocator id (process-unique)
//   24      8     sender's block address
//   32      8     offset of the block in the shared range
//   40      8     block size
//   48      ...   kind 'c': segment size (8), cudaIpcMemHandle_t (64)
//                 kind 'e': page size (8), page count (8), the sender's page ids
//                 (8 each), then with bit 1 a 64-byte fabric handle per page
// Integers are little-endian. A reader refuses a version newer than its own with a
// clear error (the sender's Reservoir is newer), and anything malformed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::detail {

inline constexpr std::uint8_t kShareFormatVersion = 1;

struct ShareRecord {
  enum Kind : char { segment = 'c', expandable = 'e' };
  Kind kind = segment;
  bool fds = false;     // descriptors travel beside the bytes
  bool fabric = false;  // fabric handles are in the bytes
  std::int32_t device = 0;
  std::uint32_t pid = 0;
  std::uint64_t allocator_id = 0;
  std::uint64_t block = 0;
  std::uint64_t offset = 0;
  std::uint64_t block_size = 0;
  // segment
  std::uint64_t segment_size = 0;
  IpcHandle ipc;
  // expandable
  std::uint64_t page_size = 0;
  std::vector<std::uint64_t> page_ids;
  std::vector<std::array<unsigned char, 64>> fabric_handles;

  // The bytes that name the shared memory (not the block): equal for every share of
  // the same segment or pages, so the receiver maps them once.
  std::string key() const;
};

std::string encode(const ShareRecord& record);
// Throws InvalidArgumentError: not a handle, truncated, inconsistent, or of a newer
// format version than this Reservoir reads.
ShareRecord decode(std::string_view bytes);

// What the owner of an allocated block tells IPC about it (BlockOwner::share).
struct SharedBlock {
  int device = 0;
  std::uintptr_t block = 0;
  std::size_t block_size = 0;
  bool expandable = false;
  std::uintptr_t segment = 0;  // ordinary: the segment
  std::size_t segment_size = 0;
  std::uintptr_t first_page = 0;  // expandable: the pages covering the block
  std::size_t page_size = 0;
  std::vector<PhysicalHandle> pages;
};

}  // namespace reservoir::detail
