#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// The discrete-event simulator of one training iteration: the plan's pipeline
// schedule played on per-GPU streams (compute, TP, PP forward / backward, DP)
// of the engine (engine.hpp), with every TP collective, PP send/recv, DP
// gradient reduction and ZeRO gather as flows over the cluster's links
// (network.hpp, collective.hpp). Returns the same Estimate as the analytical
// estimator (simulated = true), plus what only a simulation knows.
//
// Symmetry: one GPU per pipeline stage is simulated (TP rank 0 of DP replica
// 0, or of the straggler's replica). Its TP ranks and the other DP replicas
// run the same work at the same time; their collectives and p2p messages are
// added as mirrors, so they load the links they would really use. With a GPU
// speed spread (GpuProfile::speed_spread) the simulated GPU computes at the
// pace of the slowest of the tp x dp GPUs it stands for, drawn per stage
// from a fixed stratum (stage_spread_factors, cost/speed_spread.hpp).
//
// Breakdown (seconds on the critical path; sums to iteration_time_s): on the
// GPU that finishes the iteration last, every instant of [0, T] is given to
// one class, the first of optimizer, compute, TP, PP, DP that is busy on one
// of its streams then; an instant with none busy is bubble. Communication is
// thus counted only where it is exposed (no compute runs under it), and
// waiting for another stage is bubble.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/sim/timeline.hpp"

namespace cuboid::sim {

// One slow GPU (thermal throttling, a bad HBM stack): its compute kernels
// take `slowdown` times longer. Its TP group, stage and DP replica wait for it.
struct Straggler {
  int rank = 0;
  double slowdown = 1.0;
};

struct SimOptions {
  // Megatron's overlap of TP communication in the backward of column-
  // parallel layers (QKV, FC1, LM head): the input-gradient all-reduce (or,
  // with SP, the re-gather of the input and the reduce-scatter) runs under
  // the dgrad / wgrad GEMMs. Megatron's default (async_tensor_model_parallel_
  // allreduce / sequence parallelism); every other TP collective blocks.
  bool tp_backward_overlap = true;
  // Chrome trace (empty: none). Ranks to write (empty: one simulated GPU per
  // stage); a rank that is not simulated shows its stage's simulated GPU,
  // which it is identical to by symmetry.
  std::filesystem::path trace_path;
  std::vector<int> trace_ranks;
  bool trace_per_rank = false;  // one file per rank ("out.rank0.json"), with distributedInfo
  bool trace_ops = true;        // nest each kernel inside its compute segment
  // Keep the iteration's timeline (SimResult::timeline): every stage is then
  // played op by op as a traced one, with the same results.
  bool timeline = false;
  std::optional<Straggler> straggler;
  // Rail folding (Network::fold_rails): when the fabric is rail-symmetric, TP
  // fills the node on its own rail-aligned GPUs (TP rank t on local GPU t) and
  // TP traffic stays off the shared network, every collective's mirrors cover
  // all TP ranks, so the links of one rail stand for all of them. The same
  // results, exactly (tests check it); off: every route walked.
  bool fold_rails = true;
};

struct LinkUtilisation {
  std::string name;
  std::string kind;             // "nvlink", "pcie", "ib"
  double capacity_Bps = 0;
  double bytes = 0;
  double peak_utilisation = 0;  // max over time of load / capacity
};

struct StageStats {
  int stage = 0;
  int rank = 0;                 // the simulated GPU
  double compute_busy_s = 0;    // compute stream busy (optimizer included)
  double compute_factor = 1.0;  // its compute time over a median GPU's: speed spread x straggler
  double tp_busy_s = 0, pp_busy_s = 0, dp_busy_s = 0;
  double end_s = 0;             // when its last task ended
};

struct SimResult {
  Estimate estimate;
  std::vector<StageStats> stages;
  int critical_rank = 0;        // the GPU the breakdown walks
  // Peak utilisation per link kind ("nvlink", "pcie", "ib") and the busiest
  // links (highest peak first, at most 8).
  double peak_nvlink_utilisation = 0, peak_pcie_utilisation = 0, peak_ib_utilisation = 0;
  std::vector<LinkUtilisation> busiest_links;
  std::uint64_t tasks = 0, events = 0, flows = 0, solves = 0;
  bool rails_folded = false;    // SimOptions::fold_rails took effect
  double wall_s = 0;            // host seconds the simulation took
  std::vector<std::filesystem::path> trace_files;
  Timeline timeline;            // with SimOptions::timeline; empty otherwise
};

// Throws std::invalid_argument for plans the simulator cannot play (e.g. an
// interleaved schedule whose micro-batches do not divide by PP).
SimResult run_simulation(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan,
                         const SimOptions& opts = {});
inline Estimate simulate(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan,
                         const SimOptions& opts = {}) {
  return run_simulation(m, topo, plan, opts).estimate;
}

}  // namespace cuboid::sim

namespace cuboid {
using sim::simulate;
using sim::SimOptions;
}  // namespace cuboid
