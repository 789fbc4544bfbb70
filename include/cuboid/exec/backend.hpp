#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The executor's device interface. The step runner drives a Backend (memory,
// GEMMs, the transformer's kernels, timers) and Communicators (collectives and
// p2p inside one process group) without knowing whether they are the CPU
// backend (fp32, OpenBLAS, MPI) or the CUDA one (bf16, cuBLAS, NCCL).
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
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#if defined(__CUDACC__)
#define CUBOID_HD __host__ __device__
#else
#define CUBOID_HD
#endif

namespace cuboid::exec {

class DeviceBuffer;

enum class DType : std::uint8_t { f32, bf16, i32 };
std::string_view to_string(DType d);
constexpr std::size_t dtype_bytes(DType d) { return d == DType::bf16 ? 2 : 4; }

// ---------------------------------------------------------------------------
// Deterministic counter-based randomness, shared by every backend so that the
// CPU and CUDA backends draw the same weights and dropout masks (value i of a
// stream depends only on (seed, i), not on the thread that computes it).
CUBOID_HD constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;  // splitmix64
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) with 24 random bits.
CUBOID_HD constexpr float uniform01(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(mix64(mix64(seed) + index) >> 40) * 0x1p-24f;
}
// Dropout keeps element `index` when its uniform draw is >= p.
CUBOID_HD constexpr bool dropout_keep(std::uint64_t seed, std::uint64_t index, float p) {
  return uniform01(seed, index) >= p;
}

// ---------------------------------------------------------------------------
// Views. Non-owning (pointer, element count, dtype); cheap to copy. The pointer
// is backend memory: only a backend dereferences it.
class DeviceSpan {
 public:
  DeviceSpan() = default;
  DeviceSpan(void* data, std::size_t size, DType dtype) noexcept
      : data_(data), size_(size), dtype_(dtype) {}
  DeviceSpan(DeviceBuffer& buffer) noexcept;  // NOLINT: implicit on purpose

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  // Elements [offset, offset + count); ExecError when out of range.
  DeviceSpan subspan(std::size_t offset, std::size_t count) const;
  // Elements [offset, size()).
  DeviceSpan subspan(std::size_t offset) const { return subspan(offset, size_ - std::min(offset, size_)); }
  // For backend implementations only.
  void* native() const noexcept { return data_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

class ConstDeviceSpan {
 public:
  ConstDeviceSpan() = default;
  ConstDeviceSpan(const void* data, std::size_t size, DType dtype) noexcept
      : data_(data), size_(size), dtype_(dtype) {}
  ConstDeviceSpan(DeviceSpan s) noexcept : data_(s.native()), size_(s.size()), dtype_(s.dtype()) {}
  ConstDeviceSpan(const DeviceBuffer& buffer) noexcept;  // NOLINT: implicit on purpose

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  ConstDeviceSpan subspan(std::size_t offset, std::size_t count) const;
  ConstDeviceSpan subspan(std::size_t offset) const {
    return subspan(offset, size_ - std::min(offset, size_));
  }
  const void* native() const noexcept { return data_; }

 private:
  const void* data_ = nullptr;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

// A move-only owner of one backend resource (memory, an event). The deleter is
// a plain function plus a context pointer (e.g. the backend's allocator).
class OwnedHandle {
 public:
  using Deleter = void (*)(void* handle, void* context) noexcept;
  OwnedHandle() = default;
  OwnedHandle(void* handle, Deleter deleter, void* context) noexcept
      : handle_(handle), deleter_(deleter), context_(context) {}
  ~OwnedHandle() { reset(); }
  OwnedHandle(OwnedHandle&& other) noexcept;
  OwnedHandle& operator=(OwnedHandle&& other) noexcept;
  OwnedHandle(const OwnedHandle&) = delete;
  OwnedHandle& operator=(const OwnedHandle&) = delete;

  void* get() const noexcept { return handle_; }
  void reset() noexcept;

 private:
  void* handle_ = nullptr;
  Deleter deleter_ = nullptr;
  void* context_ = nullptr;
};

// Backend memory: `size()` elements of `dtype()`. Move-only; freed by the
// backend that allocated it (which must outlive it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(OwnedHandle memory, std::size_t size, DType dtype) noexcept
      : memory_(std::move(memory)), size_(size), dtype_(dtype) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * dtype_bytes(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return size_ == 0; }
  DeviceSpan span() noexcept { return {memory_.get(), size_, dtype_}; }
  ConstDeviceSpan span() const noexcept { return {memory_.get(), size_, dtype_}; }
  DeviceSpan subspan(std::size_t offset, std::size_t count) { return span().subspan(offset, count); }
  ConstDeviceSpan subspan(std::size_t offset, std::size_t count) const {
    return span().subspan(offset, count);
  }
  // Elements [offset, size()).
  DeviceSpan subspan(std::size_t offset) { return span().subspan(offset); }
  ConstDeviceSpan subspan(std::size_t offset) const { return span().subspan(offset); }
  void* native() const noexcept { return memory_.get(); }  // for backends only

 private:
  OwnedHandle memory_;
  std::size_t size_ = 0;
  DType dtype_ = DType::f32;
};

inline DeviceSpan::DeviceSpan(DeviceBuffer& b) noexcept
    : data_(b.native()), size_(b.size()), dtype_(b.dtype()) {}
inline ConstDeviceSpan::ConstDeviceSpan(const DeviceBuffer& b) noexcept
    : data_(b.native()), size_(b.size()), dtype_(b.dtype()) {}

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

  // --- GEMM ---------------------------------------------------------------
  void gemm(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
            DeviceSpan c);
  // Packed single GEMM: C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C.
  void gemm(Trans trans_a, Trans trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
            float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta, DeviceSpan c);
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
  // shape is resolved() (no `packed` left) and checked against the spans.
  virtual void gemm_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                         float beta, DeviceSpan c) = 0;
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

// ---------------------------------------------------------------------------
// A non-blocking send or receive in flight (Communicator::isend / irecv).
// Move-only through its owner (std::unique_ptr); destroying one that has not
// been waited for gives up on it (MPI: cancels a receive).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  CommRequest() = default;
  CommRequest(const CommRequest&) = delete;
  CommRequest& operator=(const CommRequest&) = delete;

  // Completes the transfer for what the caller does next: afterwards a sent
  // buffer may be overwritten and a received one read by work enqueued on the
  // backend. MPI: the host waits (MPI_Wait). NCCL: the compute stream waits
  // for the transfer; the host does not.
  virtual void wait() = 0;
  // True when the transfer has finished (wait() has nothing left to wait for).
  virtual bool test() = 0;
};

// ---------------------------------------------------------------------------
// A process group: collectives and point-to-point inside it. Ranks and peers
// are ranks *in this communicator*. Counts are elements of the spans' dtype.
// Implementations are move-only owners of the library handle (MPI_Comm,
// ncclComm_t). Calls on one communicator must be issued in the same order on
// every member; p2p between a pair is matched in issue order (NCCL has no
// tags: `tag` is checked by MPI and ignored by NCCL).
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string_view kind() const noexcept = 0;  // "mpi", "nccl"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  // In place: buffer[0, count) = sum over ranks.
  void all_reduce_sum(DeviceSpan buffer, std::size_t count);
  // send holds size() * recv_count elements; rank r receives the sum of block r.
  void reduce_scatter_sum(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count);
  // recv holds size() * send_count elements, block r from rank r.
  void all_gather(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count);
  void broadcast(DeviceSpan buffer, std::size_t count, int root);
  void send(ConstDeviceSpan buffer, std::size_t count, int peer, int tag);
  void recv(DeviceSpan buffer, std::size_t count, int peer, int tag);
  // Send and receive at once (no deadlock when two stages exchange, as in 1F1B).
  void send_recv(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                 DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer, int tag);
  // Non-blocking point-to-point: starts the transfer after the work already
  // enqueued on the backend and returns at once; the buffer must stay valid
  // and untouched until the request's wait(). A pipeline stage posts its sends
  // and receives with these so that no order of a schedule deadlocks two
  // stages that send to each other. NCCL runs p2p on one stream in issue
  // order, so it holds a send back until the next irecv (or wait) on this
  // communicator and issues them as one ncclGroupStart/End, Megatron's
  // batched send/recv pairs.
  std::unique_ptr<CommRequest> isend(ConstDeviceSpan buffer, std::size_t count, int peer, int tag);
  std::unique_ptr<CommRequest> irecv(DeviceSpan buffer, std::size_t count, int peer, int tag);
  virtual void barrier() = 0;
  // Ends every process of the job (MPI_Abort / ncclCommAbort then abort).
  [[noreturn]] virtual void abort(std::string_view message) = 0;
  // Collective over this communicator: members with the same color (>= 0)
  // form a new communicator, ordered by (key, old rank). A negative color
  // joins no group and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

 protected:
  virtual void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) = 0;
  virtual void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv,
                                       std::size_t recv_count) = 0;
  virtual void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) = 0;
  virtual void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) = 0;
  virtual void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
  virtual void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                              DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer,
                              int tag) = 0;
  virtual std::unique_ptr<CommRequest> isend_impl(ConstDeviceSpan buffer, std::size_t count, int peer,
                                                  int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) = 0;
};

// ---------------------------------------------------------------------------
// Registry. "cpu" always; "cuda" when built with the gpu feature (the CUDA
// backend defines `std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&)`).
struct BackendOptions {
  int device = 0;  // CUDA device ordinal (usually LOCAL_RANK); ignored by cpu
  // cpu: OpenBLAS threads per rank (0 = OpenBLAS's default, all cores; with
  // several ranks per node pass cores / ranks to avoid oversubscription).
  int threads = 0;
};

struct BackendInfo {
  std::string name;
  std::string description;
};

// The backends this build has, for `--backend` help and `cuboid list backends`.
std::vector<BackendInfo> backend_list();
// Throws InputError (field "--backend", listing the choices) for an unknown name.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace cuboid::exec
