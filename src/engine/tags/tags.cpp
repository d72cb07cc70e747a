#include "engine/tags/tags.hpp"

#include <algorithm>
#include <limits>

#include "reservoir/errors.hpp"

namespace reservoir::detail {

std::string TagNames::invalid_name(std::string_view name) {
  if (name.empty()) return "a tag needs a name";
  if (name.size() > 63)
    return "a tag's name has at most 63 characters, not " + std::to_string(name.size());
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.' || c == ':';
    if (!ok)
      return "a tag's name is made of letters, digits, '_', '-', '.' and ':' (not '" +
             std::string(1, c) + "')";
  }
  return "";
}

TagNames& TagNames::instance() {
  static TagNames* names = new TagNames;  // never destroyed: threads may outlive statics
  return *names;
}

TagId TagNames::intern(std::string_view name) {
  if (std::string why = invalid_name(name); !why.empty())
    throw InvalidArgumentError("reservoir: '" + std::string(name.substr(0, 80)) +
                               "' cannot be a tag: " + why);
  TagNames& t = instance();
  std::lock_guard<std::mutex> guard(t.mutex_);
  auto it = std::find(t.names_.begin(), t.names_.end(), name);
  if (it != t.names_.end()) return static_cast<TagId>(it - t.names_.begin() + 1);
  if (t.names_.size() >= std::numeric_limits<TagId>::max())
    throw InvalidArgumentError("reservoir: cannot make tag '" + std::string(name) +
                               "': " + std::to_string(t.names_.size()) + " tags exist already");
  t.names_.emplace_back(name);
  return static_cast<TagId>(t.names_.size());
}

TagId TagNames::find(std::string_view name) {
  TagNames& t = instance();
  std::lock_guard<std::mutex> guard(t.mutex_);
  auto it = std::find(t.names_.begin(), t.names_.end(), name);
  return it == t.names_.end() ? kNoTag : static_cast<TagId>(it - t.names_.begin() + 1);
}

std::string TagNames::name(TagId id) {
  if (id == kNoTag) return "";
  TagNames& t = instance();
  std::lock_guard<std::mutex> guard(t.mutex_);
  return id <= t.names_.size() ? t.names_[id - 1] : std::string();
}

ThreadTag& thread_tag() noexcept {
  thread_local ThreadTag tag;
  return tag;
}

}  // namespace reservoir::detail
