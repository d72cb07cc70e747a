// Human-readable sizes for messages and tables ("20.00 MiB").
#pragma once

#include <cstdint>
#include <string>

namespace reservoir::detail {
std::string format_size(std::uint64_t bytes);
// As PyTorch's messages print sizes ("512 bytes" up to 1 KiB, then KiB up to 1 MiB,
// MiB up to 1 GiB, else GiB; two decimals), so text that tools match stays the same.
std::string format_size_pytorch_style(std::uint64_t bytes);
std::string format_pointer(const void* ptr);
}  // namespace reservoir::detail
