// The fused attention core's pieces (Backend::attention_*): the softmax of a
// block of scores with its log-sum-exp, the probabilities again from a given
// log-sum-exp, the softmax gradient, the merge of a block's output into the
// running one, and a strided 2-D copy. One block of threads per score row;
// statistics in fp32, laid out [nq, batch] (query-major).
#include "kernels/common.cuh"

namespace cuboid::kernels {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::first_index;
using detail::from_f;
using detail::grid_stride;
using detail::kRowThreads;
using detail::kRowWarps;
using detail::launched;
using detail::row_blocks;
using detail::to_f;

// Score row `row` = bh * nq + i; query i of a causal block sees keys 0..i.
__device__ __forceinline__ int64_t block_visible(int64_t row, int64_t nq, int64_t nk, bool causal) {
  return causal ? row % nq + 1 : nk;
}
__device__ __forceinline__ int64_t stat_index(int64_t row, int64_t nq, int64_t batch) {
  return (row % nq) * batch + row / nq;
}

template <typename T>
__global__ void softmax_lse_kernel(T* x, float* lse, int64_t batch, int64_t nq, int64_t nk, float scale, bool causal) {
  __shared__ float scratch[kRowWarps];
  const int64_t row = blockIdx.x;
  T* xr = x + row * nk;
  const int64_t visible = block_visible(row, nq, nk, causal);
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) m = fmaxf(m, scale * to_f(xr[c]));
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) s += __expf(scale * to_f(xr[c]) - m);
  s = block_sum(s, scratch);
  const float l = m + __logf(s);
  for (int64_t c = threadIdx.x; c < nk; c += blockDim.x)
    xr[c] = from_f<T>(c < visible ? __expf(scale * to_f(xr[c]) - l) : 0.0f);
  if (threadIdx.x == 0) lse[stat_index(row, nq, batch)] = l;
}

template <typename T>
__global__ void probs_kernel(T* x, const float* __restrict__ lse, int64_t batch, int64_t nq, int64_t nk, float scale,
                             bool causal) {
  const int64_t row = blockIdx.x;
  T* xr = x + row * nk;
  const int64_t visible = block_visible(row, nq, nk, causal);
  const float l = lse[stat_index(row, nq, batch)];
  for (int64_t c = threadIdx.x; c < nk; c += blockDim.x)
    xr[c] = from_f<T>(c < visible ? __expf(scale * to_f(xr[c]) - l) : 0.0f);
}

template <typename T>
__global__ void softmax_grad_kernel(T* dp, const T* __restrict__ p, const float* __restrict__ delta, int64_t batch,
                                    int64_t nq, int64_t nk, float scale) {
  const int64_t row = blockIdx.x;
  const float d = delta[stat_index(row, nq, batch)];
  for (int64_t c = threadIdx.x; c < nk; c += blockDim.x) {
    const int64_t at = row * nk + c;
    dp[at] = from_f<T>(scale * to_f(p[at]) * (to_f(dp[at]) - d));
  }
}

template <typename T>
__global__ void merge_kernel(T* out, float* lse, const T* __restrict__ blk, const float* __restrict__ blk_lse,
                             int64_t cols) {
  const int64_t row = blockIdx.x;
  const float a = lse[row], b = blk_lse[row];
  const float hi = fmaxf(a, b);
  const float merged = hi + __logf(__expf(a - hi) + __expf(b - hi));
  const float keep = __expf(a - merged), add = __expf(b - merged);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[row * cols + c] = from_f<T>(to_f(out[row * cols + c]) * keep + to_f(blk[row * cols + c]) * add);
  __syncthreads();  // every thread has read lse[row] before it changes
  if (threadIdx.x == 0) lse[row] = merged;
}

template <typename T>
__global__ void copy_2d_kernel(const T* __restrict__ src, int64_t ld_src, T* __restrict__ dst, int64_t ld_dst,
                               int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t i = first_index(); i < rows * cols; i += grid_stride()) {
    const int64_t r = i / cols, c = i % cols;
    const float v = to_f(src[r * ld_src + c]);
    dst[r * ld_dst + c] = from_f<T>(accumulate ? to_f(dst[r * ld_dst + c]) + v : v);
  }
}

}  // namespace

template <typename T>
cudaError_t attention_softmax_lse(T* scores, float* lse, int64_t batch, int64_t nq, int64_t nk, float scale,
                                  bool causal, cudaStream_t stream) {
  if (batch <= 0 || nq <= 0 || nk <= 0) return cudaErrorInvalidValue;
  softmax_lse_kernel<<<row_blocks(batch * nq), kRowThreads, 0, stream>>>(scores, lse, batch, nq, nk, scale, causal);
  return launched();
}

template <typename T>
cudaError_t attention_probs(T* scores, const float* lse, int64_t batch, int64_t nq, int64_t nk, float scale,
                            bool causal, cudaStream_t stream) {
  if (batch <= 0 || nq <= 0 || nk <= 0) return cudaErrorInvalidValue;
  probs_kernel<<<row_blocks(batch * nq), kRowThreads, 0, stream>>>(scores, lse, batch, nq, nk, scale, causal);
  return launched();
}

template <typename T>
cudaError_t attention_softmax_grad(T* dp, const T* p, const float* delta, int64_t batch, int64_t nq, int64_t nk,
                                   float scale, cudaStream_t stream) {
  if (batch <= 0 || nq <= 0 || nk <= 0) return cudaErrorInvalidValue;
  softmax_grad_kernel<<<row_blocks(batch * nq), kRowThreads, 0, stream>>>(dp, p, delta, batch, nq, nk, scale);
  return launched();
}

template <typename T>
cudaError_t attention_merge(T* out, float* lse, const T* blk, const float* blk_lse, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaErrorInvalidValue;
  merge_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(out, lse, blk, blk_lse, cols);
  return launched();
}

template <typename T>
cudaError_t copy_2d(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows, int64_t cols,
                    bool accumulate, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaErrorInvalidValue;
  copy_2d_kernel<<<detail::elementwise_blocks(rows * cols), detail::kElementwiseThreads, 0, stream>>>(
      src, ld_src, dst, ld_dst, rows, cols, accumulate);
  return launched();
}

template cudaError_t attention_softmax_lse<bf16>(bf16*, float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template cudaError_t attention_softmax_lse<float>(float*, float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template cudaError_t attention_probs<bf16>(bf16*, const float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template cudaError_t attention_probs<float>(float*, const float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template cudaError_t attention_softmax_grad<bf16>(bf16*, const bf16*, const float*, int64_t, int64_t, int64_t, float,
                                                  cudaStream_t);
template cudaError_t attention_softmax_grad<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                                   float, cudaStream_t);
template cudaError_t attention_merge<bf16>(bf16*, float*, const bf16*, const float*, int64_t, int64_t, cudaStream_t);
template cudaError_t attention_merge<float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                            cudaStream_t);
template cudaError_t copy_2d<bf16>(const bf16*, int64_t, bf16*, int64_t, int64_t, int64_t, bool, cudaStream_t);
template cudaError_t copy_2d<float>(const float*, int64_t, float*, int64_t, int64_t, int64_t, bool, cudaStream_t);

}  // namespace cuboid::kernels
