// The device calls Reservoir's engine makes for a trace: a replay through an Allocator
// over a LoggingBackend, with the stream semantics of reservoir-replay.
//
//   auto sim = std::make_shared<SimBackend>(options);
//   EngineRun run = replay_logged(trace, "max_split_size_mb:128", sim, sim.get());
//   OpList ops = ops_from_calls(run.calls, "gpt2.max_split_size_mb_128");
//
// On the simulated device (sim given) a free completes the allocating stream's work and
// "s,STREAM" completes that stream (SimBackend::advance), exactly as tools/replay does
// (docs/replay.md), so the calls are the ones behind reservoir-replay's figures; on any
// other backend each trace stream gets a stream of its own and "s" synchronizes it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "logging_backend.hpp"
#include "reservoir/sim_backend.hpp"
#include "trace_reader.hpp"

namespace reservoir_bench::placement {

struct EngineRun {
  std::uint64_t events = 0, ooms = 0;
  std::uint64_t peak_requested = 0, peak_reserved = 0;
  std::uint64_t device_allocs = 0, device_frees = 0;
  std::vector<PlacementCall> calls;  // in order, addresses as the device gave them
};

// Replays trace under config (Config::parse syntax) through an Allocator over a
// LoggingBackend wrapped around device. sim: device itself when it is a SimBackend
// (for its stream semantics), else nullptr. Allocations that raise OutOfMemoryError
// are counted and their later frees and uses skipped. Throws ConfigError, DeviceError.
EngineRun replay_logged(const reservoir::replay::Trace& trace, const std::string& config,
                        std::shared_ptr<Backend> device, reservoir::SimBackend* sim);

// The same on a fresh SimBackend of capacity bytes (completion manual: the replay advances the streams).
EngineRun replay_logged_sim(const reservoir::replay::Trace& trace, const std::string& config,
                            std::uint64_t capacity);

// The smallest simulated capacity (to within tolerance bytes) under which the trace runs
// with no OOM, by bisection between the trace's peak of live bytes and unconstrained
// peak reserved + 1%; 0 when nothing is ever live or no capacity up to 1 PiB works.
std::uint64_t fit_capacity_sim(const reservoir::replay::Trace& trace, const std::string& config,
                               std::uint64_t unconstrained_peak_reserved,
                               std::uint64_t tolerance = 2 * kMiB);

}  // namespace reservoir_bench::placement
