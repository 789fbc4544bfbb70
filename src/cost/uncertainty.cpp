#include "cuboid/cost/uncertainty.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cuboid/cost/estimator.hpp"

namespace cuboid {

namespace {

// Trainers whose runs stand in for another's, nearest first: the same
// trainer, then the one whose code is closest (today's Megatron-Core kept
// 2022's kernels and added overlap and fusion; Megatron-DeepSpeed kept
// DeepSpeed's pipeline engine). A trainer not listed has no stand-in.
std::vector<std::string_view> stand_ins(std::string_view preset) {
  if (preset == "megatron-core") return {"megatron-core", "megatron-2022", "megatron-2021"};
  if (preset == "megatron-2022") return {"megatron-2022", "megatron-core", "megatron-2021"};
  if (preset == "megatron-2021") return {"megatron-2021", "megatron-2022"};
  if (preset == "megatron-deepspeed") return {"megatron-deepspeed", "megatron-deepspeed-2022"};
  if (preset == "megatron-deepspeed-2022") return {"megatron-deepspeed-2022", "megatron-deepspeed"};
  return {preset};
}

// A regime covers GPU counts within a factor of 2 of the ones it validated:
// beyond, the effects that grow with scale are unchecked.
constexpr double kScaleReach = 2.0;

}  // namespace

const std::vector<ValidationRegime>& validation_regimes() {
  static const std::vector<ValidationRegime> regimes = {
#include "validation_regimes.inc"
  };
  return regimes;
}

PredictionInterval prediction_interval(double predicted_s, std::string_view gpu_name, int gpus,
                                       std::string_view preset) {
  PredictionInterval out;
  std::vector<const ValidationRegime*> on_gpu;
  for (const ValidationRegime& r : validation_regimes())
    if (r.gpu == gpu_name) on_gpu.push_back(&r);
  if (on_gpu.empty()) {
    out.basis = fmt::format("no validation data: no measured run on {} was compared", gpu_name);
    return out;
  }
  for (std::string_view trainer : stand_ins(preset)) {
    std::vector<const ValidationRegime*> pool;
    for (const ValidationRegime* r : on_gpu)
      if (r->trainer == trainer) pool.push_back(r);
    if (pool.empty()) continue;
    int lo_gpus = pool.front()->min_gpus, hi_gpus = pool.front()->max_gpus, rows = 0;
    double min_err = pool.front()->min_error, max_err = pool.front()->max_error;
    std::string sets;
    for (const ValidationRegime* r : pool) {
      lo_gpus = std::min(lo_gpus, r->min_gpus);
      hi_gpus = std::max(hi_gpus, r->max_gpus);
      min_err = std::min(min_err, r->min_error);
      max_err = std::max(max_err, r->max_error);
      rows += r->rows;
      sets += (sets.empty() ? "" : ", ") + std::string(r->set);
    }
    if (gpus > hi_gpus * kScaleReach || gpus * kScaleReach < lo_gpus) {
      out.basis = fmt::format("no validation data near {} GPUs: {} runs of {} on {} span {}-{} GPUs", gpus, trainer,
                              gpu_name, sets, lo_gpus, hi_gpus);
      return out;
    }
    out.known = true;
    // measured = predicted / (1 + error): the largest error gives the lowest time.
    out.low_s = predicted_s / (1 + max_err);
    out.high_s = predicted_s / (1 + min_err);
    out.basis = fmt::format("{} {} runs on {} ({}, {}-{} GPUs) missed by {:+.1f}% to {:+.1f}%{}", rows, trainer,
                            gpu_name, sets, lo_gpus, hi_gpus, 100 * min_err, 100 * max_err,
                            trainer == preset ? "" : fmt::format("; {} itself has no measured runs here", preset));
    return out;
  }
  out.basis = fmt::format("no validation data: no measured run with a trainer like {} on {}", preset, gpu_name);
  return out;
}

void attach_interval(Estimate& e, const Cluster& cluster) {
  e.interval = prediction_interval(e.iteration_time_s, cluster.gpu.name, e.plan.world_size(), e.plan.trainer.preset);
}

}  // namespace cuboid
