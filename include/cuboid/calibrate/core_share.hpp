#pragma once
#ifndef CUBOID_LAYER_CALIBRATE
#error "cuboid/calibrate is not below this layer in the build (docs/architecture.md)"
#endif
// How the ranks of `cuboid calibrate` share CPU cores. On a node with more
// ranks than cores (four ranks on this two-core machine), ranks bound to the
// same CPUs would time-slice each other's GEMMs and every sample would mix a
// whole core's speed with the scheduler's turns. So ranks with the same CPU
// affinity time the GEMM and optimizer sweeps in turns (a sample is one
// rank's speed on a core of its own), and the calibration records how many
// ranks share a core (Calibration::ranks_per_core), which the cost model
// applies to every compute op of the runs it predicts.
#include <string>
#include <vector>

namespace cuboid::calibrate {

struct CoreShare {
  int turns = 1;              // the sweeps run in this many turns
  int turn = 0;               // this rank's turn, in [0, turns)
  double ranks_per_core = 1;  // ranks on the node / online CPUs, at least 1
};

// `places[r]` names rank r's host and CPU set ("vm cpus 0-1"); ranks with
// the same place share those CPUs and take turns in rank order. The GPU
// backend shares nothing (turns 1, ranks_per_core 1).
CoreShare core_share(const std::vector<std::string>& places, int rank, int ranks_on_node, int cpus_online,
                     bool cpu_backend);

// This process's host and CPU affinity, as core_share wants them
// ("<hostname> cpus 0,2-3").
std::string cpu_place(const std::string& hostname);

}  // namespace cuboid::calibrate
