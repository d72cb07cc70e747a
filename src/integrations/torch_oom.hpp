// Out of memory under PyTorch (torch_oom.cpp): PyTorch's wording for the first
// sentence, and PyTorch's own exception type when reservoir.torch.install() could
// find it.
#pragma once

#include <cstddef>
#include <string>

namespace reservoir::detail {

// Attaches (once per process) the observer that remembers, for the thread that
// runs out of memory, what the engine asked of the device and what was free: the
// figures of PyTorch's first sentence.
void attach_oom_report();

// "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
// 139.80 GiB of which 1.25 GiB is free. " + reservoir's message; from 1 EiB on,
// "CUDA out of memory. Tried to allocate more than 1EB memory. " + reservoir's.
// size is the request, device the one asked for.
std::string torch_out_of_memory_message(std::size_t size, int device, const char* reservoir);

// Throws c10::OutOfMemoryError carrying message when the c10 symbols were given
// (reservoir_torch_use_c10_errors), else std::runtime_error.
[[noreturn]] void throw_torch_out_of_memory(const std::string& message);

}  // namespace reservoir::detail
