#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The executor's device interface. The step runner drives a Backend (memory,
// GEMMs, the transformer's kernels, timers) without knowing whether it is the
// CPU backend (fp32, OpenBLAS) or the CUDA one (bf16, cuBLAS); collectives go
// through a Communicator (communicator.hpp), backends are made by name in
// registry.hpp.
//
// Conventions, for every call below:
//   * Matrices are row-major. "rows x cols" means cols is the contiguous axis.
//   * Storage dtype is the buffer's; arithmetic and accumulation are fp32.
//     Statistics (mean, rstd), the loss and Adam's state are always f32.
//   * Activation gradients (dx) are overwritten; parameter gradients (dgamma,
//     dbeta, dbias, dtable) are ACCUMULATED (+=) so micro-batches add up; the
//     caller zeroes them once per step.
//   * Calls are asynchronous on devices that can be (CUDA: one stream);
//     download(), elapsed_ns() and synchronize() wait.
//   * The public calls check sizes and dtypes (ExecError on violation) and then
//     call the protected *_impl that a backend implements (non-virtual
//     interface), so every backend gets the same checks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/exec/buffer.hpp"
#include "cuboid/exec/dtype.hpp"
#include "cuboid/exec/fp8.hpp"
#include "cuboid/exec/random.hpp"  // fill_random and dropout draw from these streams

namespace cuboid::exec {

// A timing point. CPU: a steady_clock reading taken at record(); CUDA: a
// cudaEvent_t recorded on the stream (native()).
class TimerEvent {
 public:
  TimerEvent() = default;
  explicit TimerEvent(OwnedHandle native) noexcept : native_(std::move(native)) {}
  void* native() const noexcept { return native_.get(); }
  std::int64_t host_ns = 0;  // set by host-clock backends at record()

 private:
  OwnedHandle native_;
};

// ---------------------------------------------------------------------------
enum class Trans : bool { no = false, yes = true };

// C = alpha * op(A) * op(B) + beta * C, row-major, for `batch` matrices.
// op(A) is m x k, op(B) is k x n, C is m x n. Stored A is m x k (Trans::no) or
// k x m (Trans::yes); stored B is k x n or n x k.
// Leading dimensions are row strides of the matrices *as stored*, in elements;
// `packed` means contiguous (lda = stored cols). Batch strides are in elements
// between consecutive matrices; `packed` means the matrix size, 0 broadcasts
// the same matrix to every batch entry (A or B only).
struct GemmShape {
  static constexpr std::int64_t packed = -1;
  Trans trans_a = Trans::no;
  Trans trans_b = Trans::no;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t lda = packed;
  std::int64_t ldb = packed;
  std::int64_t ldc = packed;
  std::int64_t batch = 1;
  std::int64_t stride_a = packed;
  std::int64_t stride_b = packed;
  std::int64_t stride_c = packed;

  // The same shape with every `packed` replaced by its value.
  GemmShape resolved() const;
};

// How a quantized GEMM rounds its operands (Transformer Engine's recipes,
// fp8.hpp): one scale per operand (per-tensor current scaling) or MXFP8's
// block scales along the contraction dimension; each operand in its format
// (hybrid: E4M3 activations and weights, E5M2 gradients).
enum class QuantScaling { per_tensor, mx };
struct GemmQuantization {
  QuantScaling scaling = QuantScaling::per_tensor;
  Fp8Format a = Fp8Format::e4m3;
  Fp8Format b = Fp8Format::e4m3;
};

struct AdamConfig {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW): p -= lr * wd * p
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view name() const noexcept = 0;
  // The device, for records ("NVIDIA H100 80GB HBM3"); the backend's name
  // where it has no other.
  virtual std::string device_name() const { return std::string(name()); }
  // The dtype of activations, weights and gradients: f32 (cpu), bf16 (cuda).
  virtual DType compute_dtype() const noexcept = 0;

  // --- memory -------------------------------------------------------------
  // Uninitialised memory for `elements` values.
  DeviceBuffer alloc(std::size_t elements) { return alloc(elements, compute_dtype()); }
  DeviceBuffer alloc(std::size_t elements, DType dtype);
  // Host -> device with conversion to dst's dtype (f32 or bf16); host.size() == dst.size().
  void upload(const std::vector<float>& host, DeviceSpan dst);
  void upload_indices(const std::vector<std::int32_t>& host, DeviceSpan dst);  // dst: i32
  // Device -> host as float (waits for pending work).
  std::vector<float> download(ConstDeviceSpan src);
  // Uniform in [-scale, scale): value i = (2 * uniform01(seed, i) - 1) * scale.
  void fill_random(DeviceSpan dst, std::uint64_t seed, float scale);
  void fill(DeviceSpan dst, float value);
  // dst = src with dtype conversion (e.g. f32 master weights -> bf16); equal sizes.
  void copy(ConstDeviceSpan src, DeviceSpan dst);
  void scale(DeviceSpan x, float alpha);           // x *= alpha
  void add(DeviceSpan dst, ConstDeviceSpan src);   // dst += src
  // x[r, :] *= factors[r] for rows x cols x, f32 factors (an MoE expert's
  // activations weighted by their routing probabilities).
  void scale_rows(DeviceSpan x, ConstDeviceSpan factors, std::int64_t rows, std::int64_t cols);
  // out[r] = sum_c a[r, c] * b[r, c], out f32 (the probabilities' gradient).
  void row_dot(ConstDeviceSpan a, ConstDeviceSpan b, DeviceSpan out, std::int64_t rows, std::int64_t cols);

  // --- GEMM ---------------------------------------------------------------
  void gemm(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
            DeviceSpan c);
  // Packed single GEMM: C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C.
  void gemm(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
            float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta, DeviceSpan c);
  // The packed GEMM with op(A) and op(B) quantized first (an FP8 plan's linear
  // layers): C = alpha Q(op(A)) Q(op(B)) + beta C, accumulated in f32.
  void gemm_quantized(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                      ConstDeviceSpan a, ConstDeviceSpan b, float beta, DeviceSpan c, const GemmQuantization& q);
  // Whether the backend has FP8 GEMMs of its own (not the host emulation of
  // gemm_quantized_impl): calibrate then sweeps them (time_fp8_gemm).
  virtual bool native_fp8_gemm() const { return false; }
  // The per-call times (ns) of `calls` FP8 GEMMs C[m x n] = A[m x k] B[k x n],
  // E4M3 x E4M3 with per-tensor scales, on operands quantized once beforehand
  // (the GEMM alone), after `warmup` untimed ones; `lead_call` as calibrate's
  // GEMM sweep. ExecError where native_fp8_gemm() is false.
  virtual std::vector<double> time_fp8_gemm(std::int64_t m, std::int64_t n, std::int64_t k, int warmup, int calls,
                                            bool lead_call);
  // Packed strided batch (attention: batch = micro_batch * heads).
  void gemm_strided_batched(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n,
                            std::int64_t k, float alpha, ConstDeviceSpan a, std::int64_t stride_a,
                            ConstDeviceSpan b, std::int64_t stride_b, float beta, DeviceSpan c,
                            std::int64_t stride_c, std::int64_t batch);

  // --- normalisation (x, y, dy, dx: rows x cols; gamma, beta: cols; stats: f32 rows)
  // y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) (biased variance).
  void layernorm_forward(ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta,
                         DeviceSpan y, DeviceSpan mean, DeviceSpan rstd, std::int64_t rows,
                         std::int64_t cols, float eps);
  void layernorm_backward(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                          ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx,
                          DeviceSpan dgamma, DeviceSpan dbeta, std::int64_t rows,
                          std::int64_t cols);
  // y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps).
  void rmsnorm_forward(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y, DeviceSpan rstd,
                       std::int64_t rows, std::int64_t cols, float eps);
  void rmsnorm_backward(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                        ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma, std::int64_t rows,
                        std::int64_t cols);

  // --- attention softmax: `batch` score matrices of s x s. Row i of each is
  // softmax(scale * x[i, 0..i]) and 0 for columns > i (causal). y may alias x.
  void causal_softmax_forward(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch, std::int64_t s,
                              float scale);
  // dx = scale * y * (dy - sum_j dy_j y_j); dx may alias dy.
  void causal_softmax_backward(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx,
                               std::int64_t batch, std::int64_t s, float scale);

  // --- the fused attention core's pieces (exact attention by blocks with the
  // softmax's log-sum-exp, FlashAttention's arithmetic): `batch` score blocks
  // of nq x nk, batch index bh (micro-batch sequence x head); the statistics
  // lse and delta are f32 laid out [nq, batch] (query-major, as the context's
  // rows). `causal` (nq == nk, a diagonal block): query i sees keys 0..i.
  // scores -> P = exp(scale * x - lse) in place, 0 where masked, and lse =
  // log sum exp(scale * x) over the visible keys.
  void attention_softmax_lse(DeviceSpan scores, DeviceSpan lse, std::int64_t batch, std::int64_t nq,
                             std::int64_t nk, float scale, bool causal);
  // scores -> P = exp(scale * x - lse) in place from a given lse (the backward's recomputation).
  void attention_probs(DeviceSpan scores, ConstDeviceSpan lse, std::int64_t batch, std::int64_t nq,
                       std::int64_t nk, float scale, bool causal);
  // dp -> dS = scale * P * (dp - delta) in place (delta[i, bh] = dO . O of that query).
  void attention_softmax_grad(DeviceSpan dp, ConstDeviceSpan p, ConstDeviceSpan delta, std::int64_t batch,
                              std::int64_t nq, std::int64_t nk, float scale);
  // Merges one block's output into the running one, row by row (rows of
  // `cols`): lse' = log(e^lse + e^blk_lse), out = out e^(lse - lse') +
  // blk e^(blk_lse - lse'), lse = lse' (context parallelism's out correction).
  void attention_merge(DeviceSpan out, DeviceSpan lse, ConstDeviceSpan blk, ConstDeviceSpan blk_lse,
                       std::int64_t rows, std::int64_t cols);
  // A rows x cols block between strided matrices: dst[r * ld_dst + c] = (or +=
  // with accumulate) src[r * ld_src + c]; same dtype.
  void copy_2d(ConstDeviceSpan src, std::int64_t ld_src, DeviceSpan dst, std::int64_t ld_dst, std::int64_t rows,
               std::int64_t cols, bool accumulate);

  // --- activations ----------------------------------------------------------
  // GELU, tanh approximation (GPT-2 / Megatron's openai_gelu); elementwise, equal sizes.
  void gelu_forward(ConstDeviceSpan x, DeviceSpan y);
  void gelu_backward(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx);
  // x: rows x (2 * ffn), each row [gate | up]; y: rows x ffn; y = silu(gate) * up.
  void swiglu_forward(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows, std::int64_t ffn);
  // dx: rows x (2 * ffn), [dgate | dup].
  void swiglu_backward(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx, std::int64_t rows,
                       std::int64_t ffn);

  // --- bias, dropout, residual ---------------------------------------------
  void bias_add(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows, std::int64_t cols);  // y[r] += bias
  void bias_backward(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows, std::int64_t cols);  // dbias += colsum(dy)
  // out = residual + dropout(x): element i kept (and scaled by 1/(1-p)) iff
  // dropout_keep(seed, i, p). p = 0 is a plain residual add. out may alias residual.
  void dropout_residual_forward(ConstDeviceSpan x, ConstDeviceSpan residual, DeviceSpan out,
                                float p, std::uint64_t seed);
  // dx = dropout(dout) with the same mask (the residual's gradient is dout itself).
  void dropout_backward(ConstDeviceSpan dout, DeviceSpan dx, float p, std::uint64_t seed);

  // --- embedding and loss ---------------------------------------------------
  // ids: i32 rows; table: vocab x hidden; out: rows x hidden. An id outside
  // [0, vocab) gives a zero row (vocab-parallel shards own a slice; pass ids
  // already shifted by the shard's first id).
  void embedding_forward(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out,
                         std::int64_t rows, std::int64_t hidden);
  void embedding_backward(ConstDeviceSpan dout, ConstDeviceSpan ids, DeviceSpan dtable,
                          std::int64_t rows, std::int64_t hidden);  // dtable += scatter
  // Softmax cross-entropy over full rows of logits (rows x vocab), labels i32.
  // loss (f32, 1 element) = mean over rows of -log softmax(logits)[label];
  // dlogits = (softmax - onehot(label)) / rows. dlogits may alias logits.
  void cross_entropy(ConstDeviceSpan logits, ConstDeviceSpan labels, DeviceSpan dlogits,
                     DeviceSpan loss, std::int64_t rows, std::int64_t vocab);

  // --- optimiser ------------------------------------------------------------
  // One Adam(W) step on f32 master params with f32 m, v; grads f32 or compute dtype.
  // step counts from 1 (bias correction 1 - beta^step).
  void adam_step(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                 const AdamConfig& config, std::int64_t step);

  // --- timing and sync ------------------------------------------------------
  virtual void synchronize() = 0;
  virtual TimerEvent create_event() = 0;
  virtual void record(TimerEvent& event) = 0;  // enqueue "now"
  // Nanoseconds between two recorded events; waits for `stop`.
  virtual std::int64_t elapsed_ns(const TimerEvent& start, const TimerEvent& stop) = 0;

 protected:
  virtual DeviceBuffer alloc_impl(std::size_t elements, DType dtype) = 0;
  virtual void upload_impl(const std::vector<float>& host, DeviceSpan dst) = 0;
  virtual void upload_indices_impl(const std::vector<std::int32_t>& host, DeviceSpan dst) = 0;
  virtual std::vector<float> download_impl(ConstDeviceSpan src) = 0;
  virtual void fill_random_impl(DeviceSpan dst, std::uint64_t seed, float scale) = 0;
  virtual void fill_impl(DeviceSpan dst, float value) = 0;
  virtual void copy_impl(ConstDeviceSpan src, DeviceSpan dst) = 0;
  virtual void scale_impl(DeviceSpan x, float alpha) = 0;
  virtual void add_impl(DeviceSpan dst, ConstDeviceSpan src) = 0;
  virtual void scale_rows_impl(DeviceSpan x, ConstDeviceSpan factors, std::int64_t rows, std::int64_t cols) = 0;
  virtual void row_dot_impl(ConstDeviceSpan a, ConstDeviceSpan b, DeviceSpan out, std::int64_t rows,
                            std::int64_t cols) = 0;
  // shape is resolved() (no `packed` left) and checked against the spans.
  virtual void gemm_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                         float beta, DeviceSpan c) = 0;
  // shape is packed, single and checked. Default: each operand quantized and
  // dequantized on the host (fp8.hpp) into a buffer of its dtype, then
  // gemm_impl: the CPU backend's emulation (an f32 GEMM on FP8 values).
  virtual void gemm_quantized_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                                   float beta, DeviceSpan c, const GemmQuantization& q);
  virtual void layernorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma,
                                      ConstDeviceSpan beta, DeviceSpan y, DeviceSpan mean,
                                      DeviceSpan rstd, std::int64_t rows, std::int64_t cols,
                                      float eps) = 0;
  virtual void layernorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                       ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx,
                                       DeviceSpan dgamma, DeviceSpan dbeta, std::int64_t rows,
                                       std::int64_t cols) = 0;
  virtual void rmsnorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y,
                                    DeviceSpan rstd, std::int64_t rows, std::int64_t cols,
                                    float eps) = 0;
  virtual void rmsnorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                     ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma,
                                     std::int64_t rows, std::int64_t cols) = 0;
  virtual void causal_softmax_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch,
                                           std::int64_t s, float scale) = 0;
  virtual void causal_softmax_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx,
                                            std::int64_t batch, std::int64_t s, float scale) = 0;
  virtual void attention_softmax_lse_impl(DeviceSpan scores, DeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                          std::int64_t nk, float scale, bool causal) = 0;
  virtual void attention_probs_impl(DeviceSpan scores, ConstDeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                    std::int64_t nk, float scale, bool causal) = 0;
  virtual void attention_softmax_grad_impl(DeviceSpan dp, ConstDeviceSpan p, ConstDeviceSpan delta,
                                           std::int64_t batch, std::int64_t nq, std::int64_t nk, float scale) = 0;
  virtual void attention_merge_impl(DeviceSpan out, DeviceSpan lse, ConstDeviceSpan blk, ConstDeviceSpan blk_lse,
                                    std::int64_t rows, std::int64_t cols) = 0;
  virtual void copy_2d_impl(ConstDeviceSpan src, std::int64_t ld_src, DeviceSpan dst, std::int64_t ld_dst,
                            std::int64_t rows, std::int64_t cols, bool accumulate) = 0;
  virtual void gelu_forward_impl(ConstDeviceSpan x, DeviceSpan y) = 0;
  virtual void gelu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx) = 0;
  virtual void swiglu_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows,
                                   std::int64_t ffn) = 0;
  virtual void swiglu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx,
                                    std::int64_t rows, std::int64_t ffn) = 0;
  virtual void bias_add_impl(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows,
                             std::int64_t cols) = 0;
  virtual void bias_backward_impl(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows,
                                  std::int64_t cols) = 0;
  virtual void dropout_residual_forward_impl(ConstDeviceSpan x, ConstDeviceSpan residual,
                                             DeviceSpan out, float p, std::uint64_t seed) = 0;
  virtual void dropout_backward_impl(ConstDeviceSpan dout, DeviceSpan dx, float p,
                                     std::uint64_t seed) = 0;
  virtual void embedding_forward_impl(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out,
                                      std::int64_t rows, std::int64_t hidden) = 0;
  virtual void embedding_backward_impl(ConstDeviceSpan dout, ConstDeviceSpan ids,
                                       DeviceSpan dtable, std::int64_t rows,
                                       std::int64_t hidden) = 0;
  virtual void cross_entropy_impl(ConstDeviceSpan logits, ConstDeviceSpan labels,
                                  DeviceSpan dlogits, DeviceSpan loss, std::int64_t rows,
                                  std::int64_t vocab) = 0;
  virtual void adam_step_impl(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                              const AdamConfig& config, std::int64_t step) = 0;
};

}  // namespace cuboid::exec
