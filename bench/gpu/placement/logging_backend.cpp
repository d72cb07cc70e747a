#include "logging_backend.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace reservoir_bench::placement {

namespace {

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

std::string hex(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, a);
  return buf;
}

}  // namespace

std::vector<PlacementCall> LoggingBackend::calls() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return calls_;
}

void LoggingBackend::clear() {
  std::lock_guard<std::mutex> guard(mutex_);
  calls_.clear();
}

DeviceStatus LoggingBackend::log(PlacementCall::Kind kind, std::uint64_t size,
                                 std::uintptr_t address, DeviceStatus status) {
  std::lock_guard<std::mutex> guard(mutex_);
  calls_.push_back({kind, size, address, status});
  return status;
}

// ---- logged ----
DeviceStatus LoggingBackend::allocate(int device, std::size_t size, void** ptr) {
  const DeviceStatus st = ForwardingBackend::allocate(device, size, ptr);
  return log(PlacementCall::alloc, size, st == DeviceStatus::ok ? addr(*ptr) : 0, st);
}
DeviceStatus LoggingBackend::deallocate(int device, void* ptr, std::size_t size) {
  return log(PlacementCall::free, size, addr(ptr),
             ForwardingBackend::deallocate(device, ptr, size));
}
DeviceStatus LoggingBackend::reserve_address_range(int device, std::size_t size,
                                                   std::size_t alignment, void** ptr) {
  const DeviceStatus st = ForwardingBackend::reserve_address_range(device, size, alignment, ptr);
  return log(PlacementCall::reserve, size, st == DeviceStatus::ok ? addr(*ptr) : 0, st);
}
DeviceStatus LoggingBackend::release_address_range(int device, void* ptr, std::size_t size) {
  return log(PlacementCall::release, size, addr(ptr),
             ForwardingBackend::release_address_range(device, ptr, size));
}
DeviceStatus LoggingBackend::map(int device, void* ptr, std::size_t size,
                                 reservoir::PhysicalHandle handle) {
  return log(PlacementCall::map, size, addr(ptr),
             ForwardingBackend::map(device, ptr, size, handle));
}
DeviceStatus LoggingBackend::unmap(int device, void* ptr, std::size_t size) {
  return log(PlacementCall::unmap, size, addr(ptr), ForwardingBackend::unmap(device, ptr, size));
}

// ---- reading the log ----
std::string format_calls(const std::vector<PlacementCall>& calls) {
  static constexpr const char* kTags[] = {"alloc", "free", "reserve", "release", "map", "unmap"};
  std::string out;
  for (const PlacementCall& c : calls) {
    const bool sized = c.kind != PlacementCall::free && c.kind != PlacementCall::release;
    out += kTags[c.kind];
    if (sized) {
      out += ' ';
      out += std::to_string(c.size);
    }
    if (c.status == DeviceStatus::ok) {
      out += ' ';
      out += hex(c.address);
    } else {
      out += " failed ";
      out += reservoir::to_string(c.status);
    }
    out += '\n';
  }
  return out;
}

std::vector<PlacementCall> parse_calls(std::string_view text, const std::string& name) {
  static constexpr std::pair<const char*, PlacementCall::Kind> kKinds[] = {
      {"alloc", PlacementCall::alloc},     {"free", PlacementCall::free},
      {"reserve", PlacementCall::reserve}, {"release", PlacementCall::release},
      {"map", PlacementCall::map},         {"unmap", PlacementCall::unmap}};
  std::vector<PlacementCall> calls;
  std::size_t number = 0;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string line(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string tag, word;
    in >> tag;
    PlacementCall c;
    const auto kind = std::find_if(std::begin(kKinds), std::end(kKinds),
                                   [&](const auto& k) { return tag == k.first; });
    bool good = kind != std::end(kKinds);
    if (good) c.kind = kind->second;
    const bool sized = good && c.kind != PlacementCall::free && c.kind != PlacementCall::release;
    if (good && sized) good = static_cast<bool>(in >> c.size);
    if (good) good = static_cast<bool>(in >> word);
    if (good && word == "failed") {
      good = static_cast<bool>(in >> word);
      c.status = DeviceStatus::error;
      for (DeviceStatus st : {DeviceStatus::out_of_memory, DeviceStatus::not_ready,
                              DeviceStatus::error, DeviceStatus::unsupported}) {
        if (word == reservoir::to_string(st)) c.status = st;
      }
    } else if (good) {
      char* end = nullptr;
      c.address = std::strtoull(word.c_str(), &end, 16);
      good = word.starts_with("0x") && end != nullptr && *end == '\0';
    }
    if (!good || (in >> word)) {
      throw OpError(name + ":" + std::to_string(number) + ": not a probe log line: '" + line + "'");
    }
    calls.push_back(c);
  }
  return calls;
}

OpList ops_from_calls(const std::vector<PlacementCall>& calls, std::string name) {
  OpList list;
  list.name = std::move(name);
  std::unordered_map<std::uintptr_t, std::size_t> live;  // address -> alloc index
  for (const PlacementCall& c : calls) {
    if (c.status != DeviceStatus::ok) continue;
    if (c.kind == PlacementCall::alloc) {
      live[c.address] = list.alloc(c.size);
    } else if (c.kind == PlacementCall::free) {
      const auto it = live.find(c.address);
      if (it == live.end()) continue;
      list.free(it->second);
      live.erase(it);
    } else if (c.kind == PlacementCall::reserve) {
      list.reserve(c.size);
    }
  }
  return list;
}

PlacementSummary summarize(const std::vector<PlacementCall>& calls) {
  PlacementSummary s;
  std::map<std::uintptr_t, std::uint64_t> freed;  // start -> bytes, ranges freed so far
  std::uintptr_t last = 0;
  for (const PlacementCall& c : calls) {
    if (c.kind == PlacementCall::reserve && c.status == DeviceStatus::ok) ++s.reserves;
    if (c.kind == PlacementCall::free && c.status == DeviceStatus::ok) freed[c.address] = c.size;
    if (c.kind != PlacementCall::alloc) continue;
    if (c.status != DeviceStatus::ok) {
      ++s.failed;
      continue;
    }
    ++s.allocs;
    if (s.allocs > 1 && c.address < last) ++s.down;
    last = c.address;
    // Inside a freed range: the greatest freed start <= address, if it reaches it.
    auto it = freed.upper_bound(c.address);
    if (it != freed.begin() && std::prev(it)->first + std::prev(it)->second > c.address) ++s.reuse;
  }
  return s;
}

}  // namespace reservoir_bench::placement
