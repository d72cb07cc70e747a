// Out of memory under PyTorch: the message in PyTorch's words, raised as PyTorch's
// own c10::OutOfMemoryError so that Python code sees torch.cuda.OutOfMemoryError.
//
// Why this is needed: CUDAPluggableAllocator::malloc lets whatever the alloc hook
// throws propagate, and PyTorch's Python bindings map c10::OutOfMemoryError to
// torch.cuda.OutOfMemoryError but any other std::exception to a plain RuntimeError
// (https://github.com/pytorch/pytorch/issues/133280). Returning nullptr instead is
// worse: PyTorch does not check it and hands out a tensor without memory.
//
// How, without PyTorch's headers: reservoir.torch.install() looks up, in the
// libraries PyTorch loaded, the constructor c10::Error(SourceLocation,
// std::string) (libc10) and the type_info of c10::OutOfMemoryError
// (libtorch_python), and passes their addresses here. OutOfMemoryError adds
// no member and no virtual function to c10::Error, so an object built by c10's own
// Error constructor and thrown with OutOfMemoryError's type_info is caught by
// PyTorch's `catch (const c10::OutOfMemoryError&)`. The constructor is looked up
// by its mangled name, which fixes its parameter types (and the std::string ABI);
// reservoir_torch_use_c10_errors() builds and checks one object before accepting
// the addresses. Without them (another PyTorch, a failed check) the hook throws
// std::runtime_error with the same message: a RuntimeError in Python.
#include "integrations/torch_oom.hpp"

#include <cxxabi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "reservoir/allocator.hpp"
#include "reservoir/reservoir.h"

namespace reservoir::detail {

namespace {

// c10::SourceLocation (c10/util/Exception.h), passed by value.
struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};

using ErrorConstructor = void (*)(void* self, SourceLocation where, std::string message);

// The exception's cleanup: c10::Error is a std::exception with a virtual
// destructor, so this runs c10's own destructor through the object's vtable.
void destroy_error(void* self) {
  static_cast<std::exception*>(self)->~exception();
}

// Room for a c10::Error (about 200 bytes in PyTorch 2.x); the exception object may
// be larger than the type needs.
constexpr std::size_t kErrorObjectBytes = 2048;

struct C10Errors {
  ErrorConstructor construct = nullptr;
  std::type_info* out_of_memory = nullptr;
};
std::atomic<const C10Errors*> g_c10{nullptr};

}  // namespace

std::string torch_out_of_memory_message(const char* reservoir) {
  static const std::string kFirst = "CUDA out of memory.";
  std::string message = reservoir;
  // The engine's reports already begin with PyTorch's sentences.
  if (message.compare(0, kFirst.size(), kFirst) == 0) return message;
  return kFirst + " " + message;
}

[[noreturn]] void throw_torch_out_of_memory(const std::string& message) {
  const C10Errors* c10 = g_c10.load(std::memory_order_acquire);
  if (c10 != nullptr) {
    void* object = __cxxabiv1::__cxa_allocate_exception(kErrorObjectBytes);
    std::memset(object, 0, kErrorObjectBytes);
    bool built = false;
    try {
      c10->construct(object, SourceLocation{"reservoir_torch_malloc", __FILE__, __LINE__}, message);
      built = true;
    } catch (...) {  // out of host memory building the message: the plain error below
    }
    if (built) __cxxabiv1::__cxa_throw(object, c10->out_of_memory, destroy_error);
    __cxxabiv1::__cxa_free_exception(object);
  }
  throw std::runtime_error(message);
}

}  // namespace reservoir::detail

extern "C" {

// Called by reservoir.torch.install() with the addresses of c10::Error's
// constructor (SourceLocation, std::string) and of c10::OutOfMemoryError's
// type_info. Builds one object and checks its what()
// before using them; returns RESERVOIR_OK, or RESERVOIR_ERROR_INVALID_ARGUMENT (the
// reason in reservoir_last_error) leaving out-of-memory errors plain.
RESERVOIR_C_API int reservoir_torch_use_c10_errors(void* constructor,
                                                   void* out_of_memory_type) noexcept {
  using namespace reservoir::detail;
  if (constructor == nullptr || out_of_memory_type == nullptr)
    return RESERVOIR_ERROR_INVALID_ARGUMENT;
  auto* candidate = new (std::nothrow) C10Errors;
  if (candidate == nullptr) return RESERVOIR_ERROR_INTERNAL;
  candidate->construct = reinterpret_cast<ErrorConstructor>(constructor);
  candidate->out_of_memory = static_cast<std::type_info*>(out_of_memory_type);
  // The check: an Error built by c10 is a std::exception whose what() starts with
  // the message (c10 may append context and a backtrace).
  static constexpr char kProbe[] = "reservoir: checking c10::Error";
  alignas(std::max_align_t) static unsigned char probe[kErrorObjectBytes];
  bool ok = false;
  try {
    std::memset(probe, 0, sizeof probe);
    candidate->construct(probe, SourceLocation{"probe", __FILE__, __LINE__}, kProbe);
    const char* what = reinterpret_cast<std::exception*>(probe)->what();
    ok = what != nullptr && std::strncmp(what, kProbe, sizeof kProbe - 1) == 0;
    destroy_error(probe);
  } catch (...) {
    ok = false;
  }
  const bool is_oom_type =
      std::strcmp(candidate->out_of_memory->name(), "N3c1016OutOfMemoryErrorE") == 0;
  if (!ok || !is_oom_type) {
    delete candidate;
    return RESERVOIR_ERROR_INVALID_ARGUMENT;
  }
  // Kept for the life of the process (a throw may be under way on another thread).
  g_c10.store(candidate, std::memory_order_release);
  return RESERVOIR_OK;
}

}  // extern "C"
