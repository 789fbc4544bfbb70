#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Size-dependent bus bandwidth of a fabric tier: an nccl-tests all_reduce_perf
// curve (size -> busbw, out-of-place) from a published run, stored with its
// source in the cluster card (intra_node.allreduce_busbw_curve). The tier's
// constant busbw is what multi-GB messages reach; a step's 25-100 MB TP
// collectives see less. Derivations: docs/internals/cost.md.
//
// A collective of S bytes over n GPUs:
// * busbw is read at S_eq = S x ranks / n (the measured all-reduce with the
//   same per-step chunk);
// * all_reduce, reduce_scatter and all_gather use the curve (the halves of a
//   ring all-reduce; only ring curves are shipped), broadcast and send_recv
//   keep the tier's constant;
// * between points busbw follows a power law in size (interpolate_samples),
//   outside them the first / last point's;
// * time = bus factor x S / busbw(S_eq), no alpha (a measurement holds it);
//   the caller takes the larger of that and the alpha-beta time.
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
