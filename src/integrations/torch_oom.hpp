// Out of memory under PyTorch (torch_oom.cpp): PyTorch's wording for the first
// sentence, and PyTorch's own exception type when reservoir.torch.install() could
// find it.
#pragma once

#include <cstddef>
#include <string>

namespace reservoir::detail {

// The message of a torch.cuda.OutOfMemoryError: the engine's report, which begins with
// PyTorch's wording ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total
// capacity of ... of which ... is free."; from 1 EiB on "... more than 1EB memory."),
// since tools and tests match that text.
std::string torch_out_of_memory_message(const char* reservoir);

// Throws c10::OutOfMemoryError carrying message when the c10 symbols were given
// (reservoir_torch_use_c10_errors), else std::runtime_error.
[[noreturn]] void throw_torch_out_of_memory(const std::string& message);

}  // namespace reservoir::detail
