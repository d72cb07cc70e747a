// SimBackend's IPC (segment handles, shareable physical memory), process list and
// reachability: synthetic handles between backends of one process, real shared
// memory with host_backed + shared_memory, and a forked child that opens the
// parent's memory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr DeviceStatus kOk = DeviceStatus::ok;

SimOptions shared(int devices = 1) {
  SimOptions o;
  o.capacity = 256 * MiB;
  o.device_count = devices;
  o.host_backed = true;
  o.shared_memory = true;
  return o;
}

void* alloc(SimBackend& sim, std::size_t size, int device = 0) {
  void* p = nullptr;
  EXPECT_EQ(sim.allocate(device, size, &p), kOk) << sim.last_error();
  return p;
}

TEST(SimIpc, SyntheticHandlesOpenOnceInAnotherBackend) {
  SimBackend a, b;
  void* p = alloc(a, 4 * MiB);
  IpcHandle h;
  ASSERT_EQ(a.export_ipc(0, p, &h), kOk);
  EXPECT_EQ(a.export_ipc(0, static_cast<char*>(p) + 512, &h), DeviceStatus::error);  // not a base
  ASSERT_EQ(a.export_ipc(0, p, &h), kOk);
  void* q = nullptr;
  EXPECT_EQ(a.open_ipc(0, h, &q), DeviceStatus::error);  // its own handle
  EXPECT_NE(a.last_error().find("exported by this backend"), std::string::npos);
  ASSERT_EQ(b.open_ipc(0, h, &q), kOk) << b.last_error();
  EXPECT_NE(q, nullptr);
  EXPECT_NE(q, p);  // another address space's view
  void* again = nullptr;
  EXPECT_EQ(b.open_ipc(0, h, &again), DeviceStatus::error);  // once per process, as CUDA
  EXPECT_NE(b.last_error().find("already open"), std::string::npos);
  EXPECT_EQ(b.open_ipc_mappings(), 1u);
  EXPECT_TRUE(b.can_reach(0, q, 4 * MiB));
  ASSERT_EQ(b.close_ipc(0, q), kOk);
  EXPECT_EQ(b.close_ipc(0, q), DeviceStatus::error);
  EXPECT_EQ(b.open_ipc_mappings(), 0u);
  IpcHandle garbage;
  EXPECT_EQ(b.open_ipc(0, garbage, &q), DeviceStatus::error);
  EXPECT_NE(b.last_error().find("not a handle of a simulated device"), std::string::npos);
}

TEST(SimIpc, SharedMemorySegmentsSeeEachOthersWrites) {
  SimBackend a(shared()), b(shared());
  EXPECT_TRUE(a.has(kIpc));
  char* p = static_cast<char*>(alloc(a, 3 * MiB));
  std::memset(p, 0x5a, 3 * MiB);
  IpcHandle h;
  ASSERT_EQ(a.export_ipc(0, p, &h), kOk);
  void* v = nullptr;
  ASSERT_EQ(b.open_ipc(0, h, &v), kOk) << b.last_error();
  char* q = static_cast<char*>(v);
  EXPECT_EQ(q[0], 0x5a);
  EXPECT_EQ(q[3 * MiB - 1], 0x5a);
  q[100] = 0x11;
  EXPECT_EQ(p[100], 0x11);
  ASSERT_EQ(b.close_ipc(0, v), kOk);
}

TEST(SimIpc, PrivateHostMemoryOffersNoIpc) {
  SimOptions o;
  o.capacity = 64 * MiB;
  o.host_backed = true;
  SimBackend a(o);
  EXPECT_FALSE(a.has(kIpc));
  EXPECT_FALSE(a.has(kShareablePosixFd));
  void* p = alloc(a, MiB);
  IpcHandle h;
  EXPECT_EQ(a.export_ipc(0, p, &h), DeviceStatus::unsupported);
  EXPECT_NE(a.last_error().find("shared_memory"), std::string::npos);
  SimOptions bad = o;
  bad.host_backed = false;
  bad.shared_memory = true;  // shared memory needs host memory
  EXPECT_THROW(SimBackend{bad}, InvalidArgumentError);
}

// Maps a physical handle at a new reservation of sim and grants device 0 access.
void* map_fresh(SimBackend& sim, PhysicalHandle h, std::size_t size) {
  void* r = nullptr;
  EXPECT_EQ(sim.reserve_address_range(0, size, 2 * MiB, &r), kOk) << sim.last_error();
  EXPECT_EQ(sim.map(0, r, size, h), kOk) << sim.last_error();
  const int self = 0;
  EXPECT_EQ(sim.set_access(0, r, size, &self, 1), kOk) << sim.last_error();
  return r;
}

TEST(SimIpc, PhysicalMemoryTravelsAsAFileDescriptor) {
  SimBackend a(shared()), b(shared());
  PhysicalHandle h = 0;
  ASSERT_EQ(a.create_physical(0, 4 * MiB, &h), kOk);
  char* pa = static_cast<char*>(map_fresh(a, h, 4 * MiB));
  std::memset(pa, 0x33, 4 * MiB);
  ShareableHandle out;
  ASSERT_EQ(a.export_shareable(0, h, ShareableHandle::posix_fd, &out), kOk) << a.last_error();
  ASSERT_GE(out.fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(out.fd, &st), 0);  // a real descriptor, as CUDA's
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), 4 * MiB);
  EXPECT_EQ(a.export_shareable(0, h, ShareableHandle::fabric, &out), DeviceStatus::unsupported);
  PhysicalHandle imported = 0;
  ASSERT_EQ(b.import_shareable(0, out, &imported), kOk) << b.last_error();
  close(out.fd);
  EXPECT_EQ(b.used(0), 0u);  // the exporter's memory, not the importer's
  char* pb = static_cast<char*>(map_fresh(b, imported, 4 * MiB));
  EXPECT_EQ(pb[4 * MiB - 1], 0x33);
  pb[7] = 0x44;
  EXPECT_EQ(pa[7], 0x44);
  EXPECT_EQ(b.unmap(0, pb, 4 * MiB), kOk);
  EXPECT_EQ(b.release_physical(0, imported), kOk);
  EXPECT_EQ(a.counters().shareable_exports, 1u);
  EXPECT_EQ(b.counters().shareable_imports, 1u);
  ShareableHandle junk;
  junk.fd = 0;  // stdin: not exported memory
  EXPECT_EQ(b.import_shareable(0, junk, &imported), DeviceStatus::error);
}

TEST(SimIpc, AForkedChildOpensTheParentsMemory) {
  SimBackend parent(shared());
  char* p = static_cast<char*>(alloc(parent, 2 * MiB));
  std::memset(p, 0x21, 2 * MiB);
  IpcHandle h;
  ASSERT_EQ(parent.export_ipc(0, p, &h), kOk);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // No gtest here: the exit status says what went wrong.
    SimBackend mine(shared());
    void* v = nullptr;
    if (mine.open_ipc(0, h, &v) != kOk) _exit(2);
    char* q = static_cast<char*>(v);
    if (q[2 * MiB - 1] != 0x21) _exit(3);
    std::memset(q, 0x42, 2 * MiB);
    if (mine.close_ipc(0, v) != kOk) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(p[0], 0x42);  // the child's write
  EXPECT_EQ(p[2 * MiB - 1], 0x42);
}

TEST(SimProcesses, ListsThisProcessAndTheOthersTestsSet) {
  SimBackend sim;
  alloc(sim, 4 * MiB);
  std::vector<ProcessMemory> list;
  ASSERT_EQ(sim.process_memory(0, &list), kOk);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].pid, static_cast<std::uint32_t>(getpid()));
  EXPECT_EQ(list[0].used_bytes, 4 * MiB);
  sim.set_other_processes(0, {{1234, 3 * MiB}});
  ASSERT_EQ(sim.process_memory(0, &list), kOk);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].pid, 1234u);
  sim.fail_operation(SimOp::process_memory, DeviceStatus::unsupported);
  EXPECT_EQ(sim.process_memory(0, &list), DeviceStatus::unsupported);
  EXPECT_THROW(sim.set_other_processes(3, {}), InvalidArgumentError);
}

TEST(SimReach, PeersReachSegmentsOnlyAfterPeerAccessAndMappingsOnlyWithAccess) {
  SimBackend sim(shared(2));
  char* on1 = static_cast<char*>(alloc(sim, 2 * MiB, 1));
  char* on0 = static_cast<char*>(alloc(sim, 2 * MiB, 0));
  std::memset(on1, 7, 2 * MiB);
  std::string why;
  EXPECT_FALSE(sim.can_reach(0, on1, 2 * MiB, &why));
  EXPECT_NE(why.find("enable_peer_access"), std::string::npos) << why;
  EXPECT_NE(sim.copy(0, on0, on1, 2 * MiB), "");  // nothing copied
  EXPECT_EQ(on0[0], 0);
  ASSERT_EQ(sim.enable_peer_access(0, 1), kOk);
  EXPECT_EQ(sim.copy(0, on0, on1, 2 * MiB), "");
  EXPECT_EQ(on0[2 * MiB - 1], 7);
  EXPECT_FALSE(sim.can_reach(1, on0, MiB)) << "peer access is one way";
  // Virtual memory: access is what set_access granted, whatever peer access says.
  PhysicalHandle h = 0;
  ASSERT_EQ(sim.create_physical(1, 2 * MiB, &h), kOk);
  void* r = nullptr;
  ASSERT_EQ(sim.reserve_address_range(1, 2 * MiB, 2 * MiB, &r), kOk);
  ASSERT_EQ(sim.map(1, r, 2 * MiB, h), kOk);
  const int own = 1;
  ASSERT_EQ(sim.set_access(1, r, 2 * MiB, &own, 1), kOk);
  EXPECT_FALSE(sim.can_reach(0, r, 2 * MiB, &why));
  EXPECT_NE(why.find("set_access"), std::string::npos) << why;
  const int both[2] = {0, 1};
  ASSERT_EQ(sim.set_access(1, r, 2 * MiB, both, 2), kOk);
  EXPECT_TRUE(sim.can_reach(0, r, 2 * MiB));
  EXPECT_FALSE(sim.can_reach(0, on0 + 2 * MiB + 4096, 512, &why));  // nobody's memory
  EXPECT_NE(why.find("not device memory"), std::string::npos) << why;
  // Pool memory: by its device and the devices the pool granted access.
  PoolHandle pool = 0;
  ASSERT_EQ(sim.create_pool(1, &pool), kOk);
  void* pm = nullptr;
  ASSERT_EQ(sim.allocate_from_pool(1, pool, MiB, 0x10, &pm), kOk);
  EXPECT_FALSE(sim.can_reach(0, pm, MiB)) << "peer access does not extend to pool memory";
  const int zero = 0;
  ASSERT_EQ(sim.set_pool_access(1, pool, &zero, 1), kOk);
  EXPECT_TRUE(sim.can_reach(0, pm, MiB));
  ASSERT_EQ(sim.free_async(1, pm, 0x10), kOk);
}

}  // namespace
}  // namespace reservoir
