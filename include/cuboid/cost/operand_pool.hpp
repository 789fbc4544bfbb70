#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// The step's working set per rank and the operand pool a calibrated CPU card
// measured its GEMMs and kernels in: `cuboid calibrate` sizes its sweeps'
// pools from the plans it is given, and a card calibrated on plans of
// different working sets carries one set of tables per pool
// (Calibration::other_pools); a plan is priced from the pool nearest its own.
#include <cstddef>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"

namespace cuboid {

// The bytes one rank of `plan` touches between two uses of the same weight
// in a step, as the executor holds them: the peak stage's weights in the
// backend's element size (`element_bytes`) and their fp32 gradients, plus
// the activations its schedule keeps in flight (memory_per_gpu's, which
// counts 2-byte elements, scaled to `element_bytes`). The optimizer states
// are left out: a step touches them once, after the last backward. The GEMM
// sweep rotates its operands over a pool of this size, so that a sample
// finds its operands as cached as the step's GEMMs find theirs.
double step_working_set_bytes(const ModelSpec& model, const ParallelPlan& plan, const GpuProfile& gpu,
                              int element_bytes);
// What the whole step touches per rank: the working set plus the Adam
// moments (fp32 m and v) the optimizer streams through after the backward.
// The once-per-step work (the optimizer's kernels, the data-parallel
// collectives) finds its buffers after this much has passed.
double step_memory_bytes(const ModelSpec& model, const ParallelPlan& plan, const GpuProfile& gpu, int element_bytes);

// A footprint as a sweep's pool: times `ranks_per_core` (the ranks sharing a
// core share its caches), between 1 MiB and 512 MiB (64 MiB for
// `calibrate --quick`).
std::size_t operand_pool_bytes(double footprint_bytes, double ranks_per_core, bool quick = false);

// The topology whose calibration tables a plan is priced from: `topo` itself
// unless its card has several operand pools; then the pool nearest the
// plan's own (its step working set in the card's activation element size,
// as operand_pool_bytes clamps it). The estimator, the simulator and
// `cuboid validate` call it where they start pricing a plan.
const Topology& topology_for_plan(const Topology& topo, const ModelSpec& model, const ParallelPlan& plan);

}  // namespace cuboid
