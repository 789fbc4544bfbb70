// Per-tensor FP8 quantization as Transformer Engine d0067d0d's current
// scaling runs it (include/cuboid/exec/fp8.hpp has the host reference): the
// tensor's amax, scale = max / amax (recipe/recipe_common.cuh
// compute_scale_from_amax, epsilon 0, no power-of-2), and the cast
// cvt.rn.satfinite to E4M3 or E5M2 (cuda_fp8.h's __NV_SATFINITE), written
// row-major or transposed for cuBLASLt's K-major operands.
#include <cuda_fp8.h>

#include <cfloat>

#include "kernels/common.cuh"

namespace cuboid::kernels {
namespace {

using detail::block_max;
using detail::elementwise_blocks;
using detail::first_index;
using detail::grid_stride;
using detail::kElementwiseThreads;
using detail::launched;
using detail::to_f;

// amax >= 0 as float bits orders like an unsigned int: atomicMax on the bits.
template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, unsigned* __restrict__ amax_bits, int64_t n) {
  __shared__ float scratch[kElementwiseThreads / 32];
  float m = 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride()) m = fmaxf(m, fabsf(to_f(x[i])));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

__global__ void scale_kernel(const float* __restrict__ amax, float fp8_max, float* __restrict__ scale,
                             float* __restrict__ scale_inv) {
  const float a = *amax;
  float s = 1.0f;
  if (!(isinf(a) || a == 0.0f || isnan(a))) {
    s = __fdiv_rn(fp8_max, a);
    if (isinf(s)) s = FLT_MAX;
  }
  *scale = s;
  *scale_inv = 1.0f / s;
}

template <typename T, typename F8>
__global__ void cast_kernel(const T* __restrict__ x, const float* __restrict__ scale, F8* __restrict__ out,
                            int64_t rows, int64_t cols, bool transpose, int64_t n) {
  const float s = *scale;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const F8 q(to_f(x[i]) * s);  // __nv_fp8_e4m3 / e5m2 (float): round to nearest even, satfinite
    out[transpose ? (i % cols) * rows + i / cols : i] = q;
  }
}

}  // namespace

template <typename T>
cudaError_t fp8_amax(const T* x, int64_t n, float* amax, cudaStream_t stream) {
  if (const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  amax_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(x, reinterpret_cast<unsigned*>(amax), n);
  return launched();
}

cudaError_t fp8_scale(const float* amax, bool e5m2, float* scale, float* scale_inv, cudaStream_t stream) {
  scale_kernel<<<1, 1, 0, stream>>>(amax, e5m2 ? 57344.0f : 448.0f, scale, scale_inv);
  return launched();
}

template <typename T>
cudaError_t fp8_cast(const T* x, int64_t rows, int64_t cols, bool transpose, bool e5m2, const float* scale,
                     void* out, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  if (e5m2)
    cast_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        x, scale, static_cast<__nv_fp8_e5m2*>(out), rows, cols, transpose, n);
  else
    cast_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        x, scale, static_cast<__nv_fp8_e4m3*>(out), rows, cols, transpose, n);
  return launched();
}

#define CUBOID_FP8_INSTANTIATE(T)                                                                         \
  template cudaError_t fp8_amax<T>(const T*, int64_t, float*, cudaStream_t);                            \
  template cudaError_t fp8_cast<T>(const T*, int64_t, int64_t, bool, bool, const float*, void*, cudaStream_t);
CUBOID_FP8_INSTANTIATE(bf16)
CUBOID_FP8_INSTANTIATE(float)
#undef CUBOID_FP8_INSTANTIATE

}  // namespace cuboid::kernels
