#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// Per-rank sweep results, their JSON form (gathered to rank 0 as text), and
// how rank 0 combines them into a Calibration: GEMM and kernel times are the
// slowest rank's median (every rank runs its own copy; in a step the ranks of
// a TP / PP / DP group meet at every collective, so a group moves at the pace
// of its slowest member, and the simulator plays one representative rank);
// a collective's time is the slowest member's (it ends when the last rank
// has its data), and #wrong sums over ranks.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/calibrate/collective_sweep.hpp"
#include "cuboid/calibrate/kernel_sweep.hpp"
#include "cuboid/core/calibration.hpp"
#include "cuboid/io/measurements.hpp"

namespace cuboid::calibrate {

struct CollectiveRecord {
  CollectiveKey key;       // collective, tier, group size
  std::string group;       // "tp", "pp", "dp": the plan group it ran on
  CollectiveMeasurement m;
};

// The GEMM and kernel samples of the plans whose operand pool is not the
// largest of the calibration (calibrate.hpp: the plans grouped by their own
// step working set), one per pool.
struct PoolResults {
  std::size_t pool_bytes = 0;
  std::vector<GemmSample> gemms;
  std::vector<KernelMeasurement> kernels;
};

struct RankResults {
  int rank = 0;
  std::vector<GemmSample> gemms;  // the largest pool's
  std::vector<KernelMeasurement> kernels;
  std::vector<CollectiveRecord> collectives;
  std::vector<PoolResults> other_pools;  // every rank lists the same pools in the same order
};

// Each sample over repeated sweeps (calibrate --repeat): the median of the
// repeats, or their minimum (calibrate --statistic min). Every repeat lists
// the same samples in the same order (the sweeps are deterministic);
// anything else is a logic error (std::logic_error).
std::vector<GemmSample> combine_repeats(const std::vector<std::vector<GemmSample>>& repeats, Statistic stat);
std::vector<KernelMeasurement> combine_repeats(const std::vector<std::vector<KernelMeasurement>>& repeats,
                                               Statistic stat);

// A layer's GEMM samples (LayerSweep::gemms) over the GEMM sweep's table:
// a shape the layer ran takes the mean of the layer's times at it (fc1 and
// fc2_dgrad share a shape, and a card holds one time per shape, so the mean
// keeps their sum) and the layer's source; a shape another plan's layer ran
// before: the mean of both.
void merge_layer_gemms(std::vector<GemmSample>& table, const std::vector<GemmSample>& layer);

nlohmann::json to_json(const RankResults& r);
RankResults rank_results_from_json(const nlohmann::json& j);

// One row of a combined collective table.
struct CollectiveRow {
  std::int64_t size_bytes = 0, count = 0, wrong = 0;
  double time_ns = 0;
};
struct CollectiveTable {
  std::string group;  // the plan group kind it ran on
  std::vector<CollectiveRow> rows;  // by size
};

struct CombinedTables {
  std::vector<GemmSample> gemms;
  std::map<std::string, std::vector<SizeSample>> kernels;  // sorted by bytes
};
struct CombinedPool : CombinedTables {
  double pool_bytes = 0;
};
struct Combined : CombinedTables {
  std::map<CollectiveKey, CollectiveTable> collectives;
  std::int64_t wrong = 0;
  std::vector<CombinedPool> other_pools;  // RankResults::other_pools, combined alike
};
Combined combine(const std::vector<RankResults>& ranks);

}  // namespace cuboid::calibrate
