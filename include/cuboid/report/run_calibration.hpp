#pragma once
#ifndef CUBOID_LAYER_REPORT
#error "cuboid/report is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid calibrate --from-measurements`: a calibration from the per-op times
// `cuboid run` measured inside the training step, instead of (or on top of)
// the microbenchmark sweep. The inverse of validate's per-op pricing:
// * a GEMM op's per-call time (its per-step figure by the statistic, divided
//   by calls_per_step) is the GEMM entry of its shape (m, n, k, batch);
// * a collective op's per-call time is a sample of its (collective, tier,
//   group size) table at its buffer bytes (the nccl-tests size on the run's
//   backend, what comm_size_bytes prices);
// * the same key measured more than once (ranks, op names, files): the median.
// Not taken: pipeline sends / receives (a blocking receive includes the wait
// for the neighbouring stage), executor-only ops, memory-bound kernels and the
// attention core (their sweep keys use the workload's bytes and FLOPs, which a
// measurements file does not carry), and collectives of multi-node runs (the
// tier of each group is not derived yet). What is not taken keeps the sweep's
// entries of the base card, if any.
//
// Measured entries replace the base card's entries of the same key; every
// entry records its source ("sweep" or "measured in run <file>"). Compute
// entries are stored divided by the base card's ranks_per_core, so that the
// lookups (which charge ranks_per_core x the sample) return the time measured
// in the step, where the core sharing was already in place.
#include <string>
#include <vector>

#include "cuboid/core/calibration.hpp"
#include "cuboid/io/measurements.hpp"

namespace cuboid {

struct RunCalibration {
  Calibration calibration;
  int gemms_measured = 0;          // GEMM shapes taken from the runs
  int collective_samples = 0;      // collective samples taken from the runs
  std::vector<std::string> notes;  // what was left out or adjusted, one line each
};

// `base`: the calibration section of the card given with --cluster (null: none).
// InputError when a run's backend differs from another run's or from the base
// card's calibration, or when the runs give nothing to calibrate.
RunCalibration calibration_from_runs(const std::vector<Measurements>& runs, const Calibration* base, Statistic stat,
                                     const std::string& created_by);

// `cuboid calibrate --merge`: one calibration from cards calibrated alike
// (the same backend, ranks per core, activation bytes and operand pool;
// InputError otherwise) at different times, e.g. before and after a run on
// a host whose speed wanders: every GEMM shape, kernel size and collective
// size takes its time by `stat` over the cards that measured it (min: the
// fastest, as calibrate --statistic min takes among its repeats), each
// series made monotone again and refitted. The first card's other fields
// stay; `sources` names the cards in messages; `notes` gets what was pooled
// and any host that differs.
Calibration merge_calibrations(const std::vector<Calibration>& cards, const std::vector<std::string>& sources,
                               Statistic stat, const std::string& created_by, std::vector<std::string>& notes);

}  // namespace cuboid
