#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// The memory-bound kernel microbenchmark of `cuboid calibrate`. It runs the
// executor's own transformer layer (exec::LayerRunner, forward then backward)
// at the plan's size and at scaled token counts, and keeps the per-call times
// of its memory-bound ops (norms, activation, dropout-add, softmax and their
// backward) — so each op name is timed on exactly the kernel the executor runs
// for it, with the operands a step gives it, and no second op-name -> kernel
// table exists. `bytes` is the workload's Op::bytes for the scaled plan (the
// calibration's convention); executor-only ops the workload does not know
// (e.g. residual_add_bwd) are dropped. The same layer's dense GEMMs are kept
// too, keyed by shape (LayerSweep::gemms): the GEMM sweep's rotating pool
// stands for shapes no layer ran.
#include <string>
#include <vector>

#include "cuboid/core/calibration.hpp"
#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/exec/moe.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid::exec {
class Watchdog;
}

namespace cuboid::calibrate {

struct KernelMeasurement {
  std::string name;    // workload op name ("norm_in", "act_bwd", ...)
  double bytes = 0;    // workload Op::bytes at this size
  double time_ns = 0;  // this rank's median (or fastest) per call
};

struct KernelSweepOptions {
  bool quick = false;
  int warmup_steps = 1;
  int measured_steps = 7;  // layer forward + backward passes per size
  // The optimizer sweep runs in turns like the GEMM sweep (core_share.hpp).
  // The layer sweep does not need them: its TP collectives make the ranks of
  // a core take turns already (the executor's waits yield the core).
  int turns = 1;
  int turn = 0;
  // The optimizer sweep's kernels find their buffers as the step leaves them
  // (step_cache.hpp): this many bytes written before each timed call; 0: hot.
  std::size_t step_memory_bytes = 0;
};

// GemmSample::source of a GEMM timed inside the executor's layer.
inline constexpr const char* kTimedInLayer = "timed in the executor's layer";

struct LayerSweep {
  std::vector<KernelMeasurement> kernels;
  // The layer's dense GEMMs (qkv, proj, fc1, fc2, the unfused attention's
  // batched GEMMs, and their dgrad / wgrad) at each size, keyed by the
  // shape they ran at, timed as the step runs them: between the layer's
  // other ops, on operands the op before wrote, with `depth` layers'
  // weights cycling through the caches.
  std::vector<GemmSample> gemms;
};

// `tp` is the rank's TP group (null or size 1 for TP 1), `ep` its EP group
// for an MoE model (null without EP); every member of the world calls this
// with the same plan (the layer's TP collectives and EP all-to-alls run). An
// MoE model's layer is an MoE layer (its router, permutation and expert
// kernels). At each size it also times "embed_grad" (the embedding's
// backward, Backend::embedding_backward into the rank's vocabulary shard)
// alone on its core, keyed by the workload's bytes for it.
LayerSweep run_kernel_sweep(exec::Backend& backend, exec::Communicator* tp, exec::Communicator& world,
                            const ModelSpec& model, const ParallelPlan& plan, const KernelSweepOptions& options,
                            exec::Watchdog* watchdog, exec::Communicator* ep = nullptr,
                            exec::Communicator* cp = nullptr, const exec::FlexGroups* flex = nullptr);

// The optimizer step ("adam": Backend::adam_step on f32 master weights and
// moments with compute-dtype gradients, as the step runner calls it) on this
// rank's parameter shard of the plan and x1/4 .. x4 of it (quick: x1/2 .. x2).
// bytes = parameters x cuboid::kAdamBytesPerParam (28: the estimator's and
// simulator's Adam traffic per parameter, optimizer_step.hpp), so the cost
// model prices "adam" in its own convention. At the same element counts, the
// f32 gradient buffer's "grad_scale" (Backend::scale) and "grad_zero"
// (Backend::fill), keyed like "adam" by optimizer_step_ops' bytes (8 and 4
// per element). Each kernel is timed alone on its core (turns).
std::vector<KernelMeasurement> run_optimizer_sweep(exec::Backend& backend, exec::Communicator& world,
                                                   const ModelSpec& model, const ParallelPlan& plan,
                                                   const KernelSweepOptions& options, exec::Watchdog* watchdog);

}  // namespace cuboid::calibrate
