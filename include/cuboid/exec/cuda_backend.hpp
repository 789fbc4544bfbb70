#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The CUDA backend: bf16 device memory (stream-ordered allocator), cuBLAS
// GEMMs with bf16 inputs and fp32 accumulation (CUBLAS_COMPUTE_32F), the
// transformer kernels of kernels/*.cu, CUDA events for timing; and the NCCL
// communicator, whose collectives and p2p run on their own stream, ordered
// against the compute stream with events the way a trainer does it.
//
// Every CUDA, cuBLAS and NCCL call goes through CUBOID_CUDA_CHECK,
// CUBOID_CUBLAS_CHECK or CUBOID_NCCL_CHECK, which throw ExecError with the
// call, the library's error string, the rank, and the file and line.
//
// Only built with the `gpu` feature (CUBOID_EXEC_HAVE_CUDA).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

// Throw ExecError for a failed call; `call` is the checked expression (the
// op is its function name). Use through the macros below.
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line);

}  // namespace cuboid::exec

#define CUBOID_CUDA_CHECK(call)                                                    \
  do {                                                                             \
    const cudaError_t cuboid_cuda_rc_ = (call);                                    \
    if (cuboid_cuda_rc_ != cudaSuccess) {                                          \
      ::cuboid::exec::throw_cuda_error(cuboid_cuda_rc_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

#define CUBOID_CUBLAS_CHECK(call)                                                      \
  do {                                                                                 \
    const cublasStatus_t cuboid_cublas_rc_ = (call);                                   \
    if (cuboid_cublas_rc_ != CUBLAS_STATUS_SUCCESS) {                                  \
      ::cuboid::exec::throw_cublas_error(cuboid_cublas_rc_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#define CUBOID_NCCL_CHECK(call)                                                    \
  do {                                                                             \
    const ncclResult_t cuboid_nccl_rc_ = (call);                                   \
    if (cuboid_nccl_rc_ != ncclSuccess) {                                          \
      ::cuboid::exec::throw_nccl_error(cuboid_nccl_rc_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

namespace cuboid::exec {

// ---------------------------------------------------------------------------
// Move-only owners of one library handle each. The handle is released in the
// destructor; errors there are ignored (a destructor must not throw, and the
// process is usually ending).
template <typename Handle, typename Traits>
class UniqueCudaHandle {
 public:
  UniqueCudaHandle() = default;
  explicit UniqueCudaHandle(Handle h) noexcept : handle_(h) {}
  ~UniqueCudaHandle() { reset(); }
  UniqueCudaHandle(UniqueCudaHandle&& other) noexcept : handle_(std::exchange(other.handle_, Handle{})) {}
  UniqueCudaHandle& operator=(UniqueCudaHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  UniqueCudaHandle(const UniqueCudaHandle&) = delete;
  UniqueCudaHandle& operator=(const UniqueCudaHandle&) = delete;

  Handle get() const noexcept { return handle_; }
  explicit operator bool() const noexcept { return handle_ != Handle{}; }
  Handle release() noexcept { return std::exchange(handle_, Handle{}); }
  void reset() noexcept {
    if (handle_ != Handle{}) Traits::destroy(handle_);
    handle_ = Handle{};
  }

 private:
  Handle handle_{};
};

struct StreamTraits {
  static void destroy(cudaStream_t s) noexcept { (void)cudaStreamDestroy(s); }
};
struct EventTraits {
  static void destroy(cudaEvent_t e) noexcept { (void)cudaEventDestroy(e); }
};
struct CublasTraits {
  static void destroy(cublasHandle_t h) noexcept { (void)cublasDestroy(h); }
};
struct NcclCommTraits {
  static void destroy(ncclComm_t c) noexcept { (void)ncclCommDestroy(c); }
};

using CudaStream = UniqueCudaHandle<cudaStream_t, StreamTraits>;
using CudaEvent = UniqueCudaHandle<cudaEvent_t, EventTraits>;
using CublasHandle = UniqueCudaHandle<cublasHandle_t, CublasTraits>;
using NcclComm = UniqueCudaHandle<ncclComm_t, NcclCommTraits>;

// A non-blocking stream (no implicit sync with the legacy default stream).
CudaStream make_stream();
// An event for ordering only (timing disabled: cheaper to record and wait on).
CudaEvent make_sync_event();

// ---------------------------------------------------------------------------
// What the device is, for messages and for "achieved vs peak" tables.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  std::size_t memory_bytes = 0;
};

// The number of CUDA devices, 0 when there is no GPU or no driver (never throws).
int cuda_device_count() noexcept;

class CudaBackend final : public Backend {
 public:
  // Makes `device` current on the calling thread and creates the stream, the
  // cuBLAS handle and its workspace. ExecError when the device is missing.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;

  std::string_view name() const noexcept override { return "cuda"; }
  DType compute_dtype() const noexcept override { return DType::bf16; }
  const CudaDeviceInfo& device_info() const noexcept { return info_; }
  // The compute stream: every Backend call is enqueued here.
  cudaStream_t stream() const noexcept { return stream_.get(); }

  void synchronize() override;
  TimerEvent create_event() override;
  void record(TimerEvent& event) override;
  std::int64_t elapsed_ns(const TimerEvent& start, const TimerEvent& stop) override;

 protected:
  DeviceBuffer alloc_impl(std::size_t elements, DType dtype) override;
  void upload_impl(const std::vector<float>& host, DeviceSpan dst) override;
  void upload_indices_impl(const std::vector<std::int32_t>& host, DeviceSpan dst) override;
  std::vector<float> download_impl(ConstDeviceSpan src) override;
  void fill_random_impl(DeviceSpan dst, std::uint64_t seed, float scale) override;
  void fill_impl(DeviceSpan dst, float value) override;
  void copy_impl(ConstDeviceSpan src, DeviceSpan dst) override;
  void scale_impl(DeviceSpan x, float alpha) override;
  void add_impl(DeviceSpan dst, ConstDeviceSpan src) override;
  void gemm_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                 DeviceSpan c) override;
  void layernorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta, DeviceSpan y,
                              DeviceSpan mean, DeviceSpan rstd, std::int64_t rows, std::int64_t cols,
                              float eps) override;
  void layernorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                               ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma,
                               DeviceSpan dbeta, std::int64_t rows, std::int64_t cols) override;
  void rmsnorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y, DeviceSpan rstd,
                            std::int64_t rows, std::int64_t cols, float eps) override;
  void rmsnorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan rstd,
                             DeviceSpan dx, DeviceSpan dgamma, std::int64_t rows, std::int64_t cols) override;
  void causal_softmax_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch, std::int64_t s,
                                   float scale) override;
  void causal_softmax_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx, std::int64_t batch,
                                    std::int64_t s, float scale) override;
  void gelu_forward_impl(ConstDeviceSpan x, DeviceSpan y) override;
  void gelu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx) override;
  void swiglu_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows, std::int64_t ffn) override;
  void swiglu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx, std::int64_t rows,
                            std::int64_t ffn) override;
  void bias_add_impl(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows, std::int64_t cols) override;
  void bias_backward_impl(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows, std::int64_t cols) override;
  void dropout_residual_forward_impl(ConstDeviceSpan x, ConstDeviceSpan residual, DeviceSpan out, float p,
                                     std::uint64_t seed) override;
  void dropout_backward_impl(ConstDeviceSpan dout, DeviceSpan dx, float p, std::uint64_t seed) override;
  void embedding_forward_impl(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out, std::int64_t rows,
                              std::int64_t hidden) override;
  void embedding_backward_impl(ConstDeviceSpan dout, ConstDeviceSpan ids, DeviceSpan dtable, std::int64_t rows,
                               std::int64_t hidden) override;
  void cross_entropy_impl(ConstDeviceSpan logits, ConstDeviceSpan labels, DeviceSpan dlogits, DeviceSpan loss,
                          std::int64_t rows, std::int64_t vocab) override;
  void adam_step_impl(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                      const AdamConfig& config, std::int64_t step) override;

 private:
  static void free_memory(void* ptr, void* backend) noexcept;
  // A float scratch buffer of at least `elements` (cross-entropy's row losses).
  float* scratch_floats(std::size_t elements);

  CudaDeviceInfo info_;
  CudaStream stream_;
  CublasHandle cublas_;
  void* cublas_workspace_ = nullptr;  // cudaMalloc'd; freed in ~CudaBackend
  DeviceBuffer scratch_;              // last: freed (on stream_) before the stream goes
};

// Registered as "cuda" by make_backend (backend.cpp).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// ---------------------------------------------------------------------------
// NCCL. Rank 0 of a new world calls nccl_unique_id() and the launcher hands
// the bytes to every rank (MPI_Bcast, or the torchrun store); then every rank
// calls make_nccl_world with them.
struct NcclUniqueId {
  std::array<char, 128> bytes{};  // NCCL_UNIQUE_ID_BYTES
};
NcclUniqueId nccl_unique_id();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the `size` processes that pass the same id. Uses the
  // backend's device and orders every call after the work already enqueued on
  // its compute stream (and the compute stream's later work after the call).
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, CudaBackend& backend);
  ~NcclCommunicator() override;

  std::string_view kind() const noexcept override { return "nccl"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void barrier() override;
  [[noreturn]] void abort(std::string_view message) override;
  // ncclCommSplit; nullptr for color < 0 (NCCL_SPLIT_NOCOLOR).
  std::unique_ptr<Communicator> split(int color, int key) override;

  cudaStream_t comm_stream() const noexcept { return comm_stream_.get(); }
  // Issues the sends isend() has held back, as one group (see isend_impl).
  // Called by irecv, every other op on this communicator, and a send's wait().
  void issue_pending_sends();

 protected:
  void all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) override;
  void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count) override;
  void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) override;
  void broadcast_impl(DeviceSpan buffer, std::size_t count, int root) override;
  void send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) override;
  void send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer, DeviceSpan recv_buffer,
                      std::size_t recv_count, int recv_peer, int tag) override;
  // NCCL runs a communicator's p2p in issue order on one stream, and a send
  // blocks its stream until the peer's receive runs: two stages that each
  // send before they receive would wait for each other. So isend only queues
  // the send (with an event marking its data ready on the compute stream) and
  // the next irecv issues every queued send with the receive in one
  // ncclGroupStart/End, which NCCL progresses together (Megatron's
  // send_forward_recv_backward pairs). A request's wait() makes the compute
  // stream wait for its group.
  std::unique_ptr<CommRequest> isend_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) override;

 private:
  // Shared by a request and the communicator: null until the op is issued,
  // then the event recorded on the comm stream after its group.
  struct P2pState {
    std::shared_ptr<CudaEvent> done;
  };
  struct PendingSend {
    ConstDeviceSpan buffer;
    std::size_t count = 0;
    int peer = 0;
    CudaEvent ready;  // recorded on the compute stream at isend()
    std::shared_ptr<P2pState> state;
  };
  struct PendingRecv {
    DeviceSpan buffer;
    std::size_t count = 0;
    int peer = 0;
    std::shared_ptr<P2pState> state;
  };
  class Request;
  NcclCommunicator(NcclComm comm, CudaBackend& backend);
  // One group: the queued sends and (when given) one receive.
  void issue_p2p(const PendingRecv* recv);
  // Makes the comm stream wait for the compute stream, runs `enqueue` (the
  // NCCL calls) on the comm stream, then makes the compute stream wait for it.
  template <typename Enqueue>
  void on_comm_stream(Enqueue&& enqueue);

  CudaBackend* backend_;
  NcclComm comm_;
  CudaStream comm_stream_;
  CudaEvent compute_ready_;
  CudaEvent comm_done_;
  DeviceBuffer barrier_word_;  // one f32 all-reduced by barrier()
  std::vector<PendingSend> pending_sends_;
  int rank_ = 0;
  int size_ = 1;
};

std::unique_ptr<Communicator> make_nccl_world(const NcclUniqueId& id, int rank, int size, CudaBackend& backend);

}  // namespace cuboid::exec
