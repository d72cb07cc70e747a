// Outputs and command line of reservoir-replay, on hand-made results (no engine):
// JSON keys, table, explanations, plots, byte counts, options.
#include "report.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "explain.hpp"
#include "plot.hpp"
#include "plot_png.hpp"
#include "plot_svg.hpp"
#include "replay_test_util.hpp"
#include "reservoir/version.hpp"

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
    expected_fit.push_back("fit_fraction");
  }
  EXPECT_EQ(keys_of_objects(jf), expected_fit) << jf;
  EXPECT_NE(jf.find("\"fit_capacity\": 14880000000"), std::string::npos);
  EXPECT_NE(jf.find("\"fit_capacity\": null, \"fit_ratio\": null, \"fit_fraction\": null"),
            std::string::npos);
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
  results[1].first_oom = OomFacts{};
  results[1].first_oom->requested = std::uint64_t{2} << 30;
  const std::string table = format_table(t, std::size_t{141} << 30, results, true);
  EXPECT_NE(table.find("trace gpt2.trace.gz: 3 events, 2 allocations, 1 stream"), std::string::npos)
      << table;
  EXPECT_NE(table.find("141.00 GiB"), std::string::npos);
  EXPECT_NE(table.find("default"), std::string::npos);
  EXPECT_NE(table.find("max_split_size_mb:256"), std::string::npos);
  EXPECT_NE(table.find("14,902,362,112 (13.88 GiB)"), std::string::npos) << table;
  EXPECT_NE(table.find("1.1417"), std::string::npos);
  EXPECT_NE(table.find("does not fit"), std::string::npos);
  EXPECT_EQ(table.find("calls:"), std::string::npos);  // no --calls, no call rows
  results[1].calls = {{CallKind::map, 2202, 3148860}, {CallKind::set_access, 284, 62480000}};
  const std::string with_calls = format_table(t, std::size_t{141} << 30, results, false);
  EXPECT_NE(with_calls.find("calls: map"), std::string::npos) << with_calls;
  EXPECT_NE(with_calls.find("2,202 x 1.43 us"), std::string::npos) << with_calls;
  EXPECT_NE(with_calls.find("284 x 220 us"), std::string::npos) << with_calls;
  EXPECT_NE(table.find("first OOM under max_split_size_mb:256: event 0 (an allocation of 2.00 GiB"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("fit memory fraction"), std::string::npos);
}

// --- What the report says in words (explain.hpp) ---

OomFacts oom_on_stream_3() {
  OomFacts o;
  o.event = 12345;
  o.stream = 3;
  o.requested = std::uint64_t{3} << 30;
  o.device_request = std::uint64_t{3} << 30;
  o.device_total = std::uint64_t{16} << 30;
  o.device_free = std::uint64_t{1} << 30;
  o.reserved = std::uint64_t{15} << 30;
  o.allocated = std::uint64_t{14} << 30;
  return o;
}

// In the trace's terms (event, trace stream), with advice that names the tool's own
// options: not the engine's stream handle, environment variable or command.
TEST(Explain, OomSpeaksOfTheTrace) {
  const std::string m = describe_oom(oom_on_stream_3());
  EXPECT_NE(m.find("event 12,345 (an allocation of 3.00 GiB on trace stream 3) failed"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("1.00 GiB free of 16.00 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("held 15.00 GiB: 14.00 GiB allocated, 1.00 GiB cached"), std::string::npos) << m;
  EXPECT_NE(m.find("larger --capacity"), std::string::npos) << m;
  for (const char* foreign : {"0x", "RESERVOIR_ALLOC_CONF", "reservoir-replay", "memory fraction"})
    EXPECT_EQ(m.find(foreign), std::string::npos) << foreign << " in: " << m;
}

TEST(Explain, OomAdviceFollowsTheFacts) {
  OomFacts o = oom_on_stream_3();
  o.allocated = std::uint64_t{10} << 30;  // 5 GiB cached, more than the request
  EXPECT_NE(describe_oom(o).find("compare --config expandable_segments:True"), std::string::npos);
  o.expandable_segments = true;  // already on: not suggested again
  EXPECT_EQ(describe_oom(o).find("expandable_segments:True"), std::string::npos);
  o.allowed = std::uint64_t{15} << 30;
  o.fraction = 0.9375;
  EXPECT_NE(describe_oom(o).find("the memory fraction 0.9375 allows 15.00 GiB"), std::string::npos);
  o.device_request = 0;  // refused before any device call
  EXPECT_NE(describe_oom(o).find("larger than any device"), std::string::npos);
}

ReplayResult with_ratio(double ratio) {
  ReplayResult r = sample("max_split_size_mb:256", 0);
  r.peak_requested = std::uint64_t{13} << 30;
  r.peak_allocated = r.peak_requested + (std::uint64_t{1} << 28);
  r.peak_reserved = static_cast<std::uint64_t>(ratio * static_cast<double>(r.peak_requested));
  r.ratio = ratio;
  return r;
}

TEST(Explain, OrdinaryRatiosAreNotExplained) {
  EXPECT_EQ(explain_ratio(with_ratio(1.14)), "");
  EXPECT_EQ(explain_ratio(with_ratio(kExplainRatio - 0.01)), "");
  EXPECT_EQ(explain_ratio(ReplayResult{}), "");
}

TEST(Explain, OversizeSegmentsThatAreNeverSplit) {
  ReplayResult r = with_ratio(6.99);
  r.cache.max_split_size = std::uint64_t{256} << 20;
  r.cache.max_non_split_rounding = std::uint64_t{20} << 20;
  r.cache.oversize_segments_peak = 88;
  r.cache.oversize_allocations_peak = 3;
  r.cache.at_peak = true;
  r.cache.oversize_segment_count = 88;
  r.cache.oversize_segment_bytes = r.peak_reserved * 9 / 10;
  const std::string why = explain_ratio(r);
  EXPECT_EQ(why.rfind("why max_split_size_mb:256 reserves 6.99x requested: blocks of 256.00 MiB "
                      "and more are never split",
                      0),
            0u)
      << why;
  EXPECT_NE(why.find("88 such segments"), std::string::npos) << why;
  EXPECT_NE(why.find("90% of peak reserved"), std::string::npos) << why;
  EXPECT_NE(why.find("at most 3 oversize allocations"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);  // one line

  r.cache.at_peak = false;  // only the count is known: a lower bound
  r.cache.oversize_segments_peak = 200;
  EXPECT_NE(explain_ratio(r).find("200 such segments (at least 50.00 GiB"), std::string::npos)
      << explain_ratio(r);
}

TEST(Explain, FragmentationRoundingAndCachedSegments) {
  ReplayResult r = with_ratio(3.0);
  r.cache.inactive_split_bytes_peak = std::uint64_t{20} << 30;
  EXPECT_NE(explain_ratio(r).find("sat free inside split segments"), std::string::npos);

  r.cache.inactive_split_bytes_peak = 0;
  r.peak_allocated = std::uint64_t{30} << 30;
  EXPECT_NE(explain_ratio(r).find("rounding"), std::string::npos) << explain_ratio(r);

  r.peak_allocated = r.peak_requested;
  EXPECT_NE(explain_ratio(r).find("whole cached segments"), std::string::npos) << explain_ratio(r);
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
  EXPECT_NE(svg.find("gpt2.trace.gz"), std::string::npos);                 // title
  EXPECT_NE(svg.find(">GiB<"), std::string::npos);                         // y axis unit
  EXPECT_NE(svg.find("event index"), std::string::npos);                   // x axis
  EXPECT_NE(svg.find(">requested ("), std::string::npos);                  // legend
  EXPECT_NE(svg.find(">reserved ("), std::string::npos);                   // legend
  EXPECT_NE(svg.find(">default: peak reserved"), std::string::npos);       // panel titles
  EXPECT_NE(svg.find(">a&lt;b&amp;c: peak reserved"), std::string::npos);  // escaped
  // One panel per config: requested and reserved in each.
  std::size_t lines = 0;
  for (std::size_t p = svg.find("<polyline"); p != std::string::npos;
       p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 4u);
}

// A setting reserving 85 GiB must not squash one reserving 13 GiB: each panel is
// scaled to its own data, which fills at least half of its height.
TEST(Plot, EachSettingHasItsOwnScale) {
  std::vector<ReplayResult> results = {sample("max_split_size_mb:256", 91215626240ull),
                                       sample("", 14902362112ull)};
  for (ReplayResult& r : results) {  // timelines rising to each result's peaks
    const std::size_t n = r.timeline.reserved.size();
    for (std::size_t i = 0; i < n; ++i) {
      r.timeline.reserved[i] = r.peak_reserved / n * (i + 1);
      r.timeline.requested[i] = r.peak_requested / n * (i + 1);
    }
  }
  const ChartLayout l = layout_chart(results);
  ASSERT_EQ(l.panels.size(), 2u);
  for (const Panel& p : l.panels) {
    const auto& t = p.result->timeline;
    const double top =
        static_cast<double>(std::max(*std::max_element(t.reserved.begin(), t.reserved.end()),
                                     *std::max_element(t.requested.begin(), t.requested.end()))) /
        p.y.unit_bytes;
    EXPECT_GE(p.y.max, top) << p.title;
    EXPECT_LE(p.y.max, 2 * top) << p.title;
    EXPECT_EQ(p.y.unit, "GiB");
  }
  EXPECT_GT(l.panels[0].y.max, 2 * l.panels[1].y.max);
  EXPECT_GE(l.panels[1].top, l.panels[0].top + l.panels[0].height);  // stacked, no overlap
  EXPECT_GE(l.height, l.panels[1].top + l.panels[1].height);

  // Small traces are drawn in MiB, not in hundredths of a GiB.
  ReplayResult small = sample("", 0);
  for (auto& v : small.timeline.reserved) v = std::uint64_t{36} << 20;
  small.timeline.requested.assign(small.timeline.reserved.size(), std::uint64_t{30} << 20);
  EXPECT_EQ(layout_chart({small}).panels[0].y.unit, "MiB");
}

TEST(Plot, FormatFollowsTheFileName) {
  EXPECT_EQ(plot_format("a/b.svg"), PlotFormat::svg);
  EXPECT_EQ(plot_format("B.PNG"), PlotFormat::png);
  EXPECT_FALSE(plot_format("plot.jpg"));
  EXPECT_FALSE(plot_format("dir.svg/plot"));
  EXPECT_NE(plot_refusal("plot.jpg").find("must end in .svg or .png"), std::string::npos);
  EXPECT_EQ(plot_refusal("plot.svg"), "");
}

// With cairo, a .png file is a PNG of the chart's size; without it, refused with what
// to install. (scripts/test.sh builds one flavour each way.)
TEST(Plot, PngIsAPngOrRefused) {
  const std::vector<ReplayResult> results = {sample("", 14902362112ull)};
  test::TempDir dir;
  const std::string path = dir.file("p.png");
  if (!png_supported()) {
    EXPECT_NE(plot_refusal(path).find("install libcairo2-dev"), std::string::npos);
    EXPECT_THROW(write_plot(path, "t", results), std::runtime_error);
    return;
  }
  EXPECT_EQ(plot_refusal(path), "");
  write_plot(path, "t", results);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](std::size_t at) {
    return (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at])) << 24) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + 1])) << 16) |
           (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + 2])) << 8) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + 3]));
  };
  const ChartLayout l = layout_chart(results);
  EXPECT_EQ(be32(16), static_cast<std::uint32_t>(l.width));   // IHDR width
  EXPECT_EQ(be32(20), static_cast<std::uint32_t>(l.height));  // IHDR height
  EXPECT_EQ(bytes.find("<svg"), std::string::npos);
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
  EXPECT_FALSE(o.calls);
  const char* calls[] = {"reservoir-replay", "t.trace", "--calls"};
  EXPECT_TRUE(parse_cli(3, calls).calls);
  EXPECT_EQ(o.plot, "out.svg");

  const char* plain[] = {"reservoir-replay", "t.trace"};
  const CliOptions d = parse_cli(2, plain);
  EXPECT_EQ(d.configs, std::vector<std::string>{""});
  EXPECT_EQ(d.capacity, kDefaultSimCapacity);
  EXPECT_EQ(d.device, "sim");
  EXPECT_FALSE(d.fit);

  const char* piped[] = {"reservoir-replay", "--device", "auto", "-"};
  const CliOptions p = parse_cli(4, piped);
  EXPECT_EQ(p.trace, "-");
  EXPECT_EQ(p.device, "auto");

  const char* kv[] = {"reservoir-replay", "t.trace", "--capacity", "80G", "--kv-cache", "128KiB",
                      "--kv-layers", "32"};
  const CliOptions k = parse_cli(static_cast<int>(std::size(kv)), kv);
  EXPECT_EQ(k.kv_bytes_per_token, 128u * 1024);
  EXPECT_EQ(k.kv_budget, std::size_t{80} << 30);  // --capacity's
  EXPECT_EQ(k.kv_layers, 32u);
  const char* budget[] = {"reservoir-replay", "t.trace", "--kv-cache", "1M", "--kv-budget", "40G"};
  EXPECT_EQ(parse_cli(6, budget).kv_budget, std::size_t{40} << 30);
  EXPECT_EQ(d.kv_bytes_per_token, 0u);

  const char* version[] = {"reservoir-replay", "--version"};
  EXPECT_TRUE(parse_cli(2, version).version);
  EXPECT_EQ(version_text(), std::string("reservoir-replay ") + reservoir::version());
}

// Every option once, the usage line once, nothing wider than a terminal.
TEST(Cli, HelpIsClean) {
  const std::string help = help_text();
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t p = help.find(what); p != std::string::npos; p = help.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("Usage: reservoir-replay [OPTIONS] TRACE\n"), 1u) << help;
  EXPECT_EQ(count("Usage"), 1u) << help;
  for (const char* option : {"--config STR", "--capacity BYTES", "--fit ", "--json ", "--plot FILE",
                             "--device DEVICE", "--version", "-h,--help"})
    EXPECT_EQ(count(std::string("\n  ") + option), 1u) << option << "\n" << help;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 88u) << line;
}

TEST(Cli, ProcessSettingsAreRefusedNamingTheOption) {
  EXPECT_EQ(config_refusal("max_split_size_mb:256,expandable_segments:True", true), "");
  EXPECT_EQ(config_refusal("per_process_memory_fraction:0.5", false), "");
  EXPECT_EQ(config_refusal("not key value", false), "");  // left to Config::parse
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"sim_capacity:8GiB", "use --capacity"},
      {"expandable_segments:True,device:cuda", "use --device"},
      {"record_trace:/tmp/t.gz", "remove the key"},
      {"oom_snapshot:/tmp/s.pickle", "remove the key"},
      {"sim_completion:eager", "--device-lags"},
      {"sim_pace:3", "--device-lags"}};
  for (const auto& [config, advice] : refused) {
    const std::string why = config_refusal(config, false);
    EXPECT_EQ(why.rfind("--config '" + config + "': ", 0), 0u) << why;
    EXPECT_NE(why.find(advice), std::string::npos) << why;
  }
  EXPECT_NE(config_refusal("per_process_memory_fraction:0.5", true).find("--fit searches"),
            std::string::npos);
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
  EXPECT_EQ(message({"t", "--plot", ""}), "--plot needs a file name");
  EXPECT_EQ(message({"t", "--plot="}), "--plot needs a value");
  EXPECT_EQ(message({"t", "--fit=3"}), "--fit takes no value");
  EXPECT_EQ(message({"t", "--device", "gpu"}), "--device: 'gpu' is not one of sim, cuda, auto");
  EXPECT_NE(message({"t", "--kv-cache", "0"}).find("--kv-cache: '0' is not a byte count"),
            std::string::npos);
  EXPECT_EQ(message({"t", "--kv-budget", "8G"}),
            "--kv-budget: the budget of --kv-cache, which was not given");
  EXPECT_EQ(message({"t", "--kv-layers", "4"}),
            "--kv-layers: the layers of --kv-cache, which was not given");
  EXPECT_NE(message({"t", "--kv-cache", "1K", "--kv-layers", "0"}).find("--kv-layers"),
            std::string::npos);
  EXPECT_EQ(message({"--help"}), "no error");
  EXPECT_EQ(message({"--version", "--bogus"}), "no error");
}

}  // namespace
}  // namespace reservoir::replay
