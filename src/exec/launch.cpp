// World bootstrap: who launched us (mpirun/srun, torchrun, Slurm) and the
// plan's process groups split out of the world communicator.
#include "cuboid/exec/launch.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuboid/core/error.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/host_exchange.hpp"
#include "cuboid/exec/mpi_comm.hpp"
#include "cuboid/exec/tcp_store.hpp"
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
#include "cuda_module.hpp"
#endif

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

// The variables a launcher without MPI sets: rank, world size, node-local rank.
struct RankVariables {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_size;
};

// torchrun and Slurm: rank / size / local rank from the launcher's variables,
// the rendezvous from MASTER_ADDR / MASTER_PORT.
LaunchInfo from_variables(const EnvLookup& env, Launcher launcher, const RankVariables& vars) {
  LaunchInfo info;
  info.launcher = launcher;
  info.world_size = std::max(1, env_int(env, vars.world_size, 1));
  info.rank = std::max(0, env_int(env, vars.rank, 0));
  info.local_rank = std::max(0, env_int(env, vars.local_rank, 0));
  if (env(vars.local_rank)) info.local_rank_var = vars.local_rank;
  info.local_size = std::max(0, env_int(env, vars.local_size, 0));
  info.master_addr = env("MASTER_ADDR").value_or("");
  info.master_port = std::max(0, env_int(env, "MASTER_PORT", 1));
  // torchrun's agent serves its own store on MASTER_PORT (static rendezvous,
  // TORCHELASTIC_USE_AGENT_STORE=True), so cuboid's listens on the next port
  // unless CUBOID_STORE_PORT names one.
  if (env("CUBOID_STORE_PORT")) {
    info.store_port = std::max(0, env_int(env, "CUBOID_STORE_PORT", 1));
    info.store_port_var = "CUBOID_STORE_PORT";
  } else if (info.master_port > 0) {
    info.store_port = info.master_port + 1;
  }
  check_rank(info, vars.rank, vars.world_size);
  return info;
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
    } else if (int m = env_int(env, "PMI_SIZE", 1); m > 0) {
      info.world_size = m;
      info.rank = std::max(0, env_int(env, "PMI_RANK", 0));
    } else {
      info.world_size = std::max(1, env_int(env, "SLURM_NTASKS", 1));
      info.rank = std::max(0, env_int(env, "PMIX_RANK", 0));
    }
    // The node-local rank: the MPI launcher's own variable first (mpirun run
    // inside a Slurm allocation inherits the batch step's SLURM_LOCALID),
    // Slurm's for srun --mpi (PMI / PMIx say nothing of it).
    for (const auto& [rank_var, size_var] :
         {std::pair{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
          std::pair{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"}, std::pair{"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}}) {
      if (!env(rank_var)) continue;
      info.local_rank = std::max(0, env_int(env, rank_var, 0));
      info.local_size = std::max(0, env_int(env, size_var, 0));
      info.local_rank_var = rank_var;
      break;
    }
    return info;
  }
  if (env("WORLD_SIZE") || env("RANK"))
    return from_variables(env, Launcher::torchrun, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  // Slurm has no rendezvous address of its own: the job script exports rank 0's
  // host as MASTER_ADDR / MASTER_PORT, read as for torchrun.
  if (env("SLURM_PROCID") || env("SLURM_NTASKS"))
    return from_variables(env, Launcher::slurm, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"});
  return info;
}

int choose_cuda_device(const LaunchInfo& launch, int visible, const std::optional<std::string>& cuda_visible_devices) {
  const std::string shown = cuda_visible_devices ? "CUDA_VISIBLE_DEVICES=" + *cuda_visible_devices
                                                 : std::string("CUDA_VISIBLE_DEVICES unset");
  if (visible <= 0)
    throw InputError("environment", "CUDA_VISIBLE_DEVICES", "this rank sees no NVIDIA GPU (" + shown + ")",
                     "run on a GPU node, and check that the launcher does not hide every GPU from the ranks");
  if (visible == 1) return 0;  // each rank given its own GPU
  const int ranks_here = std::max(launch.local_size, launch.local_rank + 1);
  if (visible >= ranks_here) return launch.local_rank;
  const std::string from = launch.local_rank_var.empty() ? "" : " (" + launch.local_rank_var + ")";
  throw InputError("environment", "CUDA_VISIBLE_DEVICES",
                   "local rank " + std::to_string(launch.local_rank) + from + " of " + std::to_string(ranks_here) +
                       " ranks on this node, but the rank sees " + std::to_string(visible) + " GPUs (" + shown +
                       "): ranks would share GPUs",
                   "start one rank per visible GPU, or give each rank its own GPU (srun --gpus-per-task=1)");
}

BackendOptions backend_options(const LaunchInfo& launch, std::string_view backend) {
  BackendOptions bo;
  if (backend == "cuda")
    bo.device = choose_cuda_device(launch, visible_cuda_devices(), process_environment()("CUDA_VISIBLE_DEVICES"));
  return bo;
}

void check_executable(const ModelSpec& model, const ParallelPlan& plan, const std::string& plan_source) {
  auto refuse = [&](const char* field, const std::string& what, const std::string& fix) {
    throw InputError(plan_source, field, "the executor does not run " + what + " (cuboid plan and simulate price it)", fix);
  };
  if (model.mla.enabled()) refuse("model.mla", "multi-head latent attention", "run a model with standard attention");
  if (model.mtp_layers > 0) refuse("model.mtp_layers", "multi-token prediction", "run a model without MTP layers");
  if (plan.cp > 1 && plan.cp_comm != CpComm::p2p)
    refuse("parallel.cp_comm", "context parallelism's a2a exchange (it runs the p2p ring)",
           "plan with --cp-comm-type p2p");
  if (plan.offload_layers > 0)
    refuse("parallel.offload_activations", "activation offloading (it keeps every activation on the device)",
           "plan without --offload-activations");
  if (plan.offload_modules != 0)
    refuse("parallel.offload_modules", "fine-grained activation offloading (it keeps every activation on the device)",
           "plan without --offload-modules");
  if (plan.recompute_modules != 0)
    refuse("parallel.recompute_modules", "recompute modules (it recomputes the attention core or whole layers)",
           "plan without --recompute-modules");
  if (plan.recompute_layers_set())
    refuse(plan.recompute_method != RecomputeMethod::uniform ? "parallel.recompute_method" : "parallel.recompute_num_layers",
           "a recompute method or layer count (it recomputes every layer or none)",
           "plan without --recompute-method and --recompute-num-layers");
  if (plan.trainer.cuda_graphs.on())
    refuse("parallel.trainer.cuda_graphs", "CUDA graphs (it launches every kernel from the host)",
           "plan with --cuda-graphs none");
  if (plan.trainer.tp_comm_overlap)
    refuse("parallel.trainer.tp_comm_overlap",
           "Transformer Engine's userbuffers overlap (its SP collectives block before or after their GEMM)",
           "plan with --tp-comm-overlap off");
  if (plan.trainer.overlap_param_gather)
    refuse("parallel.trainer.overlap_param_gather",
           "the parameter all-gather in the next forward (it gathers after the optimizer step)",
           "plan with --overlap-param-gather off");
  if (plan.trainer.overlap_param_gather_with_optimizer_step)
    refuse("parallel.trainer.overlap_param_gather_with_optimizer_step",
           "the first chunk's parameter all-gather under the optimizer step (it gathers after the step)",
           "plan with --overlap-param-gather-with-optimizer-step off");
  // The linear layers' GEMMs run quantized as fp8-current (per-tensor current
  // scaling) or mxfp8 prescribes (Backend::gemm_quantized, fp8.hpp).
  if (plan.precision == Precision::fp8_delayed)
    refuse("parallel.precision",
           "delayed scaling (each tensor's scale comes from an amax history of earlier iterations, which it keeps "
           "none of)",
           "plan with --precision fp8-current or mxfp8");
  if (plan.precision == Precision::fp8_blockwise)
    refuse("parallel.precision", "blockwise FP8 scaling (1 x 128 and 128 x 128 blocks)",
           "plan with --precision fp8-current or mxfp8");
  if (plan.precision == Precision::nvfp4)
    refuse("parallel.precision", "NVFP4 linear layers (4-bit elements in 16-element blocks)",
           "plan with --precision fp8-current or mxfp8");
  if (plan.fp8_attention)
    refuse("parallel.fp8_attention", "FP8 attention (it runs the attention core in bf16)", "plan without --fp8-attention");
  if (!model.moe.enabled()) return;
  if (plan.ep > 1 && plan.moe_dispatcher == MoeDispatcher::allgather)
    refuse("parallel.moe_dispatcher",
           "the allgather token dispatcher (its MoE layer exchanges tokens as Megatron-Core's alltoall and flex "
           "dispatchers do)",
           "plan with --moe-dispatcher alltoall or flex");
  if (plan.moe_ep_overlap)
    refuse("parallel.moe_ep_overlap",
           "the EP overlap (its step runs each micro-batch's forward, then its backward; not Megatron-Core's "
           "combined 1F1B schedule)",
           "plan with --moe-ep-overlap off");
  const MoeSpec& e = model.moe;
  if (e.shared_expert_ffn_hidden_size > 0)
    refuse("model.moe.shared_expert_ffn_hidden_size", "shared experts", "run a model with routed experts only");
  if (e.capacity_factor > 0)
    refuse("model.moe.capacity_factor", "a capacity factor (token dropping)", "run the model dropless (no capacity factor)");
  if (e.router_groups > 0)
    refuse("model.moe.router_groups", "group-limited routing", "run the model without router groups");
  if (plan.tp > 1 && plan.expert_tp() > 1)
    refuse("parallel.etp", "expert tensor parallelism (ETP " + std::to_string(plan.expert_tp()) + ")",
           "plan with --etp 1");
}


void check_world_size(int world_size, const ParallelPlan& plan, const std::string& plan_source) {
  if (world_size == plan.world_size()) return;
  const std::string cp = plan.cp > 1 ? " x CP " + std::to_string(plan.cp) : "";
  throw InputError(plan_source, "parallel.world_size",
                   "the plan needs TP " + std::to_string(plan.tp) + cp + " x PP " + std::to_string(plan.pp) + " x DP " +
                       std::to_string(plan.dp) + " = " + std::to_string(plan.world_size()) + " ranks but " +
                       std::to_string(world_size) + " were launched",
                   "launch " + std::to_string(plan.world_size()) + " ranks (mpirun -np " +
                       std::to_string(plan.world_size()) + ") or make a plan for " + std::to_string(world_size));
}

}  // namespace cuboid::exec

// ---------------------------------------------------------------------------
namespace cuboid::exec {

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankMapping& mapping, bool expert_groups,
                                  bool flex_groups) {
  ProcessGroups g;
  g.coord = mapping.coord(world->rank());
  const RankCoord& c = g.coord;
  // One color per group, the coordinate along the group's dimension as key,
  // so that rank i of a group is the rank RankMapping lists i-th.
  // With CP the data index is cp + CP x dp: the DP group is the gradient
  // group of DP x CP ranks (Megatron's data-parallel group with context
  // parallelism), the CP group the ranks of one sequence.
  const int data_size = static_cast<int>(mapping.dp_group(0, 0).size());
  const int tp_size = static_cast<int>(mapping.tp_group(0, 0).size());
  const int cp_size = static_cast<int>(mapping.cp_group(0, 0, 0).size());
  const int data = c.cp + cp_size * c.dp;
  g.tp = world->split(c.pp * data_size + data, c.tp);
  g.pp = world->split(data * tp_size + c.tp, c.pp);
  g.dp = world->split(c.pp * tp_size + c.tp, data);
  g.cp = world->split((c.pp * tp_size + c.tp) * (data_size / cp_size) + c.dp, c.cp);
  if (expert_groups) {
    // Color: the group's index in RankMapping's list; key: the rank's place in it.
    auto split_by = [&](const std::vector<std::vector<int>>& groups) {
      for (std::size_t i = 0; i < groups.size(); ++i)
        for (std::size_t k = 0; k < groups[i].size(); ++k)
          if (groups[i][k] == c.rank) return world->split(static_cast<int>(i), static_cast<int>(k));
      throw ExecError(__FILE__, __LINE__, c.rank, "make_process_groups", "the rank is in no expert group");
    };
    g.ep = split_by(mapping.ep_groups());
    g.edp = split_by(mapping.expert_dp_groups());
    if (flex_groups) {
      // The EP group's members' nodes (its ranks in EP order), then a group
      // per node and one per local index (DeepEP's NVL and RDMA ranks).
      std::vector<int> member_nodes;
      for (const auto& members : mapping.ep_groups())
        if (std::find(members.begin(), members.end(), c.rank) != members.end())
          for (const int r : members) member_nodes.push_back(mapping.node_of(r));
      g.flex.layout = ep_layout(member_nodes);
      const int me = g.ep->rank();
      g.ep_intra = g.ep->split(g.flex.layout.node[static_cast<std::size_t>(me)],
                               g.flex.layout.local[static_cast<std::size_t>(me)]);
      g.ep_rail = g.ep->split(g.flex.layout.local[static_cast<std::size_t>(me)],
                              g.flex.layout.node[static_cast<std::size_t>(me)]);
      g.flex.intra = g.ep_intra.get();
      g.flex.rail = g.ep_rail.get();
    }
  }
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
  void all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) override {
    copy_host(send, recv, count);
  }
  void all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts, DeviceSpan recv,
                         std::span<const std::size_t>) override {
    copy_host(send, recv, send_counts[0]);
  }
  void send_impl(ConstDeviceSpan, std::size_t, int, int) override { no_peer("send"); }
  void recv_impl(DeviceSpan, std::size_t, int, int) override { no_peer("recv"); }
  void send_recv_impl(ConstDeviceSpan, std::size_t, int, DeviceSpan, std::size_t, int, int) override {
    no_peer("send_recv");
  }
  void exchange_impl(std::span<const P2pOp>) override { no_peer("exchange"); }

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
  // Communicators and the exchange are freed before MPI_Finalize (mpi goes last).
  comm.reset();
  exchange.reset();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

namespace {

[[noreturn]] void refuse_without_mpi(const LaunchInfo& launch, const std::string& why) {
  const std::string var = launch.launcher == Launcher::slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  throw InputError("environment", var,
                   var + "=" + std::to_string(launch.world_size) + " asks for " + std::to_string(launch.world_size) +
                       " ranks but " + why + ", and this process was not started by an MPI launcher",
                   "launch with mpirun -np " + std::to_string(launch.world_size) +
                       " (or srun --mpi=pmix), or run one rank without " + var);
}

}  // namespace

World start_world(const LaunchInfo& launch, std::string_view backend, double timeout_s) {
  World w;
  w.launch = launch;
  w.hostname = host_name();
  if (launch.launcher == Launcher::mpi) {
    w.mpi = std::make_shared<MpiEnvironment>(nullptr, nullptr);
    w.exchange = make_mpi_exchange();
    w.launch.rank = w.exchange->rank();
    w.launch.world_size = w.exchange->size();
    return w;
  }
  if (launch.world_size == 1) {
    w.exchange = make_self_exchange();
    return w;
  }
  const bool slurm = launch.launcher == Launcher::slurm;
  const std::string size_var = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const std::string rank_var = slurm ? "SLURM_PROCID" : "RANK";
  if (backend == "cpu") refuse_without_mpi(launch, "the cpu backend's collectives are MPI");
  if (launch.master_addr.empty() || launch.store_port == 0) {
    const std::string var = launch.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT";
    throw InputError("environment", var,
                     "is not set, and " + size_var + "=" + std::to_string(launch.world_size) +
                         " ranks started without MPI meet at rank 0's MASTER_ADDR (port MASTER_PORT + 1)",
                     slurm ? "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) and "
                             "MASTER_PORT=29500 in the job script, or launch with srun --mpi=pmix"
                           : "launch with torchrun (it sets both), or set MASTER_ADDR and MASTER_PORT");
  }
  TcpStoreOptions o;
  o.master_addr = launch.master_addr;
  o.master_port = launch.store_port;
  o.port_var = launch.store_port_var;
  o.rank = launch.rank;
  o.world_size = launch.world_size;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000.0));
  o.rank_var = rank_var;
  o.size_var = size_var;
  w.exchange = std::make_unique<TcpStore>(o);
  return w;
}

void attach_device_world(World& w, Backend& backend) {
#if defined(CUBOID_EXEC_HAVE_CUDA) && CUBOID_EXEC_HAVE_CUDA
  if (backend.name() == "cuda") {
    w.comm = cuda_module().make_world(*w.exchange, backend);
    return;
  }
#endif
  CUBOID_EXEC_REQUIRE(backend.name() == "cpu", "attach_device_world",
                      "no communicator for backend " + std::string(backend.name()));
  if (w.mpi) {
    w.comm = std::make_unique<MpiCommunicator>(MpiCommunicator::world());
  } else {
    CUBOID_EXEC_REQUIRE(w.exchange->size() == 1, "attach_device_world",
                        "the cpu backend needs MPI for more than one rank");
    w.comm = make_self_communicator();
  }
}

void check_mpi_wait_word(std::string_view word) { (void)parse_mpi_wait(word, 1, 1); }

void check_timeout_flag(double timeout_s) {
  // The watchdog counts nanoseconds in int64 (overflow at 9.2e9 s).
  constexpr double kMaxTimeoutS = 1e9;
  if (!(timeout_s > 0))
    throw InputError("command line", "--timeout-s", "must be positive", "give a timeout in seconds, e.g. 300");
  if (!(timeout_s <= kMaxTimeoutS))
    throw InputError("command line", "--timeout-s", "is above the limit of 1e9 s",
                     "give a timeout in seconds, e.g. 300");
}

std::string apply_mpi_wait(const World& world, std::string_view word) {
  if (!world.mpi) return "none";
  const MpiWait wait = parse_mpi_wait(word, mpi_ranks_on_node(), cpus_online());
  set_mpi_wait(wait);
  return std::string(mpi_wait_name(wait));
}

void require_same_plan(HostExchange& exchange, const std::string& fingerprint, const std::string& plan_source) {
  // One line per rank: "<fingerprint> <plan file>"; usually all equal.
  const std::vector<std::string> all = exchange.all_gather(fingerprint + " " + plan_source);
  auto fingerprint_of = [](const std::string& line) { return line.substr(0, line.find(' ')); };
  std::vector<std::pair<std::string, std::vector<int>>> variants;  // line -> ranks, in first-seen order
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(variants.begin(), variants.end(),
                           [&](const auto& v) { return fingerprint_of(v.first) == fingerprint_of(all[r]); });
    if (it == variants.end()) it = variants.emplace(variants.end(), all[r], std::vector<int>{});
    it->second.push_back(static_cast<int>(r));
  }
  if (variants.size() == 1) return;
  std::string problem = "the ranks were not given the same plan and sizes: ";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& [line, ranks] = variants[i];
    std::string who;
    for (std::size_t k = 0; k < ranks.size() && k < 8; ++k) who += (k ? "," : "") + std::to_string(ranks[k]);
    if (ranks.size() > 8) who += ",...";
    const auto space = line.find(' ');
    problem += (i ? "; " : "") + std::string(ranks.size() == 1 ? "rank " : "ranks ") + who +
               (ranks.size() == 1 ? " runs " : " run ") + line.substr(space + 1) + " (fingerprint " +
               line.substr(0, space) + ")";
  }
  throw InputError(plan_source, "parallel", problem,
                   "give every rank the same --plan file and the same --layers, --seq-length, --steps, "
                   "--warmup, --check and --backend");
}

}  // namespace cuboid::exec
