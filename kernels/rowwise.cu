// Row-wise kernels: LayerNorm, RMSNorm, causal softmax and the cross-entropy
// loss (one block per row), and the column sums behind dgamma, dbeta and
// dbias. Statistics and sums in fp32.
#include "kernels/common.cuh"

namespace cuboid::kernels {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::from_f;
using detail::kRowThreads;
using detail::kRowWarps;
using detail::launched;
using detail::row_blocks;
using detail::to_f;

// --- LayerNorm / RMSNorm forward ----------------------------------------------
// kCentered: LayerNorm (subtract the mean, add beta); otherwise RMSNorm.
template <bool kCentered, typename T>
__global__ void norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                int64_t cols, float eps) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float mean = 0.0f;
  if constexpr (kCentered) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_f(xr[c]);
    mean = block_sum(s, scratch) * inv_cols;
  }
  // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2,
  // which cancels catastrophically for rows with a large mean.
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = to_f(xr[c]) - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(block_sum(sq, scratch) * inv_cols + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (to_f(xr[c]) - mean) * rstd * to_f(gamma[c]);
    if constexpr (kCentered) v += to_f(beta[c]);
    yr[c] = from_f<T>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// --- LayerNorm / RMSNorm backward: dx -----------------------------------------
// With xhat = (x - mean) * rstd and g = dy * gamma:
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
template <bool kCentered, typename T>
__global__ void norm_bwd_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                                   const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                                   T* __restrict__ dx, int64_t cols) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  T* dxr = dx + row * cols;
  const float mean = kCentered ? mean_in[row] : 0.0f;
  const float rstd = rstd_in[row];
  float sum_g = 0.0f;
  float sum_gx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = to_f(dyr[c]) * to_f(gamma[c]);
    sum_g += g;
    sum_gx += g * (to_f(xr[c]) - mean) * rstd;
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean_g = kCentered ? block_sum(sum_g, scratch) * inv_cols : 0.0f;
  const float mean_gx = block_sum(sum_gx, scratch) * inv_cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = to_f(dyr[c]) * to_f(gamma[c]);
    const float xhat = (to_f(xr[c]) - mean) * rstd;
    dxr[c] = from_f<T>(rstd * (g - mean_g - xhat * mean_gx));
  }
}

// --- column sums: dgamma, dbeta, dbias ------------------------------------------
// out0[c] += sum_r term(r, c).x, out1[c] += sum_r term(r, c).y (out1 may be
// null). A block owns 32 columns (coalesced across a warp) and 8 warps split
// the rows; no atomics, so the sums do not depend on scheduling.
constexpr int kColTile = 32;
constexpr int kRowSplit = 8;

template <typename Term, typename G>
__global__ void column_sum_kernel(Term term, G* __restrict__ out0, G* __restrict__ out1, int64_t rows,
                                  int64_t cols) {
  __shared__ float2 part[kRowSplit][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float2 s{0.0f, 0.0f};
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowSplit) {
      const float2 t = term(r, col);
      s.x += t.x;
      s.y += t.y;
    }
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < kRowSplit; ++k) {
      s.x += part[k][threadIdx.x].x;
      s.y += part[k][threadIdx.x].y;
    }
    out0[col] = from_f<G>(to_f(out0[col]) + s.x);
    if (out1 != nullptr) out1[col] = from_f<G>(to_f(out1[col]) + s.y);
  }
}

template <typename Term, typename G>
cudaError_t column_sums(Term term, G* out0, G* out1, int64_t rows, int64_t cols, cudaStream_t stream) {
  const dim3 block(kColTile, kRowSplit);
  const auto grid = static_cast<unsigned>((cols + kColTile - 1) / kColTile);
  column_sum_kernel<<<grid, block, 0, stream>>>(term, out0, out1, rows, cols);
  return launched();
}

// (dy * xhat, dy) for dgamma and dbeta; mean is null for RMSNorm.
template <typename T>
struct NormParamTerm {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ float2 operator()(int64_t r, int64_t c) const {
    const float d = to_f(dy[r * cols + c]);
    const float m = mean != nullptr ? mean[r] : 0.0f;
    return {d * (to_f(x[r * cols + c]) - m) * rstd[r], d};
  }
};

template <typename T>
struct ColumnTerm {
  const T* dy;
  int64_t cols;
  __device__ float2 operator()(int64_t r, int64_t c) const { return {to_f(dy[r * cols + c]), 0.0f}; }
};

template <bool kCentered, typename T, typename G>
cudaError_t norm_bwd(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
                     G* dgamma, G* dbeta, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  norm_bwd_dx_kernel<kCentered><<<row_blocks(rows), kRowThreads, 0, stream>>>(dy, x, gamma, mean, rstd, dx, cols);
  if (const cudaError_t e = launched(); e != cudaSuccess) return e;
  return column_sums(NormParamTerm<T>{dy, x, mean, rstd, cols}, dgamma, dbeta, rows, cols, stream);
}

// --- causal softmax -------------------------------------------------------------
__device__ __forceinline__ int64_t causal_visible(int64_t row, int64_t cols, int64_t seq_q) {
  const int64_t visible = row % seq_q + (cols - seq_q) + 1;
  return visible < 0 ? 0 : (visible > cols ? cols : visible);
}

// No __restrict__: y may alias x. Each thread rewrites only the elements it
// read itself, after the block-wide reductions, so in-place is safe.
template <typename T>
__global__ void causal_softmax_fwd_kernel(const T* x, T* y, int64_t cols, int64_t seq_q, float scale) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  const int64_t visible = causal_visible(row, cols, seq_q);
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) m = fmaxf(m, scale * to_f(xr[c]));
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) s += __expf(scale * to_f(xr[c]) - m);
  s = block_sum(s, scratch);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    yr[c] = from_f<T>(c < visible ? __expf(scale * to_f(xr[c]) - m) * inv : 0.0f);
}

template <typename T>
__global__ void causal_softmax_bwd_kernel(const T* dy, const T* __restrict__ y, T* dx, int64_t cols, int64_t seq_q,
                                          float scale) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * cols;
  const T* yr = y + row * cols;
  T* dxr = dx + row * cols;
  const int64_t visible = causal_visible(row, cols, seq_q);
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) dot += to_f(dyr[c]) * to_f(yr[c]);
  dot = block_sum(dot, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dxr[c] = from_f<T>(c < visible ? scale * to_f(yr[c]) * (to_f(dyr[c]) - dot) : 0.0f);
}

// --- cross-entropy ----------------------------------------------------------------
// No __restrict__: dlogits may alias logits. The label's logit is read before
// the first barrier and every later write touches only the thread's own reads.
template <typename T>
__global__ void cross_entropy_kernel(const T* logits, const int32_t* __restrict__ labels, T* dlogits,
                                     float* __restrict__ row_loss, int64_t rows, int64_t vocab) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  T* dr = dlogits + row * vocab;
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < vocab;
  const float label_logit = valid ? to_f(lr[label]) : 0.0f;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) m = fmaxf(m, to_f(lr[c]));
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) s += __expf(to_f(lr[c]) - m);
  s = block_sum(s, scratch);
  const float inv_s = 1.0f / s;
  const float inv_rows = 1.0f / static_cast<float>(rows);
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = __expf(to_f(lr[c]) - m) * inv_s;
    dr[c] = from_f<T>((p - (c == label ? 1.0f : 0.0f)) * inv_rows);
  }
  if (threadIdx.x == 0) row_loss[row] = valid ? m + logf(s) - label_logit : 0.0f;
}

__global__ void mean_kernel(const float* __restrict__ values, float* __restrict__ out, int64_t n) {
  __shared__ float scratch[kRowWarps];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = s / static_cast<float>(n);
}

}  // namespace

template <typename T>
cudaError_t layernorm_fwd(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, int64_t rows,
                          int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  norm_fwd_kernel<true><<<row_blocks(rows), kRowThreads, 0, stream>>>(x, gamma, beta, y, mean, rstd, cols, eps);
  return launched();
}

template <typename T, typename G>
cudaError_t layernorm_bwd(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
                          G* dgamma, G* dbeta, int64_t rows, int64_t cols, cudaStream_t stream) {
  return norm_bwd<true>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, stream);
}

template <typename T>
cudaError_t rmsnorm_fwd(const T* x, const T* gamma, T* y, float* rstd, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  norm_fwd_kernel<false>
      <<<row_blocks(rows), kRowThreads, 0, stream>>>(x, gamma, static_cast<const T*>(nullptr), y, nullptr, rstd,
                                                     cols, eps);
  return launched();
}

template <typename T, typename G>
cudaError_t rmsnorm_bwd(const T* dy, const T* x, const T* gamma, const float* rstd, T* dx, G* dgamma, int64_t rows,
                        int64_t cols, cudaStream_t stream) {
  return norm_bwd<false>(dy, x, gamma, static_cast<const float*>(nullptr), rstd, dx, dgamma,
                         static_cast<G*>(nullptr), rows, cols, stream);
}

template <typename T>
cudaError_t causal_softmax_fwd(const T* x, T* y, int64_t rows, int64_t cols, int64_t seq_q, float scale,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (seq_q <= 0) return cudaErrorInvalidValue;
  causal_softmax_fwd_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(x, y, cols, seq_q, scale);
  return launched();
}

template <typename T>
cudaError_t causal_softmax_bwd(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, int64_t seq_q,
                               float scale, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (seq_q <= 0) return cudaErrorInvalidValue;
  causal_softmax_bwd_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(dy, y, dx, cols, seq_q, scale);
  return launched();
}

template <typename T, typename G>
cudaError_t bias_bwd(const T* dy, G* dbias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return column_sums(ColumnTerm<T>{dy, cols}, dbias, static_cast<G*>(nullptr), rows, cols, stream);
}

template <typename T>
cudaError_t cross_entropy(const T* logits, const int32_t* labels, T* dlogits, float* row_loss, float* loss,
                          int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  cross_entropy_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(logits, labels, dlogits, row_loss, rows, vocab);
  if (const cudaError_t e = launched(); e != cudaSuccess) return e;
  mean_kernel<<<1, kRowThreads, 0, stream>>>(row_loss, loss, rows);
  return launched();
}

// The storage types the CUDA backend uses: T in {bf16, float}, G in {float, bf16}.
#define CUBOID_ROWWISE_T(T)                                                                                  \
  template cudaError_t layernorm_fwd<T>(const T*, const T*, const T*, T*, float*, float*, int64_t, int64_t,  \
                                        float, cudaStream_t);                                                 \
  template cudaError_t rmsnorm_fwd<T>(const T*, const T*, T*, float*, int64_t, int64_t, float, cudaStream_t); \
  template cudaError_t causal_softmax_fwd<T>(const T*, T*, int64_t, int64_t, int64_t, float, cudaStream_t);  \
  template cudaError_t causal_softmax_bwd<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, float,       \
                                             cudaStream_t);                                                   \
  template cudaError_t cross_entropy<T>(const T*, const int32_t*, T*, float*, float*, int64_t, int64_t,      \
                                        cudaStream_t);
#define CUBOID_ROWWISE_TG(T, G)                                                                              \
  template cudaError_t layernorm_bwd<T, G>(const T*, const T*, const T*, const float*, const float*, T*, G*, \
                                           G*, int64_t, int64_t, cudaStream_t);                               \
  template cudaError_t rmsnorm_bwd<T, G>(const T*, const T*, const T*, const float*, T*, G*, int64_t,        \
                                         int64_t, cudaStream_t);                                              \
  template cudaError_t bias_bwd<T, G>(const T*, G*, int64_t, int64_t, cudaStream_t);

CUBOID_ROWWISE_T(bf16)
CUBOID_ROWWISE_T(float)
CUBOID_ROWWISE_TG(bf16, float)
CUBOID_ROWWISE_TG(bf16, bf16)
CUBOID_ROWWISE_TG(float, float)
CUBOID_ROWWISE_TG(float, bf16)

}  // namespace cuboid::kernels
