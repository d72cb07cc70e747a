#include "op_list.hpp"

#include <zlib.h>

#include <charconv>
#include <filesystem>

namespace reservoir_bench::placement {

namespace {

[[noreturn]] void fail(const std::string& name, std::size_t line, const std::string& why) {
  throw OpError(name + ":" + std::to_string(line) + ": " + why);
}

bool parse_u64(std::string_view text, std::uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// Checks one op against the allocs seen so far; freed[i]: alloc i was freed.
// Returns "" or the reason the op breaks the invariant.
std::string check(const Op& op, std::vector<bool>& freed) {
  switch (op.kind) {
    case OpKind::alloc:
      if (op.value == 0) return "alloc of 0 bytes";
      freed.push_back(false);
      return "";
    case OpKind::reserve:
      return op.value == 0 ? "reserve of 0 bytes" : "";
    case OpKind::free:
      if (op.value >= freed.size())
        return "free " + std::to_string(op.value) + " names no earlier alloc (" +
               std::to_string(freed.size()) + " so far)";
      if (freed[op.value]) return "alloc " + std::to_string(op.value) + " is freed twice";
      freed[op.value] = true;
      return "";
  }
  return "unknown op";
}

}  // namespace

std::size_t OpList::allocs() const {
  std::size_t n = 0;
  for (const Op& op : ops) n += op.kind == OpKind::alloc;
  return n;
}

std::size_t OpList::alloc(std::uint64_t bytes) {
  const std::size_t index = allocs();
  ops.push_back({OpKind::alloc, bytes});
  return index;
}

void validate(const OpList& list) {
  std::vector<bool> freed;
  for (std::size_t i = 0; i < list.ops.size(); ++i)
    if (std::string why = check(list.ops[i], freed); !why.empty())
      throw OpError(list.name + ": op " + std::to_string(i) + ": " + why);
}

std::string format_ops(const OpList& list) {
  std::string out = std::string(kOpsHeader) + "\n";
  for (const std::string& note : list.notes) out += "# " + note + "\n";
  for (const Op& op : list.ops) {
    const char* tag = op.kind == OpKind::alloc  ? "alloc "
                      : op.kind == OpKind::free ? "free "
                                                : "reserve ";
    out += tag + std::to_string(op.value) + "\n";
  }
  return out;
}

OpList parse_ops(std::string_view text, const std::string& name) {
  OpList list;
  list.name = name;
  std::vector<bool> freed;
  std::size_t line_number = 0;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_number;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# placement ops v", 0) == 0) {
        if (line != kOpsHeader)
          fail(name, line_number, "unsupported version: '" + std::string(line) + "'");
        continue;
      }
      line.remove_prefix(line.size() > 1 && line[1] == ' ' ? 2 : 1);
      list.notes.emplace_back(line);
      continue;
    }
    const std::size_t space = line.find(' ');
    const std::string_view tag = line.substr(0, space);
    Op op;
    if (tag == "alloc")
      op.kind = OpKind::alloc;
    else if (tag == "free")
      op.kind = OpKind::free;
    else if (tag == "reserve")
      op.kind = OpKind::reserve;
    else
      fail(name, line_number,
           "unknown op '" + std::string(line) + "' (alloc SIZE | free INDEX | reserve SIZE)");
    if (space == std::string_view::npos || !parse_u64(line.substr(space + 1), &op.value))
      fail(name, line_number,
           "expected '" + std::string(tag) + " NUMBER', got '" + std::string(line) + "'");
    if (std::string why = check(op, freed); !why.empty()) fail(name, line_number, why);
    list.ops.push_back(op);
  }
  return list;
}

OpList read_ops(const std::string& path) {
  gzFile in = gzopen(path.c_str(), "rb");
  if (in == nullptr) throw OpError(path + ": cannot open");
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(in, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  int err = Z_OK;
  const char* message = gzerror(in, &err);
  const std::string why = n < 0 ? message : "";
  gzclose(in);
  if (n < 0) throw OpError(path + ": cannot read: " + why);
  std::string name = std::filesystem::path(path).filename().string();
  for (const char* tail : {".txt.gz", ".txt"})
    if (ends_with(name, tail)) {
      name.resize(name.size() - std::string_view(tail).size());
      break;
    }
  return parse_ops(text, name);
}

void write_ops(const std::string& path, const OpList& list) {
  validate(list);
  const std::string text = format_ops(list);
  gzFile out = gzopen(path.c_str(), ends_with(path, ".gz") ? "wb9" : "wbT");
  if (out == nullptr) throw OpError(path + ": cannot write");
  const int written = gzwrite(out, text.data(), static_cast<unsigned>(text.size()));
  if (gzclose(out) != Z_OK || written != static_cast<int>(text.size()))
    throw OpError(path + ": writing failed");
}

std::string ops_name(const std::string& trace_path, const std::string& config) {
  std::string base = std::filesystem::path(trace_path).filename().string();
  for (const char* tail : {".trace.gz", ".trace", ".gz"})
    if (ends_with(base, tail)) {
      base.resize(base.size() - std::string_view(tail).size());
      break;
    }
  std::string label = config.empty() ? "default" : config;
  for (char& c : label) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return base + "." + label;
}

}  // namespace reservoir_bench::placement
