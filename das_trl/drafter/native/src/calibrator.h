// Acceptance calibration from verification outcomes: a port of das_trl/drafter/reference/calibration.py with the same
// arithmetic in the same order (so native and Python drafts stay equal).
//
// Conditional, per draft position. A chain draft is accepted up to its first mismatch, so the chance that its first
// i + 1 tokens hold is the product of each token's chance given the ones before it held. The prior of token i given
// the ones before is r_0 = prior[0] (the evidence model's first estimate) and r_i = prior[i] / prior[i - 1] (the
// tree's count ratio). Each r_i is scaled by the observed/predicted ratio of its cell (source, match-length bucket
// 1 / 2 / 3-4 / 5-8 / 9+, draft-position bucket 1 / 2 / 3-4 / 5-8 / 9-16 / 17-32 / 33+, bin of r_i of width 1/bins),
// capped at 1, and the estimates are the running products. A cell's ratio is (hits + s R) / (expected + s), shrunk
// towards R, the ratio of its (source, position bucket) parent, itself (H + s R') / (E + s) with R' the parent ratio
// of the position bucket before (1 before the first): a cell seen rarely takes its position's pooled correction, and
// a position bucket seen rarely the one before it, so far positions decay as observed even where the tree says
// "certain" and few drafts have reached them yet.
// A verified draft teaches each token up to and including the first rejected one (the later ones were never tried);
// counts decay by step_decay per history push and are halved when a cell's expected mass passes cap.
#pragma once

#include <algorithm>
#include <vector>

#include "common.h"

namespace das {

class Calibrator {
 public:
  static constexpr int kBuckets = 5;    // match-length buckets
  static constexpr int kPositions = 7;  // draft-position buckets

  Calibrator(int bins, double pseudocount, double cap, double step_decay)
      : bins_(bins), pc_(pseudocount), cap_(cap), decay_(step_decay) {
    const size_t cells = static_cast<size_t>(kNumSources) * kBuckets * kPositions * bins;
    expected_.assign(cells, 0.0);
    hits_.assign(cells, 0.0);
    parent_expected_.assign(static_cast<size_t>(kNumSources) * kPositions, 0.0);
    parent_hits_.assign(static_cast<size_t>(kNumSources) * kPositions, 0.0);
  }

  static int bucket(int match_len) {
    if (match_len <= 1) return 0;
    if (match_len <= 2) return 1;
    if (match_len <= 4) return 2;
    if (match_len <= 8) return 3;
    return 4;
  }
  // Position bucket of 0-based draft position i: 1, 2, 3-4, 5-8, 9-16, 17-32, 33+ (1-based).
  static int position_bucket(int i) {
    if (i <= 0) return 0;
    if (i == 1) return 1;
    if (i <= 3) return 2;
    if (i <= 7) return 3;
    if (i <= 15) return 4;
    if (i <= 31) return 5;
    return 6;
  }
  int bins() const { return bins_; }
  int64_t observed_tokens() const { return observed_; }

  // Calibrated cumulative estimates of prior[0..n) into out; stops before the first estimate below floor. Returns
  // the count.
  int calibrate(int source, int match_len, const double* prior, int n, double floor, double* out) const {
    double last = 1.0;
    int k = 0;
    int pos = -1;      // the position bucket `up` is for
    double up = 1.0;   // its parent ratio (chained from the first bucket)
    for (int i = 0; i < n; ++i) {
      const double r = conditional(prior, i);
      for (const int want = position_bucket(i); pos < want;) up = parent_ratio(source, ++pos, up);
      double c = r * shrunk(cell(source, match_len, i, r), up);
      if (c > 1.0) c = 1.0;
      const double a = last * c;
      if (a < floor) break;
      out[k++] = a;
      last = a;
    }
    return k;
  }

  // One verified draft: prior[0..n) as drafted, num_accepted of them accepted.
  void observe(int source, int match_len, const double* prior, int n, int num_accepted) {
    const int n_acc = std::min(std::max(num_accepted, 0), n);
    const int tried = std::min(n_acc + 1, n);  // tokens up to and including the first rejection
    for (int i = 0; i < tried; ++i) {
      const double r = conditional(prior, i);
      const size_t c = cell(source, match_len, i, r);
      const size_t p = parent(source, i);
      const double hit = i < n_acc ? 1.0 : 0.0;
      add(expected_[c], hits_[c], r, hit);
      add(parent_expected_[p], parent_hits_[p], r, hit);
    }
    observed_ += n;
  }

  void new_step() {
    for (size_t i = 0; i < expected_.size(); ++i) {
      expected_[i] *= decay_;
      hits_[i] *= decay_;
    }
    for (size_t i = 0; i < parent_expected_.size(); ++i) {
      parent_expected_[i] *= decay_;
      parent_hits_[i] *= decay_;
    }
  }

  // The ratio applied to a conditional prior in bin `bin` at position bucket `position`, match bucket `bucket`.
  double ratio(int source, int bucket_index, int position, int bin) const {
    const size_t c = ((static_cast<size_t>(source) * kBuckets + bucket_index) * kPositions + position) * bins_ + bin;
    double up = 1.0;
    for (int p = 0; p <= position; ++p) up = parent_ratio(source, p, up);
    return shrunk(c, up);
  }

 private:
  static double conditional(const double* prior, int i) {
    if (i == 0) return std::min(std::max(prior[0], 0.0), 1.0);
    const double before = prior[i - 1];
    if (!(before > 0.0)) return 0.0;
    return std::min(std::max(prior[i] / before, 0.0), 1.0);
  }
  size_t cell(int source, int match_len, int i, double r) const {
    const int top = bins_ - 1;
    int b = static_cast<int>(r * bins_);
    b = b < top ? b : top;
    return ((static_cast<size_t>(source) * kBuckets + bucket(match_len)) * kPositions + position_bucket(i)) * bins_ + b;
  }
  size_t parent(int source, int i) const { return static_cast<size_t>(source) * kPositions + position_bucket(i); }
  // (H + s before) / (E + s) of position bucket `position`'s parent, `before` the ratio of the bucket before it.
  double parent_ratio(int source, int position, double before) const {
    const size_t p = static_cast<size_t>(source) * kPositions + position;
    return (parent_hits_[p] + pc_ * before) / (parent_expected_[p] + pc_);
  }
  double shrunk(size_t c, double up) const { return (hits_[c] + pc_ * up) / (expected_[c] + pc_); }
  void add(double& e, double& h, double r, double hit) const {
    e += r;
    h += hit;
    if (e > cap_) {
      e *= 0.5;
      h *= 0.5;
    }
  }

  int bins_;
  double pc_, cap_, decay_;
  std::vector<double> expected_, hits_, parent_expected_, parent_hits_;
  int64_t observed_ = 0;
};

}  // namespace das
