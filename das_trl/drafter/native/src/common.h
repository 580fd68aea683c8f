// Shared definitions of the DAS drafter's native core. No Python here: the core is plain C++17, the bindings
// (bindings.cc) are the only file that includes nanobind.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace das {

// Raised for bad input; the bindings translate it to Python's ValueError (asserts vanish in release builds).
struct InputError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Draft sources, in the order of das_trl.drafter.arbitration.SOURCE_ORDER (ties go to the earlier one).
enum Source : int { kProblem = 0, kSiblings = 1, kLocal = 2, kBatch = 3, kGlobal = 4, kNumSources = 5 };

// splitmix64 finalizer: the hash of the flat tables.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// 64-bit key of a g-gram of token ids (polynomial hash, then mixed). Distinct grams collide with probability
// ~2^-64 per pair; the Python reference keys its live counts by exact tuples.
inline uint64_t gram_key(const int32_t* tokens, int g) {
  uint64_t h = 0;
  for (int i = 0; i < g; ++i) h = h * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 1;
  return mix64(h);
}

// numpy's pairwise summation of a contiguous float64 array (np.add.reduce), operation for operation, so the sum
// equals the reference's np.sum bit for bit.
inline double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

}  // namespace das
