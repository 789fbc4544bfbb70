#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// The analytical estimator: one iteration of a plan priced from the workload's
// op list and the cost models, with the pipeline bubble, exposed TP / PP / DP
// communication and the optimizer step. Fast enough to score every candidate;
// the discrete-event simulator re-ranks the best.
#include <memory>

#include <optional>
#include <vector>

#include "cuboid/cost/uncertainty.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/cost/step.hpp"

namespace cuboid {

// Seconds on the critical path; the parts sum to iteration_time_s.
struct Breakdown {
  double compute_s = 0;    // GEMMs, attention, memory-bound ops (incl. recompute) of the slowest stage, all micro-batches
  double tp_comm_s = 0;    // TP all-reduce / reduce-scatter + all-gather, not overlapped
  double cp_comm_s = 0;    // CP K/V exchange not hidden behind attention (the ring), or its all-to-alls
  double ep_comm_s = 0;    // MoE dispatch and combine all-to-alls over the EP group (blocking)
  double pp_comm_s = 0;    // activation / gradient send-recv between stages on the critical path
  double dp_comm_s = 0;    // gradient reduction (and ZeRO gathers) not hidden behind backward
  double bubble_s = 0;     // pipeline fill and drain
  double optimizer_s = 0;  // Adam step on this GPU's shard
  // The EP overlap (--moe-ep-overlap, core/ep_overlap.hpp), in the figures
  // above already: the exchanges' time it hides (taken off ep_comm_s) and
  // what the compute under them loses to their SMs (added to compute_s).
  double ep_hidden_s = 0;
  double ep_overlap_sm_s = 0;
  double offload_s = 0;    // compute waiting for activation copies to / from host memory (offload.hpp)
  double total() const {
    return compute_s + tp_comm_s + cp_comm_s + ep_comm_s + pp_comm_s + dp_comm_s + bubble_s + optimizer_s + offload_s;
  }
};

// Two plans that differ only in rank order and whose times differ by at most
// this fraction tie: the planner shows them as one row.
inline constexpr double kRankOrderTie = 1e-3;

struct Estimate {
  ParallelPlan plan;
  double iteration_time_s = 0;
  double tokens_per_s = 0;
  double model_flops = 0;              // per iteration, whole job
  double hardware_flops = 0;           // with recompute
  double model_tflops_per_gpu = 0;     // model_flops / time / GPUs / 1e12
  double hardware_tflops_per_gpu = 0;
  double mfu = 0;                      // model TFLOP/s per GPU / peak
  double hfu = 0;
  MemoryReport memory;
  Breakdown breakdown;
  // The GPU speed spread (GpuProfile::speed_spread) and the compute slowdown
  // 1 + sigma x E[max over the plan's GPUs] it implies (speed_spread.hpp);
  // the simulator plays it per stage but reports the same expected figure.
  double gpu_spread = 0;
  double gpu_spread_slowdown = 1.0;
  bool simulated = false;              // false: analytical estimate; true: discrete-event simulation
  // Where a measurement would likely fall (uncertainty.hpp); set for the
  // plans a command prints or writes (attach_interval), not for every candidate.
  std::optional<PredictionInterval> interval;
  // Other rank orders of this same plan that scored within kRankOrderTie of
  // it: the planner shows one row, in the trainers' order where it is among them.
  std::vector<RankOrder> tied_orders;
  // The same plan in every other rank order that fits, fastest first; filled
  // for the plan a command writes to a plan file (attach_other_orders), so an
  // export that cannot express this order can take the next best.
  struct OtherOrder {
    RankOrder order;
    double iteration_time_s = 0;
    bool simulated = false;
  };
  std::vector<OtherOrder> other_orders;
};

// e.interval from e's time, the plan's GPU count and trainer, and the cluster's GPU.
void attach_interval(Estimate& e, const Cluster& cluster);

// Fills e's FLOPs, tokens/s, TFLOP/s per GPU, MFU and HFU from
// e.iteration_time_s (shared by the estimator and the simulator).
void fill_throughput(Estimate& e, const ModelSpec& m, const ParallelPlan& plan, const GpuProfile& gpu);

// A DP-side reduction of `comm_ns`, `nic_ns` of it over groups that cross
// nodes, issued under a pass of `window_ns` whose EP exchanges load the
// rank's NIC for `ep_nic_ns`: what of it shows past the pass. The NIC
// carries both, so the part over the NIC hides only under what the
// exchanges leave of the pass: max(0, comm - window, nic - (window - ep_nic)).
double reduction_beside_exchanges_ns(double comm_ns, double nic_ns, double window_ns, double ep_nic_ns);

// One plan, nothing cached (convenient; the planner uses Estimator).
Estimate estimate(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan);

// The DP-side collectives (step.hpp) the estimate of `plan` folds into its
// time: its critical stage's, as it prices them. Tests hold them to what the
// simulator plays.
struct FoldedStep {
  int critical_stage = 0;
  std::vector<StepCollective> collectives;
};
FoldedStep folded_step(const ModelSpec& m, const Topology& topo, const ParallelPlan& plan);

// The same estimate with what candidates share cached: the op list and
// compute times of a layer (per TP, micro-batch, sequence, SP, recompute,
// flash) and the link parameters of the groups (per TP, PP, DP and rank
// order). Results are identical to estimate(). Not thread-safe: use one
// Estimator per thread. model and topo must outlive it.
class Estimator {
 public:
  Estimator(const ModelSpec& m, const Topology& topo);
  ~Estimator();
  Estimator(Estimator&&) noexcept;
  Estimator& operator=(Estimator&&) = delete;
  Estimator(const Estimator&) = delete;
  Estimator& operator=(const Estimator&) = delete;

  Estimate operator()(const ParallelPlan& plan);

 private:
  struct Caches;
  const ModelSpec& model_;
  const Topology& topo_;
  std::unique_ptr<Caches> caches_;
};

}  // namespace cuboid
