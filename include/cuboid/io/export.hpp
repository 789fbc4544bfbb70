#pragma once
#ifndef CUBOID_LAYER_IO
#error "cuboid/io is not below this layer in the build (docs/architecture.md)"
#endif
// Exports of a plan file to the configuration other trainers consume, each
// for one named trainer version (export_targets() lists them).
// A plan the target cannot represent, or one whose settings the target would
// silently change (precision, fusion, overlap), is refused with an InputError
// that says what the target lacks and how to change the plan; an export never
// silently describes a different plan.
#include <string>
#include <string_view>
#include <vector>

#include "cuboid/io/planfile.hpp"

namespace cuboid {

struct ExportTarget {
  std::string_view name;       // the --to value: "megatron"
  std::string_view trainer;    // "Megatron-LM"
  std::string_view version;    // the version the export targets: "main at d98e8a64 (2026)"
  std::string_view extension;  // of the golden files and a sensible --out: "sh"
  std::string_view what;       // one line for --help and the docs
};

// The export targets, in the order the CLI lists them.
const std::vector<ExportTarget>& export_target_list();
// Their names only.
const std::vector<std::string>& export_targets();

struct ExportResult {
  std::string text;   // the configuration (stdout or --out)
  std::string notes;  // what the target needs beyond it, for formats without comments (stderr); may be empty
};

// Throws InputError("command line", "--to", ...) for an unknown target and
// InputError(plan file, field, ...) for a plan the target cannot express.
ExportResult export_plan(const PlanFile& plan_file, std::string_view target);

}  // namespace cuboid
