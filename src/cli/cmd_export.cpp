// cuboid export: a plan file as the configuration of another trainer.
#include "commands.hpp"
#include "plan_flags.hpp"

#include <iostream>
#include <string>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/export_order.hpp"
#include "cuboid/io/planfile.hpp"

namespace cuboid::cli {

namespace {

struct ExportFlags {
  std::string plan_path;
  std::string target;
  std::string out_path;
};

void run_export(const ExportFlags& f) {
  if (!f.out_path.empty()) check_output_path(f.out_path, "--out");
  const PlanFile pf = read_plan_file(f.plan_path);
  ExportResult result;
  try {
    result = export_in_expressible_order(pf, f.target);
  } catch (const InputError& e) {
    // A plan the target cannot express: the search that only finds plans it can.
    if (e.source() != pf.source) throw;
    throw InputError(e.source(), e.field(), e.problem(),
                     e.fix() + "; or plan again with --for " + f.target + ", which searches only what it can run");
  }
  // Notes (what the target needs beyond a comment-less file) go to stderr so
  // that stdout stays the file itself.
  if (!result.notes.empty()) std::cerr << result.notes;
  if (f.out_path.empty()) {
    std::cout << result.text;
    return;
  }
  write_file_atomically(f.out_path, result.text);
}

}  // namespace

void register_export_command(CLI::App& app) {
  static ExportFlags flags;
  CLI::App* cmd = app.add_subcommand("export", "write a plan file as the configuration of Megatron-LM, "
                                               "Megatron-Bridge, DeepSpeed, torchtitan or NeMo 1.x");
  cmd->add_option("--plan", flags.plan_path, "plan file written by cuboid plan --out (schema cuboid.plan/1)")
      ->required();
  // Not CLI11's check(IsMember): the target is validated by export_plan so
  // that the message (and exit code 2) is the same as every other bad input.
  static const std::string kTargets = [] {
    std::string out;
    for (const ExportTarget& t : export_target_list())
      out += fmt::format("\n  {:<16} {} {}: {}", t.name, t.trainer, t.version, t.what);
    return out;
  }();
  cmd->add_option("--to", flags.target, "the target trainer and version:" + kTargets)->required();
  cmd->add_option("--out", flags.out_path, "write to FILE (atomically) instead of stdout");
  cmd->callback([] { run_export(flags); });
}

}  // namespace cuboid::cli
