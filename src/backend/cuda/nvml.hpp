// NVML (libnvidia-ml.so.1), loaded at run time like the driver: the processes using a
// device and their memory, for the out-of-memory report and memory summaries (the
// spec's reportProcessMemoryInfo). No NVML header and no link-time dependency.
#pragma once

#include <string>
#include <vector>

#include "reservoir/backend.hpp"

namespace reservoir::detail::cuda {

// The compute processes on the device whose PCI bus id is pci_bus_id
// ("0000:65:00.0", as cuDeviceGetPCIBusId writes it). false when NVML cannot be used
// or does not know the device; *why then says why ("NVML is unavailable: dlopen
// ("libnvidia-ml.so.1") failed: ..."). A process whose memory NVML does not report
// (no permission) has used_bytes == UINT64_MAX.
bool nvml_processes(const std::string& pci_bus_id, std::vector<ProcessMemory>* out,
                    std::string* why);

}  // namespace reservoir::detail::cuda
