// The checks every backend shares (non-virtual interface, see backend.hpp).
#include "cuboid/exec/backend.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

GemmShape GemmShape::resolved() const {
  GemmShape r = *this;
  const std::int64_t a_cols = trans_a == Trans::yes ? m : k;
  const std::int64_t a_rows = trans_a == Trans::yes ? k : m;
  const std::int64_t b_cols = trans_b == Trans::yes ? k : n;
  const std::int64_t b_rows = trans_b == Trans::yes ? n : k;
  if (r.lda == packed) r.lda = a_cols;
  if (r.ldb == packed) r.ldb = b_cols;
  if (r.ldc == packed) r.ldc = n;
  if (r.stride_a == packed) r.stride_a = a_rows * r.lda;
  if (r.stride_b == packed) r.stride_b = b_rows * r.ldb;
  if (r.stride_c == packed) r.stride_c = m * r.ldc;
  return r;
}

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

bool is_float(DType d) { return d == DType::f32 || d == DType::bf16; }

void require_float(ConstDeviceSpan s, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(is_float(s.dtype()), op,
                      std::string(what) + " must be f32 or bf16, not " +
                          std::string(to_string(s.dtype())));
}

void require_dtype(ConstDeviceSpan s, DType d, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(s.dtype() == d, op,
                      std::string(what) + " must be " + std::string(to_string(d)) + ", not " +
                          std::string(to_string(s.dtype())));
}

// At least `needed` elements.
void require_size(ConstDeviceSpan s, std::int64_t needed, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(needed >= 0 && s.size() >= static_cast<std::size_t>(needed), op,
                      std::string(what) + " holds " + std::to_string(s.size()) +
                          " elements, needs " + str(needed));
}

void require_float_size(ConstDeviceSpan s, std::int64_t needed, const char* op, const char* what) {
  require_float(s, op, what);
  require_size(s, needed, op, what);
}

void require_positive(std::int64_t v, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(v > 0, op, std::string(what) + " must be positive, got " + str(v));
}

void require_same_size(ConstDeviceSpan a, ConstDeviceSpan b, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(a.size() == b.size(), op,
                      std::string(what) + " differ in size: " + std::to_string(a.size()) +
                          " vs " + std::to_string(b.size()));
}

void require_probability(float p, const char* op) {
  CUBOID_EXEC_REQUIRE(p >= 0.0f && p < 1.0f, op,
                      "dropout probability must be in [0, 1), got " + std::to_string(p));
}

// Elements a (batch of) stored matrices span: rows x cols with row stride ld.
std::int64_t matrix_extent(std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           std::int64_t batch, std::int64_t stride) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

}  // namespace

// --- memory ----------------------------------------------------------------
DeviceBuffer Backend::alloc(std::size_t elements, DType dtype) {
  return alloc_impl(elements, dtype);
}

void Backend::upload(const std::vector<float>& host, DeviceSpan dst) {
  require_float(dst, "upload", "dst");
  CUBOID_EXEC_REQUIRE(host.size() == dst.size(), "upload",
                      "host holds " + std::to_string(host.size()) + " values, dst " +
                          std::to_string(dst.size()));
  upload_impl(host, dst);
}

void Backend::upload_indices(const std::vector<std::int32_t>& host, DeviceSpan dst) {
  require_dtype(dst, DType::i32, "upload_indices", "dst");
  CUBOID_EXEC_REQUIRE(host.size() == dst.size(), "upload_indices",
                      "host holds " + std::to_string(host.size()) + " values, dst " +
                          std::to_string(dst.size()));
  upload_indices_impl(host, dst);
}

std::vector<float> Backend::download(ConstDeviceSpan src) { return download_impl(src); }

void Backend::fill_random(DeviceSpan dst, std::uint64_t seed, float scale) {
  require_float(dst, "fill_random", "dst");
  fill_random_impl(dst, seed, scale);
}

void Backend::fill(DeviceSpan dst, float value) {
  require_float(dst, "fill", "dst");
  fill_impl(dst, value);
}

void Backend::copy(ConstDeviceSpan src, DeviceSpan dst) {
  require_same_size(src, dst, "copy", "src and dst");
  CUBOID_EXEC_REQUIRE((is_float(src.dtype()) && is_float(dst.dtype())) ||
                          src.dtype() == dst.dtype(),
                      "copy", "cannot convert " + std::string(to_string(src.dtype())) + " to " +
                                  std::string(to_string(dst.dtype())));
  copy_impl(src, dst);
}

void Backend::scale(DeviceSpan x, float alpha) {
  require_float(x, "scale", "x");
  scale_impl(x, alpha);
}

void Backend::add(DeviceSpan dst, ConstDeviceSpan src) {
  require_float(dst, "add", "dst");
  require_float(src, "add", "src");
  require_same_size(dst, src, "add", "dst and src");
  add_impl(dst, src);
}

void Backend::scale_rows(DeviceSpan x, ConstDeviceSpan factors, std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "scale_rows";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(x, rows * cols, op, "x");
  require_dtype(factors, DType::f32, op, "factors");
  require_size(factors, rows, op, "factors");
  scale_rows_impl(x, factors, rows, cols);
}

void Backend::row_dot(ConstDeviceSpan a, ConstDeviceSpan b, DeviceSpan out, std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "row_dot";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(a, rows * cols, op, "a");
  require_float_size(b, rows * cols, op, "b");
  require_dtype(out, DType::f32, op, "out");
  require_size(out, rows, op, "out");
  row_dot_impl(a, b, out, rows, cols);
}

// --- GEMM ------------------------------------------------------------------
void Backend::gemm(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                   float beta, DeviceSpan c) {
  const GemmShape s = shape.resolved();
  CUBOID_EXEC_REQUIRE(s.m >= 0 && s.n >= 0 && s.k >= 0 && s.batch >= 0, "gemm",
                      "negative dimension (m " + str(s.m) + ", n " + str(s.n) + ", k " + str(s.k) +
                          ", batch " + str(s.batch) + ")");
  const std::int64_t a_rows = s.trans_a == Trans::yes ? s.k : s.m;
  const std::int64_t a_cols = s.trans_a == Trans::yes ? s.m : s.k;
  const std::int64_t b_rows = s.trans_b == Trans::yes ? s.n : s.k;
  const std::int64_t b_cols = s.trans_b == Trans::yes ? s.k : s.n;
  CUBOID_EXEC_REQUIRE(s.lda >= std::max<std::int64_t>(a_cols, 1) &&
                          s.ldb >= std::max<std::int64_t>(b_cols, 1) &&
                          s.ldc >= std::max<std::int64_t>(s.n, 1),
                      "gemm",
                      "leading dimension below the stored row length (lda " + str(s.lda) +
                          ", ldb " + str(s.ldb) + ", ldc " + str(s.ldc) + ")");
  CUBOID_EXEC_REQUIRE(s.stride_a >= 0 && s.stride_b >= 0 && (s.batch <= 1 || s.stride_c > 0),
                      "gemm", "batch strides must be >= 0 (C's > 0)");
  require_float_size(a, matrix_extent(a_rows, a_cols, s.lda, s.batch, s.stride_a), "gemm", "A");
  require_float_size(b, matrix_extent(b_rows, b_cols, s.ldb, s.batch, s.stride_b), "gemm", "B");
  require_float_size(c, matrix_extent(s.m, s.n, s.ldc, s.batch, s.stride_c), "gemm", "C");
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  gemm_impl(s, alpha, a, b, beta, c);
}

namespace {

// One contiguous GEMM (no batch, leading dimensions from the shape).
GemmShape contiguous_shape(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.m = m;
  s.n = n;
  s.k = k;
  return s;
}

}  // namespace

void Backend::gemm(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta, DeviceSpan c) {
  gemm(contiguous_shape(trans_a, trans_b, m, n, k), alpha, a, b, beta, c);
}

void Backend::gemm_quantized(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                             float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta, DeviceSpan c,
                             const GemmQuantization& q) {
  const GemmShape s = contiguous_shape(trans_a, trans_b, m, n, k).resolved();
  CUBOID_EXEC_REQUIRE(m >= 0 && n >= 0 && k >= 0, "gemm_quantized",
                      "negative dimension (m " + str(m) + ", n " + str(n) + ", k " + str(k) + ")");
  require_float_size(a, m * k, "gemm_quantized", "A");
  require_float_size(b, k * n, "gemm_quantized", "B");
  require_float_size(c, m * n, "gemm_quantized", "C");
  if (m == 0 || n == 0) return;
  gemm_quantized_impl(s, alpha, a, b, beta, c, q);
}

void Backend::gemm_quantized_impl(const GemmShape& s, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                                  DeviceSpan c, const GemmQuantization& q) {
  // Stored A is m x k (k along its rows) or k x m; stored B is k x n or n x k
  // (k along its rows). MXFP8's blocks run along k.
  auto quantized = [&](ConstDeviceSpan x, std::int64_t rows, std::int64_t cols, bool k_along_rows, Fp8Format f) {
    std::vector<float> host = download(x.subspan(0, static_cast<std::size_t>(rows * cols)));
    if (q.scaling == QuantScaling::per_tensor) quantize_dequantize_tensor(host, host, f);
    else quantize_dequantize_mx(host, host, rows, cols, k_along_rows, f);
    DeviceBuffer out = alloc(host.size(), x.dtype());
    upload(host, out.span());
    return out;
  };
  const bool ta = s.trans_a == Trans::yes, tb = s.trans_b == Trans::yes;
  const DeviceBuffer qa = quantized(a, ta ? s.k : s.m, ta ? s.m : s.k, !ta, q.a);
  const DeviceBuffer qb = quantized(b, tb ? s.n : s.k, tb ? s.k : s.n, tb, q.b);
  gemm_impl(s, alpha, qa, qb, beta, c);
}

std::vector<double> Backend::time_fp8_gemm(std::int64_t, std::int64_t, std::int64_t, int, int, bool) {
  throw_exec_error("time_fp8_gemm", "the " + std::string(name()) + " backend has no FP8 GEMMs of its own", __FILE__,
                   __LINE__);
}

void Backend::gemm_strided_batched(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n,
                                   std::int64_t k, float alpha, ConstDeviceSpan a,
                                   std::int64_t stride_a, ConstDeviceSpan b,
                                   std::int64_t stride_b, float beta, DeviceSpan c,
                                   std::int64_t stride_c, std::int64_t batch) {
  GemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.m = m;
  s.n = n;
  s.k = k;
  s.batch = batch;
  s.stride_a = stride_a;
  s.stride_b = stride_b;
  s.stride_c = stride_c;
  gemm(s, alpha, a, b, beta, c);
}

// --- normalisation ---------------------------------------------------------
void Backend::layernorm_forward(ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta,
                                DeviceSpan y, DeviceSpan mean, DeviceSpan rstd, std::int64_t rows,
                                std::int64_t cols, float eps) {
  constexpr const char* op = "layernorm_forward";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(x, rows * cols, op, "x");
  require_float_size(y, rows * cols, op, "y");
  require_float_size(gamma, cols, op, "gamma");
  require_float_size(beta, cols, op, "beta");
  require_dtype(mean, DType::f32, op, "mean");
  require_dtype(rstd, DType::f32, op, "rstd");
  require_size(mean, rows, op, "mean");
  require_size(rstd, rows, op, "rstd");
  layernorm_forward_impl(x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

void Backend::layernorm_backward(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                 ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx,
                                 DeviceSpan dgamma, DeviceSpan dbeta, std::int64_t rows,
                                 std::int64_t cols) {
  constexpr const char* op = "layernorm_backward";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(dy, rows * cols, op, "dy");
  require_float_size(x, rows * cols, op, "x");
  require_float_size(dx, rows * cols, op, "dx");
  require_float_size(gamma, cols, op, "gamma");
  require_float_size(dgamma, cols, op, "dgamma");
  require_float_size(dbeta, cols, op, "dbeta");
  require_dtype(mean, DType::f32, op, "mean");
  require_dtype(rstd, DType::f32, op, "rstd");
  require_size(mean, rows, op, "mean");
  require_size(rstd, rows, op, "rstd");
  layernorm_backward_impl(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols);
}

void Backend::rmsnorm_forward(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y,
                              DeviceSpan rstd, std::int64_t rows, std::int64_t cols, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(x, rows * cols, op, "x");
  require_float_size(y, rows * cols, op, "y");
  require_float_size(gamma, cols, op, "gamma");
  require_dtype(rstd, DType::f32, op, "rstd");
  require_size(rstd, rows, op, "rstd");
  rmsnorm_forward_impl(x, gamma, y, rstd, rows, cols, eps);
}

void Backend::rmsnorm_backward(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                               ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma,
                               std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "rmsnorm_backward";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(dy, rows * cols, op, "dy");
  require_float_size(x, rows * cols, op, "x");
  require_float_size(dx, rows * cols, op, "dx");
  require_float_size(gamma, cols, op, "gamma");
  require_float_size(dgamma, cols, op, "dgamma");
  require_dtype(rstd, DType::f32, op, "rstd");
  require_size(rstd, rows, op, "rstd");
  rmsnorm_backward_impl(dy, x, gamma, rstd, dx, dgamma, rows, cols);
}

// --- softmax ---------------------------------------------------------------
void Backend::causal_softmax_forward(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch,
                                     std::int64_t s, float scale) {
  constexpr const char* op = "causal_softmax_forward";
  require_positive(batch, op, "batch");
  require_positive(s, op, "s");
  require_float_size(x, batch * s * s, op, "x");
  require_float_size(y, batch * s * s, op, "y");
  causal_softmax_forward_impl(x, y, batch, s, scale);
}

void Backend::causal_softmax_backward(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx,
                                      std::int64_t batch, std::int64_t s, float scale) {
  constexpr const char* op = "causal_softmax_backward";
  require_positive(batch, op, "batch");
  require_positive(s, op, "s");
  require_float_size(dy, batch * s * s, op, "dy");
  require_float_size(y, batch * s * s, op, "y");
  require_float_size(dx, batch * s * s, op, "dx");
  causal_softmax_backward_impl(dy, y, dx, batch, s, scale);
}

// --- fused attention pieces ------------------------------------------------
namespace {
void require_blocks(std::int64_t batch, std::int64_t nq, std::int64_t nk, const char* op) {
  require_positive(batch, op, "batch");
  require_positive(nq, op, "nq");
  require_positive(nk, op, "nk");
}
void require_causal_square(bool causal, std::int64_t nq, std::int64_t nk, const char* op) {
  CUBOID_EXEC_REQUIRE(!causal || nq == nk, op,
                      "a causal block must be square (nq " + str(nq) + ", nk " + str(nk) + ")");
}
}  // namespace

void Backend::attention_softmax_lse(DeviceSpan scores, DeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                    std::int64_t nk, float scale, bool causal) {
  constexpr const char* op = "attention_softmax_lse";
  require_blocks(batch, nq, nk, op);
  require_causal_square(causal, nq, nk, op);
  require_float_size(scores, batch * nq * nk, op, "scores");
  require_dtype(lse, DType::f32, op, "lse");
  require_size(lse, batch * nq, op, "lse");
  attention_softmax_lse_impl(scores, lse, batch, nq, nk, scale, causal);
}

void Backend::attention_probs(DeviceSpan scores, ConstDeviceSpan lse, std::int64_t batch, std::int64_t nq,
                              std::int64_t nk, float scale, bool causal) {
  constexpr const char* op = "attention_probs";
  require_blocks(batch, nq, nk, op);
  require_causal_square(causal, nq, nk, op);
  require_float_size(scores, batch * nq * nk, op, "scores");
  require_dtype(lse, DType::f32, op, "lse");
  require_size(lse, batch * nq, op, "lse");
  attention_probs_impl(scores, lse, batch, nq, nk, scale, causal);
}

void Backend::attention_softmax_grad(DeviceSpan dp, ConstDeviceSpan p, ConstDeviceSpan delta, std::int64_t batch,
                                     std::int64_t nq, std::int64_t nk, float scale) {
  constexpr const char* op = "attention_softmax_grad";
  require_blocks(batch, nq, nk, op);
  require_float_size(dp, batch * nq * nk, op, "dp");
  require_float_size(p, batch * nq * nk, op, "p");
  require_dtype(delta, DType::f32, op, "delta");
  require_size(delta, batch * nq, op, "delta");
  attention_softmax_grad_impl(dp, p, delta, batch, nq, nk, scale);
}

void Backend::attention_merge(DeviceSpan out, DeviceSpan lse, ConstDeviceSpan blk, ConstDeviceSpan blk_lse,
                              std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "attention_merge";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  require_float_size(out, rows * cols, op, "out");
  require_float_size(blk, rows * cols, op, "blk");
  CUBOID_EXEC_REQUIRE(out.dtype() == blk.dtype(), op, "out and blk must have one dtype");
  require_dtype(lse, DType::f32, op, "lse");
  require_dtype(blk_lse, DType::f32, op, "blk_lse");
  require_size(lse, rows, op, "lse");
  require_size(blk_lse, rows, op, "blk_lse");
  attention_merge_impl(out, lse, blk, blk_lse, rows, cols);
}

void Backend::copy_2d(ConstDeviceSpan src, std::int64_t ld_src, DeviceSpan dst, std::int64_t ld_dst,
                      std::int64_t rows, std::int64_t cols, bool accumulate) {
  constexpr const char* op = "copy_2d";
  require_positive(rows, op, "rows");
  require_positive(cols, op, "cols");
  CUBOID_EXEC_REQUIRE(ld_src >= cols && ld_dst >= cols, op,
                      "leading dimensions below the row length (ld_src " + str(ld_src) + ", ld_dst " + str(ld_dst) +
                          ", cols " + str(cols) + ")");
  require_float_size(src, (rows - 1) * ld_src + cols, op, "src");
  require_float_size(dst, (rows - 1) * ld_dst + cols, op, "dst");
  CUBOID_EXEC_REQUIRE(src.dtype() == dst.dtype(), op, "src and dst must have one dtype");
  copy_2d_impl(src, ld_src, dst, ld_dst, rows, cols, accumulate);
}

// --- activations -----------------------------------------------------------
void Backend::gelu_forward(ConstDeviceSpan x, DeviceSpan y) {
  require_float(x, "gelu_forward", "x");
  require_float(y, "gelu_forward", "y");
  require_same_size(x, y, "gelu_forward", "x and y");
  gelu_forward_impl(x, y);
}

void Backend::gelu_backward(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx) {
  require_float(dy, "gelu_backward", "dy");
  require_float(x, "gelu_backward", "x");
  require_float(dx, "gelu_backward", "dx");
  require_same_size(dy, x, "gelu_backward", "dy and x");
  require_same_size(dx, x, "gelu_backward", "dx and x");
  gelu_backward_impl(dy, x, dx);
}

void Backend::swiglu_forward(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows,
                             std::int64_t ffn) {
  constexpr const char* op = "swiglu_forward";
  require_positive(rows, op, "rows");
  require_positive(ffn, op, "ffn");
  require_float_size(x, rows * 2 * ffn, op, "x");
  require_float_size(y, rows * ffn, op, "y");
  swiglu_forward_impl(x, y, rows, ffn);
}

void Backend::swiglu_backward(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx,
                              std::int64_t rows, std::int64_t ffn) {
  constexpr const char* op = "swiglu_backward";
  require_positive(rows, op, "rows");
  require_positive(ffn, op, "ffn");
  require_float_size(dy, rows * ffn, op, "dy");
  require_float_size(x, rows * 2 * ffn, op, "x");
  require_float_size(dx, rows * 2 * ffn, op, "dx");
  swiglu_backward_impl(dy, x, dx, rows, ffn);
}

// --- bias, dropout, residual -----------------------------------------------
void Backend::bias_add(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows, std::int64_t cols) {
  require_positive(rows, "bias_add", "rows");
  require_positive(cols, "bias_add", "cols");
  require_float_size(y, rows * cols, "bias_add", "y");
  require_float_size(bias, cols, "bias_add", "bias");
  bias_add_impl(y, bias, rows, cols);
}

void Backend::bias_backward(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows,
                            std::int64_t cols) {
  require_positive(rows, "bias_backward", "rows");
  require_positive(cols, "bias_backward", "cols");
  require_float_size(dy, rows * cols, "bias_backward", "dy");
  require_float_size(dbias, cols, "bias_backward", "dbias");
  bias_backward_impl(dy, dbias, rows, cols);
}

void Backend::dropout_residual_forward(ConstDeviceSpan x, ConstDeviceSpan residual,
                                       DeviceSpan out, float p, std::uint64_t seed) {
  constexpr const char* op = "dropout_residual_forward";
  require_probability(p, op);
  require_float(x, op, "x");
  require_float(residual, op, "residual");
  require_float(out, op, "out");
  require_same_size(x, residual, op, "x and residual");
  require_same_size(x, out, op, "x and out");
  dropout_residual_forward_impl(x, residual, out, p, seed);
}

void Backend::dropout_backward(ConstDeviceSpan dout, DeviceSpan dx, float p, std::uint64_t seed) {
  require_probability(p, "dropout_backward");
  require_float(dout, "dropout_backward", "dout");
  require_float(dx, "dropout_backward", "dx");
  require_same_size(dout, dx, "dropout_backward", "dout and dx");
  dropout_backward_impl(dout, dx, p, seed);
}

// --- embedding and loss ----------------------------------------------------
void Backend::embedding_forward(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out,
                                std::int64_t rows, std::int64_t hidden) {
  constexpr const char* op = "embedding_forward";
  require_positive(rows, op, "rows");
  require_positive(hidden, op, "hidden");
  require_dtype(ids, DType::i32, op, "ids");
  require_size(ids, rows, op, "ids");
  require_float(table, op, "table");
  CUBOID_EXEC_REQUIRE(table.size() % static_cast<std::size_t>(hidden) == 0, op,
                      "table size " + std::to_string(table.size()) +
                          " is not a multiple of hidden " + str(hidden));
  require_float_size(out, rows * hidden, op, "out");
  embedding_forward_impl(ids, table, out, rows, hidden);
}

void Backend::embedding_backward(ConstDeviceSpan dout, ConstDeviceSpan ids, DeviceSpan dtable,
                                 std::int64_t rows, std::int64_t hidden) {
  constexpr const char* op = "embedding_backward";
  require_positive(rows, op, "rows");
  require_positive(hidden, op, "hidden");
  require_dtype(ids, DType::i32, op, "ids");
  require_size(ids, rows, op, "ids");
  require_float_size(dout, rows * hidden, op, "dout");
  require_float(dtable, op, "dtable");
  CUBOID_EXEC_REQUIRE(dtable.size() % static_cast<std::size_t>(hidden) == 0, op,
                      "dtable size " + std::to_string(dtable.size()) +
                          " is not a multiple of hidden " + str(hidden));
  embedding_backward_impl(dout, ids, dtable, rows, hidden);
}

void Backend::cross_entropy(ConstDeviceSpan logits, ConstDeviceSpan labels, DeviceSpan dlogits,
                            DeviceSpan loss, std::int64_t rows, std::int64_t vocab) {
  constexpr const char* op = "cross_entropy";
  require_positive(rows, op, "rows");
  require_positive(vocab, op, "vocab");
  require_float_size(logits, rows * vocab, op, "logits");
  require_float_size(dlogits, rows * vocab, op, "dlogits");
  require_dtype(labels, DType::i32, op, "labels");
  require_size(labels, rows, op, "labels");
  require_dtype(loss, DType::f32, op, "loss");
  require_size(loss, 1, op, "loss");
  cross_entropy_impl(logits, labels, dlogits, loss, rows, vocab);
}

// --- optimiser -------------------------------------------------------------
void Backend::adam_step(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                        const AdamConfig& config, std::int64_t step) {
  constexpr const char* op = "adam_step";
  require_positive(step, op, "step");
  require_dtype(params, DType::f32, op, "params");
  require_dtype(m, DType::f32, op, "m");
  require_dtype(v, DType::f32, op, "v");
  require_float(grads, op, "grads");
  require_same_size(params, grads, op, "params and grads");
  require_same_size(params, m, op, "params and m");
  require_same_size(params, v, op, "params and v");
  adam_step_impl(params, grads, m, v, config, step);
}

}  // namespace cuboid::exec
