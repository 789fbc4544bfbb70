// cuboid calibrate: microbenchmarks under mpirun, written as a calibrated card.
#include "commands.hpp"

#include <cstdlib>
#include <string>

#include "cuboid/calibrate/calibrate.hpp"

namespace cuboid::cli {

namespace {

struct CalibrateFlags {
  calibrate::CalibrateOptions options;
};

void run_calibrate_command(CalibrateFlags& f, int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i > 0 ? " " : "") + std::string(argv[i]);
  f.options.command_line = cmd;
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
  cmd->add_option("--backend", flags.options.backend, "cpu | cuda")->required();
  cmd->add_option("--plan", flags.options.plan_paths,
                  "plan file(s) whose GEMM shapes, kernels and process groups to measure (repeatable)");
  cmd->add_option("--model", flags.options.model_path, "also measure this model as TP 1 x PP 1 x DP (all ranks)");
  cmd->add_option("--cluster", flags.options.cluster_path, "the cluster card to calibrate")->required();
  cmd->add_option("--out", flags.options.out_path, "write the calibrated card here (atomically)")->required();
  cmd->add_option("--raw", flags.options.raw_path, "also write every rank's samples here (JSON)");
  cmd->add_option("--repeat", flags.options.repeat,
                  "run the GEMM and kernel sweeps N times over and keep each sample's median (default 1; "
                  "3 on a noisy machine)");
  cmd->add_option("--statistic", flags.options.statistic,
                  "how a GEMM or kernel sample combines its --repeat sweeps: median (default) or min (the fastest "
                  "sweep, the least disturbed by the rest of the machine; pair it with cuboid validate --statistic "
                  "min). Within a sweep a sample is always the median of its timed calls");
  cmd->add_flag("--quick", flags.options.quick, "a smoke test: few sizes and calls (not for planning)");
  cmd->add_option("--max-size", flags.options.max_size_bytes,
                  "largest collective size in bytes (default 268435456 = 256 MiB)");
  cmd->add_option("--mpi-wait", flags.options.mpi_wait,
                  "how MPI ranks wait for a collective or message: spin (MPI's blocking calls), yield "
                  "(test and sched_yield, handing the core to ranks that share it), sleep (test and short "
                  "sleeps), auto (default: yield when the node runs more ranks than it has CPUs, else spin)");
  cmd->add_option("--timeout-s", flags.options.timeout_s,
                  "abort the whole job when one measurement takes longer than this (default 300 s)");
  cmd->callback([argc, argv] { run_calibrate_command(flags, argc, argv); });
}

}  // namespace cuboid::cli
