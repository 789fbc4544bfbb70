#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// `cuboid run`: bootstrap the world, check the plan against it, optionally
// check the sharding, run warm-up and measured steps, gather every rank's op
// timings and write measurements.json (schema "cuboid.measurements/1").
#include <cstdint>
#include <optional>
#include <string>

#include "cuboid/io/planfile.hpp"

namespace cuboid::exec {

inline constexpr const char* kMeasurementsSchema = "cuboid.measurements/1";

struct RunOptions {
  std::string backend = "cpu";
  int steps = 3;              // measured steps
  int warmup = 1;             // steps run before measuring
  bool check = false;
  std::optional<int> layers;  // scale the model down (--layers N)
  std::optional<std::int64_t> seq_length;
  float dropout = 0.1f;       // --dropout: the residual dropouts' probability (Megatron's hidden_dropout)
  double timeout_s = 300;
  std::string out_path;
  std::string mpi_wait = "auto";  // --mpi-wait: auto | spin | yield | sleep (mpi_comm.hpp)
  // Test hooks: "flip-shard" (the check must fail), "hang:R" / "kill:R"
  // (rank R hangs / dies in the first measured step).
  std::string inject_fault;
};

// Returns the process exit code (0: ran, and the check passed when asked;
// 1: the check failed). Throws InputError for bad plans, flags or launches.
int run_plan(const PlanFile& plan_file, const RunOptions& options);

}  // namespace cuboid::exec
