// Open-addressing hash tables with linear probing (power-of-two capacity, load <= 1/2). Keys are uint64 with
// ~0 reserved as the empty marker. Used for automaton transitions ((state, token) -> edge) and gram counts.
//
// Growth is incremental. A live automaton of the running batch holds millions of transitions (256 requests x 16k
// tokens: ~10 M), and doubling its table at once allocated, zeroed and refilled hundreds of MB inside one insert:
// a 1-1.4 s stall of the engine step that waited on it (docs/benchmarks.md, "the 256 x 16k stall"). Now a doubling
// only allocates the new table, zero-filled lazily by the OS (fresh anonymous pages; slots hold the key's complement
// so that all-zero bytes are an empty slot), and each later insert moves the next kMigrate slots of the old table;
// lookups read the new table, then the old one's unmoved part. The old table is never written, so its probe chains
// stay valid. The migration ends within capacity / kMigrate inserts, long before the next doubling is due.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include <sys/mman.h>
#include <utility>

#include "common.h"

namespace das {

template <class V>
class FlatMap {
  static_assert(std::is_trivially_copyable<V>::value, "FlatMap values are moved bytewise");

 public:
  static constexpr uint64_t kEmpty = ~0ULL;
  static constexpr size_t kMigrate = 8;  // old slots moved per insert while a doubling is in progress
  static constexpr size_t kMapBytes = size_t{1} << 20;  // tables from this size on are mapped pages

  explicit FlatMap(size_t capacity = 16) { reset(capacity); }
  ~FlatMap() {
    cur_.release();
    old_.release();
  }
  FlatMap(const FlatMap&) = delete;
  FlatMap& operator=(const FlatMap&) = delete;
  FlatMap(FlatMap&& o) noexcept { *this = std::move(o); }
  FlatMap& operator=(FlatMap&& o) noexcept {
    if (this != &o) {
      cur_.release();
      old_.release();
      cur_ = o.cur_, old_ = o.old_, moved_ = o.moved_, size_ = o.size_;
      o.cur_ = o.old_ = Table{};
      o.moved_ = o.size_ = 0;
    }
    return *this;
  }

  // Empties the table and sizes it for about `capacity` keys.
  void reset(size_t capacity = 16) {
    size_t cap = 16;
    while (cap < 2 * capacity) cap <<= 1;
    cur_.release();
    old_.release();
    cur_ = Table::make(cap);
    moved_ = size_ = 0;
  }

  size_t size() const { return size_; }
  // Bytes held by both tables (during a doubling, the old one too).
  size_t bytes() const { return (cur_.mask + 1 + (old_.slots ? old_.mask + 1 : 0)) * sizeof(Slot); }

  // Pointer to the value of key, or nullptr. Valid until the next insert.
  const V* find(uint64_t key) const {
    const uint64_t stored = ~key;
    if (const Slot* s = cur_.probe(stored)) return &s->val;
    if (old_.slots) {
      // Keys of the old table's moved part are all in the new one, so a hit here is an unmoved key.
      if (const Slot* s = old_.probe(stored)) return &s->val;
    }
    return nullptr;
  }
  V* find(uint64_t key) { return const_cast<V*>(static_cast<const FlatMap*>(this)->find(key)); }

  // Value of key, inserted as V() if absent. The reference is valid until the next insert.
  V& operator[](uint64_t key) {
    if (V* v = find(key)) return *v;
    if (2 * (size_ + 1) > cur_.mask + 1) start_doubling();
    if (old_.slots) migrate(kMigrate);
    Slot& s = cur_.place(~key);
    s.stored = ~key;
    s.val = V();
    ++size_;
    return s.val;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i <= cur_.mask; ++i)
      if (cur_.slots[i].stored) f(~cur_.slots[i].stored, cur_.slots[i].val);
    if (old_.slots)
      for (size_t i = moved_; i <= old_.mask; ++i)
        if (old_.slots[i].stored) f(~old_.slots[i].stored, old_.slots[i].val);
  }

 private:
  struct Slot {
    uint64_t stored;  // ~key; 0 = empty
    V val;
  };
  struct Table {
    Slot* slots = nullptr;
    size_t mask = 0;

    static Table make(size_t cap) {
      void* p;
      if (cap * sizeof(Slot) >= kMapBytes) {
        // Fresh anonymous pages come zeroed on first touch: a large table costs nothing up front. (calloc would
        // memset memory the allocator reuses, all of it inside this insert.)
        p = mmap(nullptr, cap * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
      } else {
        p = std::calloc(cap, sizeof(Slot));
        if (!p) throw std::bad_alloc();
      }
      return Table{static_cast<Slot*>(p), cap - 1};
    }
    void release() {
      if (!slots) return;
      const size_t n = (mask + 1) * sizeof(Slot);
      if (n >= kMapBytes) munmap(slots, n); else std::free(slots);
      *this = Table{};
    }
    const Slot* probe(uint64_t stored) const {
      for (size_t i = mix64(~stored) & mask;; i = (i + 1) & mask) {
        if (slots[i].stored == stored) return &slots[i];
        if (!slots[i].stored) return nullptr;
      }
    }
    // The slot of a key known to be absent.
    Slot& place(uint64_t stored) {
      size_t i = mix64(~stored) & mask;
      while (slots[i].stored) i = (i + 1) & mask;
      return slots[i];
    }
  };

  void start_doubling() {
    if (old_.slots) migrate(old_.mask + 1);  // the previous doubling is not done (unreachable at kMigrate >= 2)
    const Table bigger = Table::make(2 * (cur_.mask + 1));  // first: a bad_alloc leaves the map as it was
    old_ = cur_;
    cur_ = bigger;
    moved_ = 0;
  }

  // Moves the next n slots of the old table; frees it once all are moved.
  void migrate(size_t n) {
    const size_t end = std::min(old_.mask + 1, moved_ + n);
    for (; moved_ < end; ++moved_) {
      const Slot& x = old_.slots[moved_];
      if (x.stored) cur_.place(x.stored) = x;
    }
    if (moved_ > old_.mask) {
      old_.release();
      moved_ = 0;
    }
  }

  Table cur_, old_;
  size_t moved_ = 0;  // old-table slots [0, moved_) are in the new table
  size_t size_ = 0;
};

}  // namespace das
