// FP8 quantization on the host (include/cuboid/exec/fp8.hpp says from where).
#include "cuboid/exec/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

namespace {

struct Format {
  int mantissa_bits;  // explicit
  int min_exponent;   // of the smallest normal value: 2^min_exponent
  float max;
};

Format format(Fp8Format f) {
  // E4M3: bias 7, normals 2^-6 .. 1.75 x 2^8 = 448 (S.1111.111 is NaN);
  // E5M2: bias 15, normals 2^-14 .. 1.75 x 2^15 = 57344 (exponent 11111 is Inf / NaN).
  return f == Fp8Format::e4m3 ? Format{3, -6, 448.0f} : Format{2, -14, 57344.0f};
}

}  // namespace

float fp8_max(Fp8Format f) { return format(f).max; }

float round_to_fp8(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const Format fm = format(f);
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0) return x;  // keeps the sign of zero
  double r = fm.max;     // satfinite: anything beyond the largest finite value, infinities too
  if (a < fm.max) {
    int e = 0;
    (void)std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the binade's exponent is e - 1
    const int binade = std::max(e - 1, fm.min_exponent);  // subnormals share the smallest normal's spacing
    const double quantum = std::ldexp(1.0, binade - fm.mantissa_bits);
    r = std::nearbyint(a / quantum) * quantum;  // the default rounding mode: to nearest, ties to even
    r = std::min(r, static_cast<double>(fm.max));
  }
  return static_cast<float>(std::copysign(r, static_cast<double>(x)));
}

float fp8_scale_from_amax(float amax, Fp8Format f) {
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  const float scale = fp8_max(f) / amax;
  return std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
}

float amax_of(std::span<const float> x) {
  float m = 0.0f;
  for (const float v : x) {
    if (std::isnan(v)) return v;
    m = std::max(m, std::fabs(v));
  }
  return m;
}

float quantize_dequantize_tensor(std::span<const float> x, std::span<float> out, Fp8Format f) {
  CUBOID_EXEC_REQUIRE(x.size() == out.size(), "quantize_dequantize_tensor", "input and output sizes differ");
  const float scale = fp8_scale_from_amax(amax_of(x), f);
  const float scale_inv = 1.0f / scale;
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = round_to_fp8(x[i] * scale, f) * scale_inv;
  return scale;
}

std::uint8_t mx_scale_exponent(float amax) {
  // float_to_e8m0(amax * max_norm_rcp), the path without Blackwell's cvt.rp:
  // the fp32 exponent field, plus one when any mantissa bit is set (round up).
  const float v = amax * (1.0f / fp8_max(Fp8Format::e4m3));
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  auto exponent = static_cast<std::uint8_t>(bits >> 23);
  const std::uint32_t mantissa = bits & 0x7FFFFF;
  if ((mantissa > 0 && exponent != 0xFE) && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return exponent;
}

void quantize_dequantize_mx(std::span<const float> x, std::span<float> out, std::int64_t rows, std::int64_t cols,
                            bool along_rows, Fp8Format f) {
  CUBOID_EXEC_REQUIRE(rows >= 0 && cols >= 0 && x.size() == static_cast<std::size_t>(rows * cols) &&
                          out.size() == x.size(),
                      "quantize_dequantize_mx", "the buffers are not rows x cols");
  // Lines of the contraction dimension: rows of the matrix, or its columns.
  const std::int64_t lines = along_rows ? rows : cols, length = along_rows ? cols : rows;
  auto at = [&](std::int64_t line, std::int64_t i) {
    return static_cast<std::size_t>(along_rows ? line * cols + i : i * cols + line);
  };
  for (std::int64_t line = 0; line < lines; ++line)
    for (std::int64_t b0 = 0; b0 < length; b0 += kMxBlock) {
      const std::int64_t b1 = std::min(length, b0 + kMxBlock);
      float amax = 0.0f;
      for (std::int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[at(line, i)]));
      // exp2f_rcp / exp2f of the biased exponent (util/ptx.cuh).
      const int e = mx_scale_exponent(amax);
      const float to_fp8 = std::ldexp(1.0f, 127 - e), back = std::ldexp(1.0f, e - 127);
      for (std::int64_t i = b0; i < b1; ++i) out[at(line, i)] = round_to_fp8(x[at(line, i)] * to_fp8, f) * back;
    }
}

}  // namespace cuboid::exec
