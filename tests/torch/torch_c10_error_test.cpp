// With a real c10 (headers and libc10.so): the PyTorch alloc hook's out-of-memory
// error is caught by `catch (const c10::OutOfMemoryError&)`, as PyTorch's Python
// bindings catch it to raise torch.cuda.OutOfMemoryError, and carries the message
// as what_without_backtrace(), which is what Python shows.
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <typeinfo>

#include "integrations/torch_oom.hpp"

extern "C" int reservoir_torch_use_c10_errors(void* constructor, void* out_of_memory_type);

namespace {

constexpr const char* kConstructor =
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";

TEST(TorchC10Errors, HookErrorIsCaughtAsC10OutOfMemoryError) {
  void* constructor = dlsym(dlopen("libc10.so", RTLD_NOW | RTLD_GLOBAL), kConstructor);
  ASSERT_NE(constructor, nullptr) << "libc10 exports no c10::Error(SourceLocation, std::string)";
  void* oom_type = const_cast<std::type_info*>(&typeid(c10::OutOfMemoryError));
  ASSERT_EQ(reservoir_torch_use_c10_errors(constructor, oom_type), 0);
  const std::string message = "CUDA out of memory. Tried to allocate 2.00 GiB. Reservoir: ...";
  try {
    reservoir::detail::throw_torch_out_of_memory(message);
    FAIL() << "nothing thrown";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()), message);
    EXPECT_EQ(std::string(e.what()).rfind(message, 0), 0u);
  }
}

TEST(TorchC10Errors, WrongTypeOrNullIsRefused) {
  void* constructor = dlsym(dlopen("libc10.so", RTLD_NOW | RTLD_GLOBAL), kConstructor);
  ASSERT_NE(constructor, nullptr);
  EXPECT_NE(
      reservoir_torch_use_c10_errors(constructor, const_cast<std::type_info*>(&typeid(c10::Error))),
      0);
  EXPECT_NE(reservoir_torch_use_c10_errors(nullptr, nullptr), 0);
}

}  // namespace
