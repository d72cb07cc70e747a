// The shareable handle's format (src/engine/ipc/ipc_handle.hpp): round trips, the cache
// key, and refusal of what is not a handle, malformed or of a newer version.
#include "engine/ipc/ipc_handle.hpp"

#include <gtest/gtest.h>

#include <string>

#include "reservoir/errors.hpp"

namespace reservoir::detail {
namespace {

ShareRecord segment_record() {
  ShareRecord r;
  r.kind = ShareRecord::segment;
  r.device = 1;
  r.pid = 4242;
  r.allocator_id = 7;
  r.block = 0x7f0000200000;
  r.offset = 0x200000;
  r.block_size = 4096;
  r.segment_size = 20 << 20;
  for (int i = 0; i < 64; ++i) r.ipc.bytes[i] = static_cast<unsigned char>(i * 3 + 1);
  return r;
}

ShareRecord pages_record() {
  ShareRecord r;
  r.kind = ShareRecord::expandable;
  r.fds = true;
  r.device = 0;
  r.pid = 99;
  r.allocator_id = 3;
  r.block = 0x7f8000000000 + (3 << 20);
  r.offset = 3 << 20;
  r.block_size = 30 << 20;
  r.page_size = 20 << 20;
  r.page_ids = {11, 12};
  return r;
}

TEST(IpcHandle, SegmentRoundTrips) {
  const ShareRecord r = segment_record();
  const std::string bytes = encode(r);
  EXPECT_EQ(bytes.substr(0, 4), "RSVH");
  EXPECT_EQ(static_cast<unsigned char>(bytes[4]), kShareFormatVersion);
  EXPECT_EQ(bytes[5], 'c');
  EXPECT_EQ(bytes.size(), 48u + 8 + 64);
  const ShareRecord d = decode(bytes);
  EXPECT_EQ(d.kind, ShareRecord::segment);
  EXPECT_EQ(d.device, 1);
  EXPECT_EQ(d.pid, 4242u);
  EXPECT_EQ(d.allocator_id, 7u);
  EXPECT_EQ(d.block, r.block);
  EXPECT_EQ(d.offset, r.offset);
  EXPECT_EQ(d.block_size, 4096u);
  EXPECT_EQ(d.segment_size, r.segment_size);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.ipc.bytes), 64),
            std::string(reinterpret_cast<const char*>(r.ipc.bytes), 64));
  EXPECT_EQ(encode(d), bytes);
}

TEST(IpcHandle, PagesRoundTripWithAndWithoutFabricHandles) {
  ShareRecord r = pages_record();
  ShareRecord d = decode(encode(r));
  EXPECT_EQ(d.kind, ShareRecord::expandable);
  EXPECT_TRUE(d.fds);
  EXPECT_FALSE(d.fabric);
  EXPECT_EQ(d.page_size, r.page_size);
  EXPECT_EQ(d.page_ids, r.page_ids);
  r.fabric = true;
  r.fabric_handles.resize(2);
  r.fabric_handles[1][63] = 0xab;
  d = decode(encode(r));
  ASSERT_EQ(d.fabric_handles.size(), 2u);
  EXPECT_EQ(d.fabric_handles[1][63], 0xab);
  EXPECT_EQ(encode(d), encode(r));
}

TEST(IpcHandle, KeyNamesTheSharedRangeNotTheBlock) {
  ShareRecord a = segment_record(), b = segment_record();
  b.block += 4096;  // another block of the same segment
  b.offset += 4096;
  EXPECT_EQ(a.key(), b.key());
  b.ipc.bytes[0] ^= 1;  // another segment
  EXPECT_NE(a.key(), b.key());
  ShareRecord p = pages_record(), q = pages_record();
  q.allocator_id = 4;  // the same ids in another allocator
  EXPECT_NE(p.key(), q.key());
  q = pages_record();
  q.page_ids = {11, 13};
  EXPECT_NE(p.key(), q.key());
}

TEST(IpcHandle, ANewerVersionIsRefusedClearly) {
  std::string bytes = encode(segment_record());
  bytes[4] = static_cast<char>(kShareFormatVersion + 1);
  try {
    decode(bytes);
    FAIL() << "a handle of a newer version was read";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("format version 2"), std::string::npos) << m;
    EXPECT_NE(m.find("reads versions up to 1"), std::string::npos) << m;
    EXPECT_NE(m.find("newer Reservoir"), std::string::npos) << m;
  }
  bytes[4] = 0;
  EXPECT_THROW(decode(bytes), InvalidArgumentError);
}

TEST(IpcHandle, MalformedHandlesAreRefused) {
  const std::string good = encode(pages_record());
  auto refused = [](const std::string& bytes, const std::string& says) {
    try {
      decode(bytes);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("", "not a Reservoir shared-memory handle");
  refused(std::string(64, 'x'), "not a Reservoir shared-memory handle");  // a raw CUDA handle
  refused(good.substr(0, 30), "truncated");
  refused(good.substr(0, good.size() - 1), "truncated");
  refused(good + "z", "stray bytes");
  std::string kind = good;
  kind[5] = 'q';
  refused(kind, "unknown kind 'q'");
  ShareRecord r = pages_record();
  r.block_size = 1 << 30;  // beyond the two pages
  refused(encode(r), "does not lie in its shared range");
  r = pages_record();
  r.fds = false;  // nothing to import the pages from
  refused(encode(r), "neither file descriptors nor fabric handles");
  r = pages_record();
  r.page_size = 12345;  // not whole pages
  refused(encode(r), "malformed");
}

}  // namespace
}  // namespace reservoir::detail
