#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// What a trainer runs when it is started with cuboid's export of a plan: a
// model of its start-up at the pinned version (argument validation, the base
// config or recipe the export builds on, the optimizer and mixed-precision
// selection, the defaults of every option the export leaves out), read from
// the exported text alone (io/export_read), so that an export that says
// something else than the plan is caught. Each rule names the upstream file,
// line and commit it models. compare_with_plan() sets the result against the
// priced plan (docs/plan-files-and-exports.md "What the trainer runs").
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/io/export.hpp"
#include "cuboid/io/planfile.hpp"

namespace cuboid {

// One setting the trainer ends up with, under cuboid's name for it
// (priced_settings lists the names), and the rule that decided it.
struct ResolvedSetting {
  std::string name;    // "zero_stage"
  std::string value;   // "1"
  std::string source;  // "megatron/training/arguments.py:1135@d98e8a64: ..."
};

struct ResolvedRun {
  std::string target;
  std::vector<ResolvedSetting> settings;
  // Start-up assertions the export would trip, each with its source; the
  // trainer would not start.
  std::vector<std::string> failures;
  // nullptr when the trainer's configuration does not decide it (the model
  // code does: DeepSpeed's attention kernel, for one).
  const ResolvedSetting* find(std::string_view name) const;
};

// Throws InputError("command line", "--to", ...) for a target without a
// resolution model, std::invalid_argument for text the target's exporter
// does not write (a missing launch line or size).
ResolvedRun resolve_export(std::string_view target, const ExportResult& exported);

// The plan's settings under the same names and spellings: what was priced.
std::vector<ResolvedSetting> priced_settings(const PlanFile& pf);

struct RunMismatch {
  std::string name;
  std::string priced;
  std::string runs;
  std::string source;  // the rule that decided what runs
};
// Every setting the run resolves that differs from the priced plan, and one
// entry per start-up failure (name "start-up"). Settings that cannot matter
// are not compared: the data-parallel reduction and sharding with one data
// parallel rank (DP x CP = 1), the experts' sizes of a dense model, and the
// rank order's dimensions of size 1.
std::vector<RunMismatch> compare_with_plan(const ResolvedRun& run, const PlanFile& pf);
// One line per mismatch, for messages.
std::string describe(const std::vector<RunMismatch>& mismatches);

}  // namespace cuboid
