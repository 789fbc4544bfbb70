// cuboid calibrate: microbenchmarks under mpirun, written as a calibrated card.
#include "commands.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuboid/calibrate/calibrate.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/io/measurements.hpp"
#include "cuboid/report/run_calibration.hpp"

namespace cuboid::cli {

namespace {

struct CalibrateFlags {
  calibrate::CalibrateOptions options;
  std::vector<std::string> from_measurements;
  std::vector<std::string> merge;
};

// --from-measurements: no launch, no backend. The card given with --cluster,
// its calibration (if any) overlaid with what the runs measured.
void calibrate_from_measurements(const CalibrateFlags& f, const std::string& command_line) {
  const calibrate::CalibrateOptions& o = f.options;
  if (!o.plan_paths.empty() || !o.model_path.empty() || !o.raw_path.empty() || o.quick)
    throw InputError("command line", "--from-measurements",
                     "measures nothing: --plan, --model, --raw and --quick belong to the sweep",
                     "leave them out, or run the sweep under mpirun without --from-measurements");
  const Statistic stat = parse_statistic(o.statistic, "--statistic");
  const Cluster cluster = load_cluster(o.cluster_path);
  std::vector<Measurements> runs;
  for (const std::string& path : f.from_measurements) runs.push_back(load_measurements(path));
  check_output_paths(std::vector<OutputPath>{{"--out", o.out_path}});
  const RunCalibration rc = calibration_from_runs(runs, cluster.calibration.get(), stat,
                                                  command_line + " (statistic: " + std::string(to_string(stat)) +
                                                      ", operands as in the step)");
  nlohmann::json card = read_json_file(o.cluster_path);
  if (card.contains("gpu") && card["gpu"].is_string()) {
    const std::filesystem::path base = std::filesystem::path(o.cluster_path).parent_path();
    card["gpu"] = read_json_file((base / card["gpu"].get<std::string>()).string());
  }
  card["calibration"] = calibration_to_json(rc.calibration);
  // The card must load before it is written (the reader refits and checks everything).
  (void)cluster_from_json(card, o.out_path, std::filesystem::path(o.out_path).parent_path());
  write_output_file(o.out_path, card.dump(2) + "\n");
  std::cout << fmt::format("cuboid calibrate: from {} measurements file(s), statistic {}: {} GEMM shapes and {} "
                           "collective samples measured in the step{}\n",
                           runs.size(), to_string(stat), rc.gemms_measured, rc.collective_samples,
                           cluster.calibration ? "; the sweep's other entries stay" : "");
  for (const std::string& n : rc.notes) std::cout << "note: " << n << "\n";
  std::cout << "calibrated cluster card written to " << o.out_path << "\n";
}

// --merge: no launch, no backend. The cards' calibrations merged sample by
// sample (merge_calibrations), written into the first card.
void calibrate_merge(const CalibrateFlags& f, const std::string& command_line) {
  const calibrate::CalibrateOptions& o = f.options;
  if (!o.plan_paths.empty() || !o.model_path.empty() || !o.raw_path.empty() || o.quick || !o.cluster_path.empty() ||
      !f.from_measurements.empty())
    throw InputError("command line", "--merge",
                     "measures nothing and takes its cards from the list: --plan, --model, --raw, --quick, --cluster "
                     "and --from-measurements do not go with it",
                     "give only --merge A.json B.json ..., --out and --statistic");
  const Statistic stat = parse_statistic(o.statistic, "--statistic");
  std::vector<Calibration> cards;
  for (const std::string& path : f.merge) {
    const Cluster cluster = load_cluster(path);
    if (!cluster.calibration)
      throw InputError(path, "calibration", "is missing: the card was not calibrated",
                       "merge cards written by cuboid calibrate");
    cards.push_back(*cluster.calibration);
  }
  check_output_paths(std::vector<OutputPath>{{"--out", o.out_path}});
  std::vector<std::string> notes;
  const Calibration merged = merge_calibrations(
      cards, f.merge, stat, command_line + " (statistic: " + std::string(to_string(stat)) + ")", notes);
  nlohmann::json card = read_json_file(f.merge.front());
  card["description"] = fmt::format("Merged by cuboid calibrate --merge from {} calibrated cards ({} of each sample): {}",
                                    cards.size(), to_string(stat), card.value("description", ""));
  card["calibration"] = calibration_to_json(merged);
  // The card must load before it is written (the reader refits and checks everything).
  (void)cluster_from_json(card, o.out_path, std::filesystem::path(o.out_path).parent_path());
  write_output_file(o.out_path, card.dump(2) + "\n");
  std::cout << fmt::format("cuboid calibrate: merged {} cards, statistic {}: {} GEMM shapes, {} kernels, {} "
                           "collective tables\n",
                           cards.size(), to_string(stat), merged.gemms.size(), merged.kernels.size(),
                           merged.collectives.size());
  for (const std::string& n : notes) std::cout << "note: " << n << "\n";
  std::cout << "calibrated cluster card written to " << o.out_path << "\n";
}

void run_calibrate_command(CalibrateFlags& f, CLI::App& cmd_app, int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i > 0 ? " " : "") + std::string(argv[i]);
  f.options.command_line = cmd;
  if (!f.merge.empty()) {
    calibrate_merge(f, cmd);
    return;
  }
  if (f.options.cluster_path.empty()) throw CLI::RequiredError("--cluster");
  if (!f.from_measurements.empty()) {
    calibrate_from_measurements(f, cmd);
    return;
  }
  if (cmd_app.count("--backend") == 0) throw CLI::RequiredError("--backend");
  const int code = calibrate::run_calibrate(f.options);
  if (code != 0) std::exit(code);
}

}  // namespace

void register_calibrate_command(CLI::App& app, int argc, char** argv) {
  static CalibrateFlags flags;
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "measure GEMMs, kernels and collectives on this machine, one process per rank, and write a "
                   "calibrated cluster card (mpirun -np N cuboid calibrate --backend cpu --plan plan.json "
                   "--cluster card.json --out calibrated.json)");
  cmd->add_option("--backend", flags.options.backend,
                  "cpu | cuda (required, except with --from-measurements or --merge)");
  cmd->add_option("--from-measurements", flags.from_measurements,
                  "no launch and no sweep: take the GEMM and collective tables from the per-op times of these "
                  "measurements files (cuboid run --out; repeatable), by --statistic, over the --cluster card's "
                  "calibration if it has one");
  cmd->add_option("--plan", flags.options.plan_paths,
                  "plan file(s) whose GEMM shapes, kernels and process groups to measure (repeatable)");
  cmd->add_option("--model", flags.options.model_path, "also measure this model as TP 1 x PP 1 x DP (all ranks)");
  cmd->add_option("--merge", flags.merge,
                  "no launch and no sweep: merge these calibrated cards (two or more, calibrated alike, e.g. "
                  "before and after a run on a host whose speed wanders) into one, each GEMM shape, kernel size "
                  "and collective size by --statistic over the cards (min: the fastest); the first card's "
                  "cluster is kept");
  cmd->add_option("--cluster", flags.options.cluster_path,
                  "the cluster card to calibrate (required, except with --merge)");
  cmd->add_option("--out", flags.options.out_path, "write the calibrated card here (atomically)")->required();
  cmd->add_option("--raw", flags.options.raw_path, "also write every rank's samples here (JSON)");
  cmd->add_option("--repeat", flags.options.repeat,
                  "run the GEMM and kernel sweeps N times over and keep each sample's median (default 1; "
                  "3 on a noisy machine)");
  cmd->add_option("--statistic", flags.options.statistic,
                  "how a GEMM or kernel sample combines its --repeat sweeps: median (default) or min (the fastest "
                  "sweep, the least disturbed by the rest of the machine; pair it with cuboid validate --statistic "
                  "min). Within a sweep a sample is always the median of its timed calls. With --from-measurements: which "
                  "summary of the run's measured steps an op's time is (median or min); with --merge: how each "
                  "sample combines the cards");
  cmd->add_flag("--quick", flags.options.quick, "a smoke test: few sizes and calls (not for planning)");
  cmd->add_option("--max-size", flags.options.max_size_bytes,
                  "largest collective size in bytes (default 268435456 = 256 MiB)");
  cmd->add_option("--mpi-wait", flags.options.mpi_wait,
                  "how MPI ranks wait for a collective or message: spin (MPI's blocking calls), yield "
                  "(test and sched_yield, handing the core to ranks that share it), sleep (test and short "
                  "sleeps), auto (default: yield when the node runs more ranks than it has CPUs, else spin)");
  cmd->add_option("--timeout-s", flags.options.timeout_s,
                  "abort the whole job when one measurement takes longer than this (default 300 s)");
  cmd->callback([cmd, argc, argv] { run_calibrate_command(flags, *cmd, argc, argv); });
}

}  // namespace cuboid::cli
