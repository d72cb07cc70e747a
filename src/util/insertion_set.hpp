// InsertionSet: a set that remembers the order its members were added in, with
// membership in constant time at any size.
//
//   InsertionSet<StreamHandle> uses;
//   if (uses.insert(stream)) ...   // new member
//   for (StreamHandle s : uses) ... // in the order first added
//
// Made for the streams a block was used on (record_stream): a handful as a rule, so
// a few entries are found by scanning a vector, without hashing or a node per
// member; but a program may name one block on any number of streams (a trace with a
// million uses of one block, each on a new stream), so past kScanLimit members a hash
// index answers instead, and a use costs the same on the millionth stream as on the
// second.
//
// Invariant: items_ holds each member once, in insertion order; index_ is empty
// while items_.size() <= kScanLimit, else holds exactly the members of items_.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <unordered_set>
#include <vector>

namespace reservoir::detail {

template <class T, class Hash = std::hash<T>>
class InsertionSet {
 public:
  // Up to this many members a lookup scans them; past it the hash index is built.
  static constexpr std::size_t kScanLimit = 8;

  // Adds value; false when it was a member already.
  bool insert(const T& value) {
    if (contains(value)) return false;
    items_.push_back(value);
    if (!index_.empty())
      index_.insert(value);
    else if (items_.size() > kScanLimit)
      index_.insert(items_.begin(), items_.end());
    return true;
  }

  bool contains(const T& value) const {
    if (index_.empty()) return std::find(items_.begin(), items_.end(), value) != items_.end();
    return index_.find(value) != index_.end();
  }

  // Removes every member of other, in time linear in the two sizes.
  void erase_all(const InsertionSet& other) {
    if (other.empty() || empty()) return;
    std::erase_if(items_, [&](const T& v) { return other.contains(v); });
    index_.clear();
    if (items_.size() > kScanLimit) index_.insert(items_.begin(), items_.end());
  }

  void clear() {
    items_.clear();
    index_.clear();
  }

  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<T> items_;
  std::unordered_set<T, Hash> index_;
};

}  // namespace reservoir::detail
