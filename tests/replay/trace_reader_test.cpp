// Trace format v1 parser: good lines, every kind of bad line (with its line number),
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
        BadLine{"a,1,2,0\na,2,3\n", "traces/x.trace:2: expected a,ID,SIZE,STREAM, got 'a,2,3'"},
        BadLine{"# c\n\na,1,2,0,9\n", "traces/x.trace:3: expected a,ID,SIZE,STREAM"},
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
        BadLine{"a,1,2,0\nx,1\n", "traces/x.trace:2: unknown event 'x,1'"},
        BadLine{"A,1,2,0\n", "traces/x.trace:1: unknown event 'A,1,2,0'"},
        BadLine{" a,1,2,0\n", "traces/x.trace:1: unknown event"},
        BadLine{"a,1,2,0\na,1,2,0\n",
                "traces/x.trace:2: ID 1 is already live (allocated at line 1 and not freed)"},
        BadLine{"f,5\n", "traces/x.trace:1: free of ID 5, which is not live"},
        BadLine{"a,1,2,0\nf,1\nf,1\n", "traces/x.trace:3: free of ID 1, which is not live"},
        BadLine{"a,1,2,0\nf,1\nu,1,0\n", "traces/x.trace:3: use of ID 1, which is not live"},
        BadLine{"# trace v2: something else\n",
                "traces/x.trace:1: trace format v2 is not supported"}));

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
      ":3: line longer than 4096 bytes (a trace line has at most 49, "
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
