// reservoir_gpu_bench: host cost of device allocation on a real GPU, Reservoir next to
// its peers in ONE run, on the patterns of /work/shared/tools/anchor_bench.cpp and the
// trace replay of peer_replay.cpp:
//   - Reservoir: reservoir::Allocator over CudaBackend (device index given explicitly);
//   - c10: PyTorch's native caching allocator (only when built with TORCH_DIR);
//   - cudaMallocAsync/cudaFreeAsync on the default pool, release threshold UINT64_MAX;
//   - cudaMalloc/cudaFree;
//   - Reservoir under policy:compact (docs/memory.md);
//   - Reservoir with backend:cudaMallocAsync (a pool of its own, Reservoir's books on top).
// Rows: alloc+free pairs (512 B, 1 MiB, 64 MiB), log-uniform sizes, 1 MiB pairs on 2 and
// 8 threads with their own streams, one thread on one new stream and taking turns
// between 2, 8 and 512 streams, the bundled traces replayed.
// Then every single allocate and free call timed on its own (latency_bench.cpp):
// p50 / p99 / p99.9 / max with 1 and 8 threads.
// Prints side-by-side tables; --markdown PATH also writes them as a markdown file.
//
//   reservoir_gpu_bench [--markdown PATH] [--traces DIR] [--smoke] [--no-pin] [--columns NAMES]
//                       [--passes N]
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_api.hpp"
#include "latency_bench.hpp"
#include "quiet_cpu.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/cuda_backend.hpp"
#include "text_table.hpp"

#if defined(RESERVOIR_BENCH_WITH_C10)
#include "c10_api.hpp"
#endif

#ifndef RESERVOIR_TRACE_DIR
#define RESERVOIR_TRACE_DIR "traces"
#endif

namespace {

using clk = std::chrono::steady_clock;
using reservoir_bench::Api;
using reservoir_bench::QuietCpu;

// ---- The allocators, behind one shape of call (bench_api.hpp) ---------------------

// Reservoir under its settings, one instance per column: kReservoir (the defaults, or
// RESERVOIR_ALLOC_CONF), kReservoirCompact (policy:compact), kReservoirAsync
// (backend:cudaMallocAsync: its own driver pool under Reservoir's books).
enum ReservoirColumn { kReservoir, kReservoirCompact, kReservoirAsync, kReservoirColumns };
reservoir::Allocator* g_reservoir[kReservoirColumns] = {};
cudaMemPool_t g_pool = nullptr;

template <int I>
void* reservoir_alloc(std::size_t n, cudaStream_t s) {
  return g_reservoir[I]->allocate(n, reinterpret_cast<reservoir::StreamHandle>(s), 0);
}
template <int I>
void reservoir_free(void* p, cudaStream_t) {
  g_reservoir[I]->deallocate(p);
}
template <int I>
void reservoir_reset() {
  CK(cudaDeviceSynchronize());
  g_reservoir[I]->empty_cache();
  g_reservoir[I]->reset_peak_stats(0);
}
template <int I>
std::uint64_t reservoir_peak() {
  return static_cast<std::uint64_t>(g_reservoir[I]->stats(0).reserved_bytes.all().peak);
}
template <int I>
void reservoir_release_stream(cudaStream_t s) {
  g_reservoir[I]->release_stream(reinterpret_cast<reservoir::StreamHandle>(s), 0);
}
template <int I>
std::unique_ptr<Api> reservoir_api(const char* name) {
  return std::make_unique<Api>(Api{name, reservoir_alloc<I>, reservoir_free<I>, false,
                                   reservoir_reset<I>, reservoir_peak<I>,
                                   reservoir_release_stream<I>});
}

void* async_alloc(std::size_t n, cudaStream_t s) {
  void* p = nullptr;
  CK(cudaMallocAsync(&p, n, s));
  return p;
}
void async_free(void* p, cudaStream_t s) {
  CK(cudaFreeAsync(p, s));
}
void async_reset() {
  CK(cudaDeviceSynchronize());
  CK(cudaMemPoolTrimTo(g_pool, 0));
  std::uint64_t zero = 0;
  CK(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReservedMemHigh, &zero));
}
std::uint64_t async_peak() {
  CK(cudaDeviceSynchronize());
  std::uint64_t high = 0;
  CK(cudaMemPoolGetAttribute(g_pool, cudaMemPoolAttrReservedMemHigh, &high));
  return high;
}

void* plain_alloc(std::size_t n, cudaStream_t) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n));
  return p;
}
void plain_free(void* p, cudaStream_t) {
  CK(cudaFree(p));
}
void plain_reset() {
  CK(cudaDeviceSynchronize());
}
std::uint64_t plain_peak() {
  return 0;
}

#if defined(RESERVOIR_BENCH_WITH_C10)
void c10_reset() {
  CK(cudaDeviceSynchronize());
  reservoir_bench::c10_api::reset();
}
#endif

// ---- Patterns (anchor_bench.cpp) ---------------------------------------------------

// A throughput cell measured in rounds: again while the rounds so far took less than
// kRoundsTime in all (at most kMaxRounds), and the median round reported. A round of a
// fast allocator lasts a few milliseconds, short enough for one timer interrupt, a
// neighbour's burst or a clock still ramping up to move it by tens of percent; a slow
// allocator's round lasts long enough to be measured once. The cap on rounds is high
// enough that a fast allocator's rounds, too, span the whole quarter second: seven
// rounds of 8 ms can fall inside one of the host's bursts (the 512 B and 1 MiB pairs,
// the same code path, measured 40.8 and 61.1 ns a second apart on 2026-12-03).
// Every column is measured the same way.
constexpr double kRoundsTime = 0.25;  // seconds
constexpr int kMaxRounds = 31;
// At least three rounds: the median is then a warm round for every column (a round
// slower than a quarter second alone was the cell, its memory grown from nothing:
// compact's log-uniform cell, 1.8 us a step cold on an H100, against warm rounds of
// the columns beside it).
constexpr int kMinRounds = 3;
// A cell's rounds: the median is reported; the spread goes to the cell log.
struct Rounds {
  double median = 0;
  double min = 0;
  double max = 0;
  int count = 0;
};
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

template <typename Round>
Rounds measure_rounds(Round&& round) {
  std::vector<double> ns;
  double spent = 0;
  do {
    auto t0 = clk::now();
    ns.push_back(round());
    spent += std::chrono::duration<double>(clk::now() - t0).count();
  } while ((spent < kRoundsTime || static_cast<int>(ns.size()) < kMinRounds) &&
           static_cast<int>(ns.size()) < kMaxRounds);
  const auto [lo, hi] = std::minmax_element(ns.begin(), ns.end());
  return {median_of(ns), *lo, *hi, static_cast<int>(ns.size())};
}
template <typename Round>
double median_round(Round&& round) {
  return measure_rounds(round).median;
}

// One line per pinned single-thread cell on stdout: where it ran and how its rounds
// spread, so that a slow cell can be told from a slow CPU (the tables keep medians).
double logged_cell(const char* column, const std::string& cell, int pass, const QuietCpu& pin,
                   const Rounds& r) {
  const reservoir_bench::CpuSweep& c = pin.sweep();
  std::printf(
      "cell | %s | %s | pass %d | CPU %d (calibration pair %.1f ns, chase step %.1f ns) | %d "
      "rounds: min %.1f, median %.1f, max %.1f ns\n",
      column, cell.c_str(), pass + 1, c.cpu, c.best_ns, c.chase_ns, r.count, r.min, r.median,
      r.max);
  std::fflush(stdout);
  return r.median;
}

// Same-size alloc+free pairs: the steady-state cache-hit path.
double bench_pair(const Api& a, std::size_t size, int iters, cudaStream_t s) {
  for (int i = 0; i < 100; ++i) a.free(a.alloc(size, s), s);
  auto t0 = clk::now();
  for (int i = 0; i < iters; ++i) a.free(a.alloc(size, s), s);
  auto t1 = clk::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

// Random sizes with a live set (log-uniform 256 B .. 64 MiB). As anchor_bench.cpp: the
// sizes drawn first, the slot to free drawn in the timed loop (drawing those first too
// was tried: it saves the draw's ~8 ns but streams 0.8 MB more through the caches the
// pattern lives in, and departs from the figures it is compared with).
double bench_mixed(const Api& a, int iters, int live, cudaStream_t s, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, live - 1);
  std::uniform_real_distribution<double> lg(8.0, 26.0);
  std::vector<void*> slot(live, nullptr);
  std::vector<std::size_t> sizes(iters);
  for (auto& z : sizes) z = static_cast<std::size_t>(std::pow(2.0, lg(rng)));
  for (int i = 0; i < live; ++i) slot[i] = a.alloc(sizes[i % iters], s);
  auto t0 = clk::now();
  for (int i = 0; i < iters; ++i) {
    int k = pick(rng);
    a.free(slot[k], s);
    slot[k] = a.alloc(sizes[i], s);
  }
  auto t1 = clk::now();
  for (auto p : slot) a.free(p, s);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

// The single-thread cells: three pair sizes and the log-uniform pattern. A host whose
// CPUs are shared with other tenants slows for spells of seconds to minutes, and a
// spell that covers one cell's quarter second moves it by half (the 512 B and 1 MiB
// pairs, one code path, took 35.8 and 54.1 ns in one run on 2026-12-03, and the other
// way round in others). So each cell is measured in g_passes passes spread over the
// run (start, after the thread cells, after the replays and latency), each pass pinned
// to the quietest CPU at its start, and the median pass is reported: a spell has to
// cover most passes to move the figure. Every column is measured the same way.
constexpr int kSingleCells = 4;
const char* const kSingleCell[kSingleCells] = {"pair 512 B, 1 thread", "pair 1 MiB, 1 thread",
                                               "pair 64 MiB, 1 thread",
                                               "log-uniform 256 B-64 MiB, 512 live, 1 thread"};
int g_passes = 3;

// One pass of a column's single-thread cells; each cell's median round goes to
// out[cell].
void single_thread_cells(const Api& a, int div, cudaStream_t s, int pass,
                         std::vector<double> (&out)[kSingleCells]) {
  const int it = (a.slow ? 2000 : 200000) / div;
  const std::size_t sizes[] = {512, std::size_t{1} << 20, std::size_t{64} << 20};
  for (int k = 0; k < kSingleCells; ++k) {
    QuietCpu pin;
    const Rounds r = k < 3 ? measure_rounds([&] { return bench_pair(a, sizes[k], it, s); })
                           : measure_rounds([&] { return bench_mixed(a, it, 512, s, 42); });
    out[k].push_back(logged_cell(a.name, kSingleCell[k], pass, pin, r));
  }
}

// Several threads, each with its own stream, same-size pairs; total time / all pairs.
double bench_threads(const Api& a, int threads, std::size_t size, int iters) {
  std::vector<cudaStream_t> ss(threads);
  for (auto& s : ss) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::thread> th;
  auto t0 = clk::now();
  for (int t = 0; t < threads; ++t)
    th.emplace_back([&, t] {
      CK(cudaSetDevice(0));
      for (int i = 0; i < iters; ++i) a.free(a.alloc(size, ss[t]), ss[t]);
    });
  for (auto& x : th) x.join();
  auto t1 = clk::now();
  for (auto& s : ss) CK(cudaStreamSynchronize(s));
  for (auto& s : ss) reservoir_bench::destroy_stream(a, s);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() /
         (static_cast<double>(iters) * threads);
}

// One thread taking turns between n streams, a 1 KiB pair on each in turn (a compute
// stream and a copy or communication stream taking turns is the common shape of real
// programs); every stream warmed first.
double bench_interleaved(const Api& a, int n, int iters) {
  std::vector<cudaStream_t> ss(static_cast<std::size_t>(n));
  for (auto& s : ss) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int w = 0; w < 4; ++w)
    for (cudaStream_t s : ss) a.free(a.alloc(1024, s), s);
  auto t0 = clk::now();
  for (int i = 0, k = 0; i < iters; ++i) {
    cudaStream_t s = ss[static_cast<std::size_t>(k)];
    a.free(a.alloc(1024, s), s);
    if (++k == n) k = 0;
  }
  auto t1 = clk::now();
  for (auto& s : ss) CK(cudaStreamSynchronize(s));
  for (auto& s : ss) reservoir_bench::destroy_stream(a, s);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}
constexpr int kTurnCounts[] = {1, 2, 8, 512};
// One stream (not the first one used: the general routing) is the row to read the
// others against.
std::string turns_row(int n) {
  if (n == 1) return "pair 1 KiB, 1 thread, one new stream";
  return "pair 1 KiB, 1 thread, turns between " + std::to_string(n) + " streams";
}
constexpr std::size_t kTurnRows = std::size(kTurnCounts);
// The turn rows are read against each other, so they are measured together: on one
// CPU, their rounds alternating (1, 2, 8, 512, 1, ...) until they took kRoundsTime
// each, so that a slow spell of the CPU moves every row alike. Each row: its median.
void measure_turn_rows(const Api& a, int iters, double (&out)[kTurnRows]) {
  QuietCpu pin;
  std::vector<double> ns[kTurnRows];
  double spent = 0;
  do {
    auto t0 = clk::now();
    for (std::size_t k = 0; k < kTurnRows; ++k)
      ns[k].push_back(bench_interleaved(a, kTurnCounts[k], iters));
    spent += std::chrono::duration<double>(clk::now() - t0).count();
  } while (spent < kRoundsTime * kTurnRows && static_cast<int>(ns[0].size()) < kMaxRounds);
  for (std::size_t k = 0; k < kTurnRows; ++k) out[k] = median_of(ns[k]);
}

// ---- Trace replay (peer_replay.cpp) -------------------------------------------------

struct Event {
  bool alloc;
  std::uint32_t id;
  std::uint64_t size;
  std::uint32_t stream;
};

struct Trace {
  std::string name;
  std::vector<Event> events;
  std::uint32_t streams = 1;
  std::uint32_t ids = 0;
  bool skipped = false;  // it routes to private pools: not replayed here
};

// Lines "a,ID,SIZE,STREAM" and "f,ID"; '#' comments. Other record kinds (u, s) are
// skipped: the bundled traces have none, and the peers could not replay them.
bool load_trace(const std::string& path, std::size_t max_events, Trace* out) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char line[256];
  while (out->events.size() < max_events && gzgets(f, line, sizeof line) != nullptr) {
    // Requests and frees only: a trace of pools or restores is not this benchmark's.
    if (std::strchr("pxgtekryo", line[0]) != nullptr && line[1] == ',') {
      gzclose(f);
      out->skipped = true;
      return true;
    }
    unsigned long long id = 0, size = 0;
    unsigned stream = 0;
    if (line[0] == 'a' && std::sscanf(line, "a,%llu,%llu,%u", &id, &size, &stream) == 3) {
      out->events.push_back({true, static_cast<std::uint32_t>(id), size, stream});
      out->streams = std::max(out->streams, stream + 1);
      out->ids = std::max(out->ids, static_cast<std::uint32_t>(id + 1));
    } else if (line[0] == 'f' && std::sscanf(line, "f,%llu", &id) == 1) {
      out->events.push_back({false, static_cast<std::uint32_t>(id), 0, 0});
    }
  }
  gzclose(f);
  return true;
}

struct ReplayResult {
  double ns_per_event = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_requested = 0;
};

// One pass over the trace, from a cold cache. Frees go to stream 0 for
// cudaFreeAsync, as peer_replay.cpp does.
ReplayResult replay_once(const Api& a, const Trace& t, const std::vector<cudaStream_t>& ss) {
  std::vector<void*> ptr(t.ids, nullptr);
  std::vector<std::uint64_t> size(t.ids, 0);
  std::uint64_t live = 0, peak_live = 0;
  a.reset();
  auto t0 = clk::now();
  for (const Event& e : t.events) {
    if (e.alloc) {
      ptr[e.id] = a.alloc(e.size, ss[e.stream]);
      size[e.id] = e.size;
      live += e.size;
      peak_live = std::max(peak_live, live);
    } else if (ptr[e.id] != nullptr) {
      a.free(ptr[e.id], ss[0]);
      ptr[e.id] = nullptr;
      live -= size[e.id];
    }
  }
  auto t1 = clk::now();
  ReplayResult r;
  r.ns_per_event = std::chrono::duration<double, std::nano>(t1 - t0).count() /
                   static_cast<double>(std::max<std::size_t>(t.events.size(), 1));
  r.peak_reserved = a.peak_reserved();
  r.peak_requested = peak_live;
  for (std::uint32_t i = 0; i < t.ids; ++i)
    if (ptr[i] != nullptr) a.free(ptr[i], ss[0]);
  CK(cudaDeviceSynchronize());
  return r;
}

// A warm-up pass, then kReplayPasses measured passes (each from a cold cache), the
// median pass reported: one pass of a fast allocator lasts a few to a few hundred
// milliseconds, and on a busy host the same tree's single pass moved by a third
// between two runs minutes apart. cudaMalloc keeps no cache and takes seconds a pass:
// no warm-up, one pass.
constexpr int kReplayPasses = 3;
ReplayResult replay(const Api& a, const Trace& t, const std::vector<cudaStream_t>& ss) {
  if (a.slow) return replay_once(a, t, ss);
  replay_once(a, t, ss);
  std::vector<ReplayResult> passes;
  for (int i = 0; i < kReplayPasses; ++i) passes.push_back(replay_once(a, t, ss));
  std::sort(passes.begin(), passes.end(), [](const ReplayResult& x, const ReplayResult& y) {
    return x.ns_per_event < y.ns_per_event;
  });
  return passes[passes.size() / 2];
}

// ---- Report ------------------------------------------------------------------------

// columns: reservoir, c10, cudaMallocAsync, cudaMalloc, Reservoir policy:compact,
// Reservoir backend:cudaMallocAsync
constexpr int kApis = 6;
const char* const kColumn[kApis] = {"Reservoir",  "PyTorch c10",       "cudaMallocAsync",
                                    "cudaMalloc", "Reservoir compact", "Reservoir async"};
// --columns' names for them, and which are measured and shown.
const char* const kColumnKey[kApis] = {"reservoir",  "c10",     "cudaMallocAsync",
                                       "cudaMalloc", "compact", "reservoir-async"};
bool g_shown[kApis] = {true, true, true, true, true, true};

// Sets g_shown from a comma-separated list of kColumnKey names; false on an unknown one.
bool select_columns(const std::string& list) {
  for (bool& b : g_shown) b = false;
  std::size_t from = 0;
  while (from <= list.size()) {
    const std::size_t comma = std::min(list.find(',', from), list.size());
    const std::string key = list.substr(from, comma - from);
    bool known = false;
    for (int c = 0; c < kApis; ++c)
      if (key == kColumnKey[c]) known = g_shown[c] = true;
    if (!known) {
      std::fprintf(stderr, "--columns: unknown column '%s'\n", key.c_str());
      return false;
    }
    from = comma + 1;
  }
  return true;
}

struct Row {
  std::string pattern;
  double value[kApis];  // < 0: not measured
  bool ratio = false;   // value is a ratio, not ns
};

reservoir_bench::TextTable main_table(const std::vector<Row>& rows) {
  reservoir_bench::TextTable t;
  t.header.push_back("pattern");
  for (int c = 0; c < kApis; ++c)
    if (g_shown[c]) t.header.push_back(kColumn[c]);
  for (const Row& r : rows) {
    std::vector<std::string> cells = {r.pattern};
    for (int c = 0; c < kApis; ++c)
      if (g_shown[c]) cells.push_back(reservoir_bench::format_value(r.value[c], r.ratio));
    t.rows.push_back(std::move(cells));
  }
  return t;
}

void write_markdown(const std::string& path, const std::vector<Row>& rows,
                    const std::string& device, const std::string& setup,
                    const std::string& latency) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  out << "# Reservoir GPU benchmark\n\n"
      << "Measured " << date << " on " << device << " in one run of reservoir_gpu_bench.\n"
      << setup << "\n\n"
      << "Host ns per alloc+free pair (threads: total time / all pairs; each cell the median "
         "of rounds repeated while they took under 0.25 s in all, at least 3 and at most 31; a "
         "single-thread "
         "pair or log-uniform cell the median of "
      << g_passes
      << " such passes spread over the "
         "run); replay: host ns per trace event from a cold cache; ratio: peak reserved / peak "
         "requested. "
      << QuietCpu::describe() << "\n\n"
      << reservoir_bench::markdown_table(main_table(rows)) << "\n"
      << latency;
  std::printf("wrote %s\n", path.c_str());
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: reservoir_gpu_bench [--markdown PATH] [--traces DIR] [--smoke] [--no-pin]\n"
      "                           [--columns NAME,...] [--passes N]\n"
      "  --markdown PATH  also write the tables as markdown (with date and device)\n"
      "  --traces DIR     *.trace.gz to replay (default %s)\n"
      "  --smoke          1/100 of the iterations and calls, 2000 events per trace (a quick\n"
      "                   check)\n"
      "  --columns NAMES  measure and show only these columns (comma-separated: reservoir,\n"
      "                   c10, cudaMallocAsync, cudaMalloc, compact, reservoir-async;\n"
      "                   default all)\n"
      "  --passes N       measure the single-thread cells N times, spread over the run, and\n"
      "                   report each one's median pass (default 3)\n"
      "  --no-pin         run the single-thread cells wherever the scheduler puts them (by\n"
      "                   default each runs pinned to the CPU that ran the calibration\n"
      "                   loops fastest just before it: quiet_cpu.hpp)\n",
      RESERVOIR_TRACE_DIR);
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  std::string markdown, trace_dir = RESERVOIR_TRACE_DIR;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--markdown" && i + 1 < argc) {
      markdown = argv[++i];
    } else if (arg == "--traces" && i + 1 < argc) {
      trace_dir = argv[++i];
    } else if (arg == "--smoke") {
      smoke = true;
    } else if (arg == "--columns" && i + 1 < argc) {
      if (!select_columns(argv[++i])) usage(2);
    } else if (arg == "--passes" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 99) {
        std::fprintf(stderr, "--passes: a whole number from 1 to 99, not '%s'\n", argv[i]);
        usage(2);
      }
      g_passes = static_cast<int>(n);
    } else if (arg == "--no-pin") {
      QuietCpu::set_enabled(false);
    } else if (arg == "--help" || arg == "-h") {
      usage(0);
    } else {
      std::fprintf(stderr, "unknown argument: %s\n", arg.c_str());
      usage(2);
    }
  }
  if (!reservoir::CudaBackend::available()) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 reservoir::CudaBackend::unavailable_reason().c_str());
    return 1;
  }

  try {
    CK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    CK(cudaDriverGetVersion(&driver));
    CK(cudaRuntimeGetVersion(&runtime));

    reservoir::Allocator reservoir_allocator(std::make_shared<reservoir::CudaBackend>(),
                                             reservoir::Config::from_environment());
    reservoir::Allocator reservoir_compact(std::make_shared<reservoir::CudaBackend>(),
                                           reservoir::Config::parse("policy:compact"));
    reservoir::Allocator reservoir_async(std::make_shared<reservoir::CudaBackend>(),
                                         reservoir::Config::parse("backend:cudaMallocAsync"));
    g_reservoir[kReservoir] = &reservoir_allocator;
    g_reservoir[kReservoirCompact] = &reservoir_compact;
    g_reservoir[kReservoirAsync] = &reservoir_async;
#if defined(RESERVOIR_BENCH_WITH_C10)
    reservoir_bench::c10_api::init();
#endif
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaDeviceGetDefaultMemPool(&g_pool, 0));
    std::uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReleaseThreshold, &threshold));

    // Columns in kColumn order; a missing allocator leaves its column n/a.
    std::unique_ptr<Api> apis[kApis];
    apis[0] = reservoir_api<kReservoir>("reservoir");
#if defined(RESERVOIR_BENCH_WITH_C10)
    apis[1] = std::make_unique<Api>(Api{"c10", reservoir_bench::c10_api::alloc,
                                        reservoir_bench::c10_api::free, false, c10_reset,
                                        reservoir_bench::c10_api::peak_reserved});
#endif
    apis[2] = std::make_unique<Api>(
        Api{"cudaMallocAsync", async_alloc, async_free, false, async_reset, async_peak});
    apis[3] = std::make_unique<Api>(
        Api{"cudaMalloc", plain_alloc, plain_free, true, plain_reset, plain_peak});
    apis[4] = reservoir_api<kReservoirCompact>("reservoir policy:compact");
    apis[5] = reservoir_api<kReservoirAsync>("reservoir backend:cudaMallocAsync");
    for (int c = 0; c < kApis; ++c)
      if (!g_shown[c]) apis[c].reset();

    const std::string conf = reservoir_allocator.config().to_string();
    char setup[512];
    std::snprintf(setup, sizeof setup,
                  "Driver %d, runtime %d; Reservoir config: %s%s; c10 %s; cudaMallocAsync: "
                  "default pool, release threshold UINT64_MAX%s.",
                  driver, runtime, conf.empty() ? "defaults" : conf.c_str(),
                  reservoir_allocator.caching() ? "" : " (RESERVOIR_NO_CACHING: uncached)",
#if defined(RESERVOIR_BENCH_WITH_C10)
                  "built in",
#else
                  "not built (configure with -DTORCH_DIR=...)",
#endif
                  smoke ? "; SMOKE RUN (reduced iterations: not for comparison)" : "");
    std::printf("reservoir_gpu_bench on %s\n%s\n\n", prop.name, setup);

    // Traces, sorted by name.
    std::vector<Trace> traces;
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(trace_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > 9 && name.compare(name.size() - 9, 9, ".trace.gz") == 0)
        files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) std::printf("note: no *.trace.gz under %s\n", trace_dir.c_str());
    for (const auto& f : files) {
      Trace t;
      t.name = f.filename().string();
      t.name.resize(t.name.size() - 9);
      if (!load_trace(f.string(), smoke ? 2000 : SIZE_MAX, &t)) {
        std::fprintf(stderr, "cannot read %s\n", f.string().c_str());
        return 1;
      }
      if (t.skipped) {
        std::printf("note: %s routes to private pools: reservoir-replay replays it\n",
                    t.name.c_str());
        continue;
      }
      traces.push_back(std::move(t));
    }

    const int div = smoke ? 100 : 1;
    // Single-call latency: 200k timed allocate and free calls per cell (cudaMalloc:
    // 20k, about 5 s of its 60 us calls), less the clock's cost measured here.
    const reservoir_bench::ClockCost clock_cost = reservoir_bench::measure_clock_cost(200000);
    const reservoir_bench::LatencyPlan plan{std::size_t{200000} / div, std::size_t{20000} / div,
                                            clock_cost.median_ns};
    std::vector<reservoir_bench::LatencyRow> latency;
    std::vector<Row> rows;
    auto row = [&](const std::string& pattern, bool ratio = false) -> Row& {
      for (Row& r : rows)
        if (r.pattern == pattern) return r;
      Row r{pattern, {-1, -1, -1, -1, -1, -1}, ratio};
      rows.push_back(r);
      return rows.back();
    };
    // Fix the row order before measuring.
    for (const char* p : kSingleCell) row(p);
    for (const char* p :
         {"pair 1 MiB, 2 threads, own streams", "pair 1 MiB, 8 threads, own streams"})
      row(p);
    for (int n : kTurnCounts) row(turns_row(n));
    for (const Trace& t : traces) row("replay " + t.name + " (ns/event)");
    for (const Trace& t : traces) row("ratio " + t.name, true);

    // The single-thread cells in g_passes passes spread over the run (one at its start,
    // one after the thread cells, the rest after the replays), every column in each:
    // a cell is the median of its passes (single_thread_cells).
    std::vector<double> single[kApis][kSingleCells];
    auto singles = [&](int pass) {
      for (int c = 0; c < kApis; ++c) {
        if (!apis[c]) continue;
        std::printf("measuring %s: single-thread cells, pass %d of %d ...\n", apis[c]->name,
                    pass + 1, g_passes);
        std::fflush(stdout);
        single_thread_cells(*apis[c], div, s, pass, single[c]);
        apis[c]->reset();  // the next column starts from an empty device
      }
    };
    singles(0);
    for (int c = 0; c < kApis; ++c) {
      if (!apis[c]) continue;
      const Api& a = *apis[c];
      std::printf("measuring %s: threads ...\n", a.name);
      std::fflush(stdout);
      for (int threads : {2, 8}) {
        row("pair 1 MiB, " + std::to_string(threads) + " threads, own streams").value[c] =
            median_round([&] {
              return bench_threads(a, threads, std::size_t{1} << 20, (a.slow ? 500 : 100000) / div);
            });
      }
      double turns[kTurnRows];
      measure_turn_rows(a, (a.slow ? 2000 : 200000) / div, turns);
      for (std::size_t k = 0; k < kTurnRows; ++k)
        row(turns_row(kTurnCounts[k])).value[c] = turns[k];
      a.reset();
    }
    if (g_passes > 1) singles(1);
    for (int c = 0; c < kApis; ++c) {
      if (!apis[c]) continue;
      const Api& a = *apis[c];
      std::printf("measuring %s: replays, latency ...\n", a.name);
      std::fflush(stdout);
      CK(cudaDeviceSynchronize());
      for (const Trace& t : traces) {
        std::vector<cudaStream_t> ss(t.streams);
        for (auto& x : ss) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
        ReplayResult r;
        {
          QuietCpu pin;
          r = replay(a, t, ss);
        }
        for (auto& x : ss) reservoir_bench::destroy_stream(a, x);
        row("replay " + t.name + " (ns/event)").value[c] = r.ns_per_event;
        if (r.peak_reserved > 0 && r.peak_requested > 0) {
          row("ratio " + t.name, true).value[c] =
              static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested);
        }
      }
      for (auto& r : reservoir_bench::measure_latency(a, kColumn[c], plan))
        latency.push_back(std::move(r));
      // Give the memory back so the next allocator starts from an empty device.
      a.reset();
    }
    for (int pass = 2; pass < g_passes; ++pass) singles(pass);
    for (int k = 0; k < kSingleCells; ++k)
      for (int c = 0; c < kApis; ++c)
        if (!single[c][k].empty()) row(kSingleCell[k]).value[c] = median_of(single[c][k]);
    for (const auto& a : apis)
      if (a && a->release_stream) a->release_stream(s);
    CK(cudaStreamDestroy(s));

    std::printf("\n%s\n\n", QuietCpu::describe().c_str());
    reservoir_bench::print_table(main_table(rows), stdout);
    const std::string clock_line = reservoir_bench::describe_clock(clock_cost);
    const reservoir_bench::TextTable latency_table = reservoir_bench::latency_table(latency);
    std::printf(
        "\nSingle-call latency, ns (p50 / p99 / p99.9 / max of every allocate and free "
        "call, each timed on its own)\n%s\n\n",
        clock_line.c_str());
    reservoir_bench::print_table(latency_table, stdout);
    if (!markdown.empty()) {
      write_markdown(markdown, rows, prop.name, setup,
                     "## Single-call latency (ns)\n\n"
                     "Every allocate and every free call timed on its own; p50 / p99 / p99.9 / "
                     "max over all calls of the cell (all threads together); each cell starts "
                     "from an emptied cache and runs an untimed warm-up first. " +
                         clock_line + "\n\n" + reservoir_bench::markdown_table(latency_table));
    }
    for (auto*& r : g_reservoir) r = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reservoir_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
