// The conformance suite is written once against the public API and instantiated
// for every backend through a Harness: how to make the backend, how to make
// streams, and how to hold a stream's work unfinished (so record_stream and
// pending frees can be tested). SimBackend is always there; the CUDA harness joins
// in GPU builds (tests/gpu registers it) and skips cleanly without a device.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::testing {

class Harness {
 public:
  virtual ~Harness() = default;
  virtual std::string name() const = 0;
  // Non-empty: why this backend cannot run here (the test is skipped with it).
  virtual std::string unavailable() const { return ""; }
  virtual std::shared_ptr<Backend> make_backend() = 0;
  // A fresh stream of the backend.
  virtual StreamHandle new_stream() = 0;
  // Submits work to stream that does not finish until release_stream(stream).
  virtual void hold_stream(StreamHandle stream) = 0;
  // Lets held work on stream finish and waits for it.
  virtual void release_stream(StreamHandle stream) = 0;
  // Starts a graph capture on stream (in the global mode: the device refuses frees,
  // event queries and host waits meanwhile); false when the backend cannot (the
  // test is skipped).
  virtual bool begin_capture(StreamHandle) { return false; }
  virtual void end_capture(StreamHandle) {}
  // The simulated device, for tests of fault injection and device counters.
  virtual SimBackend* sim() { return nullptr; }
};

using HarnessFactory = std::function<std::unique_ptr<Harness>()>;

// Registry of harnesses (filled by static registrars before main).
std::vector<std::pair<std::string, HarnessFactory>>& harness_registry();
struct RegisterHarness {
  RegisterHarness(std::string name, HarnessFactory factory) {
    harness_registry().emplace_back(std::move(name), std::move(factory));
  }
};

}  // namespace reservoir::testing
