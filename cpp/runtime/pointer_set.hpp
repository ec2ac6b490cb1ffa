#pragma once
#include <algorithm>
#include <unordered_set>
#include <vector>

namespace bitnet {

// A set of pointers that a sequence fills a few at a time: searched in a vector while small (an
// eager op holds a handful, and a hash set's node a pointer cost more than the search), indexed
// by a hash set once it grows (a decoder graph keeps hundreds).
template <typename T>
class PointerSet {
 public:
  bool contains(T item) const {
    return index_.empty() ? std::find(items_.begin(), items_.end(), item) != items_.end()
                          : index_.count(item) != 0;
  }
  // Whether the item was new.
  bool insert(T item) {
    if (contains(item)) return false;
    items_.push_back(item);
    if (!index_.empty())
      index_.insert(item);
    else if (items_.size() > kLinear)
      index_.insert(items_.begin(), items_.end());
    return true;
  }
  void clear() {
    items_.clear();
    index_.clear();
  }

 private:
  static constexpr size_t kLinear = 16;
  std::vector<T> items_;
  std::unordered_set<T> index_;
};

}  // namespace bitnet
