// An append-only array of plain records that grows without copying once it is large.
//
// Why not std::vector. The live automata of the running batch grow to millions of states while the engine waits,
// and a std::vector doubling copied the whole array into freshly faulted pages inside one append (tens of ms at
// 256 x 4k tokens, more at 16k; docs/benchmarks.md, "the 256 x 16k stall"). From kMapBytes on, the array lives
// in its own anonymous mapping and grows with mremap: the kernel moves the page tables, not the data, and the new
// pages fault in as appends reach them. Below that it is malloc'd like a vector. Indexing is a plain pointer.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace das {

template <class T>
class PodVector {
  static_assert(std::is_trivially_copyable<T>::value && std::is_trivially_destructible<T>::value,
                "PodVector holds plain records");

 public:
  static constexpr size_t kMapBytes = size_t{1} << 20;

  PodVector() = default;
  ~PodVector() { release(); }
  PodVector(const PodVector&) = delete;
  PodVector& operator=(const PodVector&) = delete;
  PodVector(PodVector&& o) noexcept : data_(o.data_), size_(o.size_), cap_(o.cap_) {
    o.data_ = nullptr;
    o.size_ = o.cap_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

  void push_back(const T& x) {
    if (size_ == cap_) grow(cap_ < 16 ? 16 : 2 * cap_);
    data_[size_++] = x;
  }
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  // Empties it and gives the memory back.
  void clear() {
    release();
    size_ = cap_ = 0;
  }
  size_t bytes() const { return cap_ * sizeof(T); }

 private:
  static bool mapped(size_t cap) { return cap * sizeof(T) >= kMapBytes; }

  void grow(size_t cap) {
    const size_t old_bytes = cap_ * sizeof(T);
    size_t bytes = cap * sizeof(T);
    void* p;
    if (!mapped(cap)) {
      p = std::realloc(data_, bytes);
      if (!p) throw std::bad_alloc();
    } else {
      bytes = (bytes + 4095) & ~size_t{4095};  // whole pages: the mapping's true size is the capacity
      cap = bytes / sizeof(T);
      if (data_ && mapped(cap_)) {
        p = mremap(data_, (old_bytes + 4095) & ~size_t{4095}, bytes, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) throw std::bad_alloc();
      } else {
        p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        if (data_) {
          std::memcpy(p, data_, size_ * sizeof(T));
          std::free(data_);
        }
      }
    }
    data_ = static_cast<T*>(p);
    cap_ = cap;
  }
  void release() {
    if (!data_) return;
    if (mapped(cap_)) munmap(data_, (cap_ * sizeof(T) + 4095) & ~size_t{4095}); else std::free(data_);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  size_t size_ = 0, cap_ = 0;
};

}  // namespace das
