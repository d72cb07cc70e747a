// reservoir.torch's native part: PyTorch's pluggable allocator with the one query
// its interface leaves out and cuDNN needs, cacheInfo.
//
// torch.cuda.memory.CUDAPluggableAllocator forwards allocation, free and the hooks
// with setters (src/integrations/torch_allocator.cpp), but its cacheInfo fails
// ("CUDAPluggableAllocator does not yet support cacheInfo"), and cuDNN's
// benchmark mode (torch.backends.cudnn.benchmark = True) asks cacheInfo for the
// workspace it may use, so every convolution under it fails. Python cannot
// override a C++ virtual, so this file is compiled against the installed PyTorch's
// own headers (python/reservoir/_torch_native.py does it on the first install()
// and caches the result): a subclass of CUDAPluggableAllocator, copied from the
// pluggable install() has just made and wired, whose cacheInfo answers with
// Reservoir's (reservoir_torch_cache_info), made PyTorch's current allocator
// before CUDA is initialized, as change_current_allocator does.
//
// Not part of libreservoir.so (which needs no PyTorch): its own small library,
// linked against PyTorch's and libreservoir.so, loaded with ctypes.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

extern "C" void reservoir_torch_cache_info(int device, size_t* largest);

namespace {

using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

class ReservoirTorchAllocator final : public CUDAPluggableAllocator {
 public:
  // The copy keeps every function install() wired (allocation, free, hooks).
  explicit ReservoirTorchAllocator(CUDAPluggableAllocator& wired)
      : CUDAPluggableAllocator(wired) {}

  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    reservoir_torch_cache_info(static_cast<int>(device), largest);
  }

  // Not initialized until the swap is done: see reservoir_torch_native_install.
  bool initialized() override { return swapped_ && CUDAPluggableAllocator::initialized(); }
  void finish_swap() {
    if (!CUDAPluggableAllocator::initialized()) init(c10::cuda::device_count());
    swapped_ = true;
  }

 private:
  bool swapped_ = false;
};

void write_message(char* message, std::size_t capacity, const std::string& text) {
  if (message == nullptr || capacity == 0) return;
  std::snprintf(message, capacity, "%s", text.c_str());
}

}  // namespace

// Returns 0 when PyTorch's current allocator is now Reservoir's native one; else
// nonzero, with the reason in message (the pluggable allocator stays in place).
extern "C" __attribute__((visibility("default"))) int reservoir_torch_native_install(
    char* message, std::size_t capacity) noexcept {
  try {
    const auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    if (!current || current->name() != "pluggable") {
      write_message(message, capacity,
                    "PyTorch's current allocator is not the pluggable one install() made");
      return 1;
    }
    // name() is the pluggable class's: only it (or a subclass) answers "pluggable".
    auto& wired = static_cast<CUDAPluggableAllocator&>(*current);
    auto native = std::make_shared<ReservoirTorchAllocator>(wired);
    // changeCurrentAllocator refuses to replace an initialized allocator, and the
    // pluggable one was initialized when made (createCustomAllocator calls init). So
    // c10 is pointed at the new one (not initialized yet) first, then PyTorch's own
    // swap runs, keeping its record of the current allocator (what
    // torch.cuda.memory._get_current_allocator() returns) right. CUDA is not
    // initialized yet (install() checked), so nothing allocates meanwhile.
    auto& slot = c10::cuda::CUDACachingAllocator::allocator;
    slot.store(native.get());
    try {
      torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(native);
    } catch (...) {
      slot.store(current.get());
      throw;
    }
    native->finish_swap();
    return 0;
  } catch (const std::exception& e) {
    write_message(message, capacity, e.what());
  } catch (...) {
    write_message(message, capacity, "unknown exception");
  }
  return 2;
}

// Whether PyTorch's current allocator is this file's class (a test's question).
extern "C" __attribute__((visibility("default"))) int reservoir_torch_native_active() noexcept {
  try {
    const auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    return dynamic_cast<ReservoirTorchAllocator*>(current.get()) != nullptr ? 1 : 0;
  } catch (...) {
    return 0;
  }
}
