// The CPU backend. Kernels are straight loops over contiguous rows with fp32
// arithmetic (what the CUDA kernels do per row), written so -O2/-O3 vectorises
// the inner loops; GEMMs go to OpenBLAS.
#include "cuboid/exec/cpu_backend.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <cblas.h>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

namespace {

constexpr std::size_t kAlignmentBytes = 64;  // one cache line; AVX-512 loads

void free_host(void* data, void* /*context*/) noexcept { std::free(data); }

// The CPU stores floats as f32 only; anything else is a caller bug.
float* f32(DeviceSpan s, const char* op) {
  CUBOID_EXEC_REQUIRE(s.dtype() == DType::f32, op,
                      "the cpu backend computes in f32, got " + std::string(to_string(s.dtype())));
  return static_cast<float*>(s.native());
}

const float* f32(ConstDeviceSpan s, const char* op) {
  CUBOID_EXEC_REQUIRE(s.dtype() == DType::f32, op,
                      "the cpu backend computes in f32, got " + std::string(to_string(s.dtype())));
  return static_cast<const float*>(s.native());
}

const std::int32_t* i32(ConstDeviceSpan s) { return static_cast<const std::int32_t*>(s.native()); }

std::size_t count(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

int blas_int(std::int64_t v, const char* what) {
  CUBOID_EXEC_REQUIRE(v <= std::numeric_limits<int>::max(), "gemm",
                      std::string(what) + " " + std::to_string(v) + " exceeds OpenBLAS's int");
  return static_cast<int>(v);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  CUBOID_EXEC_REQUIRE(options.threads >= 0, "make_cpu_backend",
                      "threads must be >= 0, got " + std::to_string(options.threads));
  // Process-wide in OpenBLAS; every rank is its own process.
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  return std::make_unique<CpuBackend>();
}

// --- timing -----------------------------------------------------------------
TimerEvent CpuBackend::create_event() { return TimerEvent{}; }

void CpuBackend::record(TimerEvent& event) {
  event.host_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
}

std::int64_t CpuBackend::elapsed_ns(const TimerEvent& start, const TimerEvent& stop) {
  return stop.host_ns - start.host_ns;
}

// --- memory -----------------------------------------------------------------
DeviceBuffer CpuBackend::alloc_impl(std::size_t elements, DType dtype) {
  CUBOID_EXEC_REQUIRE(dtype != DType::bf16, "alloc", "the cpu backend has no bf16 storage");
  if (elements == 0) return DeviceBuffer(OwnedHandle{}, 0, dtype);
  const std::size_t bytes = elements * dtype_bytes(dtype);
  const std::size_t rounded = (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  void* data = std::aligned_alloc(kAlignmentBytes, rounded);
  CUBOID_EXEC_REQUIRE(data != nullptr, "alloc",
                      "out of host memory allocating " + std::to_string(bytes) + " bytes");
  return DeviceBuffer(OwnedHandle(data, &free_host, nullptr), elements, dtype);
}

void CpuBackend::upload_impl(const std::vector<float>& host, DeviceSpan dst) {
  if (!host.empty()) std::memcpy(f32(dst, "upload"), host.data(), host.size() * sizeof(float));
}

void CpuBackend::upload_indices_impl(const std::vector<std::int32_t>& host, DeviceSpan dst) {
  if (!host.empty()) std::memcpy(dst.native(), host.data(), host.size() * sizeof(std::int32_t));
}

std::vector<float> CpuBackend::download_impl(ConstDeviceSpan src) {
  std::vector<float> host(src.size());
  if (src.dtype() == DType::i32) {
    std::transform(i32(src), i32(src) + src.size(), host.begin(),
                   [](std::int32_t v) { return static_cast<float>(v); });
  } else if (!host.empty()) {
    std::memcpy(host.data(), f32(src, "download"), host.size() * sizeof(float));
  }
  return host;
}

void CpuBackend::fill_random_impl(DeviceSpan dst, std::uint64_t seed, float scale) {
  float* x = f32(dst, "fill_random");
  for (std::size_t i = 0; i < dst.size(); ++i) x[i] = (2.0f * uniform01(seed, i) - 1.0f) * scale;
}

void CpuBackend::fill_impl(DeviceSpan dst, float value) {
  std::fill_n(f32(dst, "fill"), dst.size(), value);
}

void CpuBackend::copy_impl(ConstDeviceSpan src, DeviceSpan dst) {
  if (src.dtype() != DType::i32) {
    (void)f32(src, "copy");
    (void)f32(dst, "copy");
  }
  if (src.size() != 0) std::memmove(dst.native(), src.native(), src.bytes());
}

void CpuBackend::scale_impl(DeviceSpan x, float alpha) {
  float* p = f32(x, "scale");
  for (std::size_t i = 0; i < x.size(); ++i) p[i] *= alpha;
}

void CpuBackend::add_impl(DeviceSpan dst, ConstDeviceSpan src) {
  float* d = f32(dst, "add");
  const float* s = f32(src, "add");
  for (std::size_t i = 0; i < dst.size(); ++i) d[i] += s[i];
}

void CpuBackend::scale_rows_impl(DeviceSpan x_span, ConstDeviceSpan factors_span, std::int64_t rows,
                                 std::int64_t cols) {
  float* x = f32(x_span, "scale_rows");
  const float* f = f32(factors_span, "scale_rows");
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) x[r * cols + c] *= f[r];
}

void CpuBackend::row_dot_impl(ConstDeviceSpan a_span, ConstDeviceSpan b_span, DeviceSpan out_span, std::int64_t rows,
                              std::int64_t cols) {
  const float* a = f32(a_span, "row_dot");
  const float* b = f32(b_span, "row_dot");
  float* out = f32(out_span, "row_dot");
  for (std::int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (std::int64_t c = 0; c < cols; ++c) sum += a[r * cols + c] * b[r * cols + c];
    out[r] = sum;
  }
}

// --- GEMM -------------------------------------------------------------------
void CpuBackend::gemm_impl(const GemmShape& s, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                           float beta, DeviceSpan c) {
  const float* pa = f32(a, "gemm");
  const float* pb = f32(b, "gemm");
  float* pc = f32(c, "gemm");
  const CBLAS_TRANSPOSE ta = s.trans_a == Trans::yes ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = s.trans_b == Trans::yes ? CblasTrans : CblasNoTrans;
  const int m = blas_int(s.m, "m"), n = blas_int(s.n, "n"), k = blas_int(s.k, "k");
  const int lda = blas_int(s.lda, "lda"), ldb = blas_int(s.ldb, "ldb"),
            ldc = blas_int(s.ldc, "ldc");
  for (std::int64_t i = 0; i < s.batch; ++i) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, pa + i * s.stride_a, lda,
                pb + i * s.stride_b, ldb, beta, pc + i * s.stride_c, ldc);
  }
}

// --- normalisation ------------------------------------------------------------
void CpuBackend::layernorm_forward_impl(ConstDeviceSpan x_span, ConstDeviceSpan gamma_span,
                                        ConstDeviceSpan beta_span, DeviceSpan y_span,
                                        DeviceSpan mean_span, DeviceSpan rstd_span,
                                        std::int64_t rows, std::int64_t cols, float eps) {
  constexpr const char* op = "layernorm_forward";
  const float* x = f32(x_span, op);
  const float* gamma = f32(gamma_span, op);
  const float* beta = f32(beta_span, op);
  float* y = f32(y_span, op);
  float* mean_out = f32(mean_span, op);
  float* rstd_out = f32(rstd_span, op);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float sum = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) sum += xr[c];
    const float mean = sum * inv_cols;
    float var = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const float rstd = 1.0f / std::sqrt(var * inv_cols + eps);
    for (std::int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

void CpuBackend::layernorm_backward_impl(ConstDeviceSpan dy_span, ConstDeviceSpan x_span,
                                         ConstDeviceSpan gamma_span, ConstDeviceSpan mean_span,
                                         ConstDeviceSpan rstd_span, DeviceSpan dx_span,
                                         DeviceSpan dgamma_span, DeviceSpan dbeta_span,
                                         std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "layernorm_backward";
  const float* dy = f32(dy_span, op);
  const float* x = f32(x_span, op);
  const float* gamma = f32(gamma_span, op);
  const float* mean = f32(mean_span, op);
  const float* rstd = f32(rstd_span, op);
  float* dx = f32(dx_span, op);
  float* dgamma = f32(dgamma_span, op);
  float* dbeta = f32(dbeta_span, op);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
    float sum_g = 0.0f;
    float sum_g_xhat = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - mean[r]) * rstd[r];
      const float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_g_xhat += g * xhat;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
    const float mean_g = sum_g * inv_cols;
    const float mean_g_xhat = sum_g_xhat * inv_cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - mean[r]) * rstd[r];
      dxr[c] = rstd[r] * (dyr[c] * gamma[c] - mean_g - xhat * mean_g_xhat);
    }
  }
}

void CpuBackend::rmsnorm_forward_impl(ConstDeviceSpan x_span, ConstDeviceSpan gamma_span,
                                      DeviceSpan y_span, DeviceSpan rstd_span, std::int64_t rows,
                                      std::int64_t cols, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  const float* x = f32(x_span, op);
  const float* gamma = f32(gamma_span, op);
  float* y = f32(y_span, op);
  float* rstd_out = f32(rstd_span, op);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float sum_sq = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) sum_sq += xr[c] * xr[c];
    const float rstd = 1.0f / std::sqrt(sum_sq / static_cast<float>(cols) + eps);
    for (std::int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * rstd * gamma[c];
    rstd_out[r] = rstd;
  }
}

void CpuBackend::rmsnorm_backward_impl(ConstDeviceSpan dy_span, ConstDeviceSpan x_span,
                                       ConstDeviceSpan gamma_span, ConstDeviceSpan rstd_span,
                                       DeviceSpan dx_span, DeviceSpan dgamma_span,
                                       std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "rmsnorm_backward";
  const float* dy = f32(dy_span, op);
  const float* x = f32(x_span, op);
  const float* gamma = f32(gamma_span, op);
  const float* rstd = f32(rstd_span, op);
  float* dx = f32(dx_span, op);
  float* dgamma = f32(dgamma_span, op);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    // dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * gamma, xhat = x * rstd.
    float sum_g_xhat = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float xhat = xr[c] * rstd[r];
      sum_g_xhat += dyr[c] * gamma[c] * xhat;
      dgamma[c] += dyr[c] * xhat;
    }
    const float mean_g_xhat = sum_g_xhat / static_cast<float>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      dxr[c] = rstd[r] * (dyr[c] * gamma[c] - xr[c] * rstd[r] * mean_g_xhat);
    }
  }
}

// --- softmax ------------------------------------------------------------------
void CpuBackend::causal_softmax_forward_impl(ConstDeviceSpan x_span, DeviceSpan y_span,
                                             std::int64_t batch, std::int64_t s, float scale) {
  constexpr const char* op = "causal_softmax_forward";
  const float* x = f32(x_span, op);
  float* y = f32(y_span, op);
  for (std::int64_t row = 0; row < batch * s; ++row) {
    const std::int64_t visible = row % s + 1;  // query i sees keys 0..i
    const float* xr = x + row * s;
    float* yr = y + row * s;
    float max = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < visible; ++j) max = std::max(max, scale * xr[j]);
    float sum = 0.0f;
    for (std::int64_t j = 0; j < visible; ++j) {
      yr[j] = std::exp(scale * xr[j] - max);
      sum += yr[j];
    }
    const float inv_sum = 1.0f / sum;
    for (std::int64_t j = 0; j < visible; ++j) yr[j] *= inv_sum;
    for (std::int64_t j = visible; j < s; ++j) yr[j] = 0.0f;
  }
}

void CpuBackend::causal_softmax_backward_impl(ConstDeviceSpan dy_span, ConstDeviceSpan y_span,
                                              DeviceSpan dx_span, std::int64_t batch,
                                              std::int64_t s, float scale) {
  constexpr const char* op = "causal_softmax_backward";
  const float* dy = f32(dy_span, op);
  const float* y = f32(y_span, op);
  float* dx = f32(dx_span, op);
  for (std::int64_t row = 0; row < batch * s; ++row) {
    const std::int64_t visible = row % s + 1;
    const float* dyr = dy + row * s;
    const float* yr = y + row * s;
    float* dxr = dx + row * s;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < visible; ++j) dot += dyr[j] * yr[j];
    for (std::int64_t j = 0; j < visible; ++j) dxr[j] = scale * yr[j] * (dyr[j] - dot);
    for (std::int64_t j = visible; j < s; ++j) dxr[j] = 0.0f;
  }
}

// --- fused attention pieces ----------------------------------------------------
namespace {
// Keys query i of a block sees.
std::int64_t visible_keys(bool causal, std::int64_t i, std::int64_t nk) { return causal ? i + 1 : nk; }
}  // namespace

void CpuBackend::attention_softmax_lse_impl(DeviceSpan scores_span, DeviceSpan lse_span, std::int64_t batch,
                                            std::int64_t nq, std::int64_t nk, float scale, bool causal) {
  constexpr const char* op = "attention_softmax_lse";
  float* x = f32(scores_span, op);
  float* lse = f32(lse_span, op);
  for (std::int64_t bh = 0; bh < batch; ++bh)
    for (std::int64_t i = 0; i < nq; ++i) {
      float* row = x + (bh * nq + i) * nk;
      const std::int64_t visible = visible_keys(causal, i, nk);
      float max = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < visible; ++j) max = std::max(max, scale * row[j]);
      float sum = 0.0f;
      for (std::int64_t j = 0; j < visible; ++j) sum += std::exp(scale * row[j] - max);
      const float l = max + std::log(sum);
      for (std::int64_t j = 0; j < visible; ++j) row[j] = std::exp(scale * row[j] - l);
      for (std::int64_t j = visible; j < nk; ++j) row[j] = 0.0f;
      lse[i * batch + bh] = l;
    }
}

void CpuBackend::attention_probs_impl(DeviceSpan scores_span, ConstDeviceSpan lse_span, std::int64_t batch,
                                      std::int64_t nq, std::int64_t nk, float scale, bool causal) {
  constexpr const char* op = "attention_probs";
  float* x = f32(scores_span, op);
  const float* lse = f32(lse_span, op);
  for (std::int64_t bh = 0; bh < batch; ++bh)
    for (std::int64_t i = 0; i < nq; ++i) {
      float* row = x + (bh * nq + i) * nk;
      const std::int64_t visible = visible_keys(causal, i, nk);
      const float l = lse[i * batch + bh];
      for (std::int64_t j = 0; j < visible; ++j) row[j] = std::exp(scale * row[j] - l);
      for (std::int64_t j = visible; j < nk; ++j) row[j] = 0.0f;
    }
}

void CpuBackend::attention_softmax_grad_impl(DeviceSpan dp_span, ConstDeviceSpan p_span, ConstDeviceSpan delta_span,
                                             std::int64_t batch, std::int64_t nq, std::int64_t nk, float scale) {
  constexpr const char* op = "attention_softmax_grad";
  float* dp = f32(dp_span, op);
  const float* p = f32(p_span, op);
  const float* delta = f32(delta_span, op);
  for (std::int64_t bh = 0; bh < batch; ++bh)
    for (std::int64_t i = 0; i < nq; ++i) {
      const std::int64_t at = (bh * nq + i) * nk;
      const float d = delta[i * batch + bh];
      for (std::int64_t j = 0; j < nk; ++j) dp[at + j] = scale * p[at + j] * (dp[at + j] - d);
    }
}

void CpuBackend::attention_merge_impl(DeviceSpan out_span, DeviceSpan lse_span, ConstDeviceSpan blk_span,
                                      ConstDeviceSpan blk_lse_span, std::int64_t rows, std::int64_t cols) {
  constexpr const char* op = "attention_merge";
  float* out = f32(out_span, op);
  float* lse = f32(lse_span, op);
  const float* blk = f32(blk_span, op);
  const float* blk_lse = f32(blk_lse_span, op);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float hi = std::max(lse[r], blk_lse[r]);
    const float merged = hi + std::log(std::exp(lse[r] - hi) + std::exp(blk_lse[r] - hi));
    const float keep = std::exp(lse[r] - merged), add = std::exp(blk_lse[r] - merged);
    for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = out[r * cols + c] * keep + blk[r * cols + c] * add;
    lse[r] = merged;
  }
}

void CpuBackend::copy_2d_impl(ConstDeviceSpan src_span, std::int64_t ld_src, DeviceSpan dst_span, std::int64_t ld_dst,
                              std::int64_t rows, std::int64_t cols, bool accumulate) {
  constexpr const char* op = "copy_2d";
  const float* src = f32(src_span, op);
  float* dst = f32(dst_span, op);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      dst[r * ld_dst + c] = accumulate ? dst[r * ld_dst + c] + src[r * ld_src + c] : src[r * ld_src + c];
}

// --- activations ----------------------------------------------------------------
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// GeLU in plain float arithmetic that GCC vectorises at -O3 (no libm call,
// no float branch: with the default -ftrapping-math a float compare before
// the division blocks if-conversion), so it costs the same per element
// whatever its input. libm's tanh and exp take a time that depends on the
// value (docs/internals/exec.md), and the calibrated GeLU (random inputs) must
// cost what the step's (real activations) does.
//
// The input of the exponential is bounded by clamping v to +-10 in the
// integer domain (|v| as bits is monotonic): beyond it 0.5 (1 + tanh(u)) is 1
// or below 5e-38 in float, so y = v (or a negligible -|v| x 5e-38), and
// exp's argument stays within +-86, where 2^n is a normal float.
constexpr float kGeluClamp = 10.0f;

inline float clamp_magnitude(float v, float limit) {
  const auto bits = std::bit_cast<std::int32_t>(v);
  const std::int32_t mag = bits & INT32_C(0x7fffffff);
  const auto lim = std::bit_cast<std::int32_t>(limit);
  return std::bit_cast<float>((mag < lim ? mag : lim) | (bits & INT32_MIN));
}

// exp(x) for |x| <= 87: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 split
// into a part exact in float and the rest); exp(r) by its Taylor series to
// r^7 (truncation error < |r|^8 / 8! ~ 6e-9, below float's 6e-8 rounding);
// 2^n built in the exponent bits.
inline float bounded_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;      // exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;   // ln 2 - kLn2Hi
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer
  constexpr int kExponentBias = 127;
  constexpr int kMantissaBits = 23;
  const float shifted = x * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const std::int32_t ni = std::bit_cast<std::int32_t>(shifted) - std::bit_cast<std::int32_t>(kRoundMagic);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  // Horner with the 1/k! coefficients.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((ni + kExponentBias) << kMantissaBits);
}

// 0.5 (1 + tanh(u(v))) = 1 / (1 + exp(-2u)) for the clamped v: GeLU's tanh
// form without the cancellation of 1 + tanh(u) for negative u.
inline float gelu_gate(float vc) {
  return 1.0f / (1.0f + bounded_exp(-2.0f * kSqrt2OverPi * (vc + kGeluCubic * vc * vc * vc)));
}
}  // namespace

void CpuBackend::gelu_forward_impl(ConstDeviceSpan x_span, DeviceSpan y_span) {
  const float* x = f32(x_span, "gelu_forward");
  float* y = f32(y_span, "gelu_forward");
  const std::size_t n = x_span.size();
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * gelu_gate(clamp_magnitude(v, kGeluClamp));
  }
}

void CpuBackend::gelu_backward_impl(ConstDeviceSpan dy_span, ConstDeviceSpan x_span,
                                    DeviceSpan dx_span) {
  const float* dy = f32(dy_span, "gelu_backward");
  const float* x = f32(x_span, "gelu_backward");
  float* dx = f32(dx_span, "gelu_backward");
  const std::size_t n = x_span.size();
  for (std::size_t i = 0; i < n; ++i) {
    // With s = 0.5 (1 + tanh(u)): d/dv [v s] = s + v (1 - tanh^2) du / 2 = s + 2 v s (1 - s) du.
    // Beyond the clamp s (1 - s) < 5e-38: the clamped v there changes nothing.
    const float v = clamp_magnitude(x[i], kGeluClamp);
    const float s = gelu_gate(v);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

void CpuBackend::swiglu_forward_impl(ConstDeviceSpan x_span, DeviceSpan y_span, std::int64_t rows,
                                     std::int64_t ffn) {
  const float* x = f32(x_span, "swiglu_forward");
  float* y = f32(y_span, "swiglu_forward");
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * ffn;
    const float* up = gate + ffn;
    float* yr = y + r * ffn;
    for (std::int64_t c = 0; c < ffn; ++c) yr[c] = gate[c] * sigmoid(gate[c]) * up[c];
  }
}

void CpuBackend::swiglu_backward_impl(ConstDeviceSpan dy_span, ConstDeviceSpan x_span,
                                      DeviceSpan dx_span, std::int64_t rows, std::int64_t ffn) {
  const float* dy = f32(dy_span, "swiglu_backward");
  const float* x = f32(x_span, "swiglu_backward");
  float* dx = f32(dx_span, "swiglu_backward");
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * ffn;
    const float* up = gate + ffn;
    const float* dyr = dy + r * ffn;
    float* dgate = dx + r * 2 * ffn;
    float* dup = dgate + ffn;
    for (std::int64_t c = 0; c < ffn; ++c) {
      const float sig = sigmoid(gate[c]);
      const float silu = gate[c] * sig;
      const float g = dyr[c];
      const float u = up[c];
      dgate[c] = g * u * sig * (1.0f + gate[c] * (1.0f - sig));
      dup[c] = g * silu;
    }
  }
}

// --- bias, dropout, residual ------------------------------------------------------
void CpuBackend::bias_add_impl(DeviceSpan y_span, ConstDeviceSpan bias_span, std::int64_t rows,
                               std::int64_t cols) {
  float* y = f32(y_span, "bias_add");
  const float* bias = f32(bias_span, "bias_add");
  for (std::int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

void CpuBackend::bias_backward_impl(ConstDeviceSpan dy_span, DeviceSpan dbias_span,
                                    std::int64_t rows, std::int64_t cols) {
  const float* dy = f32(dy_span, "bias_backward");
  float* dbias = f32(dbias_span, "bias_backward");
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) dbias[c] += dyr[c];
  }
}

void CpuBackend::dropout_residual_forward_impl(ConstDeviceSpan x_span,
                                               ConstDeviceSpan residual_span, DeviceSpan out_span,
                                               float p, std::uint64_t seed) {
  const float* x = f32(x_span, "dropout_residual_forward");
  const float* residual = f32(residual_span, "dropout_residual_forward");
  float* out = f32(out_span, "dropout_residual_forward");
  const float keep_scale = 1.0f / (1.0f - p);
  for (std::size_t i = 0; i < x_span.size(); ++i) {
    out[i] = residual[i] + (dropout_keep(seed, i, p) ? x[i] * keep_scale : 0.0f);
  }
}

void CpuBackend::dropout_backward_impl(ConstDeviceSpan dout_span, DeviceSpan dx_span, float p,
                                       std::uint64_t seed) {
  const float* dout = f32(dout_span, "dropout_backward");
  float* dx = f32(dx_span, "dropout_backward");
  const float keep_scale = 1.0f / (1.0f - p);
  for (std::size_t i = 0; i < dout_span.size(); ++i) {
    dx[i] = dropout_keep(seed, i, p) ? dout[i] * keep_scale : 0.0f;
  }
}

// --- embedding and loss --------------------------------------------------------------
void CpuBackend::embedding_forward_impl(ConstDeviceSpan ids_span, ConstDeviceSpan table_span,
                                        DeviceSpan out_span, std::int64_t rows,
                                        std::int64_t hidden) {
  const std::int32_t* ids = i32(ids_span);
  const float* table = f32(table_span, "embedding_forward");
  float* out = f32(out_span, "embedding_forward");
  const auto vocab = static_cast<std::int64_t>(table_span.size()) / hidden;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * hidden;
    if (ids[r] >= 0 && ids[r] < vocab) {
      std::memcpy(dst, table + ids[r] * hidden, count(1, hidden) * sizeof(float));
    } else {
      std::fill_n(dst, hidden, 0.0f);
    }
  }
}

void CpuBackend::embedding_backward_impl(ConstDeviceSpan dout_span, ConstDeviceSpan ids_span,
                                         DeviceSpan dtable_span, std::int64_t rows,
                                         std::int64_t hidden) {
  const float* dout = f32(dout_span, "embedding_backward");
  const std::int32_t* ids = i32(ids_span);
  float* dtable = f32(dtable_span, "embedding_backward");
  const auto vocab = static_cast<std::int64_t>(dtable_span.size()) / hidden;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (ids[r] < 0 || ids[r] >= vocab) continue;
    float* dst = dtable + ids[r] * hidden;
    const float* src = dout + r * hidden;
    for (std::int64_t c = 0; c < hidden; ++c) dst[c] += src[c];
  }
}

void CpuBackend::cross_entropy_impl(ConstDeviceSpan logits_span, ConstDeviceSpan labels_span,
                                    DeviceSpan dlogits_span, DeviceSpan loss_span,
                                    std::int64_t rows, std::int64_t vocab) {
  constexpr const char* op = "cross_entropy";
  const float* logits = f32(logits_span, op);
  const std::int32_t* labels = i32(labels_span);
  float* dlogits = f32(dlogits_span, op);
  float* loss = f32(loss_span, op);
  const float inv_rows = 1.0f / static_cast<float>(rows);
  double total = 0.0;  // the mean over many rows: sum in double
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t label = labels[r];
    CUBOID_EXEC_REQUIRE(label >= 0 && label < vocab, op,
                        "label " + std::to_string(label) + " of row " + std::to_string(r) +
                            " outside [0, " + std::to_string(vocab) + ")");
    const float* lr = logits + r * vocab;
    float* dr = dlogits + r * vocab;
    float max = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < vocab; ++c) max = std::max(max, lr[c]);
    float sum = 0.0f;
    for (std::int64_t c = 0; c < vocab; ++c) sum += std::exp(lr[c] - max);
    const float log_sum = std::log(sum) + max;
    total += static_cast<double>(log_sum - lr[label]);
    // Reads lr[c] before writing dr[c]: dlogits may alias logits.
    for (std::int64_t c = 0; c < vocab; ++c) dr[c] = std::exp(lr[c] - log_sum) * inv_rows;
    dr[label] -= inv_rows;
  }
  loss[0] = static_cast<float>(total / static_cast<double>(rows));
}

// --- optimiser ------------------------------------------------------------------------
void CpuBackend::adam_step_impl(DeviceSpan params_span, ConstDeviceSpan grads_span,
                                DeviceSpan m_span, DeviceSpan v_span, const AdamConfig& cfg,
                                std::int64_t step) {
  constexpr const char* op = "adam_step";
  float* p = f32(params_span, op);
  const float* g = f32(grads_span, op);
  float* m = f32(m_span, op);
  float* v = f32(v_span, op);
  const auto t = static_cast<double>(step);
  const auto correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta1), t));
  const auto correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta2), t));
  const float decay = 1.0f - cfg.lr * cfg.weight_decay;
  for (std::size_t i = 0; i < params_span.size(); ++i) {
    m[i] = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g[i];
    v[i] = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g[i] * g[i];
    const float m_hat = m[i] / correction1;
    const float v_hat = v[i] / correction2;
    p[i] = p[i] * decay - cfg.lr * m_hat / (std::sqrt(v_hat) + cfg.eps);
  }
}

}  // namespace cuboid::exec
