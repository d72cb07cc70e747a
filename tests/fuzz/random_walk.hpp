// The random-walk step interpreter shared by the libFuzzer target (reservoir_fuzz)
// and the corpus replayer (reservoir_fuzz_corpus).
//
// Input bytes become steps over a fresh Allocator on a host-backed SimBackend
// (2 devices of 256 MiB, streams 0-3). The first byte picks the starting
// configuration; then each step is an opcode byte (below) and its argument bytes.
// Running out of bytes reads zeros and ends the walk after the current step.
//
// The interpreter keeps its own model of the program: live blocks (with a fill
// pattern written into their host-backed memory), a shadow interval map, the
// blocks freed while other streams still used them. After every step it checks
// Allocator::validate(), the statistics against the model, and the simulated
// device against the statistics. Expected outcomes (OutOfMemoryError, a
// DeviceError in a step that had a failure injected, the documented error for a
// bad input) continue the walk; anything else is a finding.
//
// tests/fuzz/make_seed_corpus.py mirrors the encoding: keep the two in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace reservoir::fuzz {

// An opcode byte is read modulo 32; the ranges give frequent steps more codes.
// The value named here is the first code of each range.
enum Op : std::uint8_t {
  kOpAlloc = 0,          // 0-9: a, size16       -> allocate
  kOpFree = 10,          // 10-15: index         -> deallocate a live block (0xFF: the
                         //   newest, then request its size again on its stream)
  kOpBadInput = 16,      // kind, arg            -> a call that must be refused
  kOpRecordStream = 17,  // index, stream
  kOpAdvance = 18,       // 18-19: stream        -> SimBackend::advance
  kOpSync =
      20,  // kind                 -> advance_all / notify_host_wait / release_stream / device sync
  kOpEager = 21,       //                      -> toggles SimBackend::set_eager
  kOpEmptyCache = 22,  // which
  kOpFraction = 23,    // device, fraction
  kOpConfig = 24,      // row                  -> update_config / set_allocator_settings
  kOpFault = 25,       // kind, arg            -> injected failure for the next step
  kOpResetStats = 26,  // kind
  kOpCapacity = 27,    // device, size
  kOpCallback = 28,    //                      -> toggles the free-memory callback
  kOpQuery = 29,       // index                -> sizes, base, largest block, summary
  kOpFreeAll = 30,     // selector
  kOpDevice = 31,      // device               -> set the current device
};

// Runs the walk that data encodes. Returns "" when every step behaved, else a
// description of the first finding (the walk stops there). Crashes and sanitizer
// reports are findings too; they end the process.
std::string run_walk(const std::uint8_t* data, std::size_t size);

}  // namespace reservoir::fuzz
