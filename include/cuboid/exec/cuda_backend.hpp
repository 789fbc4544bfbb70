#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The CUDA backend: bf16 device memory (stream-ordered allocator), cuBLAS
// GEMMs with bf16 inputs and fp32 accumulation (CUBLAS_COMPUTE_32F), the
// transformer kernels of kernels/*.cu, CUDA events for timing. Its
// communicator is NcclCommunicator (nccl_comm.hpp).
//
// Every CUDA and cuBLAS call goes through CUBOID_CUDA_CHECK or
// CUBOID_CUBLAS_CHECK, which throw ExecError with the call, the library's
// error string, the rank, and the file and line.
//
// Only built with the `gpu` feature, into the module cuboid-cuda.so
// (src/exec/cuda_module.hpp).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/registry.hpp"

namespace cuboid::exec {

// Throw ExecError for a failed call; `call` is the checked expression (the
// op is its function name). Use through the macros below.
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line);

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

using CudaStream = UniqueCudaHandle<cudaStream_t, StreamTraits>;
using CudaEvent = UniqueCudaHandle<cudaEvent_t, EventTraits>;
using CublasHandle = UniqueCudaHandle<cublasHandle_t, CublasTraits>;

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
  std::string device_name() const override { return info_.name; }
  const CudaDeviceInfo& device_info() const noexcept { return info_; }
  // The compute stream: every Backend call is enqueued here.
  cudaStream_t stream() const noexcept { return stream_.get(); }

  void synchronize() override;
  bool native_fp8_gemm() const override;  // compute capability 8.9 or more
  std::vector<double> time_fp8_gemm(std::int64_t m, std::int64_t n, std::int64_t k, int warmup, int calls,
                                    bool lead_call) override;
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
  void scale_rows_impl(DeviceSpan x, ConstDeviceSpan factors, std::int64_t rows, std::int64_t cols) override;
  void row_dot_impl(ConstDeviceSpan a, ConstDeviceSpan b, DeviceSpan out, std::int64_t rows,
                    std::int64_t cols) override;
  // Per-tensor FP8 through cuBLASLt (E4M3 / E5M2 operands, their scale_inv
  // as the A / B scale pointers, f32 accumulation); MXFP8 through the host
  // emulation of Backend (cuBLASLt's block-scaled FP8 needs Blackwell).
  void gemm_quantized_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                           DeviceSpan c, const GemmQuantization& q) override;
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
  void attention_softmax_lse_impl(DeviceSpan scores, DeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                  std::int64_t nk, float scale, bool causal) override;
  void attention_probs_impl(DeviceSpan scores, ConstDeviceSpan lse, std::int64_t batch, std::int64_t nq,
                            std::int64_t nk, float scale, bool causal) override;
  void attention_softmax_grad_impl(DeviceSpan dp, ConstDeviceSpan p, ConstDeviceSpan delta, std::int64_t batch,
                                   std::int64_t nq, std::int64_t nk, float scale) override;
  void attention_merge_impl(DeviceSpan out, DeviceSpan lse, ConstDeviceSpan blk, ConstDeviceSpan blk_lse,
                            std::int64_t rows, std::int64_t cols) override;
  void copy_2d_impl(ConstDeviceSpan src, std::int64_t ld_src, DeviceSpan dst, std::int64_t ld_dst, std::int64_t rows,
                    std::int64_t cols, bool accumulate) override;
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
  void* cublas_workspace_ = nullptr;  // cudaMalloc'd; freed in ~CudaBackend (cuBLAS and cuBLASLt share it, one stream)
  cublasLtHandle_t cublas_lt_ = nullptr;  // FP8 GEMMs; destroyed in ~CudaBackend
  DeviceBuffer scratch_;              // last: freed (on stream_) before the stream goes
};

// The module's backend (cuda/module.cpp), which make_backend loads for "cuda".
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace cuboid::exec
