// Instructions per request pattern, for callgrind (the stable figure on a noisy
// machine; docs/benchmarks.md). Runs N alloc+free pairs of one size through
// reservoir::Allocator on the simulated device, or N steps of the log-uniform
// pattern of engine_bench.cpp (free a random one of 512 live blocks, allocate
// 256 B-64 MiB), after a warm-up, inside run_pattern() alone:
//   valgrind --tool=callgrind --toggle-collect='*run_pattern*'
//       reservoir_pair_instructions 512 20000   (one command line)
// SIZE@2 runs the pairs on a second stream (the general routing, no one-owner shortcut);
// SIZE~N takes turns between N streams (1..N), one pair on each in turn.
// Instructions per pair: the difference of the totals of two N, divided by their
// difference (scripts/pair-instructions.sh does both runs). Settings from
// RESERVOIR_ALLOC_CONF (e.g. policy:compact).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace {

using reservoir::Allocator;

// Sizes and picks of the log-uniform pattern, drawn before anything is measured.
struct LogUniform {
  std::vector<std::size_t> sizes;
  std::vector<int> picks;
  std::vector<void*> live;
};

__attribute__((noinline)) void run_pattern(Allocator& a, std::size_t size, LogUniform* lu, int n,
                                           reservoir::StreamHandle stream = 1,
                                           reservoir::StreamHandle turns = 0) {
  for (int i = 0; i < n; ++i) {
    if (turns) stream = 1 + static_cast<reservoir::StreamHandle>(i) % turns;
    if (lu) {
      void*& slot = lu->live[static_cast<std::size_t>(lu->picks[i % lu->picks.size()])];
      a.deallocate(slot);
      slot = a.allocate(lu->sizes[static_cast<std::size_t>(i) % lu->sizes.size()], 2, 0);
    } else {
      void* p = a.allocate(size, stream, 0);
      asm volatile("" : : "r"(p) : "memory");
      a.deallocate(p);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SIZE|SIZE@2|SIZE~N|logu PAIRS\n", argv[0]);
    return 2;
  }
  reservoir::SimOptions options;
  options.capacity = std::size_t{141} << 30;
  // RESERVOIR_ALLOC_CONF as the library reads it (e.g. policy:compact).
  Allocator a(std::make_shared<reservoir::SimBackend>(options),
              reservoir::Config::from_environment());
  const int n = std::atoi(argv[2]);
  if (std::string(argv[1]) == "logu") {
    LogUniform lu;
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int> pick(0, 511);
    std::uniform_real_distribution<double> lg(8.0, 26.0);
    lu.sizes.resize(1 << 16);
    for (auto& z : lu.sizes) z = static_cast<std::size_t>(std::pow(2.0, lg(rng)));
    lu.picks.resize(1 << 16);
    for (auto& p : lu.picks) p = pick(rng);
    for (std::size_t i = 0; i < 512; ++i) lu.live.push_back(a.allocate(lu.sizes[i], 2, 0));
    run_pattern(a, 0, &lu, 5000);  // warm-up: the cache reaches its working set
    run_pattern(a, 0, &lu, n);
    for (void* p : lu.live) a.deallocate(p);
    return 0;
  }
  // "SIZE@2": the pairs on a second stream, after a block on the first (the general
  // routing: the stream table, and the segment map on every free).
  const std::string pattern = argv[1];
  if (const auto tilde = pattern.find('~'); tilde != std::string::npos) {
    const std::size_t size = std::strtoull(pattern.c_str(), nullptr, 10);
    const auto turns = static_cast<reservoir::StreamHandle>(
        std::strtoull(pattern.c_str() + tilde + 1, nullptr, 10));
    if (size == 0 || turns == 0) {
      std::fprintf(stderr, "pattern %s: SIZE~N needs a size and N >= 1\n", argv[1]);
      return 2;
    }
    run_pattern(a, size, nullptr, 100 * static_cast<int>(turns), 1, turns);
    run_pattern(a, size, nullptr, n, 1, turns);
    return 0;
  }
  const bool second = pattern.size() > 2 && pattern.compare(pattern.size() - 2, 2, "@2") == 0;
  const std::size_t size = std::strtoull(argv[1], nullptr, 10);
  void* first = second ? a.allocate(size, 1, 0) : nullptr;
  const reservoir::StreamHandle stream = second ? 2 : 1;
  run_pattern(a, size, nullptr, 100, stream);
  run_pattern(a, size, nullptr, n, stream);
  a.deallocate(first);
  return 0;
}
