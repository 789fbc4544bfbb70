// FP8 numerics on the host (include/cuboid/exec/fp8.hpp): the casts, the
// per-tensor scale and MXFP8's block scales, each pinned to values worked by
// hand from the formats' definitions and Transformer Engine d0067d0d's code.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuboid/exec/fp8.hpp"

using namespace cuboid::exec;

namespace {
constexpr Fp8Format E4M3 = Fp8Format::e4m3;
constexpr Fp8Format E5M2 = Fp8Format::e5m2;
}  // namespace

TEST_CASE("E4M3: 3 mantissa bits, ties to even, saturation at 448, subnormals down to 2^-9") {
  CHECK(fp8_max(E4M3) == 448.0f);
  CHECK(round_to_fp8(1.0f, E4M3) == 1.0f);
  // Between 1 and 1.125 (spacing 2^-3 in [1, 2)): the tie goes to the even mantissa 000.
  CHECK(round_to_fp8(1.0625f, E4M3) == 1.0f);
  // Between 1.125 (001) and 1.25 (010): to 010.
  CHECK(round_to_fp8(1.1875f, E4M3) == 1.25f);
  CHECK(round_to_fp8(1.3f, E4M3) == 1.25f);
  // [256, 512) has spacing 32: 300 / 32 = 9.375 -> 288.
  CHECK(round_to_fp8(300.0f, E4M3) == 288.0f);
  CHECK(round_to_fp8(-300.0f, E4M3) == -288.0f);
  // 448 = 1.75 x 2^8 is the largest finite value (S.1111.111 is NaN):
  // 460 rounds down to it, 464 ties between 448 (110) and 480 (111) and goes to
  // 448, 470 rounds to 480, which saturates (cvt.rn.satfinite), as does
  // everything larger, infinity included.
  CHECK(round_to_fp8(448.0f, E4M3) == 448.0f);
  CHECK(round_to_fp8(460.0f, E4M3) == 448.0f);
  CHECK(round_to_fp8(464.0f, E4M3) == 448.0f);
  CHECK(round_to_fp8(470.0f, E4M3) == 448.0f);
  CHECK(round_to_fp8(1e6f, E4M3) == 448.0f);
  CHECK(round_to_fp8(std::numeric_limits<float>::infinity(), E4M3) == 448.0f);
  CHECK(round_to_fp8(-std::numeric_limits<float>::infinity(), E4M3) == -448.0f);
  CHECK(std::isnan(round_to_fp8(std::nanf(""), E4M3)));
  // Subnormals: below the smallest normal 2^-6 the spacing stays 2^-9.
  CHECK(round_to_fp8(0.015625f, E4M3) == 0.015625f);                  // 2^-6
  CHECK(round_to_fp8(0.0146f, E4M3) == 7 * std::ldexp(1.0f, -9));    // 7.475 quanta -> 7
  CHECK(round_to_fp8(std::ldexp(1.0f, -10), E4M3) == 0.0f);          // half the smallest: tie to 0 (even)
  CHECK(round_to_fp8(3 * std::ldexp(1.0f, -10), E4M3) == std::ldexp(1.0f, -8));  // 1.5 quanta: tie to 2
  CHECK(round_to_fp8(0.75f * std::ldexp(1.0f, -9), E4M3) == std::ldexp(1.0f, -9));
  const float negative_zero = round_to_fp8(-0.0f, E4M3);
  CHECK(negative_zero == 0.0f);
  CHECK(std::signbit(negative_zero));
}

TEST_CASE("E5M2: 2 mantissa bits, saturation at 57344, subnormals down to 2^-16") {
  CHECK(fp8_max(E5M2) == 57344.0f);
  CHECK(round_to_fp8(1.125f, E5M2) == 1.0f);   // spacing 0.25: tie to 00
  CHECK(round_to_fp8(1.375f, E5M2) == 1.5f);   // tie between 01 and 10: to 10
  CHECK(round_to_fp8(5000.0f, E5M2) == 5120.0f);  // [4096, 8192) in steps of 1024: 4.88 -> 5
  CHECK(round_to_fp8(60000.0f, E5M2) == 57344.0f);
  CHECK(round_to_fp8(61440.0f, E5M2) == 57344.0f);  // ties up to 65536 (an infinity): saturated
  CHECK(round_to_fp8(std::ldexp(1.0f, -17), E5M2) == 0.0f);
  CHECK(round_to_fp8(3 * std::ldexp(1.0f, -17), E5M2) == std::ldexp(1.0f, -15));
}

TEST_CASE("per-tensor scaling: scale = max / amax, 1 for a zero or non-finite amax") {
  CHECK(fp8_scale_from_amax(2.0f, E4M3) == 224.0f);
  CHECK(fp8_scale_from_amax(2.0f, E5M2) == 28672.0f);
  CHECK(fp8_scale_from_amax(0.0f, E4M3) == 1.0f);
  CHECK(fp8_scale_from_amax(std::numeric_limits<float>::infinity(), E4M3) == 1.0f);
  CHECK(fp8_scale_from_amax(std::nanf(""), E4M3) == 1.0f);
  // 448 / 1e-40 overflows fp32: the largest finite float instead.
  CHECK(fp8_scale_from_amax(1e-40f, E4M3) == std::numeric_limits<float>::max());

  // amax 2 -> scale 224: 0.5 -> 112 (exact), 0.3 -> 67.2 -> 64 ([64, 128) in
  // steps of 8), -2 -> -448; back through 1 / 224.
  const std::vector<float> x = {0.5f, -2.0f, 0.3f, 0.0f};
  std::vector<float> out(x.size());
  CHECK(quantize_dequantize_tensor(x, out, E4M3) == 224.0f);
  CHECK(out[0] == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(out[1] == doctest::Approx(-2.0).epsilon(1e-7));
  CHECK(out[2] == doctest::Approx(64.0 / 224.0).epsilon(1e-7));
  CHECK(out[3] == 0.0f);
  // E5M2: scale 28672; 0.3 -> 8601.6 -> 8192 ([8192, 16384) in steps of 2048).
  CHECK(quantize_dequantize_tensor(x, out, E5M2) == 28672.0f);
  CHECK(out[2] == doctest::Approx(8192.0 / 28672.0).epsilon(1e-7));
  // In place.
  std::vector<float> y = x;
  quantize_dequantize_tensor(y, y, E4M3);
  CHECK(y[2] == doctest::Approx(64.0 / 224.0).epsilon(1e-7));
}

TEST_CASE("MXFP8: E8M0 block scales rounded up from amax / 448, 32 elements along the contraction") {
  // 1 / 448 = 1.1428... x 2^-9: exponent field 118, mantissa set -> 119 (2^-8).
  CHECK(mx_scale_exponent(1.0f) == 119);
  CHECK(mx_scale_exponent(448.0f) == 127);  // exactly 2^0
  CHECK(mx_scale_exponent(449.0f) == 128);
  CHECK(mx_scale_exponent(0.0f) == 0);

  // 2 x 32: row 0 is 1.0 but 0.3 in column 1, row 1 is 0.01 but 0.003 in column 1.
  const std::int64_t rows = 2, cols = 32;
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t c = 0; c < cols; ++c) {
    x[static_cast<std::size_t>(c)] = c == 1 ? 0.3f : 1.0f;
    x[static_cast<std::size_t>(cols + c)] = c == 1 ? 0.003f : 0.01f;
  }
  std::vector<float> out(x.size());
  SUBCASE("blocks along the rows: each row its own scale") {
    quantize_dequantize_mx(x, out, rows, cols, true, E4M3);
    // Row 0: scale 2^8; 0.3 x 256 = 76.8 -> 80 -> 0.3125.
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 0.3125f);
    // Row 1: 0.01 / 448 = 2.2e-5 -> 2^-15; 0.01 x 2^15 = 327.7 -> 320; 0.003 x 2^15 = 98.3 -> 96.
    CHECK(out[static_cast<std::size_t>(cols)] == 320.0f / 32768.0f);
    CHECK(out[static_cast<std::size_t>(cols + 1)] == 96.0f / 32768.0f);
  }
  SUBCASE("blocks along the columns: a column's two rows share one scale") {
    quantize_dequantize_mx(x, out, rows, cols, false, E4M3);
    // Column 0 {1, 0.01}: scale 2^8; 0.01 x 256 = 2.56 -> 2.5.
    CHECK(out[0] == 1.0f);
    CHECK(out[static_cast<std::size_t>(cols)] == 2.5f / 256.0f);
    // Column 1 {0.3, 0.003}: 0.3 / 448 -> 2^-10; 307.2 -> 320, 3.072 -> 3.
    CHECK(out[1] == 0.3125f);
    CHECK(out[static_cast<std::size_t>(cols + 1)] == 3.0f / 1024.0f);
  }
}
