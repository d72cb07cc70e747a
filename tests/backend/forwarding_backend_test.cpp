// ForwardingBackend: every virtual of Backend reaches the inner backend unchanged.
//
// What makes this hold for calls added to Backend later: the test reads the virtuals
// that include/reservoir/backend.hpp declares and requires each to be in calls() below
// (and, for a device call, in BackendCall). Each entry is made through a
// ForwardingBackend over a Probe (which records every call it gets) and directly on a
// Probe; both must see the same call and give the same answers. A call that
// ForwardingBackend does not override reaches Backend's default instead and fails.
#include "reservoir/forwarding_backend.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

// The virtuals backend.hpp declares, in order: {return type, name}; no destructor.
std::vector<std::pair<std::string, std::string>> declared_virtuals() {
  std::ifstream in(RESERVOIR_BACKEND_HEADER);
  EXPECT_TRUE(in) << "cannot read " << RESERVOIR_BACKEND_HEADER;
  std::string code, line;
  while (std::getline(in, line)) code += line.substr(0, line.find("//")) + "\n";
  std::vector<std::pair<std::string, std::string>> out;
  static const std::regex kVirtual(R"(virtual\s+([^;(]*?)\s*(~?\b\w+)\s*\()");
  for (std::sregex_iterator it(code.begin(), code.end(), kVirtual), end; it != end; ++it)
    if ((*it)[2].str()[0] != '~') out.emplace_back((*it)[1].str(), (*it)[2].str());
  return out;
}

// Records every call with its inputs and answers with values no default gives.
class Probe final : public Backend {
 public:
  std::vector<std::string> log;

  const char* name() const noexcept override { return "probe"; }
  std::uint32_t capabilities() const noexcept override { return 0x5a5a; }
  std::uint64_t now_us() const override { return 4242; }
  DeviceStatus device_count(int* count) override {
    *count = 7;
    return hit("device_count");
  }
  DeviceStatus current_device(int* device) override {
    *device = 5;
    return hit("current_device");
  }
  DeviceStatus memory_info(int device, MemoryInfo* info) override {
    *info = MemoryInfo{11, 22};
    return hit("memory_info", device);
  }
  DeviceStatus allocate(int device, std::size_t size, void** ptr) override {
    *ptr = kOut;
    return hit("allocate", device, size);
  }
  DeviceStatus deallocate(int device, void* ptr, std::size_t size) override {
    return hit("deallocate", device, ptr, size);
  }
  DeviceStatus create_event(int device, EventHandle* event) override {
    *event = 0xe1;
    return hit("create_event", device);
  }
  DeviceStatus destroy_event(int device, EventHandle event) override {
    return hit("destroy_event", device, event);
  }
  DeviceStatus record_event(int device, EventHandle event, StreamHandle stream) override {
    return hit("record_event", device, event, stream);
  }
  DeviceStatus query_event(int device, EventHandle event) override {
    return hit("query_event", device, event);
  }
  DeviceStatus synchronize_event(int device, EventHandle event) override {
    return hit("synchronize_event", device, event);
  }
  DeviceStatus stream_wait_event(int device, StreamHandle stream, EventHandle event) override {
    return hit("stream_wait_event", device, stream, event);
  }
  DeviceStatus synchronize_stream(int device, StreamHandle stream) override {
    return hit("synchronize_stream", device, stream);
  }
  DeviceStatus create_stream(int device, StreamHandle* stream) override {
    *stream = 0x5e;
    return hit("create_stream", device);
  }
  DeviceStatus destroy_stream(int device, StreamHandle stream) override {
    return hit("destroy_stream", device, stream);
  }
  DeviceStatus synchronize_device(int device) override { return hit("synchronize_device", device); }
  DeviceStatus host_waited(int device, StreamHandle stream) override {
    return hit("host_waited", device, stream);
  }
  DeviceStatus capture_point(int device, StreamHandle stream, CapturePoint* out) override {
    out->capture = 77;
    out->nodes = {0x71, 0x72};
    return hit("capture_point", device, stream);
  }
  DeviceStatus capture_follows(int device, StreamHandle stream, const CapturePoint* points,
                               std::size_t count, bool* follows) override {
    *follows = true;
    return hit("capture_follows", device, stream, points[0].capture, count);
  }
  DeviceStatus granularity(int device, std::size_t* bytes) override {
    *bytes = 4096;
    return hit("granularity", device);
  }
  DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                     void** ptr) override {
    *ptr = kOut;
    return hit("reserve_address_range", device, size, alignment);
  }
  DeviceStatus release_address_range(int device, void* ptr, std::size_t size) override {
    return hit("release_address_range", device, ptr, size);
  }
  DeviceStatus create_physical(int device, std::size_t size, PhysicalHandle* handle) override {
    *handle = 0x91;
    return hit("create_physical", device, size);
  }
  DeviceStatus release_physical(int device, PhysicalHandle handle) override {
    return hit("release_physical", device, handle);
  }
  DeviceStatus map(int device, void* ptr, std::size_t size, PhysicalHandle handle) override {
    return hit("map", device, ptr, size, handle);
  }
  DeviceStatus unmap(int device, void* ptr, std::size_t size) override {
    return hit("unmap", device, ptr, size);
  }
  DeviceStatus set_access(int device, void* ptr, std::size_t size, const int* devices,
                          int count) override {
    return hit("set_access", device, ptr, size, devices[0], count);
  }
  DeviceStatus allocate_host(int device, std::size_t size, void** ptr) override {
    *ptr = kOut;
    return hit("allocate_host", device, size);
  }
  DeviceStatus free_host(int device, void* ptr) override { return hit("free_host", device, ptr); }
  DeviceStatus copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override {
    return hit("copy_to_host", device, dst, src, bytes);
  }
  DeviceStatus copy_to_device(int device, void* dst, const void* src, std::size_t bytes) override {
    return hit("copy_to_device", device, dst, src, bytes);
  }
  DeviceStatus copy_to_device_async(int device, void* dst, const void* src, std::size_t bytes,
                                    StreamHandle stream) override {
    return hit("copy_to_device_async", device, dst, src, bytes, stream);
  }
  DeviceStatus export_ipc(int device, void* base, IpcHandle* handle) override {
    handle->bytes[0] = 0x77;
    return hit("export_ipc", device, base);
  }
  DeviceStatus open_ipc(int device, const IpcHandle& handle, void** ptr) override {
    *ptr = kOut;
    return hit("open_ipc", device, int{handle.bytes[0]});
  }
  DeviceStatus close_ipc(int device, void* ptr) override { return hit("close_ipc", device, ptr); }
  DeviceStatus export_shareable(int device, PhysicalHandle handle, ShareableHandle::Kind kind,
                                ShareableHandle* out) override {
    out->kind = kind;
    out->fd = 99;
    return hit("export_shareable", device, handle, int{kind});
  }
  DeviceStatus import_shareable(int device, const ShareableHandle& shared,
                                PhysicalHandle* handle) override {
    *handle = 0x92;
    return hit("import_shareable", device, shared.fd);
  }
  DeviceStatus create_pool(int device, PoolHandle* pool) override {
    *pool = 0xb1;
    return hit("create_pool", device);
  }
  DeviceStatus destroy_pool(int device, PoolHandle pool) override {
    return hit("destroy_pool", device, pool);
  }
  DeviceStatus allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                  StreamHandle stream, void** ptr) override {
    *ptr = kOut;
    return hit("allocate_from_pool", device, pool, size, stream);
  }
  DeviceStatus free_async(int device, void* ptr, StreamHandle stream) override {
    return hit("free_async", device, ptr, stream);
  }
  DeviceStatus set_pool_release_threshold(int device, PoolHandle pool,
                                          std::uint64_t bytes) override {
    return hit("set_pool_release_threshold", device, pool, bytes);
  }
  DeviceStatus trim_pool(int device, PoolHandle pool, std::size_t keep) override {
    return hit("trim_pool", device, pool, keep);
  }
  DeviceStatus pool_usage(int device, PoolHandle pool, PoolUsage* out) override {
    out->used = 33;
    return hit("pool_usage", device, pool);
  }
  DeviceStatus reset_pool_peaks(int device, PoolHandle pool) override {
    return hit("reset_pool_peaks", device, pool);
  }
  DeviceStatus set_pool_access(int device, PoolHandle pool, const int* devices,
                               int count) override {
    return hit("set_pool_access", device, pool, devices[0], count);
  }
  DeviceStatus process_memory(int device, std::vector<ProcessMemory>* out) override {
    out->push_back(ProcessMemory{123, 456});
    return hit("process_memory", device);
  }
  DeviceStatus can_access_peer(int device, int peer, bool* can) override {
    *can = true;
    return hit("can_access_peer", device, peer);
  }
  DeviceStatus enable_peer_access(int device, int peer) override {
    return hit("enable_peer_access", device, peer);
  }

  static inline void* const kOut = reinterpret_cast<void*>(0xabc000);

 private:
  // not_ready: an answer that Backend's defaults (unsupported, ok) never give.
  template <class... A>
  DeviceStatus hit(const char* call, const A&... inputs) {
    std::ostringstream line;
    line << call;
    ((line << ' ' << inputs), ...);
    log.push_back(line.str());
    return DeviceStatus::not_ready;
  }
};

// Observes forward(): the device calls that pass through it.
class Watcher final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<BackendCall> seen;

 protected:
  DeviceStatus forward(BackendCall call, const ForwardedCall& it) override {
    seen.push_back(call);
    return it();
  }
};

std::string answer(DeviceStatus status) {
  return to_string(status);
}
template <class T>
std::string answer(DeviceStatus status, const T& out) {
  std::ostringstream s;
  s << to_string(status) << ' ' << out;
  return s.str();
}

void* const kPtr = reinterpret_cast<void*>(0x5000);
void* const kHost = reinterpret_cast<void*>(0x6000);
constexpr int kDevice = 3;
const int kPeers[] = {1, 2};

// One call of every virtual, with distinct inputs; returns what the caller gets back.
struct Call {
  std::string name;
  std::function<std::string(Backend&)> make;
};

const std::vector<Call>& calls() {
  static const std::vector<Call> kCalls = {
      {"name", [](Backend& b) { return std::string(b.name()); }},
      {"capabilities", [](Backend& b) { return std::to_string(b.capabilities()); }},
      {"device_count",
       [](Backend& b) {
         int n = 0;
         return answer(b.device_count(&n), n);
       }},
      {"current_device",
       [](Backend& b) {
         int d = 0;
         return answer(b.current_device(&d), d);
       }},
      {"memory_info",
       [](Backend& b) {
         MemoryInfo info;
         return answer(b.memory_info(kDevice, &info), info.free + 1000 * info.total);
       }},
      {"allocate",
       [](Backend& b) {
         void* p = nullptr;
         return answer(b.allocate(kDevice, 4096, &p), p);
       }},
      {"deallocate", [](Backend& b) { return answer(b.deallocate(kDevice, kPtr, 4096)); }},
      {"create_event",
       [](Backend& b) {
         EventHandle e = 0;
         return answer(b.create_event(kDevice, &e), e);
       }},
      {"destroy_event", [](Backend& b) { return answer(b.destroy_event(kDevice, 0xe2)); }},
      {"record_event", [](Backend& b) { return answer(b.record_event(kDevice, 0xe3, 0x51)); }},
      {"query_event", [](Backend& b) { return answer(b.query_event(kDevice, 0xe4)); }},
      {"synchronize_event", [](Backend& b) { return answer(b.synchronize_event(kDevice, 0xe5)); }},
      {"stream_wait_event",
       [](Backend& b) { return answer(b.stream_wait_event(kDevice, 0x52, 0xe6)); }},
      {"synchronize_stream",
       [](Backend& b) { return answer(b.synchronize_stream(kDevice, 0x53)); }},
      {"create_stream",
       [](Backend& b) {
         StreamHandle s = 0;
         return answer(b.create_stream(kDevice, &s), s);
       }},
      {"destroy_stream", [](Backend& b) { return answer(b.destroy_stream(kDevice, 0x54)); }},
      {"synchronize_device", [](Backend& b) { return answer(b.synchronize_device(kDevice)); }},
      {"host_waited", [](Backend& b) { return answer(b.host_waited(kDevice, 0x55)); }},
      {"capture_point",
       [](Backend& b) {
         CapturePoint point;
         return answer(b.capture_point(kDevice, 0x56, &point),
                       point.capture + point.nodes.size() * 1000 +
                           (point.nodes.size() > 1 ? point.nodes[1] : 0));
       }},
      {"capture_follows",
       [](Backend& b) {
         const CapturePoint points[2] = {CapturePoint{9, {1}}, CapturePoint{9, {2}}};
         bool follows = false;
         return answer(b.capture_follows(kDevice, 0x57, points, 2, &follows), follows);
       }},
      {"granularity",
       [](Backend& b) {
         std::size_t g = 0;
         return answer(b.granularity(kDevice, &g), g);
       }},
      {"reserve_address_range",
       [](Backend& b) {
         void* p = nullptr;
         return answer(b.reserve_address_range(kDevice, 8192, 4096, &p), p);
       }},
      {"release_address_range",
       [](Backend& b) { return answer(b.release_address_range(kDevice, kPtr, 8192)); }},
      {"create_physical",
       [](Backend& b) {
         PhysicalHandle h = 0;
         return answer(b.create_physical(kDevice, 4096, &h), h);
       }},
      {"release_physical", [](Backend& b) { return answer(b.release_physical(kDevice, 0x93)); }},
      {"map", [](Backend& b) { return answer(b.map(kDevice, kPtr, 4096, 0x94)); }},
      {"unmap", [](Backend& b) { return answer(b.unmap(kDevice, kPtr, 4096)); }},
      {"set_access",
       [](Backend& b) { return answer(b.set_access(kDevice, kPtr, 4096, kPeers, 2)); }},
      {"allocate_host",
       [](Backend& b) {
         void* p = nullptr;
         return answer(b.allocate_host(kDevice, 12288, &p), p);
       }},
      {"free_host", [](Backend& b) { return answer(b.free_host(kDevice, kHost)); }},
      {"copy_to_host",
       [](Backend& b) { return answer(b.copy_to_host(kDevice, kHost, kPtr, 1536)); }},
      {"copy_to_device",
       [](Backend& b) { return answer(b.copy_to_device(kDevice, kPtr, kHost, 2560)); }},
      {"copy_to_device_async",
       [](Backend& b) { return answer(b.copy_to_device_async(kDevice, kPtr, kHost, 3584, 0x57)); }},
      {"export_ipc",
       [](Backend& b) {
         IpcHandle h;
         return answer(b.export_ipc(kDevice, kPtr, &h), int{h.bytes[0]});
       }},
      {"open_ipc",
       [](Backend& b) {
         IpcHandle h;
         h.bytes[0] = 0x66;
         void* p = nullptr;
         return answer(b.open_ipc(kDevice, h, &p), p);
       }},
      {"close_ipc", [](Backend& b) { return answer(b.close_ipc(kDevice, kPtr)); }},
      {"export_shareable",
       [](Backend& b) {
         ShareableHandle out;
         return answer(b.export_shareable(kDevice, 0x95, ShareableHandle::fabric, &out),
                       int{out.kind} * 1000 + out.fd);
       }},
      {"import_shareable",
       [](Backend& b) {
         ShareableHandle in;
         in.fd = 41;
         PhysicalHandle h = 0;
         return answer(b.import_shareable(kDevice, in, &h), h);
       }},
      {"create_pool",
       [](Backend& b) {
         PoolHandle p = 0;
         return answer(b.create_pool(kDevice, &p), p);
       }},
      {"destroy_pool", [](Backend& b) { return answer(b.destroy_pool(kDevice, 0xb2)); }},
      {"allocate_from_pool",
       [](Backend& b) {
         void* p = nullptr;
         return answer(b.allocate_from_pool(kDevice, 0xb3, 512, 0x55, &p), p);
       }},
      {"free_async", [](Backend& b) { return answer(b.free_async(kDevice, kPtr, 0x56)); }},
      {"set_pool_release_threshold",
       [](Backend& b) { return answer(b.set_pool_release_threshold(kDevice, 0xb4, 1 << 20)); }},
      {"trim_pool", [](Backend& b) { return answer(b.trim_pool(kDevice, 0xb5, 2048)); }},
      {"pool_usage",
       [](Backend& b) {
         PoolUsage u;
         return answer(b.pool_usage(kDevice, 0xb6, &u), u.used);
       }},
      {"reset_pool_peaks", [](Backend& b) { return answer(b.reset_pool_peaks(kDevice, 0xb7)); }},
      {"set_pool_access",
       [](Backend& b) { return answer(b.set_pool_access(kDevice, 0xb8, kPeers, 2)); }},
      {"process_memory",
       [](Backend& b) {
         std::vector<ProcessMemory> out;
         const DeviceStatus st = b.process_memory(kDevice, &out);
         return answer(st, out.size() == 1 ? out[0].pid * 1000 + out[0].used_bytes : 0);
       }},
      {"can_access_peer",
       [](Backend& b) {
         bool can = false;
         return answer(b.can_access_peer(kDevice, 1, &can), int{can});
       }},
      {"enable_peer_access", [](Backend& b) { return answer(b.enable_peer_access(kDevice, 2)); }},
      {"now_us", [](Backend& b) { return std::to_string(b.now_us()); }},
  };
  return kCalls;
}

TEST(ForwardingBackend, TheTestCoversEveryVirtualOfBackend) {
  const auto declared = declared_virtuals();
  ASSERT_GE(declared.size(), 40u) << "reading " << RESERVOIR_BACKEND_HEADER << " went wrong";
  std::set<std::string> listed;
  for (const Call& c : calls()) listed.insert(c.name);
  for (const auto& [type, name] : declared)
    EXPECT_TRUE(listed.count(name))
        << "Backend::" << name << " is new: forward it in ForwardingBackend (and list it in "
        << "BackendCall when it answers a DeviceStatus), then add it to Probe and calls() here";
  EXPECT_EQ(listed.size(), declared.size()) << "calls() lists a call Backend no longer has";
}

TEST(ForwardingBackend, BackendCallListsEveryDeviceCallInOrder) {
  std::vector<std::string> device_calls;
  for (const auto& [type, name] : declared_virtuals())
    if (type == "DeviceStatus") device_calls.push_back(name);
  std::vector<std::string> listed;
  for (std::size_t k = 0; k < static_cast<std::size_t>(BackendCall::count_); ++k)
    listed.push_back(to_string(static_cast<BackendCall>(k)));
  EXPECT_EQ(listed, device_calls);
}

TEST(ForwardingBackend, ForwardsEveryCallWithItsInputsAndAnswers) {
  for (const Call& c : calls()) {
    SCOPED_TRACE(c.name);
    Probe direct, inner;
    Watcher forwarding(inner);
    const std::string expected = c.make(direct);
    EXPECT_EQ(c.make(forwarding), expected);
    EXPECT_EQ(inner.log, direct.log);
    // Queries log nothing; every device call reaches the probe (else the logs above
    // would be two empty ones), once, and passes through forward() once.
    const bool query = c.name == "name" || c.name == "capabilities" || c.name == "now_us";
    ASSERT_EQ(direct.log.size(), query ? 0u : 1u) << "add it to Probe";
    ASSERT_EQ(forwarding.seen.size(), query ? 0u : 1u);
    if (!query) {
      EXPECT_STREQ(to_string(forwarding.seen[0]), c.name.c_str());
    }
  }
}

TEST(ForwardingBackend, SharesOrBorrowsItsInnerBackend) {
  auto sim = std::make_shared<SimBackend>();
  std::weak_ptr<SimBackend> alive = sim;
  {
    ForwardingBackend shared(std::shared_ptr<Backend>(std::move(sim)));
    EXPECT_STREQ(shared.name(), "sim");
    EXPECT_EQ(&shared.inner(), alive.lock().get());
  }
  EXPECT_TRUE(alive.expired());
  SimBackend own;
  ForwardingBackend borrowed(own);
  EXPECT_EQ(&borrowed.inner(), &own);
  EXPECT_EQ(borrowed.capabilities(), own.capabilities());
  EXPECT_THROW(ForwardingBackend(std::shared_ptr<Backend>()), InvalidArgumentError);
}

TEST(ForwardingBackend, LastErrorIsTheInnerBackendsOnThisThread) {
  SimBackend sim;
  ForwardingBackend forwarding(sim);
  void* p = nullptr;
  EXPECT_EQ(forwarding.allocate(9, 4096, &p), DeviceStatus::error);
  EXPECT_EQ(forwarding.last_error(), sim.last_error());
  EXPECT_FALSE(forwarding.last_error().empty());
}

// The whole allocator over a forwarding SimBackend does what it does over the SimBackend
// itself, in each engine: the same addresses, device calls and statistics.
std::vector<std::uintptr_t> workload(const std::shared_ptr<Backend>& backend,
                                     const std::string& config, DeviceStats* stats) {
  Allocator alloc(backend, Config::parse(config));
  std::vector<std::uintptr_t> seen;
  std::vector<void*> live;
  const std::size_t sizes[] = {512, 3000, 1 << 20, 3 << 20, 25 << 20, 700, 12 << 20};
  for (int round = 0; round < 3; ++round) {
    for (std::size_t size : sizes) {
      live.push_back(alloc.allocate(size, /*stream=*/0x100 + round % 2));
      seen.push_back(reinterpret_cast<std::uintptr_t>(live.back()));
    }
    for (std::size_t k = 0; k < live.size(); k += 2) alloc.deallocate(live[k]);
    std::vector<void*> kept;
    for (std::size_t k = 1; k < live.size(); k += 2) kept.push_back(live[k]);
    live = kept;
  }
  for (void* p : live) alloc.deallocate(p);
  alloc.empty_cache();
  alloc.validate();
  *stats = alloc.stats(0);
  return seen;
}

TEST(ForwardingBackend, AnAllocatorOverItBehavesAsOverTheBackend) {
  for (const std::string config : {"", "expandable_segments:True", "backend:cudaMallocAsync"}) {
    SCOPED_TRACE(config);
    SimOptions options;
    options.capacity = std::size_t{1} << 30;
    auto direct = std::make_shared<SimBackend>(options);
    auto inner = std::make_shared<SimBackend>(options);
    DeviceStats direct_stats, forwarded_stats;
    const auto expected = workload(direct, config, &direct_stats);
    EXPECT_EQ(workload(std::make_shared<ForwardingBackend>(inner), config, &forwarded_stats),
              expected);
    const SimCounters a = direct->counters(), b = inner->counters();
    EXPECT_EQ(b.allocs, a.allocs);
    EXPECT_EQ(b.frees, a.frees);
    EXPECT_EQ(b.maps, a.maps);
    EXPECT_EQ(b.unmaps, a.unmaps);
    EXPECT_EQ(b.reservations, a.reservations);
    EXPECT_EQ(b.pool_allocs, a.pool_allocs);
    EXPECT_EQ(b.pool_frees, a.pool_frees);
    EXPECT_EQ(b.events_created, a.events_created);
    EXPECT_EQ(b.device_time_us, a.device_time_us);
    EXPECT_EQ(forwarded_stats.allocation.all().peak, direct_stats.allocation.all().peak);
    EXPECT_EQ(forwarded_stats.reserved_bytes.all().peak, direct_stats.reserved_bytes.all().peak);
    EXPECT_EQ(forwarded_stats.num_device_alloc, direct_stats.num_device_alloc);
  }
}

}  // namespace
}  // namespace reservoir
