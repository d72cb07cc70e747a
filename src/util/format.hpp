// Human-readable sizes for messages and tables ("20.00 MiB").
#pragma once

#include <cstdint>
#include <string>

namespace reservoir::detail {
std::string format_size(std::uint64_t bytes);
std::string format_pointer(const void* ptr);
}  // namespace reservoir::detail
