// The GPU speed spread's statistics (cost/speed_spread.hpp) against values
// computed by hand. Normal quantiles are Python's statistics.NormalDist
// (Wichura's AS241, no scipy): NormalDist().inv_cdf(p). Exact expected maxima:
// E[max of 2] = 1/sqrt(pi); for m = 8 and 64 the integral
// E[max] = int_0^inf (1 - Phi(x)^m) dx - int_-inf^0 Phi(x)^m dx, summed on a
// 2e-4 grid over [-9, 9] (1.42360 agrees with Tippett's 1925 table).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <set>
#include <vector>

#include "cuboid/cost/speed_spread.hpp"

using namespace cuboid;

namespace {

// Phi(x), for the round trip of max_normal_quantile.
double phi(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

}  // namespace

TEST_CASE("expected maximum of m standard normals: Blom's approximation") {
  CHECK(expected_max_normal(1) == 0.0);  // one GPU: the median itself, no penalty
  CHECK(expected_max_normal(0) == 0.0);
  // m = 2: inv_cdf((2 - 0.375) / (2 + 0.25) = 0.722222) = 0.5894558; exact 1/sqrt(pi) = 0.5641896.
  CHECK(expected_max_normal(2) == doctest::Approx(0.5894558).epsilon(1e-6));
  CHECK(expected_max_normal(2) - 1 / std::sqrt(std::numbers::pi) == doctest::Approx(0.0252662).epsilon(1e-4));
  // m = 8: inv_cdf(7.625 / 8.25 = 0.924242) = 1.4342002; exact 1.4236003.
  CHECK(expected_max_normal(8) == doctest::Approx(1.4342002).epsilon(1e-6));
  CHECK(std::abs(expected_max_normal(8) - 1.4236003) < 0.011);
  // m = 64: inv_cdf(63.625 / 64.25 = 0.990272) = 2.3366911; exact 2.3437335.
  CHECK(expected_max_normal(64) == doctest::Approx(2.3366911).epsilon(1e-6));
  CHECK(std::abs(expected_max_normal(64) - 2.3437335) < 0.008);
  // m = 1,024 and 3,072: inv_cdf(0.9993898) = 3.2340677, inv_cdf(0.9997966) = 3.5355885.
  CHECK(expected_max_normal(1024) == doctest::Approx(3.2340677).epsilon(1e-6));
  CHECK(expected_max_normal(3072) == doctest::Approx(3.5355885).epsilon(1e-6));
  // It grows with m, ever more slowly.
  double prev = 0;
  for (std::int64_t m = 2; m <= 1 << 20; m *= 2) {
    CAPTURE(m);
    const double e = expected_max_normal(m);
    CHECK(e > prev);
    prev = e;
  }
}

TEST_CASE("quantile of the maximum of m normals: inv_cdf(q^(1/m))") {
  CHECK(max_normal_quantile(0.5, 1) == doctest::Approx(0.0));
  CHECK(max_normal_quantile(0.975, 1) == doctest::Approx(1.9599640).epsilon(1e-6));
  // sqrt(0.5) = 0.7071068 -> 0.5449521; 0.5^(1/8) = 0.9170040 -> 1.3851981.
  CHECK(max_normal_quantile(0.5, 2) == doctest::Approx(0.5449521).epsilon(1e-6));
  CHECK(max_normal_quantile(0.5, 8) == doctest::Approx(1.3851981).epsilon(1e-6));
  // 0.9375^(1/192) = 0.99966392 -> 3.4006887 (the slowest of 8 strata at TP 8 x DP 24).
  CHECK(max_normal_quantile(0.9375, 192) == doctest::Approx(3.4006887).epsilon(1e-6));
  // Round trip: the quantile of Phi(x)^m is x, far into the tail too.
  struct Case {
    double x;
    std::int64_t m;
  };
  for (const Case c : {Case{-1.0, 1}, Case{0.3, 3}, Case{2.0, 100}, Case{3.5, 4096}, Case{4.5, 100000}}) {
    CAPTURE(c.x);
    CAPTURE(c.m);
    CHECK(max_normal_quantile(std::pow(phi(c.x), static_cast<double>(c.m)), c.m) == doctest::Approx(c.x).epsilon(1e-6));
  }
  CHECK_THROWS(max_normal_quantile(0.0, 4));
  CHECK_THROWS(max_normal_quantile(1.0, 4));
}

TEST_CASE("the job's slowdown: 1 + sigma x E[max of its GPUs]") {
  constexpr double sigma = 0.0115;
  CHECK(spread_slowdown(sigma, 1) == 1.0);
  CHECK(spread_slowdown(0.0, 4096) == 1.0);
  // 1 + 0.0115 x 1.4342002 = 1.0164933; 1 + 0.0115 x 2.0667291 (m = 32) = 1.0237674.
  CHECK(spread_slowdown(sigma, 8) == doctest::Approx(1.0164933).epsilon(1e-7));
  CHECK(spread_slowdown(sigma, 32) == doctest::Approx(1.0237674).epsilon(1e-7));
  // 1 + 0.0115 x 3.5355885 = 1.0406593: +2.4 % beyond 8 GPUs at 3,072.
  CHECK(spread_slowdown(sigma, 3072) == doctest::Approx(1.0406593).epsilon(1e-7));
  CHECK(spread_slowdown(sigma, 3072) / spread_slowdown(sigma, 8) == doctest::Approx(1.0237).epsilon(1e-4));
}

TEST_CASE("strata: a fixed permutation of the stages, stage 0 the fastest, the slowest mid-pipeline") {
  CHECK(spread_stratum(0, 1) == 0);
  // pp 8: k = 5 (8 / phi = 4.94): strata 0 5 2 7 4 1 6 3.
  const std::vector<int> eight{0, 5, 2, 7, 4, 1, 6, 3};
  for (int s = 0; s < 8; ++s) CHECK(spread_stratum(s, 8) == eight[static_cast<std::size_t>(s)]);
  // pp 4: k = 3 (4 / phi = 2.47, 2 is not coprime): 0 3 2 1.
  const std::vector<int> four{0, 3, 2, 1};
  for (int s = 0; s < 4; ++s) CHECK(spread_stratum(s, 4) == four[static_cast<std::size_t>(s)]);
  for (int pp = 1; pp <= 128; ++pp) {
    CAPTURE(pp);
    std::set<int> seen;
    for (int s = 0; s < pp; ++s) seen.insert(spread_stratum(s, pp));
    CHECK(static_cast<int>(seen.size()) == pp);
    CHECK(*seen.begin() == 0);
    CHECK(*seen.rbegin() == pp - 1);
    if (pp > 2) CHECK(spread_stratum(pp - 1, pp) != pp - 1);  // the last stage is not the slowest
  }
}

TEST_CASE("per-stage factors of the simulator") {
  constexpr double sigma = 0.0115;
  // Off: all 1.
  for (double f : stage_spread_factors(0.0, 8, 4, 16)) CHECK(f == 1.0);
  // PP 1: the Blom point of the stage's tp x dp GPUs, the estimator's factor.
  const auto one = stage_spread_factors(sigma, 8, 1, 3);
  REQUIRE(one.size() == 1);
  CHECK(one[0] == spread_slowdown(sigma, 24));
  CHECK(stage_spread_factors(sigma, 1, 1, 1)[0] == 1.0);  // one GPU: no penalty
  // PP 4, TP 8: strata 0 3 2 1, q = 0.125, 0.875, 0.625, 0.375 of the max of 8:
  // inv_cdf(q^(1/8)) = 0.7424922, 2.1307980, 1.5799605, 1.1983736.
  const auto f = stage_spread_factors(sigma, 8, 4, 1);
  REQUIRE(f.size() == 4);
  CHECK(f[0] == doctest::Approx(1 + sigma * 0.7424922).epsilon(1e-8));
  CHECK(f[1] == doctest::Approx(1 + sigma * 2.1307980).epsilon(1e-8));
  CHECK(f[2] == doctest::Approx(1 + sigma * 1.5799605).epsilon(1e-8));
  CHECK(f[3] == doctest::Approx(1 + sigma * 1.1983736).epsilon(1e-8));
  // The slowest stratum of N = pp x m GPUs sits near the whole job's expected maximum.
  const auto big = stage_spread_factors(sigma, 8, 8, 24);
  double slowest = 0;
  for (double x : big) slowest = std::max(slowest, x);
  CHECK(slowest == doctest::Approx(1 + sigma * 3.4006887).epsilon(1e-8));
  CHECK(std::abs(slowest - spread_slowdown(sigma, 1536)) < sigma * 0.06);
  // A huge sigma cannot give a non-positive duration.
  for (double x : stage_spread_factors(0.5, 1, 64, 1)) CHECK(x >= 0.1);
}
