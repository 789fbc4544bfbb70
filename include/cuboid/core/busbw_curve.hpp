#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Size-dependent bus bandwidth of a fabric tier: an nccl-tests all_reduce_perf
// curve (message size -> busbw, out-of-place) read from a published run and
// stored with its source in the cluster card (intra_node.allreduce_busbw_curve).
//
// Why: a tier's busbw constant is what multi-GB messages reach; the 25-100 MB
// TP all-reduces of a training step see less (protocol pipeline start-up and
// per-step latency are not yet amortised), and nccl-tests measures exactly that.
//
// How a curve prices a collective of S bytes (nccl-tests "size") over n GPUs:
// * The curve was measured on `ranks` GPUs. A ring all-reduce of S over n GPUs
//   moves 2(n-1) steps of S/n bytes per GPU; the curve's all-reduce with the
//   same per-step chunk has size S_eq = S x ranks / n, so its busbw at S_eq is
//   the one used (identity for a full-node group, n = ranks).
// * Reduce-scatter and all-gather of S are the two halves of a ring all-reduce
//   of S (n-1 steps of S/n each), so they reach the all-reduce's busbw at the
//   same S_eq: the all-reduce curve prices them too. That holds where the
//   measured all-reduce is a ring (A100); an NVLink SHARP (NVLS) all-reduce
//   curve (H100, H200) is not the ring's and would misprice them, so no such
//   curve is shipped. Broadcast and send_recv have other pipelines and no
//   sourced curve: they keep the tier's constant.
// * Between points busbw follows a power law in size (the measured times are
//   interpolated in log(size)-log(time) by calibration.hpp's
//   interpolate_samples, the same code that prices a calibrated card's samples);
//   below the first point busbw stays at the first point's, above the last at
//   the last point's.
// * curve time = bus factor x S / busbw(S_eq). A measured time already holds
//   the latency, so no alpha is added to it; the caller takes the larger of it
//   and the alpha-beta time at the tier's constant busbw (a curve never promises
//   more than the tier, and tiny messages keep their per-step latency).
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

struct BusbwCurve {
  int ranks = 0;                    // GPUs of the measured communicator
  std::vector<SizeSample> samples;  // (size, all_reduce time on `ranks` GPUs), strictly increasing sizes
  std::string source;               // where the numbers were read (URL, NCCL version, command)
};

// busbw in GB/s (= bytes per ns) of the curve's all-reduce at `size_bytes`,
// clamped to the first / last point outside the measured sizes.
double curve_busbw_GBps(const BusbwCurve& curve, double size_bytes);

// Time (ns) of collective c of size_bytes over group_size GPUs by the curve
// (rules above); nullopt for broadcast and send_recv, groups of one GPU and
// empty messages.
std::optional<double> curve_time_ns(const BusbwCurve& curve, Collective c, int group_size, double size_bytes);

// Reads {"ranks": 8, "source": "...", "points": [{"size_bytes": S, "busbw_GBps": B}, ...]}.
// InputError (source, field) for a missing source, fewer than 2 points, sizes
// that do not increase, a non-positive busbw, unknown keys.
BusbwCurve busbw_curve_from_json(const nlohmann::json& j, const std::string& source, const std::string& field);

}  // namespace cuboid
