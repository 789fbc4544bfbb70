#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// The GEMM microbenchmark of `cuboid calibrate`: each shape timed per call in
// the backend's precision (Backend::gemm), after warm-up, on operands taken
// from a rotating pool larger than the last-level cache (so no call finds its
// operands cached by the previous one), median of several calls. Every rank
// runs the same shapes at the same time (a barrier per shape), so on a shared
// machine the rates include the sharing, as in a real step.
#include <cstddef>
#include <vector>

#include "cuboid/calibrate/sweep_plan.hpp"
#include "cuboid/core/calibration.hpp"
#include "cuboid/core/stats.hpp"
#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"

namespace cuboid::exec {
class Watchdog;
}

namespace cuboid::calibrate {

struct GemmSweepOptions {
  // Rotating operand pool; 512 MiB exceeds the LLC of current CPUs and the L2
  // of every NVIDIA GPU (H100: 50 MB, B200: 126 MB).
  std::size_t pool_bytes = std::size_t{512} << 20;  // operand_pool_bytes' largest
  int warmup_calls = 2;
  int min_calls = 5;    // timed calls per shape, at least
  int max_calls = 31;
  double target_ms = 20;  // timed calls per shape: about this long in total
  // Ranks that share cores time each shape in turns (core_share.hpp): with
  // `turns` > 1 this rank times in turn `turn` and waits in the others.
  int turns = 1;
  int turn = 0;
  // Asynchronous backends (CUDA): enqueue an untimed call of the same shape
  // before the start event, so the timed call waits in the stream behind it,
  // as GEMMs do in a training step. Without it an idle stream's start event
  // fires at once and the sample includes cuBLAS's host-side cost and the
  // launch (on an H200: 46 us for a 2048^3 GEMM that a step runs in 27 us).
  bool lead_call = false;
};

// This rank's median per-call time of every shape (in `shapes` order). A
// sample is always its calls' median: a step is a sum of calls, whose time is
// that of typical calls, while the fastest of a sample's calls is an extreme
// value that falls with the number of calls timed (on the development VM,
// every plan of tools/calibrate-local then predicted 2-18 % fast).
// `calibrate --statistic` chooses between repeats only (results.hpp).
std::vector<GemmSample> run_gemm_sweep(exec::Backend& backend, exec::Communicator& world,
                                       const std::vector<GemmProblem>& shapes, const GemmSweepOptions& options,
                                       exec::Watchdog* watchdog);


// The linear layers' shapes an FP8 GEMM sweep takes: single GEMMs (the
// batched attention GEMMs stay bf16) with m, n and k multiples of 16
// (cuBLASLt's FP8 kernels).
inline bool fp8_gemm_shape(const GemmProblem& p) {
  return p.batch == 1 && p.m % 16 == 0 && p.n % 16 == 0 && p.k % 16 == 0;
}
// On a backend with FP8 GEMMs of its own (Backend::native_fp8_gemm; else
// none): each such shape's FP8 GEMM alone (E4M3 x E4M3, per-tensor scales,
// operands quantized beforehand; Backend::time_fp8_gemm), the median of its
// calls, as GemmFormat::fp8 samples. The operands are one set per shape, not
// the rotating pool: on a GPU a plan's linear GEMMs exceed the L2 at the
// sizes that matter.
std::vector<GemmSample> run_fp8_gemm_sweep(exec::Backend& backend, exec::Communicator& world,
                                           const std::vector<GemmProblem>& shapes, const GemmSweepOptions& options,
                                           exec::Watchdog* watchdog);

}  // namespace cuboid::calibrate
