#pragma once
#ifndef CUBOID_LAYER_COST
#error "cuboid/cost is not below this layer in the build (docs/architecture.md)"
#endif
// How far a predicted iteration time is from what runs like it measured: the
// interval a measurement would likely fall in, derived from the residuals of
// the nearest validated regime (GPU, trainer, scale) of tools/fidelity.
// Where nothing near was validated (another GPU, a trainer with no visible
// runs, far beyond the validated GPU counts) it says so instead of printing
// a narrow band. docs/fidelity.md says how it is derived and how often the
// visible runs fall inside it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/core/plan.hpp"

namespace cuboid {

// One visible set's residuals, (predicted - measured) / measured, as
// tools/fidelity --write-intervals computes them.
struct ValidationRegime {
  std::string_view set;      // "korthikanti"
  std::string_view gpu;      // GpuProfile::name
  std::string_view trainer;  // TrainerSettings::preset
  int min_gpus = 0, max_gpus = 0;
  int rows = 0;
  double min_error = 0, max_error = 0, mean_error = 0;
};

// The regimes of this build (src/cost/validation_regimes.inc).
const std::vector<ValidationRegime>& validation_regimes();

struct PredictionInterval {
  bool known = false;      // false: no validation data near this plan
  double low_s = 0;        // a measurement likely falls in [low_s, high_s]
  double high_s = 0;
  std::string basis;       // the runs it comes from, or why there are none
};

// The interval of a predicted time for a plan on `gpus` GPUs of `gpu_name`
// with trainer `preset`.
PredictionInterval prediction_interval(double predicted_s, std::string_view gpu_name, int gpus,
                                       std::string_view preset);

}  // namespace cuboid
