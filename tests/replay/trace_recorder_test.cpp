// TraceRecorder on its own (no engine): what it writes, plain and gzip, and that
// concurrent writers still give a trace the reader accepts.
#include "front/trace_recorder.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "replay_test_util.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {
namespace {

using detail::TraceRecorder;
using test::TempDir;

const void* fake(std::uintptr_t v) {
  return reinterpret_cast<const void*>(v);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void script(TraceRecorder& rec) {
  rec.on_allocate(fake(0x1000), 100, /*stream=*/77);
  rec.on_allocate(fake(0x2000), 200, /*stream=*/5);
  rec.on_allocate(nullptr, 0, 77);        // size 0: recorded, never mapped
  rec.on_record_stream(fake(0x1000), 9);  // third stream seen -> 2
  rec.on_free(fake(0x1000));
  rec.on_free(fake(0x1000));              // already freed: ignored
  rec.on_free(fake(0x9999));              // never seen: ignored
  rec.on_record_stream(fake(0x9999), 9);  // never seen: ignored
  rec.on_host_wait(5);
  rec.on_allocate(fake(0x1000), 300, 9);  // address reused: a new ID
  rec.on_free(fake(0x1000));
}

constexpr const char* kHeader =
    "# trace v2: a,ID,SIZE,STREAM[,TAG[,POOL]] | f,ID | u,ID,STREAM | s,STREAM | n,TAG,NAME | "
    "z,TAG,MODE | w,TAG[,STREAM] | c | p,POOL[,OPTIONS] | x,POOL[,empty] | g,POOL[,STREAM] | "
    "t,POOL | e,POOL | k,CKPT,POOL | r,CKPT | y,ID | o,ID,OLDID\n";

const std::string kExpected = std::string(kHeader) +
                              "a,0,100,0\n"
                              "a,1,200,1\n"
                              "a,2,0,0\n"
                              "u,0,2\n"
                              "f,0\n"
                              "s,1\n"
                              "a,3,300,2\n"
                              "f,3\n";

TEST(TraceRecorder, WritesPlainText) {
  TempDir dir;
  const std::string path = dir.file("r.trace");
  {
    TraceRecorder rec(path);
    EXPECT_EQ(rec.path(), path);
    script(rec);
  }
  EXPECT_EQ(read_file(path), kExpected);
}

TEST(TraceRecorder, WritesGzipWhenNameEndsInGz) {
  TempDir dir;
  const std::string path = dir.file("r.trace.gz");
  {
    TraceRecorder rec(path);
    script(rec);
    rec.flush();
    // After flush() the data so far is readable while recording goes on.
    EXPECT_EQ(test::read_gzip(path), kExpected);
  }
  const std::string raw = read_file(path);
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(raw[0]), 0x1f);  // gzip magic
  EXPECT_EQ(static_cast<unsigned char>(raw[1]), 0x8b);
  EXPECT_EQ(test::read_gzip(path), kExpected);

  const Trace t = read_trace(path);
  EXPECT_EQ(t.allocations, 4u);
  EXPECT_EQ(t.streams, 3u);
  EXPECT_EQ(t.live_at_end, 2u);  // ID 1, and the size-0 ID 2
}

// Tags are numbered from 1 in order of first use, each named by an n line before it;
// sleeps and wakes name the tag (and a wake's stream); an empty_cache is a c line.
TEST(TraceRecorder, WritesTagsSleepsWakesAndEmptyCaches) {
  TempDir dir;
  const std::string path = dir.file("tags.trace");
  const detail::TagId weights = detail::TagNames::intern("recorder-weights");
  const detail::TagId kv = detail::TagNames::intern("recorder-kv");
  {
    TraceRecorder rec(path);
    rec.on_allocate(fake(0x1000), 100, 7, kv);
    rec.on_allocate(fake(0x2000), 200, 7, weights);
    rec.on_allocate(fake(0x3000), 300, 7);  // no tag
    rec.on_allocate(fake(0x4000), 400, 7, kv);
    rec.on_sleep(weights, SleepMode::offload);
    rec.on_sleep(kv, SleepMode::discard);
    rec.on_free(fake(0x4000));  // a sleeping tag's block may be freed
    rec.on_empty_cache();
    rec.on_wake(kv, nullptr);
    const StreamHandle other = 8;
    rec.on_wake(weights, &other);
  }
  EXPECT_EQ(read_file(path), std::string(kHeader) +
                                 "n,1,recorder-kv\n"
                                 "a,0,100,0,1\n"
                                 "n,2,recorder-weights\n"
                                 "a,1,200,0,2\n"
                                 "a,2,300,0\n"
                                 "a,3,400,0,1\n"
                                 "z,2,offload\n"
                                 "z,1,discard\n"
                                 "f,3\n"
                                 "c\n"
                                 "w,1\n"
                                 "w,2,1\n");
  const Trace t = read_trace(path);
  EXPECT_EQ(t.sleeps, 2u);
  EXPECT_EQ(t.wakes, 2u);
  EXPECT_EQ(t.empty_caches, 1u);
  EXPECT_EQ(t.alloc_tags, (std::vector<std::uint16_t>{1, 2, 0, 1}));
}

TEST(TraceRecorder, UnwritablePathThrowsNamingIt) {
  try {
    TraceRecorder rec("/nonexistent-dir/x.trace");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.trace"), std::string::npos);
  }
}

TEST(TraceRecorder, ConcurrentThreadsGiveAValidTrace) {
  TempDir dir;
  const std::string path = dir.file("mt.trace.gz");
  constexpr int kThreads = 4, kPerThread = 2000;
  {
    TraceRecorder rec(path);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&rec, t] {
        // Each thread has its own addresses and stream, as threads on their own
        // streams would.
        const std::uintptr_t base = (static_cast<std::uintptr_t>(t) + 1) << 32;
        for (int i = 0; i < kPerThread; ++i) {
          const void* p = fake(base + static_cast<std::uintptr_t>(i % 16) * 512);
          rec.on_allocate(p, 512, static_cast<StreamHandle>(t + 100));
          if (i % 7 == 0) rec.on_record_stream(p, 1);
          rec.on_free(p);
          if (i % 100 == 0) rec.on_host_wait(static_cast<StreamHandle>(t + 100));
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  const Trace t = read_trace(path);  // throws if any line is torn or out of order
  EXPECT_EQ(t.allocations, static_cast<std::uint32_t>(kThreads * kPerThread));
  EXPECT_EQ(t.frees, static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(t.streams, static_cast<std::uint32_t>(kThreads + 1));
  EXPECT_EQ(t.live_at_end, 0u);
}

}  // namespace
}  // namespace reservoir::replay
