#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// What `cuboid run --out` measured (schema "cuboid.measurements/1", written by
// src/exec/run.cpp), read back strictly for `cuboid validate` and calibration
// checks: the plan and model as run, the backend and cluster, and per rank its
// coordinates, iteration times and per-op times with shapes, bytes and groups.
//
// Times are seconds per training step: an op's figure is the sum over its
// calls within one step, summarised over the measured steps (median, min,
// max). The reader rejects (InputError naming the file and the field) another
// schema, a missing field, a wrong type, a time that is not finite (the
// executor writes NaN and infinity as null) or negative, an empty rank list,
// duplicate ranks and unknown op kinds, passes or groups.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/host.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/core/stats.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

inline constexpr const char* kMeasurementsSchemaV1 = "cuboid.measurements/1";

// median / min / max of one quantity over the measured steps, seconds.
struct TimeStats {
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
};

// Which summary of the measured steps a comparison uses: the median (the
// default), or the minimum, the step least disturbed by other processes on a
// shared machine (interference only ever adds time; see cuboid validate
// --statistic). "median" | "min"; InputError (flag) for anything else.
enum class Statistic { median, min };
Statistic parse_statistic(const std::string& word, const std::string& flag);
std::string_view to_string(Statistic s) noexcept;
inline double pick(const TimeStats& t, Statistic s) noexcept { return s == Statistic::min ? t.min_s : t.median_s; }
// The same choice over repeated measurements of one sample (non-empty).
inline double pick(std::vector<double> times, Statistic s) {
  return s == Statistic::min ? *std::min_element(times.begin(), times.end()) : median_of(std::move(times));
}

struct MeasuredOp {
  std::string name;            // the workload's op name ("qkv", "tp_rs_attn", ...) or an executor-only op
  OpKind kind = OpKind::gemm;
  Pass pass = Pass::forward;
  std::int64_t calls_per_step = 0;
  TimeStats time_per_step;     // summed over the op's calls in one step
  // gemm: C[m x n] = A[m x k] B[k x n], `batch` times (0 for other kinds)
  std::int64_t m = 0, n = 0, k = 0, batch = 0;
  // memory-bound: bytes touched per call; collective / p2p: buffer bytes per rank per call
  double bytes_per_call = 0;
  Group group = Group::none;   // collective / p2p
  std::optional<Collective> collective;
  int group_size = 0;
};

struct MeasuredRank {
  int rank = 0;
  std::string hostname;
  RankCoord coord;             // tp, pp, dp, node, gpu as the executor mapped them
  TimeStats iteration;
  double compute_s = 0;        // the executor's own split (sum of op medians)
  double communication_s = 0;
  // Minor page faults of the rank's process in a measured step, the median
  // over the steps; absent in files written before `cuboid run` counted them.
  std::optional<std::int64_t> page_faults_per_step;
  std::vector<MeasuredOp> ops;

  const MeasuredOp* find(const std::string& name) const;
};

// The plan settings as run (after --layers / --seq-length scaling).
struct MeasuredPlan {
  int tp = 0, pp = 0, dp = 0, micro_batch = 0, virtual_stages = 0, zero_stage = 0, world_size = 0;
  int cp = 1;  // context parallelism (absent in runs without it)
  std::int64_t global_batch = 0, num_micro_batches = 0, seq_length = 0;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::one_f_one_b;
  std::string rank_order;      // "tp-dp-pp"
  // The linear layers' GEMMs' format ("precision"; absent: bf16, the backend's own).
  Precision precision = Precision::bf16;
};

struct MeasuredModel {
  std::string name;
  std::int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0, ffn_hidden_size = 0, vocab_size = 0;
};

struct Measurements {
  std::string source;          // the file (error messages)
  std::string generator;       // "cuboid 0.1.0"
  std::string plan_file;       // the plan file the run was given
  MeasuredModel model;
  MeasuredPlan plan;
  // The cluster the plan was made for (from the plan file); absent in files
  // written before `cuboid run` recorded it.
  std::optional<std::string> cluster_name, cluster_source_file;
  std::string backend;         // "cpu" | "cuda"
  std::string device;
  std::vector<std::string> hostnames;
  // The machine of rank 0 (environment.host); absent in files written before
  // `cuboid run` recorded it.
  std::optional<HostInfo> host;
  int steps = 0, warmup = 0;
  double iteration_time_s = 0; // the slowest rank's median iteration
  std::vector<MeasuredRank> ranks;  // sorted by rank

  // The rank with the largest median iteration time (the end-to-end figure).
  const MeasuredRank& slowest_rank() const;
  // The same by another statistic of the iteration time.
  const MeasuredRank& slowest_rank(Statistic s) const;
};

Measurements measurements_from_json(const nlohmann::json& j, const std::string& source);
Measurements load_measurements(const std::filesystem::path& path);

// Several runs of one plan as one (cuboid validate --measurements A B: runs
// interleaved with calibrations, so that a slow spell of the host lands on
// both sides). Every quantity's min is the runs' smallest, its max their
// largest, its median the median of the runs' medians (the mean of two);
// steps add up. The runs must be of the same model, plan, backend, device
// and host, with the same ranks at the same coordinates timing the same ops
// (InputError naming the later run's file and field otherwise). One run is
// returned as it is.
Measurements merge_runs(const std::vector<Measurements>& runs);

}  // namespace cuboid
