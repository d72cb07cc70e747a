// reservoir_snapshot_demo TRACE SNAPSHOT.pickle [CONFIG]
//
// Replays a trace (docs/trace_format.md; gzip or plain) through an Allocator on the
// simulated device with history on (every entry keeps the context
// "demo.py:42 train_step"), then writes the snapshot for PyTorch's memory viewer:
//
//   python -m torch.cuda._memory_viz trace_plot SNAPSHOT.pickle -o trace.html
//
// A check that real workloads produce snapshots the viewer opens, without a GPU.
// CONFIG is RESERVOIR_ALLOC_CONF syntax ("expandable_segments:True", ...).
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/sim_backend.hpp"

namespace {

// Splits "a,1,2,3" into numbers after the tag; false on anything malformed.
bool fields(const char* text, std::vector<unsigned long long>* out) {
  out->clear();
  const char* p = text;
  while (*p == ',') {
    char* end = nullptr;
    ++p;
    if (*p < '0' || *p > '9') return false;
    out->push_back(std::strtoull(p, &end, 10));
    p = end;
  }
  while (*p == ' ' || *p == '\r' || *p == '\n' || *p == '\t') ++p;
  return *p == '\0';
}

int fail(const std::string& message) {
  std::fprintf(stderr, "reservoir_snapshot_demo: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s TRACE SNAPSHOT.pickle [CONFIG]\n", argv[0]);
    return 2;
  }
  const std::string trace = argv[1], out = argv[2];
  try {
    reservoir::SimOptions options;
    options.capacity = std::size_t{1} << 40;  // the replay measures, it does not run out
    auto sim = std::make_shared<reservoir::SimBackend>(options);
    reservoir::Allocator a(sim, reservoir::Config::parse(argc == 4 ? argv[3] : ""));
    a.record_history(true, 1000000, reservoir::ContextLevel::all,
                     [] { return std::string("demo.py:42 train_step"); });

    gzFile in = gzopen(trace.c_str(), "rb");
    if (!in) return fail("cannot open " + trace);
    std::unordered_map<unsigned long long, void*> live;
    std::vector<unsigned long long> f;
    char line[512];
    long number = 0, events = 0;
    while (gzgets(in, line, sizeof line)) {
      ++number;
      const std::string where = trace + ":" + std::to_string(number);
      const char tag = line[0];
      if (tag == '#' || tag == '\n' || tag == '\r' || tag == '\0') continue;
      if (!fields(line + 1, &f)) {
        gzclose(in);
        return fail(where + ": malformed line '" + line + "'");
      }
      ++events;
      if (tag == 'a' && f.size() == 3) {
        live[f[0]] = a.allocate(f[1], f[2]);
      } else if (tag == 'f' && f.size() == 1 && live.count(f[0])) {
        a.deallocate(live[f[0]]);
        live.erase(f[0]);
      } else if (tag == 'u' && f.size() == 2 && live.count(f[0])) {
        a.record_stream(live[f[0]], f[1]);
      } else if (tag == 's' && f.size() == 1) {
        sim->advance(f[0]);  // the simulated stream finishes its work
        a.notify_host_wait(f[0]);
      } else {
        gzclose(in);
        return fail(where + ": unexpected event '" + line + "'");
      }
    }
    int error = Z_OK;
    const char* message = gzerror(in, &error);
    const bool read_failed = error != Z_OK && error != Z_STREAM_END;
    const std::string reason = read_failed ? message : "";
    gzclose(in);
    if (read_failed) return fail(trace + ": cannot read: " + reason);

    a.dump_snapshot(out);
    const reservoir::DeviceStats st = a.stats(0);
    std::printf("%ld events replayed; %zu history entries; peak reserved %lld bytes; wrote %s\n",
                events, a.history(0).size(), static_cast<long long>(st.reserved_bytes.all().peak),
                out.c_str());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
