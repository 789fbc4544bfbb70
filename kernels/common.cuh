#pragma once
// Shared device helpers for kernels/*.cu: type conversion, block-wide
// reductions and launch shapes. bf16 is only a storage type; every kernel
// computes in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/kernels.hpp"

namespace cuboid::kernels::detail {

constexpr int kWarp = 32;
// Row kernels run one block per row: 256 threads keep a 4k-16k wide row to a
// handful of loads per thread and let 8 blocks share an SM.
constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / kWarp;
constexpr int kElementwiseThreads = 256;

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(int32_t v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ int32_t from_f<int32_t>(float v) { return __float2int_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide sum (or max) returned to every thread; blockDim.x is a multiple
// of 32. `scratch` holds one float per warp; the trailing barrier lets the
// caller reuse it straight away.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = kMax ? -INFINITY : 0.0f;
  for (int w = 0; w < warps; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Grid for an elementwise kernel with a grid-stride loop: enough blocks to
// fill an H100 several times over, never more than the work needs.
inline unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65536));
}

// Row kernels use one block per row (gridDim.x allows 2^31 - 1 rows).
inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows); }

// A launch reports a bad configuration through cudaGetLastError; nothing here
// synchronises, so faults inside a kernel surface at the next checked sync.
inline cudaError_t launched() { return cudaGetLastError(); }

}  // namespace cuboid::kernels::detail
