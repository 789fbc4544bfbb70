#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid calibrate`: microbenchmarks on the user's machines, launched like
// `cuboid run` (one process per rank under mpirun/srun). Every rank runs the
// GEMM sweep, the memory-bound kernel sweep and the collective sweep of the
// given plans at the same time; rank 0 gathers the medians, fits them
// (calibration.hpp), prints nccl-tests tables and the fits, and writes the
// input cluster card plus a "calibration" section (atomically).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuboid/calibrate/core_share.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid::exec {
class Backend;
class Communicator;
class HostExchange;
class Watchdog;
}  // namespace cuboid::exec

namespace cuboid::calibrate {

struct CalibrateOptions {
  std::string backend = "cpu";
  std::vector<std::string> plan_paths;
  std::string model_path;    // optional: a model calibrated as TP 1 x PP 1 x DP world
  std::string cluster_path;
  std::string out_path;      // the calibrated card
  std::string raw_path;      // optional: every sample, per rank
  bool quick = false;        // a smoke test: few sizes, few calls
  std::int64_t max_size_bytes = std::int64_t{256} << 20;  // largest collective size
  double timeout_s = 300;
  // Run the GEMM and kernel sweeps this many times over (whole sweeps, one
  // after the other) and keep each sample's median: a slow spell of a noisy
  // machine (another tenant, a few seconds long) spoils one sweep's samples
  // of a few shapes, not the median of three.
  int repeat = 1;
  // How the repeats combine: "median", or "min" (the least disturbed sweep:
  // on a shared machine interference only adds time).
  std::string statistic = "median";
  std::string mpi_wait = "auto";  // --mpi-wait: auto | spin | yield | sleep (exec/mpi_comm.hpp)
  std::string command_line;  // recorded in the card
};

// Returns the exit code (0; 1 when a collective returned wrong results).
// Throws InputError for bad flags, files or launches.
int run_calibrate(const CalibrateOptions& options);

// A plan (or a model as TP 1 x PP 1 x DP world) whose shapes and groups are calibrated.
struct CalibrationJob {
  ModelSpec model;
  ParallelPlan plan;
  std::string source;
};

struct SweepSeconds {
  double gemm = 0, kernel = 0, collective = 0;
};

// The jobs' plans' footprints per rank (cost/operand_pool.hpp, in
// `element_bytes`), the largest of each, as operand_pool_bytes clamps them:
// times `ranks_per_core` (the ranks that share a core share its caches: each
// time it runs one of them, the others' working sets have passed), between
// 1 MiB and 512 MiB (64 MiB with --quick). `working_set`: the GEMM sweep's operand
// pool, so that a sample finds its operands in the cache exactly when the
// step's GEMMs do (on a GPU every real plan's working set exceeds the L2 and
// the pool stays above it). `whole_step`: what the optimizer sweep and the
// cold collective sweep write before each call (step_cache.hpp).
struct StepFootprint {
  std::size_t working_set = 0;
  std::size_t whole_step = 0;
};
StepFootprint step_footprint(const std::vector<CalibrationJob>& jobs, const GpuProfile& gpu, int element_bytes,
                             double ranks_per_core, bool quick);
// Each job's own footprint: the GEMM sweep groups the plans by their
// working set (one operand pool each; Calibration::other_pools), and each
// plan's optimizer kernels find its own whole step evicted.
std::vector<StepFootprint> job_footprints(const std::vector<CalibrationJob>& jobs, const GpuProfile& gpu,
                                          int element_bytes, double ranks_per_core, bool quick);

// What every rank of run_calibrate measures once its world is up: the GEMM,
// kernel and optimizer sweeps and each group shape's collectives, on the
// device world `comm` (NCCL's for the cuda backend, MPI's for cpu; each
// job's TP / PP / DP groups split from it as cuboid run splits them); then
// every rank's results gathered over `exchange`, never over the device world
// (NCCL moves GPU memory only). Collective: every rank calls it, with the
// same jobs and options. Returns on rank 0 each rank's results as JSON, in
// rank order (results.hpp rank_results_from_json); on the others nothing.
// `footprint`: the GEMM operand pool and the bytes written before the
// optimizer's kernels and the cold collectives (step_footprint above).
std::vector<std::string> measure_and_gather(exec::Backend& backend, std::unique_ptr<exec::Communicator> comm,
                                            exec::HostExchange& exchange, const std::vector<CalibrationJob>& jobs,
                                            const Cluster& cluster, const CalibrateOptions& options,
                                            const CoreShare& share, const StepFootprint& footprint,
                                            exec::Watchdog* watchdog, SweepSeconds& seconds);

}  // namespace cuboid::calibrate
