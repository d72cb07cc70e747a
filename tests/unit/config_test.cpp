#include "reservoir/config.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "reservoir/errors.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Config::parse(text) throws ConfigError, its message naming every one of named.
void expect_parse_refused(const std::string& text, const std::vector<std::string>& named) {
  try {
    Config::parse(text);
    ADD_FAILURE() << text << " was accepted";
  } catch (const ConfigError& e) {
    for (const std::string& n : named)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in: " << e.what();
  }
}

TEST(Config, DefaultsMatchPyTorch) {
  Config c;
  EXPECT_EQ(c.max_split_size, ~std::size_t{0});
  EXPECT_EQ(c.max_non_split_rounding_size, 20 * MiB);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_EQ(c.divisions_for(5000), 0u);
}

TEST(Config, ParsesEveryKey) {
  Config c = Config::parse(
      " max_split_size_mb:256, max_non_split_rounding_mb:40,garbage_collection_threshold:0.6,"
      "expandable_segments:True,release_lock_on_cudamalloc:True,"
      "graph_capture_record_stream_reuse:True,"
      "per_process_memory_fraction:0.5,roundup_power2_divisions:[256:1,512:2,>:8],"
      "backend:native,device:sim,sim_capacity:8GiB,expandable_segments_reserve:64GiB,"
      "pinned_use_cuda_host_register:True");
  EXPECT_EQ(c.max_split_size, 256 * MiB);
  EXPECT_EQ(c.max_non_split_rounding_size, 40 * MiB);
  EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_TRUE(c.release_lock_on_cudamalloc);
  EXPECT_TRUE(c.graph_capture_record_stream_reuse);
  EXPECT_TRUE(c.per_process_memory_fraction_set);
  EXPECT_DOUBLE_EQ(c.per_process_memory_fraction, 0.5);
  // PyTorch's meaning: an entry names the interval that starts at its size.
  EXPECT_EQ(c.divisions_for(100 * MiB), 1u);
  EXPECT_EQ(c.divisions_for(300 * MiB), 1u);  // [256, 512) MiB: the "256" entry
  EXPECT_EQ(c.divisions_for(600 * MiB), 2u);  // [512, 1024) MiB: the "512" entry
  EXPECT_EQ(c.divisions_for(std::size_t{64} << 30), 8u);
  EXPECT_EQ(c.device, "sim");
  EXPECT_EQ(c.sim_capacity, std::size_t{8} << 30);
  EXPECT_EQ(c.expandable_segments_reserve, std::size_t{64} << 30);
  EXPECT_EQ(Config::parse("expandable_segments_reserve:0.25").expandable_segments_reserve_fraction,
            0.25);
  EXPECT_EQ(Config::parse("roundup_power2_divisions:4").divisions_for(1), 4u);
  const Config paced = Config::parse("sim_completion:paced,sim_pace:8");
  EXPECT_EQ(paced.sim_completion, "paced");
  EXPECT_EQ(paced.sim_pace, 8u);
  EXPECT_EQ(Config{}.sim_completion, "host_waits");
}

// The list form as PyTorch parses it (measured on the H200 against c10: the reading
// of the documentation, "256:1 = below 256 MiB", reserved 4.8% more on a real trace):
// the first entry also sets every interval below its own; later entries only their
// own; ">" every interval after the last entry; 0 divisions is allowed (no rounding).
TEST(Config, RoundupListFollowsPyTorchsParser) {
  Config c = Config::parse("roundup_power2_divisions:[256:1,2048:4,>:8]");
  EXPECT_EQ(c.divisions_for(1000), 1u);
  EXPECT_EQ(c.divisions_for(300 * MiB), 1u);
  EXPECT_EQ(c.divisions_for(600 * MiB), 0u);   // [512, 1024) MiB: a gap, no rounding
  EXPECT_EQ(c.divisions_for(1500 * MiB), 0u);  // [1, 2) GiB: a gap
  EXPECT_EQ(c.divisions_for(3000 * MiB), 4u);  // [2, 4) GiB: the "2048" entry
  EXPECT_EQ(c.divisions_for(5000 * MiB), 8u);
  Config zero = Config::parse("roundup_power2_divisions:[64:0,>:2]");
  EXPECT_EQ(zero.divisions_for(10 * MiB), 0u);
  EXPECT_EQ(zero.divisions_for(100 * MiB), 0u);  // interval 6 ([64, 128) MiB) is the entry's
  EXPECT_EQ(zero.divisions_for(200 * MiB), 2u);
}

// Each bad value names its key and says what is allowed.
TEST(Config, BadValuesNameTheKey) {
  const char* cases[][2] = {
      {"max_split_size_mb:20", "max_split_size_mb"},
      {"max_split_size_mb:abc", "max_split_size_mb"},
      {"max_non_split_rounding_mb:-1", "max_non_split_rounding_mb"},
      {"garbage_collection_threshold:1.0", "garbage_collection_threshold"},
      {"garbage_collection_threshold:0", "garbage_collection_threshold"},
      {"expandable_segments:yes", "expandable_segments"},
      {"release_lock_on_cudamalloc:2", "release_lock_on_cudamalloc"},
      {"graph_capture_record_stream_reuse:maybe", "graph_capture_record_stream_reuse"},
      {"per_process_memory_fraction:1.5", "per_process_memory_fraction"},
      {"roundup_power2_divisions:3", "roundup_power2_divisions"},
      {"roundup_power2_divisions:[100:2]", "roundup_power2_divisions"},
      {"roundup_power2_divisions:[256:3]", "roundup_power2_divisions"},
      {"roundup_power2_divisions:[256:1", "roundup_power2_divisions"},
      {"backend:cudamallocasync", "backend"},
      {"backend:foo", "backend"},
      {"device:gpu", "device"},
      {"sim_capacity:lots", "sim_capacity"},
      {"sim_completion:lazy", "sim_completion"},
      {"sim_pace:0", "sim_pace"},
      {"expandable_segments_reserve:-3", "expandable_segments_reserve"},
      {"no_such_key:1", "no_such_key"},
      {"max_split_size_mb", "key:value"},
  };
  for (auto& c : cases) expect_parse_refused(c[0], {c[1]});
}

TEST(Config, ApplyIsAllOrNothing) {
  Config c = Config::parse("max_split_size_mb:256");
  EXPECT_THROW(c.apply("expandable_segments:True,max_split_size_mb:1"), ConfigError);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size, 256 * MiB);
}

// As torch.cuda.memory._set_allocator_settings: the three per-call settings reset
// unless named, the others kept; all or nothing.
TEST(Config, ApplySettingsResetsWhatPyTorchResets) {
  Config c = Config::parse(
      "max_split_size_mb:256,roundup_power2_divisions:4,garbage_collection_threshold:0.6,"
      "expandable_segments:True,release_lock_on_cudamalloc:True");
  c.apply_settings("max_non_split_rounding_mb:64");
  EXPECT_EQ(c.max_split_size, Config{}.max_split_size);
  EXPECT_EQ(c.roundup_power2_divisions, Config{}.roundup_power2_divisions);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_TRUE(c.release_lock_on_cudamalloc);
  EXPECT_EQ(c.max_non_split_rounding_size, 64 * MiB);
  c.apply_settings("roundup_power2_divisions:8");
  EXPECT_EQ(c.divisions_for(100 * MiB), 8u);
  EXPECT_THROW(c.apply_settings("garbage_collection_threshold:0.5,bogus:1"), ConfigError);
  EXPECT_EQ(c.divisions_for(100 * MiB), 8u);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
}

// Keys in order, lists with commas inside brackets kept whole, values unchecked.
TEST(Config, KeysOfNamesEveryKeyGiven) {
  EXPECT_EQ(Config::keys_of(" device : sim ,roundup_power2_divisions:[256:1,>:8],sim_capacity:x,"),
            (std::vector<std::string>{"device", "roundup_power2_divisions", "sim_capacity"}));
  EXPECT_TRUE(Config::keys_of("").empty());
  EXPECT_THROW(Config::keys_of("device"), ConfigError);
}

TEST(Config, EnvironmentPrefersReservoirVariable) {
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:300", 1);
  unsetenv("RESERVOIR_ALLOC_CONF");
  EXPECT_EQ(Config::from_environment().max_split_size, 300 * MiB);
  setenv("RESERVOIR_ALLOC_CONF", "max_split_size_mb:400", 1);
  EXPECT_EQ(Config::from_environment().max_split_size, 400 * MiB);
  setenv("RESERVOIR_ALLOC_CONF", "bogus:1", 1);
  try {
    Config::from_environment();
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RESERVOIR_ALLOC_CONF"), std::string::npos);
  }
  unsetenv("RESERVOIR_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
}

// to_string() is the settings in force, not the history of what was applied: each
// non-default setting once, in docs/config.md's order.
TEST(Config, TextIsEachNonDefaultSettingOnceInTheDocumentedOrder) {
  Config c = Config::parse(
      "policy:compact,policy:pytorch,expandable_segments:True,expandable_segments:False,,");
  EXPECT_EQ(c.to_string(), "");
  EXPECT_EQ(c, Config{});
  c.apply("oom_snapshot:/tmp/o.pickle,sim_capacity:8GiB,max_split_size_mb:64");
  c.apply("garbage_collection_threshold:0.8,max_split_size_mb:128,device:sim");
  c.apply("roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments_reserve:0.5");
  c.apply("per_process_memory_fraction:1.0,max_non_split_rounding_mb:0");
  EXPECT_EQ(c.to_string(),
            "max_split_size_mb:128,max_non_split_rounding_mb:0,"
            "roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.8,"
            "expandable_segments_reserve:0.5,per_process_memory_fraction:1.0,device:sim,"
            "sim_capacity:8GiB,oom_snapshot:/tmp/o.pickle");
  EXPECT_EQ(Config::parse("policy:compact,backend:native,max_split_size_mb:99999999999999,"
                          "expandable_segments_reserve:1000,release_lock_on_cudamalloc:True")
                .to_string(),
            "policy:compact,expandable_segments_reserve:1000,release_lock_on_cudamalloc:True");
  EXPECT_EQ(Config::parse("graph_capture_record_stream_reuse:True,release_lock_on_cudamalloc:True")
                .to_string(),
            "release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True");
  EXPECT_EQ(Config::parse("graph_capture_record_stream_reuse:False").to_string(), "");
}

// Parsing the text gives back the same configuration, for every key and for any
// roundup_power2_divisions table the parser can make.
TEST(Config, TextRoundTrips) {
  for (const char* text :
       {"", "policy:compact,per_process_memory_fraction:0",
        "backend:cudaMallocAsync,expandable_segments:True,expandable_segments_reserve:64GiB",
        "max_split_size_mb:21,max_non_split_rounding_mb:1099511627776,record_trace:t.gz",
        "garbage_collection_threshold:0.1,per_process_memory_fraction:0.3333333333333333",
        "roundup_power2_divisions:1", "roundup_power2_divisions:[256:1,2048:4,>:8]",
        "roundup_power2_divisions:[64:0,>:2]", "roundup_power2_divisions:[1:4,2:2,>:8]",
        "roundup_power2_divisions:[32768:4]", "roundup_power2_divisions:[1:0,>:16]",
        "expandable_segments_reserve:4.0,sim_capacity:1536MiB,device:cuda"}) {
    const Config c = Config::parse(text);
    EXPECT_EQ(Config::parse(c.to_string()), c) << text << " -> " << c.to_string();
  }
  std::mt19937 random(7);
  for (int i = 0; i < 2000; ++i) {
    Config c;
    for (std::size_t& d : c.roundup_power2_divisions) {
      const unsigned pick = random() % 8;
      d = pick < 4 ? 0 : std::size_t{1} << (pick - 4);
    }
    EXPECT_EQ(Config::parse(c.to_string()).roundup_power2_divisions, c.roundup_power2_divisions)
        << c.to_string();
  }
}

// policy:compact places its own pages: expandable segments and the driver's pool
// cannot apply under it. Refused, naming both settings; apply changes nothing.
TEST(Config, SettingsThatCannotApplyTogetherAreRefused) {
  const char* cases[][2] = {
      {"policy:compact,expandable_segments:True", "expandable_segments:True"},
      {"expandable_segments:True,policy:compact", "expandable_segments:True"},
      {"backend:cudaMallocAsync,policy:compact", "backend:cudaMallocAsync"},
  };
  for (auto& c : cases)
    expect_parse_refused(c[0], {"policy:compact", c[1], "cannot be used together"});
  Config c = Config::parse("expandable_segments:True,max_split_size_mb:64");
  const Config before = c;
  EXPECT_THROW(c.apply("policy:compact"), ConfigError);
  EXPECT_EQ(c, before);
  c.apply("policy:compact,expandable_segments:False");  // one update switches
  EXPECT_EQ(c.to_string(), "policy:compact,max_split_size_mb:64");
  Config built;  // field by field, as a program may build one
  built.policy = Config::Policy::compact;
  built.backend = "cudaMallocAsync";
  EXPECT_THROW(built.check(), ConfigError);
}

// RESERVOIR_ALLOC_CONF= (empty or blank) is as if unset: PYTORCH_CUDA_ALLOC_CONF applies.
TEST(Config, AnEmptyEnvironmentVariableCountsAsUnset) {
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:300", 1);
  for (const char* empty : {"", "  "}) {
    setenv("RESERVOIR_ALLOC_CONF", empty, 1);
    EXPECT_EQ(Config::from_environment().max_split_size, 300 * MiB) << "'" << empty << "'";
  }
  setenv("PYTORCH_CUDA_ALLOC_CONF", "", 1);
  EXPECT_EQ(Config::from_environment(), Config{});
  unsetenv("RESERVOIR_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
}

}  // namespace
}  // namespace reservoir
