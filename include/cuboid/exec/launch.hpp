#pragma once
// World bootstrap for `cuboid run`: one process per rank, started like every
// multi-node GPU job. Under mpirun / srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment) the ranks bootstrap with MPI; otherwise the
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables say who we are.
// The plan's process groups (TP, PP, DP) come from RankMapping, the same
// mapping the planner prices, split out of the world with MPI_Comm_split.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cuboid/exec/backend.hpp"
#include "cuboid/plan.hpp"

namespace cuboid::exec {

enum class Launcher { mpi, torchrun, slurm, standalone };
std::string_view to_string(Launcher l);

struct LaunchInfo {
  Launcher launcher = Launcher::standalone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // torchrun only
  int master_port = 0;      // torchrun only
};

// Looks up one environment variable; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;
EnvLookup process_environment();

// Who launched us and which rank we are, from the environment alone (nothing
// is initialised). Throws InputError naming the variable when a value is not
// a number or out of range.
LaunchInfo detect_launch(const EnvLookup& env);

// InputError when the launched world size is not the plan's TP x PP x DP.
void check_world_size(int world_size, const ParallelPlan& plan, const std::string& plan_source);

// The communicators of one rank: the world and the rank's TP, PP and DP
// groups, each ordered by the coordinate along its dimension (rank 0 of
// `tp` is the rank with tp coordinate 0, and so on).
struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> dp;
  RankCoord coord;
};

// Splits `world` by RankMapping (collective: every rank of the world calls it).
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankMapping& mapping);

// A one-rank world for a run without a launcher: collectives are copies, p2p
// is an error (a one-rank plan has no pipeline peers).
std::unique_ptr<Communicator> make_self_communicator();

class MpiEnvironment;

// The started world of this process: MPI when a launcher started us,
// otherwise a one-rank world. The CPU backend's collectives are MPI, so
// `torchrun`/Slurm variables asking for more than one rank without an MPI
// launcher are an InputError naming the variable and the fix.
struct World {
  LaunchInfo launch;
  std::shared_ptr<MpiEnvironment> mpi;  // null when standalone
  std::unique_ptr<Communicator> comm;
  std::string hostname;

  World();
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  ~World();
};
World start_world(const LaunchInfo& launch, std::string_view backend);

std::string host_name();

}  // namespace cuboid::exec
