#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// GPU-to-GPU speed spread (GpuProfile::speed_spread): GPUs of one SKU do not
// sustain the same speed, and a synchronous training step waits for the
// slowest of them. Per-GPU speed is taken as normal with relative standard
// deviation sigma around the median GPU the other constants describe, so the
// slowest of N GPUs takes 1 + sigma x (its standard-normal score) of the
// median's compute time. The estimator charges the expected slowest of the
// whole job; the simulator gives each pipeline stage its own slowest-of-M
// (docs/cost-model.md, "GPU-to-GPU speed spread").
#include <cstdint>
#include <vector>

#include "cuboid/core/cluster.hpp"

namespace cuboid {

// E[max of m standard normals] by Blom's approximation,
// Phi^-1((m - 0.375) / (m + 0.25)); 0 for m <= 1. Within 0.026 of the exact
// value for every m (+0.025 at m = 2, under 0.016 in size from m = 5 on).
double expected_max_normal(std::int64_t m);

// The q-quantile of the maximum of m standard normals: Phi^-1(q^(1/m)),
// for q in (0, 1) and m >= 1.
double max_normal_quantile(double q, std::int64_t m);

// 1 + sigma x E[max of gpus]: the compute slowdown of a job on `gpus` GPUs
// paced by its slowest, relative to a median GPU. 1 when sigma is 0 or
// gpus <= 1.
double spread_slowdown(double sigma, std::int64_t gpus);

// The stratum stage `stage` of `pp` takes in the simulator: a fixed
// permutation of 0..pp-1, stage s -> k s mod pp with k the integer nearest
// pp / phi (golden ratio) that is coprime to pp, so consecutive stages land
// far apart and the slowest is a middle stage (stage 0 is the fastest).
int spread_stratum(int stage, int pp);

// Per pipeline stage, the compute factor of its simulated GPU, which stands
// for the m = tp x dp GPUs of the stage and waits for the slowest of them at
// every TP collective and the DP reduction: 1 + sigma x
// Phi^-1(q_s^(1/m)) with q_s = (spread_stratum(s, pp) + 0.5) / pp; with
// pp = 1 the Blom point, 1 + sigma x E[max of m]. All 1 when sigma is 0.
// Held at 0.1 or more (a large sigma would put the fastest stratum's time
// at or below zero).
std::vector<double> stage_spread_factors(double sigma, int tp, int pp, int dp);

}  // namespace cuboid
