// Elementwise kernels: GeLU, SwiGLU, bias add, dropout + residual add, the
// embedding gather/scatter, AdamW, and the scale/add/convert/fill helpers.
// Grid-stride loops, fp32 math.
#include <cmath>

#include "cuboid/exec/random.hpp"  // uniform01, dropout_keep: the CPU backend's random streams
#include "kernels/common.cuh"

namespace cuboid::kernels {
namespace {

using detail::elementwise_blocks;
using detail::first_index;
using detail::from_f;
using detail::grid_stride;
using detail::kElementwiseThreads;
using detail::launched;
using detail::to_f;

// kernel<<<...>>>(args..., n) over n elements on `stream`.
template <typename Kernel, typename... Args>
cudaError_t launch_elementwise(Kernel kernel, int64_t n, cudaStream_t stream, Args... args) {
  if (n == 0) return cudaSuccess;
  kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(args..., n);
  return launched();
}

// --- GeLU, tanh approximation -------------------------------------------------
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

template <typename T>
__global__ void gelu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = to_f(x[i]);
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    y[i] = from_f<T>(0.5f * v * (1.0f + t));
  }
}

template <typename T>
__global__ void gelu_bwd_kernel(const T* dy, const T* __restrict__ x, T* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = to_f(x[i]);
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float dt = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = from_f<T>(to_f(dy[i]) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dt));
  }
}

// --- SwiGLU ---------------------------------------------------------------------
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

template <typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t ffn, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t gate = (i / ffn) * 2 * ffn + i % ffn;
    const float g = to_f(x[gate]);
    y[i] = from_f<T>(g * sigmoid(g) * to_f(x[gate + ffn]));
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                  int64_t ffn, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t gate = (i / ffn) * 2 * ffn + i % ffn;
    const float g = to_f(x[gate]);
    const float u = to_f(x[gate + ffn]);
    const float s = sigmoid(g);
    const float d = to_f(dy[i]);
    dx[gate] = from_f<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dx[gate + ffn] = from_f<T>(d * g * s);
  }
}

// --- bias, dropout, residual --------------------------------------------------------
template <typename T>
__global__ void bias_add_kernel(T* __restrict__ y, const T* __restrict__ bias, int64_t cols, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = from_f<T>(to_f(y[i]) + to_f(bias[i % cols]));
}

// No __restrict__ on residual/out (they may alias) nor on dout/dx.
template <typename T>
__global__ void dropout_add_fwd_kernel(const T* __restrict__ x, const T* residual, T* out, float p, float inv_keep,
                                       uint64_t seed, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float kept = exec::dropout_keep(seed, static_cast<uint64_t>(i), p) ? to_f(x[i]) * inv_keep : 0.0f;
    out[i] = from_f<T>(to_f(residual[i]) + kept);
  }
}

template <typename T>
__global__ void dropout_bwd_kernel(const T* dout, T* dx, float p, float inv_keep, uint64_t seed, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = from_f<T>(exec::dropout_keep(seed, static_cast<uint64_t>(i), p) ? to_f(dout[i]) * inv_keep : 0.0f);
}

template <typename T>
__global__ void scale_rows_kernel(T* __restrict__ x, const float* __restrict__ factors, int64_t cols, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = from_f<T>(to_f(x[i]) * factors[i / cols]);
}

// One thread per row: the rows are few (an MoE layer's token copies) and the
// kernel runs once per expert pass.
template <typename T>
__global__ void row_dot_kernel(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ out, int64_t cols,
                               int64_t rows) {
  for (int64_t r = first_index(); r < rows; r += grid_stride()) {
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += to_f(a[r * cols + c]) * to_f(b[r * cols + c]);
    out[r] = sum;
  }
}

// --- embedding --------------------------------------------------------------------
template <typename T>
__global__ void embedding_fwd_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table,
                                     T* __restrict__ out, int64_t hidden, int64_t vocab, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t id = ids[i / hidden];
    out[i] = id >= 0 && id < vocab ? table[id * hidden + i % hidden] : from_f<T>(0.0f);
  }
}

__device__ __forceinline__ void atomic_accumulate(float* dst, float v) { atomicAdd(dst, v); }
__device__ __forceinline__ void atomic_accumulate(bf16* dst, float v) { atomicAdd(dst, __float2bfloat16_rn(v)); }

template <typename T, typename G>
__global__ void embedding_bwd_kernel(const T* __restrict__ dout, const int32_t* __restrict__ ids,
                                     G* __restrict__ dtable, int64_t hidden, int64_t vocab, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int32_t id = ids[i / hidden];
    if (id >= 0 && id < vocab) atomic_accumulate(&dtable[id * hidden + i % hidden], to_f(dout[i]));
  }
}

// --- AdamW ------------------------------------------------------------------------
template <typename G>
__global__ void adam_kernel(float* __restrict__ params, const G* __restrict__ grads, float* __restrict__ m,
                            float* __restrict__ v, AdamHyper hp, float bias1, float bias2, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = to_f(grads[i]);
    const float mi = hp.beta1 * m[i] + (1.0f - hp.beta1) * g;
    const float vi = hp.beta2 * v[i] + (1.0f - hp.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    params[i] = p - hp.lr * ((mi / bias1) / (sqrtf(vi / bias2) + hp.eps) + hp.weight_decay * p);
  }
}

// --- helpers ------------------------------------------------------------------------
template <typename T>
__global__ void scale_kernel(T* __restrict__ x, float alpha, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = from_f<T>(alpha * to_f(x[i]));
}

template <typename D, typename S>
__global__ void add_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = from_f<D>(to_f(dst[i]) + to_f(src[i]));
}

template <typename D, typename S>
__global__ void convert_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = from_f<D>(to_f(src[i]));
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ x, float value, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = from_f<T>(value);
}

template <typename T>
__global__ void fill_random_kernel(T* __restrict__ x, uint64_t seed, float scale, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    x[i] = from_f<T>((2.0f * exec::uniform01(seed, static_cast<uint64_t>(i)) - 1.0f) * scale);
}

}  // namespace

template <typename T>
cudaError_t gelu_fwd(const T* x, T* y, int64_t n, cudaStream_t stream) {
  return launch_elementwise(gelu_fwd_kernel<T>, n, stream, x, y);
}

template <typename T>
cudaError_t gelu_bwd(const T* dy, const T* x, T* dx, int64_t n, cudaStream_t stream) {
  return launch_elementwise(gelu_bwd_kernel<T>, n, stream, dy, x, dx);
}

template <typename T>
cudaError_t swiglu_fwd(const T* x, T* y, int64_t rows, int64_t ffn, cudaStream_t stream) {
  return launch_elementwise(swiglu_fwd_kernel<T>, rows * ffn, stream, x, y, ffn);
}

template <typename T>
cudaError_t swiglu_bwd(const T* dy, const T* x, T* dx, int64_t rows, int64_t ffn, cudaStream_t stream) {
  return launch_elementwise(swiglu_bwd_kernel<T>, rows * ffn, stream, dy, x, dx, ffn);
}

template <typename T>
cudaError_t bias_add(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_elementwise(bias_add_kernel<T>, rows * cols, stream, y, bias, cols);
}

template <typename T>
cudaError_t scale_rows(T* x, const float* factors, int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_elementwise(scale_rows_kernel<T>, rows * cols, stream, x, factors, cols);
}

template <typename T>
cudaError_t row_dot(const T* a, const T* b, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  return launch_elementwise(row_dot_kernel<T>, rows, stream, a, b, out, cols);
}

template <typename T>
cudaError_t dropout_add_fwd(const T* x, const T* residual, T* out, int64_t n, float p, uint64_t seed,
                            cudaStream_t stream) {
  if (!(p >= 0.0f && p < 1.0f)) return cudaErrorInvalidValue;
  return launch_elementwise(dropout_add_fwd_kernel<T>, n, stream, x, residual, out, p, 1.0f / (1.0f - p), seed);
}

template <typename T>
cudaError_t dropout_bwd(const T* dout, T* dx, int64_t n, float p, uint64_t seed, cudaStream_t stream) {
  if (!(p >= 0.0f && p < 1.0f)) return cudaErrorInvalidValue;
  return launch_elementwise(dropout_bwd_kernel<T>, n, stream, dout, dx, p, 1.0f / (1.0f - p), seed);
}

template <typename T>
cudaError_t embedding_fwd(const int32_t* ids, const T* table, T* out, int64_t rows, int64_t hidden, int64_t vocab,
                          cudaStream_t stream) {
  return launch_elementwise(embedding_fwd_kernel<T>, rows * hidden, stream, ids, table, out, hidden, vocab);
}

template <typename T, typename G>
cudaError_t embedding_bwd(const T* dout, const int32_t* ids, G* dtable, int64_t rows, int64_t hidden,
                          int64_t vocab, cudaStream_t stream) {
  return launch_elementwise(embedding_bwd_kernel<T, G>, rows * hidden, stream, dout, ids, dtable, hidden, vocab);
}

template <typename G>
cudaError_t adam_step(float* params, const G* grads, float* m, float* v, int64_t n, const AdamHyper& hp,
                      cudaStream_t stream) {
  if (hp.step < 1) return cudaErrorInvalidValue;
  const auto t = static_cast<double>(hp.step);
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), t));
  const auto bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), t));
  return launch_elementwise(adam_kernel<G>, n, stream, params, grads, m, v, hp, bias1, bias2);
}

template <typename T>
cudaError_t scale(T* x, float alpha, int64_t n, cudaStream_t stream) {
  return launch_elementwise(scale_kernel<T>, n, stream, x, alpha);
}

template <typename D, typename S>
cudaError_t add(D* dst, const S* src, int64_t n, cudaStream_t stream) {
  return launch_elementwise(add_kernel<D, S>, n, stream, dst, src);
}

template <typename D, typename S>
cudaError_t convert(D* dst, const S* src, int64_t n, cudaStream_t stream) {
  return launch_elementwise(convert_kernel<D, S>, n, stream, dst, src);
}

template <typename T>
cudaError_t fill(T* x, float value, int64_t n, cudaStream_t stream) {
  return launch_elementwise(fill_kernel<T>, n, stream, x, value);
}

template <typename T>
cudaError_t fill_random(T* x, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  return launch_elementwise(fill_random_kernel<T>, n, stream, x, seed, scale);
}

#define CUBOID_ELEMENTWISE_T(T)                                                                                \
  template cudaError_t gelu_fwd<T>(const T*, T*, int64_t, cudaStream_t);                                       \
  template cudaError_t gelu_bwd<T>(const T*, const T*, T*, int64_t, cudaStream_t);                             \
  template cudaError_t swiglu_fwd<T>(const T*, T*, int64_t, int64_t, cudaStream_t);                            \
  template cudaError_t swiglu_bwd<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);                  \
  template cudaError_t bias_add<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                              \
  template cudaError_t scale_rows<T>(T*, const float*, int64_t, int64_t, cudaStream_t);                       \
  template cudaError_t row_dot<T>(const T*, const T*, float*, int64_t, int64_t, cudaStream_t);                \
  template cudaError_t dropout_add_fwd<T>(const T*, const T*, T*, int64_t, float, uint64_t, cudaStream_t);     \
  template cudaError_t dropout_bwd<T>(const T*, T*, int64_t, float, uint64_t, cudaStream_t);                   \
  template cudaError_t embedding_fwd<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t, cudaStream_t); \
  template cudaError_t embedding_bwd<T, float>(const T*, const int32_t*, float*, int64_t, int64_t, int64_t,     \
                                               cudaStream_t);                                                  \
  template cudaError_t embedding_bwd<T, bf16>(const T*, const int32_t*, bf16*, int64_t, int64_t, int64_t,       \
                                              cudaStream_t);                                                   \
  template cudaError_t adam_step<T>(float*, const T*, float*, float*, int64_t, const AdamHyper&, cudaStream_t); \
  template cudaError_t scale<T>(T*, float, int64_t, cudaStream_t);                                             \
  template cudaError_t fill_random<T>(T*, int64_t, uint64_t, float, cudaStream_t);                             \
  template cudaError_t add<T, float>(T*, const float*, int64_t, cudaStream_t);                                 \
  template cudaError_t add<T, bf16>(T*, const bf16*, int64_t, cudaStream_t);                                   \
  template cudaError_t convert<T, float>(T*, const float*, int64_t, cudaStream_t);                             \
  template cudaError_t convert<T, bf16>(T*, const bf16*, int64_t, cudaStream_t);

CUBOID_ELEMENTWISE_T(bf16)
CUBOID_ELEMENTWISE_T(float)
template cudaError_t fill<bf16>(bf16*, float, int64_t, cudaStream_t);
template cudaError_t fill<float>(float*, float, int64_t, cudaStream_t);
template cudaError_t fill<int32_t>(int32_t*, float, int64_t, cudaStream_t);

}  // namespace cuboid::kernels
