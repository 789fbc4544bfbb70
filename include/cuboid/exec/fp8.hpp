#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// FP8 numerics on the host, as Transformer Engine d0067d0d computes them, so
// that the CPU backend can run a plan's quantized GEMMs (quantize, then
// dequantize, then an f32 GEMM on the quantized values) and a GPU's results
// can be checked against them:
//   * the formats E4M3 (1 sign, 4 exponent bits, 3 mantissa bits, bias 7,
//     max 448, no infinities) and E5M2 (5 exponent, 2 mantissa, bias 15,
//     max 57344), with subnormals;
//   * the cast: round to nearest, ties to even, saturating to +-max
//     (transformer_engine/common/util/ptx.cuh: cvt.rn.satfinite.e4m3x2.f32 /
//     e5m2x2; a NaN stays NaN);
//   * per-tensor scaling: scale = max / amax (recipe/recipe_common.cuh
//     compute_scale_from_amax, with Float8CurrentScaling's defaults: epsilon 0,
//     no power-of-2 rounding; 1 for a zero, infinite or NaN amax; the largest
//     finite float if max / amax overflows), q = cast(x * scale), and the GEMM
//     multiplies by scale_inv = 1 / scale;
//   * MXFP8: one E8M0 scale per 32 consecutive elements along the GEMM's
//     contraction dimension, the biased exponent of amax / max rounded up
//     (util/ptx_arch_spec.cuh float_to_e8m0; cast/mxfp8/quantize_mxfp8.cuh),
//     q = cast(x * 2^(127 - e)).
#include <cstdint>
#include <span>

namespace cuboid::exec {

enum class Fp8Format { e4m3, e5m2 };

// The largest finite value: 448 (E4M3), 57344 (E5M2).
float fp8_max(Fp8Format f);
// x rounded to the nearest value of the format, ties to even, saturated to +-fp8_max.
float round_to_fp8(float x, Fp8Format f);
// The per-tensor scale Transformer Engine computes from a tensor's amax.
float fp8_scale_from_amax(float amax, Fp8Format f);
// max |x| (NaN if any element is NaN).
float amax_of(std::span<const float> x);

// Per-tensor current scaling: out = cast(x * scale) * (1 / scale), scale from
// amax_of(x); returns the scale. out may alias x.
float quantize_dequantize_tensor(std::span<const float> x, std::span<float> out, Fp8Format f);

// TE's E8M0 scale of a block with this amax (biased exponent, 127 = 2^0).
std::uint8_t mx_scale_exponent(float amax);
// MXFP8 on a rows x cols row-major matrix, blocks of 32 along each row
// (`along_rows`: the contraction dimension is the columns) or along each
// column; a last block shorter than 32 is its own block. out may alias x.
void quantize_dequantize_mx(std::span<const float> x, std::span<float> out, std::int64_t rows, std::int64_t cols,
                            bool along_rows, Fp8Format f);

inline constexpr std::int64_t kMxBlock = 32;

}  // namespace cuboid::exec
