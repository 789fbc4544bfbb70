// cuboid run: the embedded executor (one process per rank, under mpirun/srun,
// or torchrun / Slurm variables with the cuda backend).
#include "commands.hpp"

#include <cstdlib>
#include <iostream>
#include <string>

#include "cuboid/exec/run.hpp"
#include "cuboid/io/planfile.hpp"

namespace cuboid::cli {

namespace {

struct RunFlags {
  std::string plan_path;
  exec::RunOptions options;
};

void run_run(RunFlags& f) {
  const PlanFile pf = read_plan_file(f.plan_path);
  const int code = exec::run_plan(pf, f.options);
  // The check failed: exit non-zero on every rank (the message is printed).
  if (code != 0) std::exit(code);
}

}  // namespace

void register_run_command(CLI::App& app) {
  static RunFlags flags;
  CLI::App* cmd = app.add_subcommand("run", "run real training steps of a plan, one process per rank "
                                            "(mpirun -np N cuboid run --plan plan.json --backend cpu)");
  cmd->add_option("--plan", flags.plan_path, "plan file written by cuboid plan --out (schema cuboid.plan/1)")
      ->required();
  cmd->add_option("--backend", flags.options.backend, "cpu | cuda")->required();
  cmd->add_option("--steps", flags.options.steps, "measured steps (default 3)");
  cmd->add_option("--warmup", flags.options.warmup, "steps before measuring (default 1)");
  cmd->add_flag("--check", flags.options.check,
                "first compare the sharded forward pass with an unsharded reference; exit 1 on mismatch");
  cmd->add_option("--out", flags.options.out_path, "write per-rank per-op timings to FILE (JSON, atomically)");
  cmd->add_option("--layers", flags.options.layers, "scale the model down to N layers (a multiple of PP x virtual stages)");
  cmd->add_option("--seq-length", flags.options.seq_length, "scale the sequence length down to S tokens");
  cmd->add_option("--dropout", flags.options.dropout,
                  "the residual dropouts' probability (default 0.1; 0: the same losses whatever the layout)")
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--mpi-wait", flags.options.mpi_wait,
                  "how MPI ranks wait for a collective or message: spin (MPI's blocking calls), yield "
                  "(test and sched_yield, handing the core to ranks that share it), sleep (test and short "
                  "sleeps), auto (default: yield when the node runs more ranks than it has CPUs, else spin)");
  cmd->add_option("--timeout-s", flags.options.timeout_s,
                  "abort the whole job when one op, or the start-up rendezvous of a torchrun launch, takes "
                  "longer than this (default 300 s)");
  // Test hook, hidden from --help: flip-shard | hang:RANK | kill:RANK.
  cmd->add_option("--inject-fault", flags.options.inject_fault)->group("");
  cmd->callback([] { run_run(flags); });
}

}  // namespace cuboid::cli
