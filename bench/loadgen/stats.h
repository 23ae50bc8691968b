// Latency statistics of a benchmark run: count, mean, min, max and the 50th,
// 90th and 99th percentiles. Percentiles interpolate linearly between the
// closest ranks (numpy's default, which vLLM's benchmark_serving reports),
// so p50 of {1, 2} is 1.5 and p99 of a single value is that value.
//
// Thread-safety: free functions on values.
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve::bench {

struct Summary {
  int64_t count = 0;
  double mean = 0;
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// q in [0, 100] of values sorted ascending; 0 for an empty vector.
double Percentile(const std::vector<double>& sorted, double q);

// All fields zero when `values` is empty (count says so).
Summary Summarize(std::vector<double> values);

}  // namespace kvserve::bench
