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
  if (preset == "megatron-deepspeed") return {"megatron-deepspeed", "megatron-deepspeed-2022", "megatron-deepspeed-2021"};
  if (preset == "megatron-deepspeed-2022") return {"megatron-deepspeed-2022", "megatron-deepspeed-2021", "megatron-deepspeed"};
  if (preset == "megatron-deepspeed-2021") return {"megatron-deepspeed-2021", "megatron-deepspeed-2022"};
  return {preset};
}

// A regime covers GPU counts within a factor of 2 of the ones it validated:
// beyond, the effects that grow with scale are unchecked.
constexpr double kScaleReach = 2.0;
// The fewest measured runs an interval is drawn from: with n runs a new one
// falls outside their range about 2 / (n + 1) of the time, always for n = 1.
constexpr int kMinRuns = 3;

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
  // The trainer's own runs, then its stand-ins' in order, until the pool
  // holds kMinRuns: the range of one or two residuals is no interval.
  std::vector<const ValidationRegime*> pool;
  std::vector<std::string_view> trainers;
  int rows = 0;
  for (std::string_view trainer : stand_ins(preset)) {
    bool used = false;
    for (const ValidationRegime* r : on_gpu) {
      if (r->trainer != trainer) continue;
      pool.push_back(r);
      rows += r->rows;
      used = true;
    }
    if (used) trainers.push_back(trainer);
    if (rows >= kMinRuns) break;
  }
  if (!pool.empty()) {
    int lo_gpus = pool.front()->min_gpus, hi_gpus = pool.front()->max_gpus;
    double min_err = pool.front()->min_error, max_err = pool.front()->max_error;
    std::string sets;
    for (const ValidationRegime* r : pool) {
      lo_gpus = std::min(lo_gpus, r->min_gpus);
      hi_gpus = std::max(hi_gpus, r->max_gpus);
      min_err = std::min(min_err, r->min_error);
      max_err = std::max(max_err, r->max_error);
      sets += (sets.empty() ? "" : ", ") + std::string(r->set);
    }
    std::string names;
    for (std::size_t i = 0; i < trainers.size(); ++i)
      names += (i == 0 ? "" : i + 1 == trainers.size() ? " and " : ", ") + std::string(trainers[i]);
    if (gpus > hi_gpus * kScaleReach || gpus * kScaleReach < lo_gpus) {
      out.basis = fmt::format("no validation data near {} GPUs: the {} runs on {} ({}) span {}-{} GPUs", gpus, names,
                              gpu_name, sets, lo_gpus, hi_gpus);
      return out;
    }
    out.known = true;
    // measured = predicted / (1 + error): the largest error gives the lowest time.
    out.low_s = predicted_s / (1 + max_err);
    out.high_s = predicted_s / (1 + min_err);
    const bool own = trainers.front() == preset;
    out.basis = fmt::format("{} {} runs on {} ({}, {}-{} GPUs) missed by {:+.1f}% to {:+.1f}%{}", rows, names, gpu_name,
                            sets, lo_gpus, hi_gpus, 100 * min_err, 100 * max_err,
                            own ? "" : fmt::format("; {} itself has no measured runs here", preset));
    return out;
  }
  out.basis = fmt::format("no validation data: no measured run with a trainer like {} on {}", preset, gpu_name);
  return out;
}

void attach_interval(Estimate& e, const Cluster& cluster) {
  e.interval = prediction_interval(e.iteration_time_s, cluster.gpu.name, e.plan.world_size(), e.plan.trainer.preset);
}

}  // namespace cuboid
