// An Allocator over its own SimBackend, for tests that need the simulated device's
// controls (fault injection, stream progress, counters) next to the allocator.
#pragma once

#include <memory>
#include <string>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::test {

struct SimAllocator {
  explicit SimAllocator(const std::string& config = "", SimOptions options = {})
      : sim(std::make_shared<SimBackend>(options)), a(sim, Config::parse(config)) {}
  std::shared_ptr<SimBackend> sim;
  Allocator a;
};

}  // namespace reservoir::test
