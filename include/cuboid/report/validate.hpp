#pragma once
#ifndef CUBOID_LAYER_REPORT
#error "cuboid/report is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid validate`: the simulator's prediction of a plan against what
// `cuboid run` measured for that plan, per component and end to end.
//
// First the measurements must belong to the plan and the cluster card
// (check_measurements): the same parallel settings, model shapes, rank
// mapping and world size; the cluster the plan was made for; a backend the
// card describes (a cpu run needs a cpu card, a calibrated card must have been
// calibrated on the same backend); and the same ops: every op the simulator
// prices for a pipeline stage must have been timed on that stage's ranks and
// every timed op must be one the simulator prices, except the ops listed in
// executor_only_ops() and simulator_only_ops() (each with the reason). Any
// mismatch is an InputError (exit 2) naming the file, the field and the fix.
//
// Then the plan is simulated with the executor's semantics: the DP gradient
// reduction runs after the last backward (not overlapped with it), no TP
// collective overlaps a GEMM and no CP ring exchange its attention block,
// since the executor runs every op of a rank in order on one stream.
//
// Measured components (the slowest rank, whose median iteration is the
// end-to-end figure; an op's figure is the median over the measured steps of
// its summed time within a step):
//   compute     GEMMs and memory-bound ops the simulator prices (recompute included)
//   tp_comm     collectives of the TP group (including waits for the slower TP peer)
//   pp_comm+bubble  pipeline sends / receives: a blocking receive includes the
//               wait for the neighbouring stage, so the measured figure is PP
//               transfer plus bubble; predicted: pp_comm + bubble of the critical path
//   dp_comm     collectives of the DP group (gradient reduce, ZeRO gathers)
//   optimizer   grad_scale, adam, param_copy (the write-back of the updated
//               weights) and grad_zero: the step's kernels (optimizer_step.hpp)
//   not simulated  the executor-only ops (predicted 0)
//   untimed     iteration minus the sum of the op medians (host work between
//               ops; can be slightly negative: a median of sums is not the sum
//               of medians); predicted 0
//   iteration   the slowest rank's median iteration vs the simulated iteration
// Predicted components are the simulator's critical-path breakdown (they sum
// to the simulated iteration).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/cost/uncertainty.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/io/measurements.hpp"
#include "cuboid/io/planfile.hpp"

namespace cuboid {

struct NamedReason {
  const char* name;
  const char* reason;
};
// Ops the executor times that the simulator does not price.
const std::vector<NamedReason>& executor_only_ops();
// Ops the simulator prices that the executor does not run.
const std::vector<NamedReason>& simulator_only_ops();

// The backend a cluster card describes: its calibration's backend, else "cpu"
// for a card whose device is named "cpu", else "cuda".
std::string card_backend(const Cluster& cluster);

// Throws InputError (exit 2) when the measurements are not a run of this plan
// on this cluster card; see the header comment.
void check_measurements(const PlanFile& plan, const Cluster& cluster, const Measurements& m);

// One line when the card's calibration and the measurements both record their
// host and the hosts differ ("calibrated on another host: cpu_model 'A' vs
// 'B'"); empty otherwise. A warning, not a refusal: the comparison is still
// made, but host drift then counts in its error.
std::string host_mismatch_warning(const Cluster& cluster, const Measurements& m);

struct ComponentRow {
  std::string component;
  double predicted_s = 0;
  double measured_s = 0;
  bool predicted_only = false;  // nothing to compare (measured below 1 us)
  // (predicted - measured) / measured; 0 when measured is 0.
  double error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0.0; }
};

struct StageRow {
  int stage = 0;
  int measured_rank = 0;  // the stage's slowest rank
  std::vector<ComponentRow> rows;
};

struct OpRow {
  int stage = 0;
  std::string name;
  std::string kind;
  std::int64_t calls_per_step = 0;
  double predicted_s = 0;  // cost model per call x calls, per step
  double measured_s = 0;   // the stage's slowest rank, per step
  double error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0.0; }
};

struct ValidationReport {
  std::string plan_source, measurements_source, cluster_name, backend;
  int measured_rank = 0;                 // the slowest rank
  int critical_rank = 0;                 // the simulator's critical GPU
  bool context_parallel = false;         // CP > 1: the ring's exchanges were played unoverlapped too
  double ranks_per_core = 1;             // the calibration's core share (Calibration::ranks_per_core)
  // A card of several operand pools (Calibration::other_pools): each pool's
  // bytes, largest first, and the one the plan was priced from (nearest its
  // own working set); empty and 0 for a card of one pool.
  std::vector<double> card_pools_bytes;
  double priced_pool_bytes = 0;
  // The most page faults per measured step of any rank (its median over the
  // steps) and that rank; -1 when the measurements do not count them.
  std::int64_t page_faults_per_step = -1;
  int page_fault_rank = -1;
  std::vector<ComponentRow> components;  // the last row is "iteration"
  std::vector<StageRow> stages;
  std::vector<OpRow> ops;                // per stage, per op priced one by one
  double predicted_iteration_s = 0;
  double measured_iteration_s = 0;
  double tolerance = 0.10;
  Statistic statistic = Statistic::median;  // of the measured steps (validate --statistic)
  // The prediction's interval (cost/uncertainty.hpp) for this plan on this cluster.
  PredictionInterval interval;
  bool measured_inside() const {
    return interval.known && measured_iteration_s >= interval.low_s && measured_iteration_s <= interval.high_s;
  }
  double error() const {
    return measured_iteration_s > 0 ? (predicted_iteration_s - measured_iteration_s) / measured_iteration_s : 0.0;
  }
  bool within_tolerance() const { return std::abs(error()) <= tolerance; }
};

// Checks (check_measurements), simulates and compares. tolerance: the largest
// accepted |end-to-end error| (a fraction, e.g. 0.10); stat: which summary of
// the measured steps stands for each op and the iteration (the slowest rank
// by that summary).
ValidationReport validate_measurements(const PlanFile& plan, const Cluster& cluster, const Measurements& m,
                                       double tolerance, Statistic stat = Statistic::median);

// The text report; with_ops adds the per-op table.
std::string format_validation(const ValidationReport& r, bool with_ops);
nlohmann::json validation_to_json(const ValidationReport& r);

}  // namespace cuboid
