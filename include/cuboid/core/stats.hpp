#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The median of measured times, shared by the executor, the calibration sweeps
// and the calibration from a run's measurements.
#include <algorithm>
#include <vector>

namespace cuboid {

// The median of `v` (the mean of the middle two for an even count); 0 when empty.
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace cuboid
