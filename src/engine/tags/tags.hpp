// Tags: names for parts of a program's memory (weights, kv, ...), so that a part can
// be put to sleep and woken (device_engine.hpp: sleep, wake) without the rest.
//
// A tag is a process-wide name interned as a small id (TagId; kNoTag, 0, is the
// memory no tag names). A thread's current tag (ThreadTag) names the allocator it
// applies to (its engines' shared hooks), so a scope opened on one allocator never
// tags another's requests. The engine reads it only on its detour path, which an
// allocator takes only while a tag scope is open (DeviceEngine::set_tagging).
//
// Invariants: names_[id - 1] is the name of id for 1 <= id <= names_.size();
//   names are unique, valid (valid_name), and never forgotten (ids stay stable).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace reservoir::detail {

using TagId = std::uint16_t;
constexpr TagId kNoTag = 0;

class TagNames {
 public:
  // Why name cannot be a tag ("" when it can): 1-63 characters of letters, digits,
  // '_', '-', '.' and ':'.
  static std::string invalid_name(std::string_view name);
  // The id of name, made on first use. Throws InvalidArgumentError for an invalid name
  // or when 65,535 names exist.
  static TagId intern(std::string_view name);
  // The id of name, or kNoTag when no tag of that name was ever made.
  static TagId find(std::string_view name);
  // The name of id ("" for kNoTag).
  static std::string name(TagId id);

 private:
  static TagNames& instance();
  std::mutex mutex_;
  std::vector<std::string> names_;
};

// A thread's tag: owner identifies the allocator (its EngineHooks), tag its name.
struct ThreadTag {
  const void* owner = nullptr;
  TagId tag = kNoTag;
};
// The calling thread's tag (a thread_local).
ThreadTag& thread_tag() noexcept;
// The calling thread's tag for the allocator owner (kNoTag when it names another).
inline TagId thread_tag_for(const void* owner) noexcept {
  const ThreadTag& t = thread_tag();
  return t.owner == owner ? t.tag : kNoTag;
}

}  // namespace reservoir::detail
