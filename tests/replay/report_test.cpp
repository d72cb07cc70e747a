// Outputs and command line of reservoir-replay, on hand-made results (no engine):
// JSON keys, table, SVG, byte counts, options.
#include "report.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli.hpp"
#include "plot_svg.hpp"

namespace reservoir::replay {
namespace {

ReplayResult sample(const std::string& config, std::uint64_t reserved) {
  ReplayResult r;
  r.config = config;
  r.events = 86675;
  r.peak_requested = 13053261360ull;
  r.peak_allocated = 13079198208ull;
  r.peak_reserved = reserved;
  r.ratio = static_cast<double>(reserved) / static_cast<double>(r.peak_requested);
  r.device_allocs = 161;
  r.device_frees = 3;
  r.device_time_us = 24450.5;
  r.ns_per_event = 123.4;
  r.timeline.bucket = 10;
  for (std::uint64_t i = 0; i < 50; ++i) {
    r.timeline.requested.push_back(i << 28);
    r.timeline.reserved.push_back((i << 28) + (reserved >> 8));
  }
  return r;
}

// Every "name": in order (the values written here hold no such pattern).
std::vector<std::string> keys_of_objects(const std::string& json) {
  std::vector<std::string> keys;
  for (std::size_t p = json.find("\":"); p != std::string::npos; p = json.find("\":", p + 1)) {
    const std::size_t open = json.rfind('"', p - 1);
    keys.push_back(json.substr(open + 1, p - open - 1));
  }
  return keys;
}

TEST(Report, JsonHasExactlyTheDocumentedKeys) {
  const std::vector<ReplayResult> results = {sample("", 14902362112ull),
                                             sample("max_split_size_mb:256", 14000000000ull)};
  const std::vector<std::string> base = {
      "config",        "events",       "peak_requested", "peak_allocated", "peak_reserved", "ratio",
      "device_allocs", "device_frees", "device_time_us", "ooms",           "ns_per_event"};
  std::vector<std::string> expected;
  for (int i = 0; i < 2; ++i) expected.insert(expected.end(), base.begin(), base.end());
  const std::string json = format_json(results, false);
  EXPECT_EQ(keys_of_objects(json), expected) << json;
  EXPECT_EQ(json.front(), '[');
  EXPECT_NE(json.find("\"config\": \"\""), std::string::npos);
  EXPECT_NE(json.find("\"peak_reserved\": 14902362112"), std::string::npos);

  std::vector<ReplayResult> fitted = results;
  fitted[0].fit_capacity = 14880000000ull;
  fitted[0].fit_ratio = 1.14;
  const std::string jf = format_json(fitted, true);
  std::vector<std::string> expected_fit;
  for (int i = 0; i < 2; ++i) {
    expected_fit.insert(expected_fit.end(), base.begin(), base.end());
    expected_fit.push_back("fit_capacity");
    expected_fit.push_back("fit_ratio");
  }
  EXPECT_EQ(keys_of_objects(jf), expected_fit) << jf;
  EXPECT_NE(jf.find("\"fit_capacity\": 14880000000"), std::string::npos);
  EXPECT_NE(jf.find("\"fit_capacity\": null, \"fit_ratio\": null"), std::string::npos);
  EXPECT_EQ(format_json({}, false), "[]\n");
}

TEST(Report, JsonStringsAreEscaped) {
  EXPECT_EQ(json_string("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

TEST(Report, TableHasOneColumnPerConfig) {
  Trace t;
  t.path = "/some/dir/gpt2.trace.gz";
  t.events.resize(3);
  t.allocations = 2;
  t.streams = 1;
  std::vector<ReplayResult> results = {sample("", 14902362112ull),
                                       sample("max_split_size_mb:256", 14000000000ull)};
  results[1].ooms = 2;
  results[1].first_oom = "out of memory: asked 2 GiB";
  const std::string table = format_table(t, std::size_t{141} << 30, results, true);
  EXPECT_NE(table.find("trace gpt2.trace.gz: 3 events, 2 allocations, 1 stream"), std::string::npos)
      << table;
  EXPECT_NE(table.find("141.00 GiB"), std::string::npos);
  EXPECT_NE(table.find("default"), std::string::npos);
  EXPECT_NE(table.find("max_split_size_mb:256"), std::string::npos);
  EXPECT_NE(table.find("14,902,362,112 (13.88 GiB)"), std::string::npos) << table;
  EXPECT_NE(table.find("1.1417"), std::string::npos);
  EXPECT_NE(table.find("does not fit"), std::string::npos);
  EXPECT_NE(table.find("first OOM under max_split_size_mb:256: out of memory"), std::string::npos);
}

TEST(Report, Numbers) {
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(14902362112ull), "14,902,362,112");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(std::uint64_t{141} << 30), "141.00 GiB");
  EXPECT_EQ(config_label(""), "default");
  EXPECT_EQ(config_label("expandable_segments:True"), "expandable_segments:True");
}

TEST(Plot, SvgIsSelfDescribing) {
  const std::vector<ReplayResult> results = {sample("", 14902362112ull),
                                             sample("a<b&c", 14000000000ull)};
  const std::string svg = render_svg("gpt2.trace.gz", results);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("gpt2.trace.gz"), std::string::npos);            // title
  EXPECT_NE(svg.find("memory (GiB)"), std::string::npos);             // y axis unit
  EXPECT_NE(svg.find("event index"), std::string::npos);              // x axis
  EXPECT_NE(svg.find(">requested<"), std::string::npos);              // one shared series
  EXPECT_NE(svg.find("reserved (default)"), std::string::npos);       // legend
  EXPECT_NE(svg.find("reserved (a&lt;b&amp;c)"), std::string::npos);  // escaped
  // requested once + reserved per config.
  std::size_t lines = 0;
  for (std::size_t p = svg.find("<polyline"); p != std::string::npos;
       p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 3u);
}

TEST(Plot, NiceSteps) {
  EXPECT_DOUBLE_EQ(nice_step(10, 5), 2);
  EXPECT_DOUBLE_EQ(nice_step(86675, 8), 10000);
  EXPECT_DOUBLE_EQ(nice_step(14, 6), 2);
  EXPECT_DOUBLE_EQ(nice_step(0.8, 6), 0.1);
  EXPECT_DOUBLE_EQ(nice_step(0, 6), 1);
}

TEST(Cli, ByteCounts) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("80GiB"), std::size_t{80} << 30);
  EXPECT_EQ(parse_bytes("141G"), std::size_t{141} << 30);
  EXPECT_EQ(parse_bytes("141gb"), std::size_t{141} << 30);
  EXPECT_EQ(parse_bytes("512MiB"), std::size_t{512} << 20);
  EXPECT_EQ(parse_bytes("1.5GiB"), std::size_t{3} << 29);
  EXPECT_EQ(parse_bytes("2T"), std::size_t{2} << 40);
  EXPECT_EQ(parse_bytes("64K"), std::size_t{64} << 10);
  EXPECT_EQ(parse_bytes("100B"), 100u);
  for (const char* bad : {"", "GiB", "-5", "0", "12X", "12GiBs", "1.2.3G", "9999999999T"})
    EXPECT_FALSE(parse_bytes(bad)) << bad;
}

TEST(Cli, Options) {
  const char* argv[] = {
      "reservoir-replay", "t.trace.gz", "--config", "",       "--config=max_split_size_mb:256",
      "--capacity",       "80GiB",      "--fit",    "--json", "--plot",
      "out.svg"};
  const CliOptions o = parse_cli(static_cast<int>(std::size(argv)), argv);
  EXPECT_EQ(o.trace, "t.trace.gz");
  EXPECT_EQ(o.configs, (std::vector<std::string>{"", "max_split_size_mb:256"}));
  EXPECT_EQ(o.capacity, std::size_t{80} << 30);
  EXPECT_TRUE(o.fit);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.plot, "out.svg");

  const char* plain[] = {"reservoir-replay", "t.trace"};
  const CliOptions d = parse_cli(2, plain);
  EXPECT_EQ(d.configs, std::vector<std::string>{""});
  EXPECT_EQ(d.capacity, kDefaultCapacity);
  EXPECT_FALSE(d.fit);
}

TEST(Cli, Errors) {
  auto message = [](std::vector<const char*> args) -> std::string {
    args.insert(args.begin(), "reservoir-replay");
    try {
      parse_cli(static_cast<int>(args.size()), args.data());
    } catch (const UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({"t", "--frobnicate"}), "unknown option '--frobnicate'");
  EXPECT_EQ(message({}), "no trace given");
  EXPECT_EQ(message({"t", "u"}), "unexpected argument 'u' (one trace at a time)");
  EXPECT_EQ(message({"t", "--config"}), "--config needs a value");
  EXPECT_NE(message({"t", "--capacity", "lots"}).find("'lots' is not a byte count"),
            std::string::npos);
  EXPECT_EQ(message({"t", "--plot="}), "--plot needs a file name");
  EXPECT_EQ(message({"--help"}), "no error");
}

}  // namespace
}  // namespace reservoir::replay
