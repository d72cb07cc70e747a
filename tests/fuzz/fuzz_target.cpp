// libFuzzer entry point: every input is a random walk (random_walk.hpp); a finding
// aborts so that libFuzzer saves the input as a crasher.
#include <cstdio>
#include <cstdlib>

#include "fuzz/random_walk.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string finding = reservoir::fuzz::run_walk(data, size);
  if (!finding.empty()) {
    std::fprintf(stderr, "reservoir_fuzz finding: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
