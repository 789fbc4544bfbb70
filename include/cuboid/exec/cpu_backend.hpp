#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// The CPU backend: f32 host memory, OpenBLAS GEMMs (cblas_sgemm; strided batch
// as a loop), the transformer kernels as plain loops the compiler vectorises,
// steady_clock timers. The reference the CUDA backend is checked against.
#include <memory>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/registry.hpp"

namespace cuboid::exec {

class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;

  std::string_view name() const noexcept override { return "cpu"; }
  DType compute_dtype() const noexcept override { return DType::f32; }

  void synchronize() override {}
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
  void gemm_impl(const GemmShape& shape, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                 float beta, DeviceSpan c) override;
  void layernorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta,
                              DeviceSpan y, DeviceSpan mean, DeviceSpan rstd, std::int64_t rows,
                              std::int64_t cols, float eps) override;
  void layernorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                               ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx,
                               DeviceSpan dgamma, DeviceSpan dbeta, std::int64_t rows,
                               std::int64_t cols) override;
  void rmsnorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y,
                            DeviceSpan rstd, std::int64_t rows, std::int64_t cols,
                            float eps) override;
  void rmsnorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                             ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma,
                             std::int64_t rows, std::int64_t cols) override;
  void causal_softmax_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch,
                                   std::int64_t s, float scale) override;
  void causal_softmax_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx,
                                    std::int64_t batch, std::int64_t s, float scale) override;
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
  void swiglu_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows,
                           std::int64_t ffn) override;
  void swiglu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx,
                            std::int64_t rows, std::int64_t ffn) override;
  void bias_add_impl(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows,
                     std::int64_t cols) override;
  void bias_backward_impl(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows,
                          std::int64_t cols) override;
  void dropout_residual_forward_impl(ConstDeviceSpan x, ConstDeviceSpan residual, DeviceSpan out,
                                     float p, std::uint64_t seed) override;
  void dropout_backward_impl(ConstDeviceSpan dout, DeviceSpan dx, float p,
                             std::uint64_t seed) override;
  void embedding_forward_impl(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out,
                              std::int64_t rows, std::int64_t hidden) override;
  void embedding_backward_impl(ConstDeviceSpan dout, ConstDeviceSpan ids, DeviceSpan dtable,
                               std::int64_t rows, std::int64_t hidden) override;
  void cross_entropy_impl(ConstDeviceSpan logits, ConstDeviceSpan labels, DeviceSpan dlogits,
                          DeviceSpan loss, std::int64_t rows, std::int64_t vocab) override;
  void adam_step_impl(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                      const AdamConfig& config, std::int64_t step) override;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace cuboid::exec
