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
    slots_.assign(cap, Slot{kEmpty, V()});
    mask_ = cap - 1;
    size_ = 0;
  }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

  // Pointer to the value of key, or nullptr.
  const V* find(uint64_t key) const {
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].val;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  V* find(uint64_t key) { return const_cast<V*>(static_cast<const FlatMap*>(this)->find(key)); }

  // Value of key, inserted as V() if absent.
  V& operator[](uint64_t key) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = mix64(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].val;
      if (slots_[i].key == kEmpty) break;
    }
    slots_[i].key = key;
    slots_[i].val = V();
    ++size_;
    return slots_[i].val;
  }

  // Removes key if present (backward-shift deletion keeps probe chains intact).
  void erase(uint64_t key) {
    size_t i = mix64(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) return;
      if (slots_[i].key == key) break;
    }
    size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j].key == kEmpty) break;
      size_t home = mix64(slots_[j].key) & mask_;
      // Move j back into the hole at i if its home slot is not in (i, j] cyclically.
      if ((j > i) ? (home <= i || home > j) : (home <= i && home > j)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = kEmpty;
    --size_;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const Slot& x : slots_)
      if (x.key != kEmpty) f(x.key, x.val);
  }

 private:
  struct Slot {
    uint64_t key;
    V val;
  };

  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    size_t cap = old.size() * 2;
    slots_.assign(cap, Slot{kEmpty, V()});
    mask_ = cap - 1;
    for (const Slot& x : old) {
      if (x.key == kEmpty) continue;
      size_t j = mix64(x.key) & mask_;
      while (slots_[j].key != kEmpty) j = (j + 1) & mask_;
      slots_[j] = x;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace das
