// reservoir-replay-calls: how many device calls the engine makes per 1000 trace
// events, call by call, and its host ns per event. On a GPU each driver call costs
// ~1-5 us of host time, so these counts, more than instructions, decide the replay
// cost there; the engine makes the same calls on the simulated device, whose events
// here complete as they are recorded (a GPU that keeps up), as on the GPU.
//
//   reservoir-replay-calls TRACE... [-- CONFIG...]
//
// One row per trace x config (no config: the defaults). Counts include the
// allocator's teardown (the trace's live allocations freed, segments given back).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "replay.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace {

using reservoir::SimOp;

struct Column {
  const char* name;
  SimOp op;
};
// Everything the engine asks of a device during a replay, in the table's order.
constexpr Column kColumns[] = {
    {"alloc", SimOp::allocate},
    {"free", SimOp::deallocate},
    {"ev_create", SimOp::create_event},
    {"ev_record", SimOp::record_event},
    {"ev_query", SimOp::query_event},
    {"ev_sync", SimOp::synchronize_event},
    {"st_wait", SimOp::stream_wait_event},
    {"st_sync", SimOp::synchronize_stream},
    {"reserve", SimOp::reserve_address_range},
    {"create", SimOp::create_physical},
    {"map", SimOp::map},
    {"access", SimOp::set_access},
    {"unmap", SimOp::unmap},
    {"release", SimOp::release_physical},
    {"unreserve", SimOp::release_address_range},
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> traces, configs;
  bool after = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0)
      after = true;
    else
      (after ? configs : traces).push_back(argv[i]);
  }
  if (traces.empty()) {
    std::fprintf(stderr, "usage: reservoir-replay-calls TRACE... [-- CONFIG...]\n");
    return 2;
  }
  if (configs.empty()) configs.push_back("");
  try {
    std::printf("device calls per 1000 events (simulated device; teardown included)\n");
    std::printf("%-28s %-24s %9s", "trace", "config", "ns/event");
    for (const Column& c : kColumns) std::printf(" %9s", c.name);
    std::printf(" %9s\n", "total");
    for (const std::string& path : traces) {
      const reservoir::replay::Trace trace = reservoir::replay::read_trace(path);
      const std::string name = path.substr(path.find_last_of('/') + 1);
      for (const std::string& config : configs) {
        reservoir::SimOptions sim_options;
        sim_options.eager = true;
        auto sim = std::make_shared<reservoir::SimBackend>(sim_options);
        reservoir::replay::ReplayOptions options;
        options.backend = sim;
        const auto r = reservoir::replay::replay_trace(trace, config, options);
        const double per = 1000.0 / static_cast<double>(r.events);
        std::printf("%-28s %-24s %9.1f", name.c_str(), config.empty() ? "default" : config.c_str(),
                    r.ns_per_event);
        std::uint64_t total = 0;
        for (const Column& c : kColumns) {
          std::printf(" %9.2f", static_cast<double>(sim->calls(c.op)) * per);
          total += sim->calls(c.op);
        }
        std::printf(" %9.2f\n", static_cast<double>(total) * per);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reservoir-replay-calls: %s\n", e.what());
    return 1;
  }
  return 0;
}
