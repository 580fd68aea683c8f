// Acceptance calibration from verification outcomes: a port of das_trl/drafter/calibration.py with the same
// arithmetic in the same order (so native and Python drafts stay equal). Cells are (source, match-length bucket
// 1 / 2 / 3-4 / 5-8 / 9+, prior-estimate bin of width 1/bins); the calibrated estimate is
// a * (hits + s) / (expected + s), made non-increasing along the draft; counts decay by step_decay per history push.
#pragma once

#include <algorithm>
#include <vector>

#include "common.h"

namespace das {

class Calibrator {
 public:
  static constexpr int kBuckets = 5;

  Calibrator(int bins, double pseudocount, double cap, double step_decay)
      : bins_(bins), pc_(pseudocount), cap_(cap), decay_(step_decay) {
    const size_t cells = static_cast<size_t>(kNumSources) * kBuckets * bins;
    expected_.assign(cells, 0.0);
    hits_.assign(cells, 0.0);
    ratios_.assign(cells, 1.0);
  }

  static int bucket(int match_len) {
    if (match_len <= 1) return 0;
    if (match_len <= 2) return 1;
    if (match_len <= 4) return 2;
    if (match_len <= 8) return 3;
    return 4;
  }
  int bins() const { return bins_; }
  int64_t observed_tokens() const { return observed_; }

  // Calibrated estimates of prior[0..n) into out; stops before the first estimate below floor. Returns the count.
  int calibrate(int source, int match_len, const double* prior, int n, double floor, double* out) const {
    const double* r = &ratios_[row(source, match_len) * bins_];
    const int top = bins_ - 1;
    double last = 1.0;
    int k = 0;
    for (int i = 0; i < n; ++i) {
      const double a = prior[i];
      int b = static_cast<int>(a * bins_);
      double c = a * r[b < top ? b : top];
      if (c < last) {
        if (c < floor) break;
        last = c;
      }
      out[k++] = last;
    }
    return k;
  }

  void observe(int source, int match_len, const double* prior, int n, int num_accepted) {
    const size_t base = row(source, match_len) * bins_;
    const int n_acc = std::min(std::max(num_accepted, 0), n);
    const int top = bins_ - 1;
    for (int i = 0; i < n; ++i) {
      const double a = prior[i];
      const int b = std::min(top, std::max(0, static_cast<int>(a * bins_)));
      double& e = expected_[base + b];
      double& h = hits_[base + b];
      e += a;
      if (i < n_acc) h += 1.0;
      if (e > cap_) {
        e *= 0.5;
        h *= 0.5;
      }
      ratios_[base + b] = (h + pc_) / (e + pc_);
    }
    observed_ += n;
  }

  void new_step() {
    for (size_t i = 0; i < expected_.size(); ++i) {
      expected_[i] *= decay_;
      hits_[i] *= decay_;
      ratios_[i] = (hits_[i] + pc_) / (expected_[i] + pc_);
    }
  }

  double ratio(int source, int bucket_index, int bin) const {
    return ratios_[(static_cast<size_t>(source) * kBuckets + bucket_index) * bins_ + bin];
  }

 private:
  size_t row(int source, int match_len) const { return static_cast<size_t>(source) * kBuckets + bucket(match_len); }

  int bins_;
  double pc_, cap_, decay_;
  std::vector<double> expected_, hits_, ratios_;
  int64_t observed_ = 0;
};

}  // namespace das
