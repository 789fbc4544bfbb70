#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid run --check`: the sharded forward pass of one transformer layer
// (column-parallel QKV and FC1, head-parallel attention, row-parallel
// projection and FC2 with their TP reduction, sequence parallelism as
// planned) against the unsharded layer with the same weights computed on one
// rank. Every TP rank compares its part of the output; the world agrees on
// the largest error.
#include <string>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid::exec {

class OpTimer;

struct CheckResult {
  double attention_error = 0;  // max |sharded - reference| / max |reference|, after the attention block
  double layer_error = 0;      // the same after the MLP block (the layer's output)
  double tolerance = 0;
  bool passed() const { return attention_error <= tolerance && layer_error <= tolerance; }
};

// Relative tolerance for the backend's compute dtype (fp32: 1e-4, bf16: 3e-2).
double check_tolerance(DType compute);
// ... and for a plan whose linear layers' GEMMs are quantized (against the
// unquantized reference): 0.25, from E4M3's rounding (check.cpp).
double check_tolerance(DType compute, Precision precision);

// Collective over the world. `flip_shard` negates TP rank tp-1's FC2 shard
// (the test of the check itself: it must then fail).
CheckResult check_sharded_forward(Backend& backend, ProcessGroups& groups, const ModelSpec& model,
                                  const ParallelPlan& plan, OpTimer& timer, bool flip_shard);

}  // namespace cuboid::exec
