// The out-of-memory report's opening and the process list: see oom_report.hpp.
#include "engine/device/oom_report.hpp"

#include <unistd.h>

#include <algorithm>

#include "util/format.hpp"

namespace reservoir::detail {

namespace {

std::string used(const ProcessMemory& p) {
  return p.used_bytes == UINT64_MAX ? std::string("an unknown amount of")
                                    : format_size_pytorch_style(p.used_bytes);
}

// The list, this process last (as PyTorch's wording puts it), or why there is none.
bool processes(Backend& backend, int device, std::vector<ProcessMemory>* out, std::string* why) {
  if (backend.process_memory(device, out) != DeviceStatus::ok) {
    *why = backend.last_error();
    return false;
  }
  const auto self = static_cast<std::uint32_t>(getpid());
  std::stable_partition(out->begin(), out->end(),
                        [self](const ProcessMemory& p) { return p.pid != self; });
  return true;
}

}  // namespace

std::string process_memory_sentences(Backend& backend, int device) {
  std::vector<ProcessMemory> list;
  std::string why;
  if (!processes(backend, device, &list, &why))
    return "The list of processes using GPU " + std::to_string(device) + " is unavailable (" + why +
           "). ";
  const auto self = static_cast<std::uint32_t>(getpid());
  std::string out;
  for (const ProcessMemory& p : list) {
    out += p.pid == self ? std::string("Including non-PyTorch memory, this process")
                         : "Process " + std::to_string(p.pid);
    out += " has " + used(p) + " memory in use. ";
  }
  return out;
}

std::vector<std::string> process_memory_lines(Backend& backend, int device) {
  std::vector<ProcessMemory> list;
  std::string why;
  if (!processes(backend, device, &list, &why))
    return {"the list of processes is unavailable (" + why + ")"};
  const auto self = static_cast<std::uint32_t>(getpid());
  std::vector<std::string> lines;
  lines.reserve(list.size());
  for (const ProcessMemory& p : list)
    lines.push_back("process " + std::to_string(p.pid) + ": " + used(p) +
                    (p.pid == self ? " (this process, including non-Reservoir memory)" : ""));
  if (lines.empty()) lines.push_back("no process uses the device");
  return lines;
}

std::string oom_opening(Backend& backend, const OomOpening& o) {
  const auto size = format_size_pytorch_style;
  std::string m = "CUDA out of memory. Tried to allocate " + size(o.alloc_size) + ". GPU " +
                  std::to_string(o.device);
  if (o.have_info)
    m += " has a total capacity of " + size(o.info.total) + " of which " + size(o.info.free) +
         " is free. ";
  else
    m += " did not report its memory. ";
  m += process_memory_sentences(backend, o.device);
  if (o.limited) m += size(o.allowed) + " allowed; ";
  const std::uint64_t unallocated = o.reserved - std::min(o.reserved, o.allocated);
  m += "Of the allocated memory " + size(o.allocated) + " is allocated by Reservoir, and " +
       size(unallocated) + " is reserved by Reservoir but unallocated. ";
  return m;
}

}  // namespace reservoir::detail
