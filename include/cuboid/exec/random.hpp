#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// Deterministic counter-based randomness, shared by every backend so that the
// CPU and CUDA backends draw the same weights and dropout masks (value i of a
// stream depends only on (seed, i), not on the thread that computes it).
#include <cstdint>

// Callable from CUDA kernels as well as host code.
#if defined(__CUDACC__)
#define CUBOID_HD __host__ __device__
#else
#define CUBOID_HD
#endif

namespace cuboid::exec {

CUBOID_HD constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;  // splitmix64
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) with 24 random bits.
CUBOID_HD constexpr float uniform01(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(mix64(mix64(seed) + index) >> 40) * 0x1p-24f;
}
// Dropout keeps element `index` when its uniform draw is >= p.
CUBOID_HD constexpr bool dropout_keep(std::uint64_t seed, std::uint64_t index, float p) {
  return uniform01(seed, index) >= p;
}

}  // namespace cuboid::exec
