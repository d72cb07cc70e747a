// Trace format v1 and v2 parser: good lines, every kind of bad line (with its line number),
// plain and gzip files, and the real traces shipped in traces/.
#include "trace_reader.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "replay_test_util.hpp"

namespace reservoir::replay {
namespace {

using test::TempDir;

TEST(TraceReader, ParsesEveryKindOfLine) {
  const Trace t = parse_trace_text(
      "# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM\n"
      "a,10,1024,0\n"
      "\n"
      "a,7,4096,2\r\n"
      "   \n"
      "u,10,1\n"
      "# a comment in the middle\n"
      "f,10\n"
      "s,1\n"
      "a,10,0,0\n"  // an ID may come back once freed; size 0 is allowed
      "f,7",        // no newline at the end
      "t.trace");
  ASSERT_EQ(t.events.size(), 7u);
  EXPECT_EQ(t.allocations, 3u);
  EXPECT_EQ(t.streams, 3u);
  EXPECT_EQ(t.frees, 2u);
  EXPECT_EQ(t.uses, 1u);
  EXPECT_EQ(t.host_waits, 1u);
  EXPECT_EQ(t.peak_live_bytes, 5120u);
  EXPECT_EQ(t.live_at_end, 1u);

  const auto& e = t.events;
  EXPECT_EQ(e[0].kind, EventKind::alloc);
  EXPECT_EQ(e[0].slot, 0u);
  EXPECT_EQ(e[0].size, 1024u);
  EXPECT_EQ(e[0].stream, 0u);
  EXPECT_EQ(e[1].kind, EventKind::alloc);
  EXPECT_EQ(e[1].slot, 1u);
  EXPECT_EQ(e[1].stream, 2u);
  EXPECT_EQ(e[2].kind, EventKind::use);
  EXPECT_EQ(e[2].slot, 0u);
  EXPECT_EQ(e[2].stream, 1u);
  EXPECT_EQ(e[3].kind, EventKind::free);
  EXPECT_EQ(e[3].slot, 0u);
  EXPECT_EQ(e[3].stream, 0u);  // a free carries its allocating stream
  EXPECT_EQ(e[4].kind, EventKind::host_wait);
  EXPECT_EQ(e[4].stream, 1u);
  EXPECT_EQ(e[5].kind, EventKind::alloc);
  EXPECT_EQ(e[5].slot, 2u);  // reused ID, new slot
  EXPECT_EQ(e[5].size, 0u);
  EXPECT_EQ(e[6].kind, EventKind::free);
  EXPECT_EQ(e[6].slot, 1u);
  EXPECT_EQ(e[6].stream, 2u);
}

TEST(TraceReader, EmptyAndCommentOnlyTraces) {
  EXPECT_TRUE(parse_trace_text("", "e").events.empty());
  const Trace t = parse_trace_text("# only\n\n# comments\n", "e");
  EXPECT_TRUE(t.events.empty());
  EXPECT_EQ(t.streams, 0u);
}

TEST(TraceReader, LargeIdsAndSizes) {
  const Trace t = parse_trace_text(
      "a,18446744073709551615,18446744073709551615,65535\nf,18446744073709551615\n", "big");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].size, 18446744073709551615ull);
  EXPECT_EQ(t.events[0].stream, 65535u);
  EXPECT_EQ(t.streams, 1u);  // one stream, whatever its number
}

// Streams are counted, not numbered: a free names no stream of its own.
TEST(TraceReader, StreamsAreTheNumbersUsed) {
  const Trace t = parse_trace_text("a,1,8,3\ns,9\na,2,8,65535\nu,1,3\nf,1\nf,2\n", "s");
  EXPECT_EQ(t.stream_ids, (std::vector<std::uint16_t>{3, 9, 65535}));
  EXPECT_EQ(t.streams, 3u);
}

struct BadLine {
  const char* text;     // whole trace
  const char* message;  // expected what(), exactly or as a prefix
};

class TraceReaderBadLine : public ::testing::TestWithParam<BadLine> {};

TEST_P(TraceReaderBadLine, NamesFileAndLine) {
  const BadLine& p = GetParam();
  try {
    parse_trace_text(p.text, "traces/x.trace");
    FAIL() << "no error for: " << p.text;
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(p.message, 0), 0u)
        << "got: " << e.what() << "\nexpected to start with: " << p.message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, TraceReaderBadLine,
    ::testing::Values(
        BadLine{"a,1,2,0\na,2,3\n",
                "traces/x.trace:2: expected a,ID,SIZE,STREAM[,TAG[,POOL]], got 'a,2,3'"},
        BadLine{"# c\n\na,1,2,0,0,0,9\n", "traces/x.trace:3: expected a,ID,SIZE,STREAM"},
        BadLine{"a,x,2,0\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1,-2,0\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1,2,zero\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1, 2,0\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1,,0\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1,18446744073709551616,0\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM"},
        BadLine{"a,1,2,65536\n", "traces/x.trace:1: stream 65536 is too large"},
        BadLine{"a,1,2,0\nf\n", "traces/x.trace:2: expected f,ID, got 'f'"},
        BadLine{"a,1,2,0\nf,1,0\n", "traces/x.trace:2: expected f,ID"},
        BadLine{"a,1,2,0\nu,1\n", "traces/x.trace:2: expected u,ID,STREAM"},
        BadLine{"a,1,2,0\nu,1,0,0\n", "traces/x.trace:2: expected u,ID,STREAM"},
        BadLine{"a,1,2,0\nu,1,x\n", "traces/x.trace:2: expected u,ID,STREAM"},
        BadLine{"s\n", "traces/x.trace:1: expected s,STREAM"},
        BadLine{"s,1,2\n", "traces/x.trace:1: expected s,STREAM"},
        BadLine{"s,-1\n", "traces/x.trace:1: expected s,STREAM"},
        BadLine{"a,1,2,0\nq,1\n", "traces/x.trace:2: unknown event 'q,1'"},
        BadLine{"A,1,2,0\n", "traces/x.trace:1: unknown event 'A,1,2,0'"},
        BadLine{" a,1,2,0\n", "traces/x.trace:1: unknown event"},
        BadLine{"a,1,2,0\na,1,2,0\n",
                "traces/x.trace:2: ID 1 is already live (allocated at line 1 and not freed)"},
        BadLine{"f,5\n", "traces/x.trace:1: free of ID 5, which is not live"},
        BadLine{"a,1,2,0\nf,1\nf,1\n", "traces/x.trace:3: free of ID 1, which is not live"},
        BadLine{"a,1,2,0\nf,1\nu,1,0\n", "traces/x.trace:3: use of ID 1, which is not live"},
        BadLine{"# trace v3: something else\n",
                "traces/x.trace:1: trace format v3 is not supported (this reader knows v1 and v2)"},
        // v2: tags, sleep and wake.
        BadLine{"n,1\n", "traces/x.trace:1: expected n,TAG,NAME, got 'n,1'"},
        BadLine{"n,0,w\n", "traces/x.trace:1: tag number 0 is out of range (1 to 65535"},
        BadLine{"n,65536,w\n", "traces/x.trace:1: tag number 65536 is out of range"},
        BadLine{"n,1,bad name\n", "traces/x.trace:1: tag name 'bad name' cannot be a tag: "},
        BadLine{"n,1,w\nn,1,x\n", "traces/x.trace:2: tag number 1 is already declared (line 1)"},
        BadLine{"n,1,w\nn,2,w\n", "traces/x.trace:2: tag 'w' is already number 1 (line 1)"},
        BadLine{"a,1,2,0,3\n", "traces/x.trace:1: tag 3 is not declared"},
        BadLine{"a,1,2,0,x\n", "traces/x.trace:1: expected a,ID,SIZE,STREAM[,TAG[,POOL]], got"},
        BadLine{"n,1,w\nw,1\nw,1\n",
                "traces/x.trace:3: wake of tag 'w' (number 1), which is not asleep"},
        BadLine{"z,0,offload\n", "traces/x.trace:1: tag 0 is no tag: it cannot sleep or wake"},
        BadLine{"z,4,offload\n", "traces/x.trace:1: tag 4 is not declared"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,keep\n",
                "traces/x.trace:3: expected z,TAG,MODE (MODE offload or discard), got 'z,1,keep'"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1\n", "traces/x.trace:3: expected z,TAG,MODE"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,offload\nz,1,discard\n",
                "traces/x.trace:4: sleep of tag 'w' (number 1), asleep already since line 3"},
        BadLine{"n,1,w\na,1,2,0,1\nw,1\n",
                "traces/x.trace:3: wake of tag 'w' (number 1), which is not asleep"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,offload\na,2,2,0,1\n",
                "traces/x.trace:4: allocation under tag 'w' (number 1), asleep since line 3 "
                "(requests under a sleeping tag are refused)"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,offload\nw,1,65536\n",
                "traces/x.trace:4: stream 65536 is too large"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,offload\nw,1,0,0\n",
                "traces/x.trace:4: expected w,TAG[,STREAM], got 'w,1,0,0'"},
        BadLine{"n,1,w\na,1,2,0,1\nz,1,offload\nw\n", "traces/x.trace:4: expected w,TAG[,STREAM]"},
        BadLine{"c,1\n", "traces/x.trace:1: expected c, got 'c,1'"}));

// v2: a tag's blocks need no device memory while it sleeps, so the peak of live bytes
// (the fit's floor) counts awake tags only; a sleeping tag's blocks may be freed.
TEST(TraceReader, ParsesTagsSleepsAndWakes) {
  const Trace t = parse_trace_text(
      "# trace v2: a,ID,SIZE,STREAM[,TAG] | f,ID | u,ID,STREAM | s,STREAM | n,TAG,NAME | "
      "z,TAG,MODE | w,TAG[,STREAM] | c\n"
      "n,1,weights\n"
      "a,0,1000,0,1\n"
      "n,2,kv\n"
      "a,1,300,0,2\n"
      "a,2,50,0\n"     // untagged
      "a,3,20,0,0\n"   // tag 0: untagged too
      "z,1,offload\n"  // awake live: 300 + 50 + 20
      "z,2,discard\n"  // 70
      "a,4,500,1\n"    // 570
      "f,1\n"          // kv asleep: still 570
      "w,2,1\n"        // kv wakes with nothing live, its copies on stream 1
      "f,4\n"
      "c\n"    // the program emptied the cache
      "w,1\n"  // 1070
      "f,0\n",
      "t.trace");
  EXPECT_EQ(t.allocations, 5u);
  EXPECT_EQ(t.sleeps, 2u);
  EXPECT_EQ(t.wakes, 2u);
  EXPECT_EQ(t.tag_names, (std::vector<std::string>{"", "weights", "kv"}));
  EXPECT_EQ(t.alloc_tags, (std::vector<std::uint16_t>{1, 2, 0, 0, 0}));
  EXPECT_EQ(t.peak_live_bytes, 1370u);  // before the sleeps; 1070 after
  EXPECT_EQ(t.streams, 2u);
  EXPECT_EQ(t.empty_caches, 1u);
  ASSERT_EQ(t.events.size(), 13u);
  EXPECT_EQ(t.events[10].kind, EventKind::empty_cache);
  EXPECT_EQ(t.events[4].kind, EventKind::sleep);
  EXPECT_EQ(t.events[4].slot, 1u);
  EXPECT_EQ(t.events[4].size, kSleepOffload);
  EXPECT_EQ(t.events[5].size, kSleepDiscard);
  EXPECT_EQ(t.events[8].kind, EventKind::wake);
  EXPECT_EQ(t.events[8].slot, 2u);
  EXPECT_EQ(t.events[8].size, kWakeOnStream);
  EXPECT_EQ(t.events[8].stream, 1u);
  EXPECT_EQ(t.events[11].size, kWakeOnHost);

  // While weights sleeps, 700 live bytes are awake at most: the floor a fit starts at.
  const Trace asleep =
      parse_trace_text("n,1,weights\na,0,1000,0,1\nz,1,offload\na,1,700,0\nf,1\nw,1\n", "s");
  EXPECT_EQ(asleep.peak_live_bytes, 1000u);
  const Trace bigger =
      parse_trace_text("n,1,weights\na,0,1000,0,1\nz,1,offload\na,1,1200,0\nf,1\nw,1\n", "s");
  EXPECT_EQ(bigger.peak_live_bytes, 1200u);
  // Recording may begin while a tag sleeps, or after its blocks were made: its first
  // line may wake it (nothing to wake in a replay) or put it to sleep.
  const Trace late = parse_trace_text("n,1,weights\nw,1,3\nz,1,discard\nw,1\n", "late");
  ASSERT_EQ(late.events.size(), 3u);
  EXPECT_EQ(late.events[0].size, kWakeNotAsleep);
  EXPECT_EQ(late.events[2].size, kWakeOnHost);
  EXPECT_TRUE(late.alloc_tags.empty());
  // A trace without tags has none of the tag tables.
  const Trace plain = parse_trace_text("a,0,8,0\n", "p");
  EXPECT_TRUE(plain.tag_names.empty());
  EXPECT_TRUE(plain.alloc_tags.empty());
}

TEST(TraceReader, ReadsPlainAndGzipFilesAlike) {
  TempDir dir;
  const std::string text = test::sample_trace_text();
  const std::string plain = dir.file("s.trace");
  const std::string gz = dir.file("s.trace.gz");
  test::write_plain(plain, text);
  test::write_gzip(gz, text);

  const Trace a = read_trace(plain);
  const Trace b = read_trace(gz);
  const Trace c = parse_trace_text(text, "mem");
  ASSERT_EQ(a.events.size(), c.events.size());
  ASSERT_EQ(b.events.size(), c.events.size());
  for (std::size_t i = 0; i < c.events.size(); ++i) {
    EXPECT_EQ(a.events[i].slot, c.events[i].slot);
    EXPECT_EQ(b.events[i].size, c.events[i].size);
    EXPECT_EQ(b.events[i].kind, c.events[i].kind);
  }
  EXPECT_EQ(b.path, gz);
}

TEST(TraceReader, GzipErrorNamesLine) {
  TempDir dir;
  std::string text = "# header\n";
  for (int i = 0; i < 50; ++i) text += "a," + std::to_string(i) + ",64,0\n";
  text += "f,999\n";
  const std::string gz = dir.file("bad.trace.gz");
  test::write_gzip(gz, text);
  try {
    read_trace(gz);
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()), gz + ":52: free of ID 999, which is not live (never " +
                                         "allocated, or already freed)");
  }
}

TEST(TraceReader, LongLinesKeepLineNumbers) {
  TempDir dir;
  // Lines as long as allowed, across the reader's 16 KiB reads.
  std::string text;
  for (int i = 0; i < 9; ++i) text += "# " + std::string(kMaxLineBytes - 2, 'x') + "\n";
  text += "a,1,8,0\na,2,8," + std::string(kMaxLineBytes - 6, '1') + "\n";
  const std::string gz = dir.file("long.trace.gz");
  test::write_gzip(gz, text);
  try {
    read_trace(gz);
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(gz + ":11: expected a,ID,SIZE,STREAM", 0), 0u)
        << e.what();
  }
}

// A line longer than kMaxLineBytes is refused with its number once that many bytes
// are read, never held whole: a file of one huge line (a gigabyte of text, or a small
// gzip of it) costs a few KiB. Plain, gzip and text in memory alike.
TEST(TraceReader, OverlongLineIsRefusedAtTheLimit) {
  TempDir dir;
  const std::string text = "# trace v1\na,1,8,0\n" + std::string(1u << 20, '7');
  const std::string plain = dir.file("long.trace");
  const std::string gz = dir.file("long.trace.gz");
  test::write_plain(plain, text);
  test::write_gzip(gz, text);
  const std::string reason =
      ":3: line longer than 4096 bytes (a trace line has at most 71, "
      "comments at most 4096): '" +
      std::string(60, '7') + "...'";
  for (const std::string& path : {plain, gz}) {
    try {
      read_trace(path);
      FAIL() << path;
    } catch (const TraceError& e) {
      EXPECT_EQ(std::string(e.what()), path + reason);
    }
  }
  EXPECT_THROW(parse_trace_text(text, "mem"), TraceError);
  // The limit itself is allowed.
  EXPECT_EQ(
      parse_trace_text("#" + std::string(kMaxLineBytes - 1, ' ') + "\na,1,8,0\n", "m").allocations,
      1u);
}

// Input that is not text never reaches the terminal raw: plain binary data is named as
// such with its first bytes escaped, and a bad line deeper in quotes its bytes escaped.
TEST(TraceReader, BinaryInputIsNamedAndEscaped) {
  TempDir dir;
  const std::string elf = dir.file("a.out");
  test::write_plain(elf, std::string("\x7f"
                                     "ELF\x02\x01\x01\0\0\0",
                                     11) +
                             std::string(100, '\0'));
  try {
    read_trace(elf);
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        elf + ": not a trace (binary data): it starts '\\x7fELF\\x02\\x01\\x01" +
            [] {
              std::string zeros;
              for (int i = 0; i < 53; ++i) zeros += "\\x00";
              return zeros;
            }() +
            "...'");
  }
  const std::string bad = dir.file("bad.trace");
  test::write_plain(bad, std::string(600, '\n') + "x\x1b]0;title\x07\xff,1\n");
  try {
    read_trace(bad);
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind(bad + ":601: unknown event 'x\\x1b]0;title\\x07\\xff,1' ", 0),
        0u)
        << e.what();
  }
}

TEST(TraceReader, MissingFilesAndDirectories) {
  TempDir dir;
  EXPECT_THROW(
      {
        try {
          read_trace(dir.file("nope.trace"));
        } catch (const TraceError& e) {
          EXPECT_NE(std::string(e.what()).find("nope.trace: no such file"), std::string::npos);
          throw;
        }
      },
      TraceError);
  EXPECT_THROW(read_trace(dir.path()), TraceError);
}

std::size_t count_lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

// A gzip stream cut in half is reported as damaged gzip at the first line not read
// whole, never as the partial line the cut leaves ("expected a,ID,SIZE,STREAM, got
// 'a,3'").
TEST(TraceReader, TruncatedGzipIsReportedAsSuch) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "a," + std::to_string(i) + ",512,0\n";
  const std::string gz = dir.file("cut.trace.gz");
  test::write_gzip(gz, text);
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) / 2);
  // What zlib can still decompress: that many lines are whole.
  const std::string readable = test::read_gzip(gz);
  ASSERT_GT(readable.size(), 0u);
  ASSERT_LT(readable.size(), text.size());
  ASSERT_NE(readable.back(), '\n') << "the cut should fall inside a line";
  try {
    read_trace(gz);
    FAIL() << "truncated gzip accepted";
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()), gz + ": corrupt or truncated gzip data at line " +
                                         std::to_string(count_lines(readable) + 1) +
                                         ": unexpected end of file");
  }
}

// Damage inside the stream: whatever garbage it decompresses to, the report names
// the gzip damage, not a malformed line.
TEST(TraceReader, CorruptGzipIsReportedAsSuch) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += "a," + std::to_string(i) + "," + std::to_string(512 + i % 977) + ",0\nf," +
            std::to_string(i) + "\n";
  const std::string gz = dir.file("bad.trace.gz");
  test::write_gzip(gz, text);
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (std::size_t i = bytes.size() / 2; i < bytes.size() / 2 + 64; ++i)
    bytes[i] = static_cast<char>(~bytes[i]);
  test::write_plain(gz, bytes);
  try {
    read_trace(gz);
    FAIL() << "corrupt gzip accepted";
  } catch (const TraceError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(gz + ": corrupt or truncated gzip data at line ", 0), 0u) << what;
    EXPECT_EQ(what.find("expected"), std::string::npos) << what;
  }
}

// "-" reads standard input, plain or gzip alike; messages call it <stdin>.
TEST(TraceReader, StandardInput) {
  TempDir dir;
  const std::string text = test::sample_trace_text();
  test::write_plain(dir.file("s.trace"), text);
  test::write_gzip(dir.file("s.trace.gz"), text);
  test::write_plain(dir.file("bad.trace"), "a,1,2,0\nf,7\n");
  auto from_stdin = [&](const std::string& file) {
    const int saved = dup(STDIN_FILENO);
    const int fd = open(file.c_str(), O_RDONLY);
    dup2(fd, STDIN_FILENO);
    close(fd);
    struct Restore {
      int saved;
      ~Restore() {
        dup2(saved, STDIN_FILENO);
        close(saved);
      }
    } restore{saved};
    return read_trace(kStdinPath);
  };
  for (const char* name : {"s.trace", "s.trace.gz"}) {
    const Trace t = from_stdin(dir.file(name));
    EXPECT_EQ(t.path, kStdinName);
    EXPECT_EQ(t.events.size(), 10u) << name;
    EXPECT_EQ(t.streams, 2u);
  }
  try {
    from_stdin(dir.file("bad.trace"));
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("<stdin>:2: free of ID 7", 0), 0u) << e.what();
  }
}

// The traces shipped in traces/ (CTest sets RESERVOIR_TRACES): counts from
// traces/README.md; the peak of live requested bytes equals PyTorch's peak requested.
TEST(TraceReader, RealTraces) {
  const char* dir = std::getenv("RESERVOIR_TRACES");
  if (dir == nullptr) GTEST_SKIP() << "RESERVOIR_TRACES not set";
  const std::string path = std::string(dir) + "/resnet50_train.trace.gz";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing";
  const Trace t = read_trace(path);
  EXPECT_EQ(t.events.size(), 23975u);
  EXPECT_EQ(t.allocations, 11989u);
  EXPECT_EQ(t.streams, 1u);
  EXPECT_EQ(t.peak_live_bytes, 3192592912u);
  EXPECT_EQ(t.live_at_end, 3u);

  const Trace m = read_trace(std::string(dir) + "/multistream_train_overlap.trace.gz");
  EXPECT_EQ(m.events.size(), 13455u);
  EXPECT_EQ(m.streams, 3u);
  EXPECT_EQ(m.peak_live_bytes, 858138251u);
}

}  // namespace
}  // namespace reservoir::replay
