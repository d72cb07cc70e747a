// The conformance suite's CUDA harness: real streams, and held work as a kernel
// that waits on a host-mapped flag. Registered as "cuda"; skipped without a device.
#include <cuda_runtime_api.h>

#include <map>
#include <stdexcept>

#include "conformance/harness.hpp"
#include "gpu/gpu_kernels.hpp"
#include "reservoir/cuda_backend.hpp"

namespace reservoir::testing {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class CudaHarness : public Harness {
 public:
  ~CudaHarness() override {
    for (auto& [stream, flag] : flags_) {
      *flag.host = 1;
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
      cudaFreeHost(const_cast<int*>(flag.host));
    }
    for (StreamHandle s : streams_) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(s));
  }
  std::string name() const override { return "cuda"; }
  std::string unavailable() const override {
    if (!CudaBackend::available()) return CudaBackend::unavailable_reason();
    return "";
  }
  std::shared_ptr<Backend> make_backend() override {
    check(cudaSetDevice(0), "cudaSetDevice");
    return std::make_shared<CudaBackend>();
  }
  StreamHandle new_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    streams_.push_back(reinterpret_cast<StreamHandle>(s));
    return streams_.back();
  }
  void hold_stream(StreamHandle stream) override {
    Flag& f = flags_[stream];
    if (!f.host) {
      int* host = nullptr;
      check(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(int), cudaHostAllocMapped),
            "cudaHostAlloc");
      f.host = host;
      int* device = nullptr;
      check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0),
            "cudaHostGetDevicePointer");
      f.device = device;
    }
    *f.host = 0;
    check(gpu_test::wait_for_flag(f.device, 20'000'000'000ull,
                                  reinterpret_cast<cudaStream_t>(stream)),
          "wait_for_flag");
  }
  void release_stream(StreamHandle stream) override {
    auto it = flags_.find(stream);
    if (it != flags_.end()) *it->second.host = 1;
    check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

 private:
  struct Flag {
    volatile int* host = nullptr;
    volatile int* device = nullptr;
  };
  std::vector<StreamHandle> streams_;
  std::map<StreamHandle, Flag> flags_;
};

RegisterHarness register_cuda("cuda", [] { return std::make_unique<CudaHarness>(); });

}  // namespace
}  // namespace reservoir::testing
