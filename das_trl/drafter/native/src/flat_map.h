// Open-addressing hash tables with linear probing (power-of-two capacity, load <= 1/2). Keys are uint64 with
// ~0 reserved as the empty marker. Used for automaton transitions ((state, token) -> edge) and gram counts.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace das {

template <class V>
class FlatMap {
 public:
  static constexpr uint64_t kEmpty = ~0ULL;

  explicit FlatMap(size_t capacity = 16) { reset(capacity); }

  void reset(size_t capacity = 16) {
    size_t cap = 16;
    while (cap < 2 * capacity) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, V());
    mask_ = cap - 1;
    size_ = 0;
  }

  size_t size() const { return size_; }
  size_t bytes() const { return keys_.capacity() * sizeof(uint64_t) + vals_.capacity() * sizeof(V); }

  // Pointer to the value of key, or nullptr.
  const V* find(uint64_t key) const {
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  V* find(uint64_t key) { return const_cast<V*>(static_cast<const FlatMap*>(this)->find(key)); }

  // Value of key, inserted as V() if absent.
  V& operator[](uint64_t key) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    size_t i = mix64(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmpty) break;
    }
    keys_[i] = key;
    vals_[i] = V();
    ++size_;
    return vals_[i];
  }

  // Removes key if present (backward-shift deletion keeps probe chains intact).
  void erase(uint64_t key) {
    size_t i = mix64(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty) return;
      if (keys_[i] == key) break;
    }
    size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (keys_[j] == kEmpty) break;
      size_t home = mix64(keys_[j]) & mask_;
      // Move j back into the hole at i if its home slot is not in (i, j] cyclically.
      if ((j > i) ? (home <= i || home > j) : (home <= i && home > j)) {
        keys_[i] = keys_[j];
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = kEmpty;
    --size_;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
  }

 private:
  void grow() {
    std::vector<uint64_t> old_keys;
    std::vector<V> old_vals;
    old_keys.swap(keys_);
    old_vals.swap(vals_);
    size_t cap = old_keys.size() * 2;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, V());
    mask_ = cap - 1;
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] == kEmpty) continue;
      size_t j = mix64(old_keys[i]) & mask_;
      while (keys_[j] != kEmpty) j = (j + 1) & mask_;
      keys_[j] = old_keys[i];
      vals_[j] = old_vals[i];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<V> vals_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace das
