// reservoir_thread_cells: the thread cells of reservoir_gpu_bench (1 MiB pairs, each
// thread on its own stream) on their own, split into each thread's first call and its
// steady pairs, with the lifetime of the streams and threads chosen. Its source uses
// only the public API, so it also builds against another tree's library: an A/B of two
// builds on one machine (scripts/gpu/bench.sh threads-ab).
//
//   reservoir_thread_cells [--device cuda|sim] [--threads N] [--pairs N] [--rounds N]
//                          [--streams release|keep|same] [--cpus A,B,...]
//
// Each round starts N threads (new ones), each making `pairs` alloc+free pairs of 1 MiB
// on its stream: `release` new streams every round, released (release_stream) and
// destroyed at its end, as reservoir_gpu_bench does; `keep` new streams every round,
// never released; `same` the first round's streams throughout. Prints the median, min
// and max over rounds of the time per pair (all threads' pairs), the slowest first call
// of a round (median, max) and a thread's steady pair (after its first 1,000; median).
// --cpus pins thread t to the t-th CPU of the list (cycled): threads on two cores of
// their own against two hardware threads of one core tell sharing from contention.
#include <cuda_runtime.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/cuda_backend.hpp"
#include "reservoir/sim_backend.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kPair = std::size_t{1} << 20;
constexpr int kWarmPairs = 1000;  // a thread's pairs before its steady ones

[[noreturn]] void usage(int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: reservoir_thread_cells [--device cuda|sim] [--threads N] [--pairs N]\n"
               "                              [--rounds N] [--streams release|keep|same]\n"
               "                              [--cpus A,B,...]\n"
               "  --device   cuda (default) or sim (the simulated device: no GPU needed)\n"
               "  --threads  threads per round, each on its own stream (default 2)\n"
               "  --pairs    1 MiB alloc+free pairs per thread and round, more than %d\n"
               "             (default 100000)\n"
               "  --rounds   rounds (default 15)\n"
               "  --streams  release: new streams each round, released and destroyed at its\n"
               "             end (default, as reservoir_gpu_bench); keep: new streams, never\n"
               "             released; same: the first round's streams throughout\n"
               "  --cpus     pin thread t to the t-th CPU of the list, cycled (default: none)\n",
               kWarmPairs);
  std::exit(code);
}

int positive(const char* flag, const char* text, int at_least) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < at_least || v > 100'000'000) {
    std::fprintf(stderr, "%s: a whole number from %d to 100000000, not '%s'\n", flag, at_least,
                 text);
    usage(2);
  }
  return static_cast<int>(v);
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "reservoir_thread_cells: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// "3,7,11": CPU numbers, each below CPU_SETSIZE.
std::vector<int> cpu_list(const char* text) {
  std::vector<int> cpus;
  const std::string s = text;
  for (std::size_t at = 0; at <= s.size();) {
    std::size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    cpus.push_back(positive("--cpus", s.substr(at, comma - at).c_str(), 0));
    if (cpus.back() >= CPU_SETSIZE) {
      std::fprintf(stderr, "--cpus: CPU %d is beyond %d\n", cpus.back(), CPU_SETSIZE - 1);
      usage(2);
    }
    at = comma + 1;
  }
  return cpus;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda", streams = "release";
  int threads = 2, pairs = 100'000, rounds = 15;
  std::vector<int> cpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(0);
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: needs a value\n", arg.c_str());
      usage(2);
    }
    const char* value = argv[++i];
    if (arg == "--device") {
      device = value;
      if (device != "cuda" && device != "sim") {
        std::fprintf(stderr, "--device: cuda or sim, not '%s'\n", value);
        usage(2);
      }
    } else if (arg == "--threads") {
      threads = positive("--threads", value, 1);
    } else if (arg == "--pairs") {
      pairs = positive("--pairs", value, kWarmPairs + 1);
    } else if (arg == "--cpus") {
      cpus = cpu_list(value);
    } else if (arg == "--rounds") {
      rounds = positive("--rounds", value, 1);
    } else if (arg == "--streams") {
      streams = value;
      if (streams != "release" && streams != "keep" && streams != "same") {
        std::fprintf(stderr, "--streams: release, keep or same, not '%s'\n", value);
        usage(2);
      }
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", arg.c_str());
      usage(2);
    }
  }
  const bool cuda = device == "cuda";
  std::shared_ptr<reservoir::Backend> backend;
  if (cuda) {
    int count = 0;
    if (!check(cudaGetDeviceCount(&count), "cudaGetDeviceCount") || count == 0) {
      std::fprintf(stderr, "reservoir_thread_cells: no CUDA device (--device sim needs none)\n");
      return 1;
    }
    backend = std::make_shared<reservoir::CudaBackend>();
  } else {
    reservoir::SimOptions options;
    options.capacity = std::size_t{141} << 30;
    backend = std::make_shared<reservoir::SimBackend>(options);
  }
  reservoir::Allocator a(backend, reservoir::Config{});

  const auto n = static_cast<std::size_t>(threads);
  std::vector<reservoir::StreamHandle> handles(n);
  std::vector<cudaStream_t> made(n);
  std::vector<double> per_pair, first_max, steady;
  for (int round = 0; round < rounds; ++round) {
    if (streams != "same" || round == 0) {
      for (std::size_t t = 0; t < n; ++t) {
        if (cuda) {
          if (!check(cudaStreamCreateWithFlags(&made[t], cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags"))
            return 1;
          handles[t] = reinterpret_cast<reservoir::StreamHandle>(made[t]);
        } else {
          handles[t] = 1000 + static_cast<reservoir::StreamHandle>(round) * n + t;
        }
      }
    }
    std::vector<double> first(n), rest(n);
    std::vector<std::thread> workers;
    const Clock::time_point t0 = Clock::now();
    for (std::size_t t = 0; t < n; ++t)
      workers.emplace_back([&, t] {
        if (!cpus.empty()) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(cpus[t % cpus.size()], &one);
          if (sched_setaffinity(0, sizeof one, &one) != 0)
            std::fprintf(stderr, "reservoir_thread_cells: cannot pin a thread to CPU %d\n",
                         cpus[t % cpus.size()]);
        }
        if (cuda) cudaSetDevice(0);
        const reservoir::StreamHandle s = handles[t];
        const Clock::time_point f0 = Clock::now();
        a.deallocate(a.allocate(kPair, s, 0));
        const Clock::time_point f1 = Clock::now();
        for (int i = 1; i < kWarmPairs; ++i) a.deallocate(a.allocate(kPair, s, 0));
        const Clock::time_point f2 = Clock::now();
        for (int i = kWarmPairs; i < pairs; ++i) a.deallocate(a.allocate(kPair, s, 0));
        const Clock::time_point f3 = Clock::now();
        first[t] = std::chrono::duration<double, std::micro>(f1 - f0).count();
        rest[t] = std::chrono::duration<double, std::nano>(f3 - f2).count() / (pairs - kWarmPairs);
      });
    for (std::thread& w : workers) w.join();
    const Clock::time_point t1 = Clock::now();
    per_pair.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                       (static_cast<double>(pairs) * threads));
    first_max.push_back(*std::max_element(first.begin(), first.end()));
    steady.push_back(median(rest));
    if (streams == "release" || (streams == "same" && round == rounds - 1)) {
      for (std::size_t t = 0; t < n; ++t) {
        if (cuda && !check(cudaStreamSynchronize(made[t]), "cudaStreamSynchronize")) return 1;
        a.release_stream(handles[t], 0);
        if (cuda && !check(cudaStreamDestroy(made[t]), "cudaStreamDestroy")) return 1;
      }
    }
  }
  std::printf(
      "%s, %d threads, streams %s, %d rounds of %d pairs per thread: %.2f ns per pair (min %.2f, "
      "max %.2f); first call %.1f us (max %.1f); steady pair per thread %.2f ns\n",
      device.c_str(), threads, streams.c_str(), rounds, pairs, median(per_pair),
      *std::min_element(per_pair.begin(), per_pair.end()),
      *std::max_element(per_pair.begin(), per_pair.end()), median(first_max),
      *std::max_element(first_max.begin(), first_max.end()), median(steady));
  return 0;
}
