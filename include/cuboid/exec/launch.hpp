#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// World bootstrap for `cuboid run`: one process per rank, started like every
// multi-node GPU job. Under mpirun / mpiexec / srun (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK in the environment) the ranks bootstrap with MPI;
// otherwise the torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) or Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) variables
// say who we are. The node-local rank (which GPU) comes from the launcher
// that started the process, in this order: Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, MPICH's and Intel MPI's MPI_LOCALRANKID, then
// Slurm's SLURM_LOCALID under an MPI launch (srun --mpi); torchrun's
// LOCAL_RANK under torchrun (also when torchrun runs inside a Slurm step,
// whose SLURM_LOCALID is the agent's, not the worker's); SLURM_LOCALID for a
// plain srun.
// The plan's process groups (TP, PP, DP) come from RankMapping, the same
// mapping the planner prices, split out of the world communicator
// (MPI_Comm_split for the cpu backend, ncclCommSplit for cuda).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/communicator.hpp"
#include "cuboid/exec/moe.hpp"
#include "cuboid/exec/registry.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid::exec {

enum class Launcher { mpi, torchrun, slurm, standalone };
std::string_view to_string(Launcher l);

struct LaunchInfo {
  Launcher launcher = Launcher::standalone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks on this node; 0 when the launcher does not say.
  int local_size = 0;
  // The variable local_rank came from ("" when none was set: rank 0 of one).
  std::string local_rank_var;
  std::string master_addr;  // MASTER_ADDR (torchrun sets it; Slurm jobs export it)
  int master_port = 0;      // MASTER_PORT
  // The port of cuboid's TCP store on rank 0: CUBOID_STORE_PORT, else
  // MASTER_PORT + 1 (torchrun's agent already serves its own store on
  // MASTER_PORT); 0 when neither is set. store_port_var names its source.
  int store_port = 0;
  std::string store_port_var = "MASTER_PORT + 1";
};

// Looks up one environment variable; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;
EnvLookup process_environment();

// Who launched us and which rank we are, from the environment alone (nothing
// is initialised). Throws InputError naming the variable when a value is not
// a number or out of range.
LaunchInfo detect_launch(const EnvLookup& env);

// The CUDA device of this rank, from its node-local rank and the devices the
// process sees (cudaGetDeviceCount, after CUDA_VISIBLE_DEVICES):
// * one device visible: that one (each rank given its own GPU, as Slurm's
//   --gpus-per-task or --gpu-bind=single:1, or a wrapper script, does);
// * at least as many as the node's ranks: device local_rank;
// * otherwise an InputError naming the counts and CUDA_VISIBLE_DEVICES.
// `cuda_visible_devices` is the variable's value (for the message).
int choose_cuda_device(const LaunchInfo& launch, int visible_devices, const std::optional<std::string>& cuda_visible_devices);

// The backend's options for this rank: the CUDA device by choose_cuda_device
// (cuda), nothing to choose for cpu.
BackendOptions backend_options(const LaunchInfo& launch, std::string_view backend);

// InputError when the launched world size is not the plan's TP x CP x PP x DP.
void check_world_size(int world_size, const ParallelPlan& plan, const std::string& plan_source);
// Refuses a model and plan the executor cannot run: of mixture-of-experts
// models it runs routed experts with ETP 1 (or TP 1), dropless, without
// shared experts, group-limited routing, latent attention or MTP; context
// parallelism with the p2p ring only.
void check_executable(const ModelSpec& model, const ParallelPlan& plan, const std::string& plan_source);


// The communicators of one rank: the world and the rank's TP, PP and DP
// groups, each ordered by the coordinate along its dimension (rank 0 of
// `tp` is the rank with tp coordinate 0, and so on).
struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> dp;
  // An MoE plan's expert groups (null otherwise): the EP group its tokens
  // are dispatched over and the expert-DP group its experts' gradients are
  // reduced over (Megatron-Core's folding, RankMapping::ep_group).
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> edp;
  // The flex dispatcher's two legs (with flex_groups): the EP ranks on this
  // rank's node and those on its rail (the same local index on each node;
  // nodes as RankMapping::node_of makes them), in flex.
  std::unique_ptr<Communicator> ep_intra;
  std::unique_ptr<Communicator> ep_rail;
  FlexGroups flex;
  // The ranks that split one sequence (context parallelism; with CP 1 a
  // group of one). `dp` is then the gradient group, DP x CP ranks.
  std::unique_ptr<Communicator> cp;
  RankCoord coord;
};

// Splits `world` by RankMapping (collective: every rank of the world calls
// it), with the EP and expert-DP groups too when `expert_groups`.
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankMapping& mapping,
                                  bool expert_groups = false, bool flex_groups = false);

// A one-rank world for a run without a launcher: collectives are copies, p2p
// is an error (a one-rank plan has no pipeline peers).
std::unique_ptr<Communicator> make_self_communicator();

class MpiEnvironment;
class HostExchange;

// The started world of this process. `exchange` moves host bytes between the
// ranks (start-up agreement, NCCL id, measurements): MPI under mpirun / srun,
// the TCP store (MASTER_ADDR, port MASTER_PORT + 1 or CUBOID_STORE_PORT) under torchrun / Slurm variables,
// nothing for one rank. `comm` is the device communicator of the whole world,
// made by attach_device_world once the backend exists.
struct World {
  LaunchInfo launch;
  std::shared_ptr<MpiEnvironment> mpi;  // null unless an MPI launcher started us
  std::unique_ptr<HostExchange> exchange;
  std::unique_ptr<Communicator> comm;
  std::string hostname;

  World();
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  ~World();
};

// Bootstraps the host exchange. The cpu backend's collectives are MPI, so
// torchrun / Slurm variables asking for more than one rank without an MPI
// launcher are an InputError naming the variable and the fix (use mpirun or
// srun); the cuda backend rendezvous over the TCP store instead, waiting at
// most `timeout_s` for every rank.
World start_world(const LaunchInfo& launch, std::string_view backend, double timeout_s);

// Creates world.comm for `backend`: MPI_COMM_WORLD's duplicate (cpu under
// MPI), a one-rank world (cpu standalone), or NCCL (cuda: rank 0 makes the
// ncclUniqueId, world.exchange hands it to every rank, ncclCommInitRank).
void attach_device_world(World& world, Backend& backend);

// Sets how this process's MPI ranks wait (mpi_comm.hpp, MpiWait) from the
// --mpi-wait word (auto | spin | yield | sleep; auto: yield when this node
// runs more ranks than it has online CPUs, else spin). Collective over the world under MPI; without
// MPI nothing waits on MPI and the result is "none". Returns the policy's name
// for the measurements / calibration record. Call check_mpi_wait_word first
// to refuse a bad word before any work.
std::string apply_mpi_wait(const World& world, std::string_view word);
void check_mpi_wait_word(std::string_view word);

// Refuses a --timeout-s that is not positive or is too large for the
// watchdog's and the rendezvous' clocks (InputError naming the flag).
void check_timeout_flag(double timeout_s);

// Every rank must run the same plan with the same sizes, or the collectives
// would not match and the job would hang. Compares `fingerprint` (a hash of
// what this rank will run) across world.exchange; on a mismatch every rank
// throws InputError naming the ranks of each variant and their plan files.
void require_same_plan(HostExchange& exchange, const std::string& fingerprint, const std::string& plan_source);

std::string host_name();

}  // namespace cuboid::exec
