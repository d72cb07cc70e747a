#include "scenarios.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace reservoir_bench::placement {

namespace {

// splitmix64: a fixed sequence on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::uint64_t state_;
};

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}

// Large-pool sizes as the engine rounds them: multiples of 2 MiB.
std::uint64_t log_uniform_large(Rng& rng, std::uint64_t lo, std::uint64_t hi) {
  const double x = std::exp(
      std::log(static_cast<double>(lo)) +
      rng.unit() * (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))));
  return round_up(static_cast<std::uint64_t>(x), 2 * kMiB);
}

std::string mib(std::uint64_t bytes) {
  return std::to_string(bytes / kMiB) + "MiB";
}

OpList repeated(std::string name, std::uint64_t size, int n, std::string note) {
  OpList l;
  l.name = std::move(name);
  l.notes.push_back(std::move(note));
  for (int i = 0; i < n; ++i) l.alloc(size);
  return l;
}

OpList mixed_large(std::uint64_t budget) {
  OpList l;
  l.name = "mixed_large";
  l.notes.push_back(
      "c: fixed rounded large sizes (12 MiB .. 3 GiB), then 64 log-uniform in [12 MiB, 4 GiB]"
      " (seed 1), stopping before a quarter of the device is live");
  const std::uint64_t fixed[] = {12 * kMiB,  14 * kMiB,  20 * kMiB,  22 * kMiB,  40 * kMiB,
                                 64 * kMiB,  100 * kMiB, 128 * kMiB, 130 * kMiB, 256 * kMiB,
                                 512 * kMiB, 1 * kGiB,   2 * kGiB,   3 * kGiB};
  std::uint64_t live = 0;
  for (std::uint64_t s : fixed) {
    l.alloc(s);
    live += s;
  }
  Rng rng(1);
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t s = log_uniform_large(rng, 12 * kMiB, 4 * kGiB);
    if (live + s > budget) break;
    l.alloc(s);
    live += s;
  }
  return l;
}

enum class Pattern { first, last, every_other, middle_run };

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::first:
      return "first";
    case Pattern::last:
      return "last";
    case Pattern::every_other:
      return "every_other";
    case Pattern::middle_run:
      return "middle_run";
  }
  return "?";
}

// n allocations of size, then the pattern freed, then requests around the holes' size.
// Returns the list; reserve_at: op positions (counted in allocations made so far) at which
// a reservation of reserve_bytes is made (empty: none).
OpList holes(const std::string& name, std::uint64_t size, Pattern pattern,
             const std::vector<int>& reserve_at, std::uint64_t reserve_bytes) {
  constexpr int kCount = 16;
  OpList l;
  l.name = name;
  l.notes.push_back("d: " + std::to_string(kCount) + " x " + mib(size) + ", free " +
                    pattern_name(pattern) +
                    ", then requests smaller / equal / larger than the holes");
  auto maybe_reserve = [&](int made) {
    for (int at : reserve_at)
      if (at == made) l.reserve(reserve_bytes);
  };
  for (int i = 0; i < kCount; ++i) {
    maybe_reserve(i);
    l.alloc(size);
  }
  maybe_reserve(kCount);
  std::vector<int> freed;
  switch (pattern) {
    case Pattern::first:
      freed = {0};
      break;
    case Pattern::last:
      freed = {kCount - 1};
      break;
    case Pattern::every_other:
      for (int i = 0; i < kCount; i += 2) freed.push_back(i);
      break;
    case Pattern::middle_run:
      freed = {6, 7, 8, 9};
      break;
  }
  for (int i : freed) l.free(static_cast<std::size_t>(i));
  const std::uint64_t half = std::max<std::uint64_t>(2 * kMiB, round_up(size / 2, 2 * kMiB));
  // Smaller, equal, larger (by one 2 MiB step and by half), the size of a merged run of
  // two holes, and smaller again: which hole (if any) each lands in.
  for (std::uint64_t s : {half, size, size + 2 * kMiB, size + half, 2 * size, half}) l.alloc(s);
  maybe_reserve(kCount + 1);
  return l;
}

}  // namespace

std::uint64_t expandable_reservation(std::uint64_t device_total, std::uint64_t granularity) {
  return round_up(device_total + device_total / 8, granularity == 0 ? 2 * kMiB : granularity);
}

std::vector<OpList> builtin_scenarios(std::uint64_t device_total, std::uint64_t granularity) {
  std::vector<OpList> out;
  const std::uint64_t budget = device_total / 4;
  out.push_back(repeated("small_2MiB", 2 * kMiB, 128, "a: 128 x 2 MiB (small-pool segments)"));
  out.push_back(repeated("large_20MiB", 20 * kMiB, 64, "b: 64 x 20 MiB (large-pool segments)"));
  out.push_back(mixed_large(budget));

  const Pattern patterns[] = {Pattern::first, Pattern::last, Pattern::every_other,
                              Pattern::middle_run};
  for (std::uint64_t size : {2 * kMiB, 20 * kMiB, 64 * kMiB, 1 * kGiB})
    for (Pattern p : patterns)
      out.push_back(holes("holes_" + mib(size) + "_" + pattern_name(p), size, p, {}, 0));

  const std::uint64_t r = expandable_reservation(device_total, granularity);
  const std::string rnote = "e: reservations of " + std::to_string(r) +
                            " bytes (device total * 9/8, rounded to the granularity)";
  struct Vmm {
    const char* name;
    std::uint64_t size;
    Pattern pattern;
    std::vector<int> at;  // reservations after this many allocations
  };
  const Vmm vmm[] = {
      {"vmm_one_first_20MiB_middle_run", 20 * kMiB, Pattern::middle_run, {0}},
      {"vmm_two_first_20MiB_middle_run", 20 * kMiB, Pattern::middle_run, {0, 0}},
      {"vmm_between_20MiB_every_other", 20 * kMiB, Pattern::every_other, {4, 12}},
      {"vmm_between_2MiB_middle_run", 2 * kMiB, Pattern::middle_run, {8, 17}},
      {"vmm_first_and_between_64MiB_first", 64 * kMiB, Pattern::first, {0, 16}},
  };
  for (const Vmm& v : vmm) {
    OpList l = holes(v.name, v.size, v.pattern, v.at, r);
    l.notes.push_back(rnote);
    out.push_back(std::move(l));
  }
  for (const OpList& l : out) validate(l);
  return out;
}

}  // namespace reservoir_bench::placement
