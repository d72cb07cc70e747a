// CudaBackend on a real GPU, below the allocator: every operation of the device seam,
// its status codes, and error messages that name the failing call. Skips (with the
// reason) on machines without a CUDA device.
//
// The suites named *Errors* make driver calls fail on purpose; run them under
// compute-sanitizer with --report-api-errors no (docs/gpu.md).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_kernels.hpp"
#include "gpu/gpu_test_util.hpp"
#include "reservoir/errors.hpp"

namespace reservoir::gpu_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

::testing::AssertionResult starts_with(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not start with \"" << prefix << "\"";
}

// Whether [ptr, ptr + size) holds tag's pattern, checked by the test's own kernel on
// stream (after the work already there).
::testing::AssertionResult holds(void* ptr, std::size_t size, std::uint32_t tag,
                                 cudaStream_t stream) {
  DeviceArray<unsigned long long> bad(1);
  if (bad.status() != cudaSuccess) return cuda_ok(bad.status(), "cudaMalloc");
  if (auto ok = cuda_ok(verify(Region{ptr, size, tag}, bad.get(), stream), "verify"); !ok)
    return ok;
  unsigned long long mismatches = 0;
  if (auto ok = cuda_ok(cudaMemcpyAsync(&mismatches, bad.get(), sizeof mismatches,
                                        cudaMemcpyDeviceToHost, stream),
                        "cudaMemcpyAsync");
      !ok)
    return ok;
  if (auto ok = cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !ok) return ok;
  if (mismatches != 0)
    return ::testing::AssertionFailure() << mismatches << " bytes did not hold the pattern";
  return ::testing::AssertionSuccess();
}

// Writes and checks a pattern through the test's own kernels.
::testing::AssertionResult usable(void* ptr, std::size_t size, cudaStream_t stream) {
  DeviceArray<unsigned long long> bad(1);
  if (bad.status() != cudaSuccess) return cuda_ok(bad.status(), "cudaMalloc");
  const Region r{ptr, size, 0x5eed};
  if (auto ok = cuda_ok(fill(r, stream), "fill"); !ok) return ok;
  if (auto ok = cuda_ok(verify(r, bad.get(), stream), "verify"); !ok) return ok;
  unsigned long long mismatches = 0;
  if (auto ok = cuda_ok(cudaMemcpyAsync(&mismatches, bad.get(), sizeof mismatches,
                                        cudaMemcpyDeviceToHost, stream),
                        "cudaMemcpyAsync");
      !ok)
    return ok;
  if (auto ok = cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); !ok) return ok;
  if (mismatches != 0)
    return ::testing::AssertionFailure() << mismatches << " bytes did not hold the pattern";
  return ::testing::AssertionSuccess();
}

using CudaBackendTest = GpuTest;

TEST_F(CudaBackendTest, DescribesTheDevice) {
  EXPECT_STREQ(backend_->name(), "cuda");
  EXPECT_TRUE(backend_->has(kIpc));
  EXPECT_TRUE(backend_->has(kPeerAccess));
  int current = -1;
  ASSERT_EQ(backend_->current_device(&current), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(current, 0);  // the fixture called cudaSetDevice(0)
  MemoryInfo info;
  ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok) << backend_->last_error();
  EXPECT_GT(info.total, 0u);
  EXPECT_LE(info.free, info.total);
  EXPECT_FALSE(backend_->device_name(0).empty());
  std::printf("device 0: %s, %zu of %zu bytes free, capabilities %#x\n",
              backend_->device_name(0).c_str(), info.free, info.total, backend_->capabilities());
}

// Segments are aligned as the contract says, usable by kernels, and freed.
TEST_F(CudaBackendTest, SegmentsAreAlignedAndUsable) {
  Stream stream;
  ASSERT_CUDA(stream.status());
  for (std::size_t size : {std::size_t{512}, kMiB + 1, 2 * kMiB, 20 * kMiB + 512}) {
    void* p = nullptr;
    ASSERT_EQ(backend_->allocate(0, size, &p), DeviceStatus::ok) << backend_->last_error();
    ASSERT_NE(p, nullptr);
    const std::uintptr_t align = size >= 2 * kMiB ? 2 * kMiB : 512;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << size << " bytes at " << p;
    EXPECT_TRUE(usable(p, size, stream.get())) << size << " bytes";
    ASSERT_EQ(backend_->deallocate(0, p, size), DeviceStatus::ok) << backend_->last_error();
  }
}

// Events capture stream work: not_ready while a kernel runs, ok after; a stream made
// to wait on the event waits too.
TEST_F(CudaBackendTest, EventsFollowStreamWork) {
  Stream s1, s2;
  DeviceArray<SpinResult> spin(1);
  void* p = nullptr;
  ASSERT_CUDA(s1.status());
  ASSERT_CUDA(s2.status());
  ASSERT_CUDA(spin.status());
  ASSERT_EQ(backend_->allocate(0, kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  const Region r{p, kMiB, 7};
  ASSERT_CUDA(fill(r, s1.get()));

  EventHandle e1 = 0, e2 = 0;
  ASSERT_EQ(backend_->create_event(0, &e1), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->create_event(0, &e2), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->query_event(0, e1), DeviceStatus::ok) << "a fresh event is complete";

  ASSERT_CUDA(spin_then_verify(r, 300'000'000, spin.get(), s1.get()));
  ASSERT_EQ(backend_->record_event(0, e1, s1.handle()), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->query_event(0, e1), DeviceStatus::not_ready);
  ASSERT_EQ(backend_->stream_wait_event(0, s2.handle(), e1), DeviceStatus::ok)
      << backend_->last_error();
  ASSERT_EQ(backend_->record_event(0, e2, s2.handle()), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->query_event(0, e2), DeviceStatus::not_ready) << "s2 did not wait for s1";

  ASSERT_EQ(backend_->synchronize_event(0, e1), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->query_event(0, e1), DeviceStatus::ok);
  ASSERT_EQ(backend_->synchronize_stream(0, s2.handle()), DeviceStatus::ok)
      << backend_->last_error();
  EXPECT_EQ(backend_->query_event(0, e2), DeviceStatus::ok);
  // The legacy default stream (0) works too.
  ASSERT_EQ(backend_->record_event(0, e2, 0), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->synchronize_stream(0, 0), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->synchronize_device(0), DeviceStatus::ok) << backend_->last_error();

  SpinResult seen{};
  ASSERT_CUDA(cudaMemcpy(&seen, spin.get(), sizeof seen, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen.blocks_done, kSpinBlocks);
  EXPECT_EQ(seen.mismatches, 0u);
  EXPECT_EQ(backend_->destroy_event(0, e1), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->destroy_event(0, e2), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->deallocate(0, p, kMiB), DeviceStatus::ok) << backend_->last_error();
}

// deallocate waits for work still using the segment (cudaFree semantics).
TEST_F(CudaBackendTest, DeallocateWaitsForPendingWork) {
  Stream stream;
  DeviceArray<SpinResult> spin(1);
  ASSERT_CUDA(stream.status());
  ASSERT_CUDA(spin.status());
  void* p = nullptr;
  ASSERT_EQ(backend_->allocate(0, 4 * kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  const Region r{p, 4 * kMiB, 9};
  ASSERT_CUDA(fill(r, stream.get()));
  ASSERT_CUDA(spin_then_verify(r, 300'000'000, spin.get(), stream.get()));
  ASSERT_EQ(backend_->deallocate(0, p, 4 * kMiB), DeviceStatus::ok) << backend_->last_error();
  EXPECT_CUDA(cudaStreamQuery(stream.get()));  // already complete: deallocate waited
  SpinResult seen{};
  ASSERT_CUDA(cudaMemcpy(&seen, spin.get(), sizeof seen, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen.blocks_done, kSpinBlocks);
  EXPECT_EQ(seen.mismatches, 0u);
}

// The order inside a capture, read from the graph being built: s2 forked from s1 and
// joined back. s1's work follows s2's only after the join; a point of one capture
// does not hold in the next; a stream that is not capturing is an error.
TEST_F(CudaBackendTest, CaptureOrderFollowsTheGraph) {
  Stream s1, s2;
  ASSERT_CUDA(s1.status());
  ASSERT_CUDA(s2.status());
  void* p = nullptr;
  ASSERT_EQ(backend_->allocate(0, kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  const Region r{p, kMiB, 3};
  CapturePoint point;
  bool follows = true;
  EXPECT_EQ(backend_->capture_point(0, s1.handle(), &point), DeviceStatus::error)
      << "s1 is not capturing";
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  ASSERT_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  std::uint64_t first_capture = 0;
  for (int round = 0; round < 2; ++round) {
    ASSERT_CUDA(cudaStreamBeginCapture(s1.get(), cudaStreamCaptureModeThreadLocal));
    ASSERT_CUDA(fill(r, s1.get()));
    ASSERT_CUDA(cudaEventRecord(fork, s1.get()));
    ASSERT_CUDA(cudaStreamWaitEvent(s2.get(), fork, 0));
    ASSERT_CUDA(fill(r, s2.get()));  // the use on s2
    CapturePoint use;
    ASSERT_EQ(backend_->capture_point(0, s2.handle(), &use), DeviceStatus::ok)
        << backend_->last_error();
    EXPECT_FALSE(use.nodes.empty());
    if (round == 0) {
      first_capture = use.capture;
      point = use;
    } else {
      EXPECT_NE(use.capture, first_capture) << "a new capture has a new id";
      ASSERT_EQ(backend_->capture_follows(0, s1.handle(), &point, 1, &follows), DeviceStatus::ok)
          << backend_->last_error();
      EXPECT_FALSE(follows) << "a point of the last capture holds in this one";
    }
    ASSERT_EQ(backend_->capture_follows(0, s1.handle(), &use, 1, &follows), DeviceStatus::ok)
        << backend_->last_error();
    EXPECT_FALSE(follows) << "round " << round << ": s1 follows s2 before joining it";
    ASSERT_CUDA(fill(r, s1.get()));  // s1 goes on, still not after s2
    ASSERT_EQ(backend_->capture_follows(0, s1.handle(), &use, 1, &follows), DeviceStatus::ok);
    EXPECT_FALSE(follows) << "round " << round;
    ASSERT_CUDA(cudaEventRecord(join, s2.get()));
    ASSERT_CUDA(cudaStreamWaitEvent(s1.get(), join, 0));
    ASSERT_EQ(backend_->capture_follows(0, s1.handle(), &use, 1, &follows), DeviceStatus::ok)
        << backend_->last_error();
    EXPECT_TRUE(follows) << "round " << round << ": s1 joined s2 back";
    ASSERT_CUDA(fill(r, s1.get()));  // and stays after it
    ASSERT_EQ(backend_->capture_follows(0, s1.handle(), &use, 1, &follows), DeviceStatus::ok);
    EXPECT_TRUE(follows) << "round " << round;
    cudaGraph_t graph = nullptr;
    ASSERT_CUDA(cudaStreamEndCapture(s1.get(), &graph));
    ASSERT_CUDA(cudaGraphDestroy(graph));
  }
  EXPECT_EQ(backend_->capture_follows(0, s1.handle(), &point, 1, &follows), DeviceStatus::error)
      << "s1 is not capturing";
  ASSERT_CUDA(cudaEventDestroy(fork));
  ASSERT_CUDA(cudaEventDestroy(join));
  ASSERT_EQ(backend_->deallocate(0, p, kMiB), DeviceStatus::ok) << backend_->last_error();
}

// Reserve, create, map, grant access, use, unmap, release.
TEST_F(CudaBackendTest, VirtualMemoryMapsUsableMemory) {
  if (!backend_->has(kVirtualMemory)) GTEST_SKIP() << "the device has no virtual memory support";
  Stream stream;
  ASSERT_CUDA(stream.status());
  std::size_t g = 0;
  ASSERT_EQ(backend_->granularity(0, &g), DeviceStatus::ok) << backend_->last_error();
  ASSERT_GT(g, 0u);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity " << g << " is not a power of two";

  void* base = nullptr;
  ASSERT_EQ(backend_->reserve_address_range(0, 4 * g, g, &base), DeviceStatus::ok)
      << backend_->last_error();
  PhysicalHandle h1 = 0, h2 = 0;
  ASSERT_EQ(backend_->create_physical(0, g, &h1), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->create_physical(0, g, &h2), DeviceStatus::ok) << backend_->last_error();
  auto* second = static_cast<char*>(base) + g;
  ASSERT_EQ(backend_->map(0, base, g, h1), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->map(0, second, g, h2), DeviceStatus::ok) << backend_->last_error();
  const int devices[] = {0};
  ASSERT_EQ(backend_->set_access(0, base, 2 * g, devices, 1), DeviceStatus::ok)
      << backend_->last_error();
  // Two physical pieces back one contiguous range.
  EXPECT_TRUE(usable(base, 2 * g, stream.get()));

  EXPECT_EQ(backend_->unmap(0, base, 2 * g), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->release_physical(0, h1), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->release_physical(0, h2), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->release_address_range(0, base, 4 * g), DeviceStatus::ok)
      << backend_->last_error();
}

// allocate_host, copy_to_host and copy_to_device: the bytes travel both ways, between
// pinned or pageable host memory and a segment or a virtual-memory mapping, and a copy
// comes after the work already submitted, on a non-blocking stream too (which the
// legacy default stream does not wait for).
TEST_F(CudaBackendTest, CopiesToAndFromHostMemory) {
  Stream stream;
  DeviceArray<SpinResult> spin(1);
  ASSERT_CUDA(stream.status());
  ASSERT_CUDA(spin.status());
  constexpr std::size_t n = 4 * kMiB;
  constexpr std::uint32_t kTag = 0xc0de;
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(backend_->allocate(0, n, &p), DeviceStatus::ok) << backend_->last_error();
  ASSERT_EQ(backend_->allocate(0, n, &q), DeviceStatus::ok) << backend_->last_error();
  void* host = nullptr;
  ASSERT_EQ(backend_->allocate_host(0, n, &host), DeviceStatus::ok) << backend_->last_error();
  ASSERT_NE(host, nullptr);

  // The caller finishes the work that used the memory; the copy then waits for itself
  // only: a 200 ms kernel on another stream is still running when it returns.
  ASSERT_CUDA(fill(Region{p, n, kTag}, stream.get()));
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  ASSERT_CUDA(spin_then_verify(Region{q, n, 1}, 200'000'000, spin.get(), stream.get()));
  ASSERT_EQ(backend_->copy_to_host(0, host, p, n), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);  // no host-wide wait
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  // Back into q and checked there by a kernel: the host copy held the pattern.
  ASSERT_EQ(backend_->copy_to_device(0, q, host, n), DeviceStatus::ok) << backend_->last_error();
  EXPECT_TRUE(holds(q, n, kTag, stream.get()));

  // Pageable host memory works too (the copy to the device returns once it landed).
  std::vector<unsigned char> pageable(n);
  ASSERT_EQ(backend_->copy_to_host(0, pageable.data(), p, n), DeviceStatus::ok)
      << backend_->last_error();
  EXPECT_EQ(std::memcmp(pageable.data(), host, n), 0);
  ASSERT_CUDA(cudaMemsetAsync(q, 0, n, stream.get()));
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  ASSERT_EQ(backend_->copy_to_device(0, q, pageable.data(), n), DeviceStatus::ok)
      << backend_->last_error();
  EXPECT_TRUE(holds(q, n, kTag, stream.get()));

  if (backend_->has(kVirtualMemory)) {
    std::size_t g = 0;
    ASSERT_EQ(backend_->granularity(0, &g), DeviceStatus::ok) << backend_->last_error();
    const std::size_t m = 2 * g;  // two physical pieces behind one range
    void* base = nullptr;
    ASSERT_EQ(backend_->reserve_address_range(0, m, g, &base), DeviceStatus::ok)
        << backend_->last_error();
    PhysicalHandle h1 = 0, h2 = 0;
    ASSERT_EQ(backend_->create_physical(0, g, &h1), DeviceStatus::ok) << backend_->last_error();
    ASSERT_EQ(backend_->create_physical(0, g, &h2), DeviceStatus::ok) << backend_->last_error();
    ASSERT_EQ(backend_->map(0, base, g, h1), DeviceStatus::ok) << backend_->last_error();
    ASSERT_EQ(backend_->map(0, static_cast<char*>(base) + g, g, h2), DeviceStatus::ok)
        << backend_->last_error();
    const int devices[] = {0};
    ASSERT_EQ(backend_->set_access(0, base, m, devices, 1), DeviceStatus::ok)
        << backend_->last_error();
    void* big_host = nullptr;
    void* segment = nullptr;
    ASSERT_EQ(backend_->allocate_host(0, m, &big_host), DeviceStatus::ok) << backend_->last_error();
    ASSERT_EQ(backend_->allocate(0, m, &segment), DeviceStatus::ok) << backend_->last_error();
    ASSERT_CUDA(fill(Region{base, m, kTag + 1}, stream.get()));
    ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    ASSERT_EQ(backend_->copy_to_host(0, big_host, base, m), DeviceStatus::ok)
        << backend_->last_error();
    ASSERT_EQ(backend_->copy_to_device(0, segment, big_host, m), DeviceStatus::ok)
        << backend_->last_error();
    EXPECT_TRUE(holds(segment, m, kTag + 1, stream.get()));
    // And into the mapping from the host (a pattern the mapping did not hold).
    ASSERT_CUDA(fill(Region{segment, m, kTag + 2}, stream.get()));
    ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    ASSERT_EQ(backend_->copy_to_host(0, big_host, segment, m), DeviceStatus::ok)
        << backend_->last_error();
    ASSERT_EQ(backend_->copy_to_device(0, base, big_host, m), DeviceStatus::ok)
        << backend_->last_error();
    EXPECT_TRUE(holds(base, m, kTag + 2, stream.get()));

    EXPECT_EQ(backend_->deallocate(0, segment, m), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->free_host(0, big_host), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->unmap(0, base, m), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->release_physical(0, h1), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->release_physical(0, h2), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->release_address_range(0, base, m), DeviceStatus::ok)
        << backend_->last_error();
  }

  SpinResult seen{};
  ASSERT_CUDA(cudaMemcpy(&seen, spin.get(), sizeof seen, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen.blocks_done, kSpinBlocks);
  EXPECT_EQ(backend_->free_host(0, host), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->deallocate(0, p, n), DeviceStatus::ok) << backend_->last_error();
  EXPECT_EQ(backend_->deallocate(0, q, n), DeviceStatus::ok) << backend_->last_error();
}

TEST_F(CudaBackendTest, ExportsIpcHandles) {
  void* p = nullptr;
  ASSERT_EQ(backend_->allocate(0, 2 * kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  IpcHandle handle;
  EXPECT_EQ(backend_->export_ipc(0, p, &handle), DeviceStatus::ok) << backend_->last_error();
  bool any = false;
  for (unsigned char b : handle.bytes) any = any || b != 0;
  EXPECT_TRUE(any) << "the IPC handle is all zero";
  EXPECT_EQ(backend_->deallocate(0, p, 2 * kMiB), DeviceStatus::ok) << backend_->last_error();
}

// Calls for another device switch to its context and put the caller's back.
TEST_F(CudaBackendTest, OtherDeviceCallsKeepTheCurrentDevice) {
  if (device_count_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << device_count_;
  bool can = false;
  ASSERT_EQ(backend_->can_access_peer(0, 1, &can), DeviceStatus::ok) << backend_->last_error();
  if (can) {
    EXPECT_EQ(backend_->enable_peer_access(0, 1), DeviceStatus::ok) << backend_->last_error();
  }
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaFree(nullptr));  // makes device 0's context current
  void* p = nullptr;
  ASSERT_EQ(backend_->allocate(1, 4 * kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  int runtime_device = -1;
  ASSERT_CUDA(cudaGetDevice(&runtime_device));
  EXPECT_EQ(runtime_device, 0);
  int current = -1;
  ASSERT_EQ(backend_->current_device(&current), DeviceStatus::ok);
  EXPECT_EQ(current, 0);
  cudaPointerAttributes attributes{};
  ASSERT_CUDA(cudaPointerGetAttributes(&attributes, p));
  EXPECT_EQ(attributes.device, 1);
  {
    ASSERT_CUDA(cudaSetDevice(1));
    Stream on_one;
    ASSERT_CUDA(on_one.status());
    EXPECT_TRUE(usable(p, 4 * kMiB, on_one.get()));
  }
  ASSERT_CUDA(cudaSetDevice(0));
  EXPECT_EQ(backend_->deallocate(1, p, 4 * kMiB), DeviceStatus::ok) << backend_->last_error();
}

// (e) Failing calls answer the right status and last_error() names the call and the
// driver's reason; afterwards the device still works. Only failures that leave the
// context healthy are provoked (no destroyed events or bad stream handles).
using CudaBackendErrors = GpuTest;

TEST_F(CudaBackendErrors, EachFailureNamesTheCall) {
  void* p = nullptr;
  // More than any GPU has: out_of_memory, not error.
  EXPECT_EQ(backend_->allocate(0, std::size_t{1} << 50, &p), DeviceStatus::out_of_memory);
  EXPECT_EQ(p, nullptr);

  EXPECT_EQ(backend_->allocate(device_count_ + 3, 512, &p), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemAlloc: invalid device"));
  MemoryInfo info;
  EXPECT_EQ(backend_->memory_info(-1, &info), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemGetInfo: invalid device -1"));

  int not_ours = 0;  // a host address: the driver refuses to free it
  EXPECT_EQ(backend_->deallocate(0, &not_ours, sizeof not_ours), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemFree("));
  EXPECT_NE(backend_->last_error().find("CUDA_ERROR_"), std::string::npos)
      << backend_->last_error();

  // Host memory: more than any host has is out_of_memory (and says so); memory that
  // cuMemHostAlloc did not give cannot be freed as such.
  void* host = nullptr;
  EXPECT_EQ(backend_->allocate_host(0, std::size_t{1} << 50, &host), DeviceStatus::out_of_memory)
      << backend_->last_error();
  EXPECT_EQ(host, nullptr);
  EXPECT_TRUE(
      starts_with(backend_->last_error(),
                  "cuMemHostAlloc(1125899906842624 bytes) on device 0: CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_EQ(backend_->free_host(0, &not_ours), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemFreeHost("));
  EXPECT_EQ(backend_->allocate_host(device_count_ + 3, 512, &host), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemHostAlloc: invalid device"));
  EXPECT_EQ(backend_->copy_to_host(-1, &not_ours, &not_ours, sizeof not_ours), DeviceStatus::error);
  EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemcpyDtoH: invalid device -1"));

  // A thread's last_error is its own.
  std::string other_thread = "unset";
  std::thread([&] { other_thread = backend_->last_error(); }).join();
  EXPECT_EQ(other_thread, "");

  if (backend_->has(kVirtualMemory)) {
    std::size_t g = 0;
    ASSERT_EQ(backend_->granularity(0, &g), DeviceStatus::ok) << backend_->last_error();
    ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok) << backend_->last_error();
    PhysicalHandle h = 0;
    const std::size_t too_much = (info.total / g + 1024) * g;
    EXPECT_EQ(backend_->create_physical(0, too_much, &h), DeviceStatus::out_of_memory)
        << backend_->last_error();

    void* base = nullptr;
    ASSERT_EQ(backend_->reserve_address_range(0, 2 * g, g, &base), DeviceStatus::ok)
        << backend_->last_error();
    ASSERT_EQ(backend_->create_physical(0, g, &h), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->map(0, static_cast<char*>(base) + g / 2, g, h), DeviceStatus::error)
        << "a mapping off the granularity";
    EXPECT_TRUE(starts_with(backend_->last_error(), "cuMemMap(")) << backend_->last_error();
    EXPECT_EQ(backend_->release_physical(0, h), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->release_address_range(0, base, 2 * g), DeviceStatus::ok)
        << backend_->last_error();
  }

  // Enabling peer access twice is not an error (the driver answers ALREADY_ENABLED).
  bool can = false;
  if (device_count_ >= 2 && backend_->can_access_peer(0, 1, &can) == DeviceStatus::ok && can) {
    EXPECT_EQ(backend_->enable_peer_access(0, 1), DeviceStatus::ok) << backend_->last_error();
    EXPECT_EQ(backend_->enable_peer_access(0, 1), DeviceStatus::ok) << backend_->last_error();
  }

  // A process cannot open its own IPC handle; if a driver ever allows it, close it.
  ASSERT_EQ(backend_->allocate(0, 2 * kMiB, &p), DeviceStatus::ok) << backend_->last_error();
  IpcHandle handle;
  ASSERT_EQ(backend_->export_ipc(0, p, &handle), DeviceStatus::ok) << backend_->last_error();
  void* opened = nullptr;
  if (backend_->open_ipc(0, handle, &opened) == DeviceStatus::ok) {
    EXPECT_EQ(backend_->close_ipc(0, opened), DeviceStatus::ok) << backend_->last_error();
  } else {
    EXPECT_TRUE(starts_with(backend_->last_error(), "cuIpcOpenMemHandle on device 0: "));
  }

  // The context survived every failure.
  Stream stream;
  ASSERT_CUDA(stream.status());
  EXPECT_TRUE(usable(p, 2 * kMiB, stream.get()));
  EXPECT_EQ(backend_->deallocate(0, p, 2 * kMiB), DeviceStatus::ok) << backend_->last_error();
}

// Runs everywhere: without a driver the backend says why, and constructing it throws
// DeviceError with that reason (the default allocator then uses the simulated device).
TEST(CudaBackendAvailability, ExplainsWhyItIsUnavailable) {
  if (CudaBackend::available()) {
    EXPECT_EQ(CudaBackend::unavailable_reason(), "");
    GTEST_SKIP() << "a CUDA device is present";
  }
  const std::string reason = CudaBackend::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  std::printf("CudaBackend unavailable: %s\n", reason.c_str());
  if (reason.rfind("cannot load the CUDA driver", 0) == 0) {
    try {
      CudaBackend backend;
      ADD_FAILURE() << "CudaBackend constructed without a driver";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace reservoir::gpu_test
