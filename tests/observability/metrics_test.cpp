// Metrics: the Prometheus text parses line by line and holds the expected series
// with the statistics' values; the JSON carries the same data; the C API.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "observability/sim_allocator.hpp"
#include "reservoir/reservoir.h"

namespace reservoir {
namespace {

using test::kMiB;
using test::SimAllocator;
using test::temp_path;

struct Exposition {
  std::map<std::string, std::string> types;     // family -> gauge/counter
  std::map<std::string, std::int64_t> samples;  // "name{labels}" -> value
  std::vector<std::string> families_in_order;
};

// Parses the text exposition format strictly; fails the test on any other line.
Exposition parse(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")"
      R"((,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\}) (-?[0-9]+))");
  Exposition out;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      EXPECT_EQ(out.types.count(m[1]), 0u) << "family typed twice: " << line;
      out.types[m[1]] = m[2];
      out.families_in_order.push_back(m[1]);
      continue;
    }
    if (std::regex_match(line, m, sample)) {
      EXPECT_FALSE(out.families_in_order.empty()) << line;
      if (!out.families_in_order.empty()) {
        EXPECT_EQ(out.families_in_order.back(), m[1]) << line;
      }
      const std::string key = std::string(m[1]) + std::string(m[2]);
      EXPECT_EQ(out.samples.count(key), 0u) << "duplicate sample: " << line;
      out.samples[key] = std::stoll(m[4]);
      continue;
    }
    ADD_FAILURE() << "not exposition format: '" << line << "'";
  }
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  return out;
}

TEST(Metrics, PrometheusTextHasEverySeriesWithTheStatistics) {
  SimAllocator s;
  void* small = s.a.allocate(4096, 1, 0);
  void* large = s.a.allocate(3 * kMiB, 1, 0);
  s.a.deallocate(s.a.allocate(20 * kMiB, 1, 0));
  const Exposition e = parse(s.a.metrics_prometheus());
  const DeviceStats st = s.a.stats(0);

  const char* pools[] = {"all", "small", "large"};
  const std::pair<const char*, StatArray DeviceStats::*> arrays[] = {
      {"reservoir_allocated_bytes", &DeviceStats::allocated_bytes},
      {"reservoir_reserved_bytes", &DeviceStats::reserved_bytes},
      {"reservoir_active_bytes", &DeviceStats::active_bytes},
      {"reservoir_requested_bytes", &DeviceStats::requested_bytes},
      {"reservoir_inactive_split_bytes", &DeviceStats::inactive_split_bytes},
      {"reservoir_allocations", &DeviceStats::allocation},
      {"reservoir_segments", &DeviceStats::segment},
  };
  for (const auto& [name, member] : arrays) {
    for (int pool = 0; pool < kPoolKinds; ++pool) {
      const std::string labels = std::string("{device=\"0\",pool=\"") + pools[pool] + "\"}";
      const Stat& stat = (st.*member).pool[pool];
      ASSERT_EQ(e.samples.count(name + labels), 1u) << name << labels;
      EXPECT_EQ(e.samples.at(name + labels), stat.current) << name << labels;
      EXPECT_EQ(e.samples.at(std::string(name) + "_peak" + labels), stat.peak) << name << labels;
    }
    EXPECT_EQ(e.types.at(name), "gauge");
  }
  const std::string d = "{device=\"0\"}";
  EXPECT_EQ(e.samples.at("reservoir_largest_cached_block_bytes" + d),
            static_cast<std::int64_t>(s.a.largest_cached_block(0)));
  EXPECT_EQ(e.samples.at("reservoir_largest_cached_block_bytes" + d), 20 * kMiB);
  EXPECT_EQ(e.samples.at("reservoir_reserved_unallocated_bytes{device=\"0\",pool=\"large\"}"),
            st.reserved_bytes.large().current - st.allocated_bytes.large().current);
  EXPECT_EQ(e.samples.at("reservoir_device_allocs_total" + d), st.num_device_alloc);
  EXPECT_EQ(e.samples.at("reservoir_device_frees_total" + d), st.num_device_free);
  EXPECT_EQ(e.samples.at("reservoir_alloc_retries_total" + d), 0);
  EXPECT_EQ(e.samples.at("reservoir_ooms_total" + d), 0);
  for (const char* counter : {"reservoir_alloc_retries_total", "reservoir_ooms_total",
                              "reservoir_device_allocs_total", "reservoir_device_frees_total"})
    EXPECT_EQ(e.types.at(counter), "counter") << counter;
  EXPECT_EQ(e.samples.at("reservoir_allocations{device=\"0\",pool=\"all\"}"), 2);
  EXPECT_EQ(e.samples.at("reservoir_allocated_bytes{device=\"0\",pool=\"small\"}"), 4096);
  s.a.deallocate(small);
  s.a.deallocate(large);
}

TEST(Metrics, EveryDeviceIsLabelled) {
  SimOptions o;
  o.device_count = 2;
  SimAllocator s("", o);
  s.a.deallocate(s.a.allocate(4096, 1, 1));
  const Exposition e = parse(s.a.metrics_prometheus());
  EXPECT_EQ(e.samples.at("reservoir_device_allocs_total{device=\"1\"}"), 1);
  // Device 0 was never used: not reported (reporting it would create its engine).
  EXPECT_EQ(e.samples.count("reservoir_device_allocs_total{device=\"0\"}"), 0u);
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  const Exposition both = parse(s.a.metrics_prometheus());
  EXPECT_EQ(both.samples.at("reservoir_device_allocs_total{device=\"0\"}"), 1);
}

TEST(Metrics, JsonCarriesTheSameData) {
  SimAllocator s;
  void* p = s.a.allocate(3 * kMiB, 1, 0);
  const std::string json = s.a.metrics_json();
  const DeviceStats st = s.a.stats(0);
  EXPECT_EQ(json.rfind("{\"devices\":[{\"device\":0,\"stats\":{", 0), 0u) << json;
  const std::string allocated = "\"allocated_bytes\":{\"all\":{\"current\":" +
                                std::to_string(st.allocated_bytes.all().current) +
                                ",\"peak\":" + std::to_string(st.allocated_bytes.all().peak);
  EXPECT_NE(json.find(allocated), std::string::npos) << json;
  EXPECT_NE(json.find("\"num_device_alloc\":1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"largest_cached_block\":" + std::to_string(s.a.largest_cached_block(0))),
            std::string::npos);
  EXPECT_NE(json.find("\"reserved_unallocated_bytes\":{\"all\":" +
                      std::to_string(st.reserved_bytes.all().current - 3 * kMiB)),
            std::string::npos)
      << json;
  // Well-formed JSON, checked by Python's parser when there is one.
  const std::string python = RESERVOIR_PYTHON;
  if (!python.empty()) {
    const std::string path = temp_path("metrics.json");
    {
      std::FILE* f = std::fopen(path.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      std::fwrite(json.data(), 1, json.size(), f);
      std::fclose(f);
    }
    const std::string command =
        "\"" + python +
        "\" -c \"import json,sys; d=json.load(open(sys.argv[1])); "
        "assert d['devices'][0]['stats']['segment']['large']['current'] == 1\" \"" +
        path + "\"";
    EXPECT_EQ(std::system(command.c_str()), 0);
    std::remove(path.c_str());
  }
  s.a.deallocate(p);
}

// The C API uses the process-wide allocator: each test case runs in its own process
// (gtest_discover_tests), so the environment set here picks the simulated device.
TEST(MetricsCApi, HistorySnapshotAndMetrics) {
  ::setenv("RESERVOIR_ALLOC_CONF", "device:sim", 1);
  ASSERT_EQ(reservoir_record_history(1, 1000), RESERVOIR_OK);
  void* p = nullptr;
  ASSERT_EQ(reservoir_allocate(&p, 1 << 20, 0, 0), RESERVOIR_OK);
  ASSERT_EQ(reservoir_free(p), RESERVOIR_OK);

  size_t needed = 0;
  ASSERT_EQ(reservoir_metrics_prometheus(nullptr, 0, &needed), RESERVOIR_OK);
  ASSERT_GT(needed, 100u);
  std::string text(needed, '\0');
  ASSERT_EQ(reservoir_metrics_prometheus(text.data(), text.size(), &needed), RESERVOIR_OK);
  EXPECT_EQ(needed, text.size());
  EXPECT_NE(text.find("reservoir_device_allocs_total{device=\"0\"} 1\n"), std::string::npos);
  char small[16];
  ASSERT_EQ(reservoir_metrics_json(small, sizeof small, &needed), RESERVOIR_OK);
  EXPECT_EQ(std::string(small), std::string("{\"devices\":[{\"d"));  // truncated, terminated
  EXPECT_GT(needed, sizeof small);

  const std::string path = temp_path("capi.pickle");
  ASSERT_EQ(reservoir_dump_snapshot(path.c_str()), RESERVOIR_OK) << reservoir_last_error();
  const int rc = test::check_snapshot(path, "--min-entries 4");
  std::remove(path.c_str());
  if (rc != -1) {
    EXPECT_EQ(rc, 0);
  }

  EXPECT_EQ(reservoir_dump_snapshot(nullptr), RESERVOIR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(reservoir_dump_snapshot("/nonexistent-dir/x.pickle"), RESERVOIR_OK);
  EXPECT_NE(std::string(reservoir_last_error()).find("/nonexistent-dir/x.pickle"),
            std::string::npos);
  ASSERT_EQ(reservoir_record_history(0, 1), RESERVOIR_OK);
}

}  // namespace
}  // namespace reservoir
