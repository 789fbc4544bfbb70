#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// What `cuboid calibrate` measures, derived from the plans it is given (pure
// functions, no device): the GEMM shapes the plans' workloads run and a grid
// around them, the memory-bound kernels at scaled sizes, the collective sizes,
// and the process-group shapes (group size and tier) the plans' collectives use.
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/operand_pool.hpp"

namespace cuboid::calibrate {

// One GEMM problem per call: C[m x n] = A[m x k] B[k x n], `batch` times.
struct GemmProblem {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  auto operator<=>(const GemmProblem&) const = default;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
           static_cast<double>(batch);
  }
};

// The workload of one rank of `plan` as the executor runs it: the layer's
// forward, backward and recompute ops plus the embedding and LM head. The
// executor computes attention unfused whatever the plan says, so the ops are
// those of the plan with flash attention off (attn_qk, attn_softmax, attn_av).
std::vector<Op> executor_workload_ops(const ModelSpec& model, const ParallelPlan& plan);

// The distinct GEMM shapes of executor_workload_ops, sorted.
std::vector<GemmProblem> plan_gemm_problems(const ModelSpec& model, const ParallelPlan& plan);

// step_working_set_bytes and step_memory_bytes: cost/operand_pool.hpp.


// `base` plus, for each shape, every combination of m, n, k (and batch when
// it is > 1) times {1/2, 1, 2}, so that any shape near a measured one lies
// inside a measured box and interpolates. Dimensions never fall below 1;
// sorted and deduplicated. `quick` keeps only the shapes and their 2x corner
// (enough for a smoke test).
std::vector<GemmProblem> gemm_grid(const std::vector<GemmProblem>& base, bool quick);

// Sizes min_bytes, min_bytes * factor, ... up to and including the largest
// one <= max_bytes (and max_bytes itself when it is not on the ladder).
// InputError(source "command line", field) when min > max or factor <= 1.
std::vector<std::int64_t> size_ladder(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor,
                                      const std::string& field);

// One size of the memory-bound kernel sweep: the plan run with this
// micro-batch and sequence length.
struct KernelScale {
  int micro_batch = 1;
  std::int64_t seq_length = 0;
};
// The plan's (micro_batch, seq) and scaled variants with tokens x{1/4, 1/2, 1, 2, 4}
// (quick: x{1/2, 1, 2}). Below 1x the sequence is shortened (keeping it a
// multiple of TP with sequence parallelism); above, the micro-batch grows.
std::vector<KernelScale> kernel_scales(const ParallelPlan& plan, std::int64_t seq_length, bool quick);

// A process-group shape the plan's collectives run on.
// The flex dispatcher's legs of an EP group: its ranks on one node (the
// intra-node leg, DeepEP's NVLink forwarding) and those of one local index
// across the nodes (the inter-node leg, one rail's RDMA).
enum class FlexLeg { none, intra, rail };
struct GroupShape {
  Group group = Group::tp;
  int size = 0;
  std::string tier;  // "intra_node" when every group of this kind stays on one node
  FlexLeg leg = FlexLeg::none;
  auto operator<=>(const GroupShape&) const = default;
};
// The TP, PP and DP groups of the plan with more than one rank, from its rank
// mapping on nodes of `gpus_per_node` ranks; with the flex dispatcher and an
// EP group over several nodes also its legs (each with more than one rank):
// the intra-node leg's tables price the forwarding, the inter-node leg's the
// deduplicated tokens between nodes.
std::vector<GroupShape> plan_group_shapes(const ParallelPlan& plan, int gpus_per_node);

}  // namespace cuboid::calibrate
