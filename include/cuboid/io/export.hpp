#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// Exports of a plan file to the configuration other trainers consume:
//   megatron   - Megatron-LM pretrain_gpt.py arguments (a bash array) and a torchrun / srun launch
//   deepspeed  - a DeepSpeed config JSON (batch sizes, ZeRO stage, bf16, pipeline block)
//   torchtitan - --parallelism.* / --training.* overrides and the same as a TOML table
//   nemo       - NeMo 1.x megatron_gpt_config.yaml overrides (trainer.*, model.*)
// A plan the target cannot represent is refused with an InputError that says
// what the target lacks and how to change the plan; an export never silently
// describes a different plan.
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/io/planfile.hpp"

namespace cuboid {

// The export targets, in the order the CLI lists them.
const std::vector<std::string>& export_targets();

// Throws InputError("command line", "--to", ...) for an unknown target and
// InputError(plan file, field, ...) for a plan the target cannot express.
std::string export_plan(const PlanFile& plan_file, std::string_view target);

}  // namespace cuboid
