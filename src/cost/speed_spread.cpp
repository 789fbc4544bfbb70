#include "cuboid/cost/speed_spread.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <stdexcept>
#include <string>

#include <boost/math/distributions/normal.hpp>

namespace cuboid {

namespace {

// A large sigma would put the fastest stratum's factor at or below zero, a
// duration the engine cannot play; no measured spread comes near it.
constexpr double kMinFactor = 0.1;

double normal_quantile(double p) { return boost::math::quantile(boost::math::normal_distribution<double>(), p); }

// The stride coprime to pp nearest pp / phi (ties: the smaller), so k s mod pp
// is a permutation and consecutive stages sit about 0.38 of the range apart.
int stratum_stride(int pp) {
  const double target = static_cast<double>(pp) / std::numbers::phi;
  int k = 1;
  for (int c = 1; c < pp; ++c) {
    if (std::gcd(c, pp) != 1) continue;
    if (std::abs(c - target) < std::abs(k - target)) k = c;
  }
  return k;
}

}  // namespace

double expected_max_normal(std::int64_t m) {
  if (m <= 1) return 0;
  const double md = static_cast<double>(m);
  return normal_quantile((md - 0.375) / (md + 0.25));
}

double max_normal_quantile(double q, std::int64_t m) {
  if (!(q > 0 && q < 1) || m < 1)
    throw std::invalid_argument("max_normal_quantile: needs 0 < q < 1 and m >= 1, got q = " + std::to_string(q) +
                                ", m = " + std::to_string(m));
  // q^(1/m) is close to 1 for large m: take its distance from 1 without
  // cancellation and read the quantile from the upper tail.
  const double upper = -std::expm1(std::log(q) / static_cast<double>(m));
  return -normal_quantile(upper);
}

double spread_slowdown(double sigma, std::int64_t gpus) {
  if (sigma <= 0 || gpus <= 1) return 1.0;
  return 1.0 + sigma * expected_max_normal(gpus);
}

int spread_stratum(int stage, int pp) {
  if (pp <= 1) return 0;
  return static_cast<int>((static_cast<std::int64_t>(stratum_stride(pp)) * stage) % pp);
}

std::vector<double> stage_spread_factors(double sigma, int tp, int pp, int dp) {
  const int stages = std::max(1, pp);
  std::vector<double> f(static_cast<std::size_t>(stages), 1.0);
  if (sigma <= 0) return f;
  const std::int64_t m = static_cast<std::int64_t>(std::max(1, tp)) * std::max(1, dp);
  const std::int64_t k = stratum_stride(stages);
  for (int s = 0; s < stages; ++s) {
    const double q = (static_cast<double>((k * s) % stages) + 0.5) / stages;  // spread_stratum(s, stages)
    const double z = stages == 1 ? expected_max_normal(m) : max_normal_quantile(q, m);
    f[static_cast<std::size_t>(s)] = std::max(kMinFactor, 1.0 + sigma * z);
  }
  return f;
}

}  // namespace cuboid
