#pragma once
// Host-callable launchers for the CUDA backend's own kernels (the GEMMs are
// cuBLAS). Semantics are those of the matching cuboid::exec::Backend calls
// (include/cuboid/exec/backend.hpp); the CPU backend is their reference.
//
//   * Tensors are row-major device memory. T is the storage type of
//     activations (bf16 on the CUDA backend, float also instantiated); G is
//     the type of a parameter-gradient accumulator (float or bf16), which
//     the backward kernels ADD into. Arithmetic is fp32 throughout.
//   * Each launcher only enqueues on `stream` and returns the launch's
//     cudaError_t, so the caller wraps it in CUBOID_CUDA_CHECK with its own
//     file and line. Empty shapes launch nothing and return cudaSuccess.
//
// Plain C++: included by g++-compiled code as well as by nvcc.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace cuboid::kernels {

using bf16 = __nv_bfloat16;

// --- norms over the last dimension of x[rows, cols] -------------------------
// mean and rstd (one per row) are written by the forward for the backward.
template <typename T>
cudaError_t layernorm_fwd(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd,
                          int64_t rows, int64_t cols, float eps, cudaStream_t stream);
template <typename T, typename G>
cudaError_t layernorm_bwd(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd,
                          T* dx, G* dgamma, G* dbeta, int64_t rows, int64_t cols, cudaStream_t stream);
template <typename T>
cudaError_t rmsnorm_fwd(const T* x, const T* gamma, T* y, float* rstd, int64_t rows, int64_t cols,
                        float eps, cudaStream_t stream);
template <typename T, typename G>
cudaError_t rmsnorm_bwd(const T* dy, const T* x, const T* gamma, const float* rstd, T* dx, G* dgamma,
                        int64_t rows, int64_t cols, cudaStream_t stream);

// --- causal softmax ---------------------------------------------------------
// `rows` rows of `cols` attention scores; row r is query position r % seq_q
// of its (batch, head) block and sees keys 0 .. r % seq_q + (cols - seq_q)
// (seq_q == cols: the square causal mask of Backend::causal_softmax_*).
// y = softmax(scale * x) over the visible keys, 0 elsewhere; y may alias x.
template <typename T>
cudaError_t causal_softmax_fwd(const T* x, T* y, int64_t rows, int64_t cols, int64_t seq_q, float scale,
                               cudaStream_t stream);
// dx = scale * y * (dy - sum(dy * y)), 0 where masked; dx may alias dy.
template <typename T>
cudaError_t causal_softmax_bwd(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, int64_t seq_q,
                               float scale, cudaStream_t stream);

// --- the fused attention core's pieces (attention.cu; Backend::attention_*) ---
template <typename T>
cudaError_t attention_softmax_lse(T* scores, float* lse, int64_t batch, int64_t nq, int64_t nk, float scale,
                                  bool causal, cudaStream_t stream);
template <typename T>
cudaError_t attention_probs(T* scores, const float* lse, int64_t batch, int64_t nq, int64_t nk, float scale,
                            bool causal, cudaStream_t stream);
template <typename T>
cudaError_t attention_softmax_grad(T* dp, const T* p, const float* delta, int64_t batch, int64_t nq, int64_t nk,
                                   float scale, cudaStream_t stream);
template <typename T>
cudaError_t attention_merge(T* out, float* lse, const T* blk, const float* blk_lse, int64_t rows, int64_t cols,
                            cudaStream_t stream);
template <typename T>
cudaError_t copy_2d(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows, int64_t cols,
                    bool accumulate, cudaStream_t stream);

// --- activations --------------------------------------------------------------
// GeLU, tanh approximation.
template <typename T>
cudaError_t gelu_fwd(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t gelu_bwd(const T* dy, const T* x, T* dx, int64_t n, cudaStream_t stream);
// x[rows, 2*ffn] = [gate | up] per row; y[rows, ffn] = silu(gate) * up;
// the backward writes dx[rows, 2*ffn] = [dgate | dup].
template <typename T>
cudaError_t swiglu_fwd(const T* x, T* y, int64_t rows, int64_t ffn, cudaStream_t stream);
template <typename T>
cudaError_t swiglu_bwd(const T* dy, const T* x, T* dx, int64_t rows, int64_t ffn, cudaStream_t stream);

// --- bias, dropout, residual ----------------------------------------------------
template <typename T>
cudaError_t bias_add(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// dbias += column sums of dy.
template <typename T, typename G>
cudaError_t bias_bwd(const T* dy, G* dbias, int64_t rows, int64_t cols, cudaStream_t stream);
// out = residual + x * keep(i) / (1 - p), keep(i) = exec::dropout_keep(seed, i, p):
// the mask is recomputed, never stored. out may alias residual. 0 <= p < 1.
template <typename T>
cudaError_t dropout_add_fwd(const T* x, const T* residual, T* out, int64_t n, float p, uint64_t seed,
                            cudaStream_t stream);
// dx = dout * keep(i) / (1 - p); dx may alias dout.
template <typename T>
cudaError_t dropout_bwd(const T* dout, T* dx, int64_t n, float p, uint64_t seed, cudaStream_t stream);

// --- embedding and loss ---------------------------------------------------------
// out[r] = table[ids[r]], a zero row when ids[r] is outside [0, vocab).
template <typename T>
cudaError_t embedding_fwd(const int32_t* ids, const T* table, T* out, int64_t rows, int64_t hidden,
                          int64_t vocab, cudaStream_t stream);
// dtable[ids[r]] += dout[r] (atomics: rows may repeat an id).
template <typename T, typename G>
cudaError_t embedding_bwd(const T* dout, const int32_t* ids, G* dtable, int64_t rows, int64_t hidden,
                          int64_t vocab, cudaStream_t stream);
// loss[0] = mean over rows of -log softmax(logits[r])[labels[r]];
// dlogits = (softmax - onehot) / rows, may alias logits. row_loss: a float
// workspace of `rows` elements (the sum over rows is a second, deterministic pass).
template <typename T>
cudaError_t cross_entropy(const T* logits, const int32_t* labels, T* dlogits, float* row_loss, float* loss,
                          int64_t rows, int64_t vocab, cudaStream_t stream);

// --- optimiser ------------------------------------------------------------------
struct AdamHyper {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  // decoupled: p -= lr * wd * p
  int64_t step;        // from 1
};
// One AdamW step on fp32 master params with fp32 m and v.
template <typename G>
cudaError_t adam_step(float* params, const G* grads, float* m, float* v, int64_t n, const AdamHyper& hp,
                      cudaStream_t stream);

// --- elementwise helpers --------------------------------------------------------
template <typename T>
cudaError_t scale(T* x, float alpha, int64_t n, cudaStream_t stream);
// dst += src (the types may differ, e.g. fp32 gradients += bf16).
template <typename D, typename S>
cudaError_t add(D* dst, const S* src, int64_t n, cudaStream_t stream);
// dst = src with conversion (round to nearest even into bf16).
template <typename D, typename S>
cudaError_t convert(D* dst, const S* src, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t fill(T* x, float value, int64_t n, cudaStream_t stream);
// x[r, :] *= factors[r] (rows x cols x, fp32 factors).
template <typename T>
cudaError_t scale_rows(T* x, const float* factors, int64_t rows, int64_t cols, cudaStream_t stream);
// out[r] = sum_c a[r, c] * b[r, c] in fp32.
template <typename T>
cudaError_t row_dot(const T* a, const T* b, float* out, int64_t rows, int64_t cols, cudaStream_t stream);
// x[i] = (2 * exec::uniform01(seed, i) - 1) * scale, the CPU backend's values.
template <typename T>
cudaError_t fill_random(T* x, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

// --- per-tensor FP8 quantization (fp8.cu; Backend::gemm_quantized) ---------
// *amax = max |x[i]| over n elements (zeroed first on `stream`).
template <typename T>
cudaError_t fp8_amax(const T* x, int64_t n, float* amax, cudaStream_t stream);
// *scale = max / *amax (448 for E4M3, 57344 for E5M2; 1 for a zero or
// non-finite amax), *scale_inv = 1 / *scale.
cudaError_t fp8_scale(const float* amax, bool e5m2, float* scale, float* scale_inv, cudaStream_t stream);
// out = FP8(x * *scale), rounded to nearest even and saturated, one byte per
// element: x[rows, cols] row-major, out the same or (transpose) [cols, rows].
template <typename T>
cudaError_t fp8_cast(const T* x, int64_t rows, int64_t cols, bool transpose, bool e5m2, const float* scale,
                     void* out, cudaStream_t stream);

}  // namespace cuboid::kernels
