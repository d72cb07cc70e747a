// Allocates through the installed library on the simulated device and checks the
// statistics: proves headers (the generated version.hpp too), library and package
// config work together.
#include <reservoir/reservoir.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <reservoir/allocator.hpp>
#include <reservoir/history.hpp>
#include <reservoir/sim_backend.hpp>
#include <reservoir/version.hpp>

int main() {
  reservoir::Allocator a(std::make_shared<reservoir::SimBackend>(), reservoir::Config{});
  int segments_made = 0;  // a trace tracker, and the names of the actions it sees
  a.attach_trace_tracker([&](const reservoir::TraceEntry& e) {
    segments_made += std::strcmp(reservoir::to_string(e.action), "segment_alloc") == 0;
  });
  void* p = a.allocate(1 << 20, 0, 0);
  bool ok = a.stats(0).allocated_bytes.all().current == (1 << 20);
  a.deallocate(p);
  ok = ok && a.stats(0).allocated_bytes.all().current == 0;
  ok = ok && segments_made == 1 && a.segments(0).size() == 1;
  ok = ok && std::strcmp(reservoir::version(), reservoir::kVersionString) == 0 &&
       std::strcmp(reservoir_version(), reservoir::kVersionString) == 0;
  std::printf("consumer: %s (reservoir %s)\n", ok ? "ok" : "FAILED", reservoir::version());
  return ok ? 0 : 1;
}
