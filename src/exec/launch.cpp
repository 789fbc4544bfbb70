// World bootstrap: who launched us (mpirun/srun, torchrun, Slurm) and the
// plan's process groups split out of the world communicator.
#include "cuboid/exec/launch.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuboid/error.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/mpi_comm.hpp"

namespace cuboid::exec {

std::string_view to_string(Launcher l) {
  switch (l) {
    case Launcher::mpi: return "mpi";
    case Launcher::torchrun: return "torchrun";
    case Launcher::slurm: return "slurm";
    case Launcher::standalone: return "standalone";
  }
  return "?";
}

EnvLookup process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

const std::string kEnv = "environment";

int env_int(const EnvLookup& env, std::string_view name, int min_value) {
  const std::optional<std::string> v = env(name);
  if (!v) return -1;
  int out = 0;
  const char* first = v->data();
  const char* last = v->data() + v->size();
  const auto [ptr, ec] = std::from_chars(first, last, out);
  if (ec != std::errc{} || ptr != last || out < min_value)
    throw InputError(kEnv, std::string(name), "'" + *v + "' is not an integer >= " + std::to_string(min_value),
                     "launch with mpirun, srun or torchrun, or unset " + std::string(name));
  return out;
}

void check_rank(const LaunchInfo& info, std::string_view rank_var, std::string_view size_var) {
  if (info.rank >= info.world_size)
    throw InputError(kEnv, std::string(rank_var),
                     "rank " + std::to_string(info.rank) + " is not below " + std::string(size_var) + "=" +
                         std::to_string(info.world_size),
                     "launch with a consistent rank and world size");
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  // mpirun (Open MPI) and srun with PMI-2 or PMIx: MPI bootstraps the world
  // and knows the ranks; the numbers here are only for messages before MPI_Init.
  if (env("OMPI_COMM_WORLD_SIZE") || env("PMI_SIZE") || env("PMIX_RANK")) {
    info.launcher = Launcher::mpi;
    if (int n = env_int(env, "OMPI_COMM_WORLD_SIZE", 1); n > 0) {
      info.world_size = n;
      info.rank = std::max(0, env_int(env, "OMPI_COMM_WORLD_RANK", 0));
      info.local_rank = std::max(0, env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0));
    } else if (int m = env_int(env, "PMI_SIZE", 1); m > 0) {
      info.world_size = m;
      info.rank = std::max(0, env_int(env, "PMI_RANK", 0));
    } else {
      info.world_size = std::max(1, env_int(env, "SLURM_NTASKS", 1));
      info.rank = std::max(0, env_int(env, "PMIX_RANK", 0));
    }
    return info;
  }
  if (env("WORLD_SIZE") || env("RANK")) {
    info.launcher = Launcher::torchrun;
    info.world_size = std::max(1, env_int(env, "WORLD_SIZE", 1));
    info.rank = std::max(0, env_int(env, "RANK", 0));
    info.local_rank = std::max(0, env_int(env, "LOCAL_RANK", 0));
    info.master_addr = env("MASTER_ADDR").value_or("");
    info.master_port = std::max(0, env_int(env, "MASTER_PORT", 1));
    check_rank(info, "RANK", "WORLD_SIZE");
    return info;
  }
  if (env("SLURM_PROCID") || env("SLURM_NTASKS")) {
    info.launcher = Launcher::slurm;
    info.world_size = std::max(1, env_int(env, "SLURM_NTASKS", 1));
    info.rank = std::max(0, env_int(env, "SLURM_PROCID", 0));
    info.local_rank = std::max(0, env_int(env, "SLURM_LOCALID", 0));
    check_rank(info, "SLURM_PROCID", "SLURM_NTASKS");
    return info;
  }
  return info;
}

void check_world_size(int world_size, const ParallelPlan& plan, const std::string& plan_source) {
  if (world_size == plan.world_size()) return;
  throw InputError(plan_source, "parallel.world_size",
                   "the plan needs TP " + std::to_string(plan.tp) + " x PP " + std::to_string(plan.pp) + " x DP " +
                       std::to_string(plan.dp) + " = " + std::to_string(plan.world_size()) + " ranks but " +
                       std::to_string(world_size) + " were launched",
                   "launch " + std::to_string(plan.world_size()) + " ranks (mpirun -np " +
                       std::to_string(plan.world_size()) + ") or make a plan for " + std::to_string(world_size));
}

}  // namespace cuboid::exec

// ---------------------------------------------------------------------------
namespace cuboid::exec {

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankMapping& mapping) {
  ProcessGroups g;
  g.coord = mapping.coord(world->rank());
  const RankCoord& c = g.coord;
  // One color per group, the coordinate along the group's dimension as key,
  // so that rank i of a group is the rank RankMapping lists i-th.
  const int dp_size = static_cast<int>(mapping.dp_group(0, 0).size());
  const int tp_size = static_cast<int>(mapping.tp_group(0, 0).size());
  g.tp = world->split(c.pp * dp_size + c.dp, c.tp);
  g.pp = world->split(c.dp * tp_size + c.tp, c.pp);
  g.dp = world->split(c.pp * tp_size + c.tp, c.dp);
  g.world = std::move(world);
  return g;
}

namespace {

class SelfCommunicator final : public Communicator {
 public:
  std::string_view kind() const noexcept override { return "self"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  void barrier() override {}
  [[noreturn]] void abort(std::string_view message) override {
    std::fprintf(stderr, "cuboid: aborting: %.*s\n", static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    std::abort();
  }
  std::unique_ptr<Communicator> split(int color, int /*key*/) override {
    if (color < 0) return nullptr;
    return std::make_unique<SelfCommunicator>();
  }

 protected:
  void all_reduce_sum_impl(DeviceSpan, std::size_t) override {}
  void reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override {
    copy_host(send, recv, count);
  }
  void all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override {
    copy_host(send, recv, count);
  }
  void broadcast_impl(DeviceSpan, std::size_t, int) override {}
  void send_impl(ConstDeviceSpan, std::size_t, int, int) override { no_peer("send"); }
  void recv_impl(DeviceSpan, std::size_t, int, int) override { no_peer("recv"); }
  void send_recv_impl(ConstDeviceSpan, std::size_t, int, DeviceSpan, std::size_t, int, int) override {
    no_peer("send_recv");
  }

 private:
  // Standalone runs use the CPU backend, whose memory is host memory.
  static void copy_host(ConstDeviceSpan src, DeviceSpan dst, std::size_t count) {
    if (src.native() != dst.native())
      std::memcpy(dst.native(), src.native(), count * dtype_bytes(src.dtype()));
  }
  [[noreturn]] static void no_peer(const char* op) {
    throw ExecError(__FILE__, __LINE__, 0, op, "a one-rank world has no peer");
  }
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() { return std::make_unique<SelfCommunicator>(); }

World::World() = default;
World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;
World::~World() {
  comm.reset();  // communicators are freed before MPI_Finalize
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

World start_world(const LaunchInfo& launch, std::string_view backend) {
  World w;
  w.launch = launch;
  w.hostname = host_name();
  if (launch.launcher == Launcher::mpi) {
    w.mpi = std::make_shared<MpiEnvironment>(nullptr, nullptr);
    w.comm = std::make_unique<MpiCommunicator>(MpiCommunicator::world());
    w.launch.rank = w.comm->rank();
    w.launch.world_size = w.comm->size();
    return w;
  }
  if (launch.world_size > 1) {
    const std::string var = launch.launcher == Launcher::slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
    const std::string why = backend == "cpu"
                                ? "the cpu backend's collectives are MPI, and this process was not started by an MPI launcher"
                                : "a multi-rank world is bootstrapped with MPI (the NCCL unique id is broadcast over it), "
                                  "and this process was not started by an MPI launcher";
    throw InputError("environment", var,
                     var + "=" + std::to_string(launch.world_size) + " asks for " + std::to_string(launch.world_size) +
                         " ranks but " + why,
                     "launch with mpirun -np " + std::to_string(launch.world_size) + " (or srun --mpi=pmix), "
                     "or run one rank without " + var);
  }
  w.comm = make_self_communicator();
  return w;
}

}  // namespace cuboid::exec
