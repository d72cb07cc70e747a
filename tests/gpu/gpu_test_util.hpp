// Shared pieces of the GPU tests: the device check that skips on machines without a
// GPU, CUDA error assertions, and RAII owners for the tests' own CUDA objects (so the
// tests leak nothing under compute-sanitizer --leak-check full).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

#include "reservoir/backend.hpp"
#include "reservoir/cuda_backend.hpp"

namespace reservoir::gpu_test {

inline ::testing::AssertionResult cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
}
#define ASSERT_CUDA(expr) ASSERT_TRUE(::reservoir::gpu_test::cuda_ok((expr), #expr))
#define EXPECT_CUDA(expr) EXPECT_TRUE(::reservoir::gpu_test::cuda_ok((expr), #expr))

inline StreamHandle handle(cudaStream_t s) {
  return reinterpret_cast<StreamHandle>(s);
}

// Skips the test, with the reason, unless a CUDA device is usable.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackend::available())
      GTEST_SKIP() << "no CUDA device: " << CudaBackend::unavailable_reason();
    backend_ = std::make_shared<CudaBackend>();
    int count = 0;
    if (backend_->device_count(&count) != DeviceStatus::ok || count <= 0)
      GTEST_SKIP() << "no CUDA device: the driver reports " << count << " devices";
    device_count_ = count;
    ASSERT_CUDA(cudaSetDevice(0));
  }

  std::shared_ptr<CudaBackend> backend_;
  int device_count_ = 0;
};

class Stream {
 public:
  Stream() { created_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~Stream() {
    if (created_ == cudaSuccess) cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaError_t status() const { return created_; }
  cudaStream_t get() const { return stream_; }
  StreamHandle handle() const { return gpu_test::handle(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t created_ = cudaSuccess;
};

class Event {
 public:
  Event() { created_ = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming); }
  ~Event() {
    if (created_ == cudaSuccess) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaError_t status() const { return created_; }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  cudaError_t created_ = cudaSuccess;
};

// n zero-initialised Ts of the test's own device memory (cudaMalloc, not Reservoir).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    status_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T));
    if (status_ == cudaSuccess) status_ = cudaMemset(ptr_, 0, n * sizeof(T));
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  cudaError_t status() const { return status_; }
  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
  cudaError_t status_ = cudaSuccess;
};

// Whether an out-of-memory message names a request of bytes, in any of the usual
// renderings ("1073741824", "1.00 GiB", "1024.00 MiB").
inline bool names_size(const std::string& message, std::size_t bytes) {
  char buf[64];
  if (message.find(std::to_string(bytes)) != std::string::npos) return true;
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  if (message.find(buf) != std::string::npos) return true;
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1ull << 20));
  return message.find(buf) != std::string::npos;
}

}  // namespace reservoir::gpu_test
