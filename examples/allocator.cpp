// Reservoir from C++: allocate on two streams, share a block between them, read the
// statistics, and handle out-of-memory. Runs on the GPU when there is one, else on
// the simulated device (the same code either way).
//
//   build/release/examples/example_allocator
#include <cstdio>
#include <reservoir/allocator.hpp>
#include <reservoir/version.hpp>
#include <string>

int main() {
  // The process-wide allocator: CUDA when a device is present, else simulated.
  // Settings come from RESERVOIR_ALLOC_CONF (docs/config.md).
  reservoir::Allocator& a = reservoir::Allocator::instance();
  std::printf("Reservoir %s on the %s device\n", reservoir::version(), a.backend().name());
  const int device = 0;
  constexpr std::size_t MiB = std::size_t{1} << 20;

  // Streams are the program's (a cudaStream_t cast to StreamHandle); here one is made
  // through the backend so the example needs no CUDA headers. 0 is the default stream.
  const reservoir::StreamHandle compute = 0;
  reservoir::StreamHandle copy = 0;
  if (a.backend().create_stream(device, &copy) != reservoir::DeviceStatus::ok) {
    std::fprintf(stderr, "creating a stream failed: %s\n", a.backend().last_error().c_str());
    return 1;
  }

  // Blocks belong to the stream they were allocated on and are reused there.
  void* weights = a.allocate(256 * MiB, compute, device);
  void* batch = a.allocate(64 * MiB, copy, device);

  // The batch is filled on the copy stream and read on the compute stream: say so,
  // and its memory is not reused before the compute stream's work is done.
  a.record_stream(batch, compute);
  a.deallocate(batch);
  (void)a.backend().synchronize_stream(device, compute);  // the host waits for compute
  a.notify_host_wait(compute, device);                    // ...and tells the allocator

  // The same size again on the copy stream: a cache hit, no device call.
  const auto device_allocs = a.stats(device).num_device_alloc;
  batch = a.allocate(64 * MiB, copy, device);
  const bool cache_hit = a.stats(device).num_device_alloc == device_allocs;
  std::printf("second batch served from the cache: %s\n", cache_hit ? "yes" : "no");

  const reservoir::DeviceStats s = a.stats(device);
  std::printf("allocated %lld MiB, reserved %lld MiB\n",
              static_cast<long long>(s.allocated_bytes.all().current / (1 << 20)),
              static_cast<long long>(s.reserved_bytes.all().current / (1 << 20)));
  const bool books_right = s.allocated_bytes.all().current == static_cast<long long>(320 * MiB);

  // Out of memory is an exception (a std::bad_alloc) saying what was asked, what the
  // device has, what the cache holds and what to try.
  bool oom = false;
  try {
    a.allocate(std::size_t{1} << 50, compute, device);  // 1 PiB
  } catch (const reservoir::OutOfMemoryError& e) {
    oom = true;
    std::printf("out of memory, as expected: %.100s...\n", e.what());
  }

  a.deallocate(batch);
  a.deallocate(weights);
  a.empty_cache();  // give the cached segments back to the device
  (void)a.backend().destroy_stream(device, copy);
  const bool empty = a.stats(device).reserved_bytes.all().current == 0;
  std::printf("after empty_cache: %s\n", empty ? "nothing reserved" : "memory still reserved");
  return cache_hit && books_right && oom && empty ? 0 : 1;
}
