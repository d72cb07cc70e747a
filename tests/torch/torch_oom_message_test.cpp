// The out-of-memory error of the PyTorch alloc hook on the simulated device: its
// first sentence is PyTorch's ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
// has a total capacity of ... of which ... is free."), which tools and tests match,
// followed by Reservoir's report. Without c10's type (no PyTorch here) it is a
// std::runtime_error.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "integrations/torch_hooks.hpp"
#include "reservoir/allocator.hpp"

namespace {

std::string gib(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

std::string oom_message(std::size_t size) {
  try {
    reservoir_torch_malloc(size, 0, nullptr);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TorchOomMessage, FirstSentenceIsPyTorchsThenReservoirsReport) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  ASSERT_STREQ(a.backend().name(), "sim");
  reservoir::MemoryInfo info;
  ASSERT_EQ(a.backend().memory_info(0, &info), reservoir::DeviceStatus::ok);
  const std::size_t request = info.total + (std::size_t{1} << 30);  // 1 GiB too many
  const std::string message = oom_message(request);
  // The engine asked the device for the request rounded to its 2 MiB segments.
  const std::size_t asked = (request + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  const std::string expected_first = "CUDA out of memory. Tried to allocate " + gib(asked) +
                                     ". GPU 0 has a total capacity of " + gib(info.total) +
                                     " of which " + gib(info.total) + " is free. ";
  EXPECT_EQ(message.substr(0, expected_first.size()), expected_first) << message;
  EXPECT_NE(message.find("Reservoir (sim device 0): the request of"), std::string::npos) << message;
}

TEST(TorchOomMessage, SmallSizesUseBytesKiBAndMiB) {
  // A fraction of 0 refuses every new segment: the sizes stay small.
  reservoir::Allocator& a = reservoir::Allocator::instance();
  a.set_memory_fraction(0.0, 0);
  EXPECT_EQ(oom_message(3 << 20).rfind("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0", 0),
            0u);
  EXPECT_EQ(oom_message(1000).rfind("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0", 0),
            0u);
  a.set_memory_fraction(1.0, 0);
}

TEST(TorchOomMessage, AboveOneEiBKeepsPyTorchsWording) {
  const std::string message = oom_message(std::size_t{1} << 61);
  EXPECT_EQ(message.rfind("CUDA out of memory. Tried to allocate more than 1EB memory. ", 0), 0u)
      << message;
  EXPECT_NE(message.find("Reservoir: the request of 2.00 EiB"), std::string::npos) << message;
}

}  // namespace
