// cuboid run: the executor's driver on every rank.
#include "cuboid/exec/run.hpp"

#include "cuboid/core/pipeline_layout.hpp"

#include <mpi.h>

#include <csignal>
#include <chrono>
#include <cmath>
#include <iostream>
#include <numeric>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/stats.hpp"
#include "cuboid/core/host.hpp"
#include "cuboid/exec/check.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/host_exchange.hpp"
#include "cuboid/exec/host_memory.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/exec/mpi_comm.hpp"
#include "cuboid/exec/registry.hpp"
#include "cuboid/exec/step.hpp"
#include "cuboid_config.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::exec {

namespace {

const std::string kCl = "command line";

// Applies --layers / --seq-length to the plan's model and plan.
void scale_down(ModelSpec& model, ParallelPlan& plan, const RunOptions& o) {
  if (o.layers) {
    const int v = plan.schedule == Schedule::interleaved ? plan.virtual_stages : 1;
    if (*o.layers <= 0 || *o.layers % (plan.pp * v) != 0)
      throw InputError(kCl, "--layers",
                       fmt::format("{} layers do not split into PP {} x {} virtual stages", *o.layers, plan.pp, v),
                       fmt::format("give a positive multiple of {}", plan.pp * v));
    model.num_layers = *o.layers;
    // An MoE model keeps its pattern's last N layers (a first-k-dense model
    // keeps MoE layers, the kind it has most of).
    if (model.moe.enabled()) {
      std::vector<bool>& kinds = model.moe.moe_layers;
      if (static_cast<std::int64_t>(kinds.size()) > *o.layers)
        kinds.erase(kinds.begin(), kinds.end() - *o.layers);
      else
        kinds.insert(kinds.begin(), static_cast<std::size_t>(*o.layers) - kinds.size(), kinds.front());
    }
    plan.first_stage_layers = 0;
    plan.last_stage_layers = 0;
    plan.embedding_in_split = plan.loss_in_split = false;
    plan.pipeline_layout = {};
  }
  if (o.seq_length) {
    const std::int64_t s = *o.seq_length;
    // Tokens: at most a model's largest size (validate_model), so s x micro-batch stays inside 64 bits.
    constexpr std::int64_t kMaxTokens = std::int64_t{1} << 24;
    if (s <= 0 || s > kMaxTokens || (plan.sequence_parallel && plan.tp > 1 && s * plan.micro_batch % plan.tp != 0))
      throw InputError(kCl, "--seq-length", fmt::format("{} is not a positive sequence length that TP {} splits", s, plan.tp),
                       fmt::format("give a positive multiple of {}", plan.tp));
    plan.seq_length = s;
  }
}

struct Fault {
  enum Kind { none, flip_shard, hang, kill, fail, stall_setup } kind = none;
  int rank = -1;
};

Fault parse_fault(const std::string& s) {
  Fault f;
  if (s.empty()) return f;
  if (s == "flip-shard") {
    f.kind = Fault::flip_shard;
    return f;
  }
  const auto colon = s.find(':');
  const std::string what = s.substr(0, colon);
  if (colon != std::string::npos && (what == "hang" || what == "kill" || what == "throw" || what == "stall-setup")) {
    f.kind = what == "hang"    ? Fault::hang
             : what == "kill"  ? Fault::kill
             : what == "throw" ? Fault::fail
                               : Fault::stall_setup;
    try {
      f.rank = std::stoi(s.substr(colon + 1));
      return f;
    } catch (const std::exception&) {
    }
  }
  throw InputError(kCl, "--inject-fault", "'" + s + "' is not a fault", "use flip-shard, hang:RANK, kill:RANK, throw:RANK or stall-setup:RANK");
}

nlohmann::json stats_json(const std::vector<double>& v) {
  if (v.empty()) return {{"median_s", 0}, {"min_s", 0}, {"max_s", 0}, {"mean_s", 0}, {"stddev_s", 0}};
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  return {{"median_s", median_of(v)},
          {"min_s", *std::min_element(v.begin(), v.end())},
          {"max_s", *std::max_element(v.begin(), v.end())},
          {"mean_s", mean},
          {"stddev_s", std::sqrt(var / static_cast<double>(v.size()))}};
}

nlohmann::json rank_json(const World& world, const ProcessGroups& g, const StepRunner& runner, const OpTimer& timer,
                         const std::vector<double>& losses) {
  nlohmann::json ops = nlohmann::json::array();
  double compute = 0, comm = 0, flops = 0;
  for (const auto& [name, st] : timer.stats()) {
    const OpDesc& d = st.desc;
    const double med = median_of(st.step_seconds);
    nlohmann::json j = {{"name", name},
                        {"kind", std::string(to_string(d.kind))},
                        {"pass", d.pass == Pass::forward ? "forward" : "backward"},
                        {"calls_per_step", st.calls_per_step},
                        {"time_per_step", stats_json(st.step_seconds)},
                        {"step_seconds", st.step_seconds}};
    if (d.kind == OpKind::gemm || d.kind == OpKind::attention_core) {
      j["shape"] = {{"m", d.m}, {"n", d.n}, {"k", d.k}, {"batch", d.batch}};
      j["flops_per_call"] = d.flops;
      flops += d.flops * static_cast<double>(st.calls_per_step);
    } else if (d.kind == OpKind::memory_bound) {
      j["bytes_per_call"] = d.bytes;
    } else {
      j["collective"] = std::string(to_string(d.collective));
      j["group"] = std::string(to_string(d.group));
      j["group_size"] = d.group_size;
      j["bytes_per_call"] = d.comm_bytes;
    }
    (d.kind == OpKind::collective || d.kind == OpKind::p2p ? comm : compute) += med;
    ops.push_back(std::move(j));
  }
  const double iter = median_of(timer.step_seconds());
  nlohmann::json loss = nlohmann::json::array();
  for (double l : losses) loss.push_back(std::isnan(l) ? nlohmann::json() : nlohmann::json(l));
  return {{"rank", g.world->rank()},
          {"hostname", world.hostname},
          {"coord",
           {{"tp", g.coord.tp}, {"pp", g.coord.pp}, {"dp", g.coord.dp}, {"cp", g.coord.cp}, {"node", g.coord.node},
            {"gpu", g.coord.gpu}}},
          {"groups",
           {{"tp_size", g.tp->size()}, {"pp_size", g.pp->size()}, {"dp_size", g.dp->size()}, {"cp_size", g.cp->size()}}},
          {"parameters", runner.parameter_count()},
          {"layers", runner.layers_on_rank()},
          {"step_seconds", timer.step_seconds()},
          {"iteration", stats_json(timer.step_seconds())},
          {"page_faults_per_step", timer.step_page_faults()},
          {"compute_s", compute},
          {"communication_s", comm},
          {"gemm_flops_per_step", flops},
          {"achieved_tflops", iter > 0 ? flops / iter / 1e12 : 0.0},
          {"loss", loss},
          {"ops", ops}};
}

nlohmann::json run_plan_json(const ParallelPlan& plan, int gpus_per_node) {
  nlohmann::json j = plan_layout_json(plan);
  j["cp"] = plan.cp;
  j["ep"] = plan.ep;
  j["etp"] = plan.etp;
  j["first_stage_layers"] = plan.first_stage_layers;
  j["last_stage_layers"] = plan.last_stage_layers;
  if (plan.embedding_in_split) j["embedding_in_pipeline_split"] = true;
  if (plan.loss_in_split) j["loss_in_pipeline_split"] = true;
  if (!plan.pipeline_layout.empty()) j["pipeline_layout"] = pipeline_layout_string(plan.pipeline_layout);
  j["flash_attention"] = plan.flash_attention;
  if (plan.precision != Precision::bf16) j["precision"] = std::string(to_string(plan.precision));
  j["gpus_per_node"] = gpus_per_node;
  return j;
}

// What every rank must agree on before it runs (require_same_plan): the model
// and plan as this rank will run them and the flags that change which
// collectives it calls. FNV-1a over the canonical JSON (sorted keys).
std::string run_fingerprint(const ModelSpec& model, const ParallelPlan& plan, int gpus_per_node, const RunOptions& o) {
  const nlohmann::json j = {
      {"model", model_to_json(model)},
      {"plan", run_plan_json(plan, gpus_per_node)},
      {"run", {{"backend", o.backend}, {"steps", o.steps}, {"warmup", o.warmup}, {"check", o.check}, {"dropout", o.dropout}}}};
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : j.dump()) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

void print_summary(const nlohmann::json& doc) {
  const auto& ranks = doc["ranks"];
  const auto& p = doc["plan"];
  const std::string experts =
      p.contains("ep") ? fmt::format("; experts EP {} x ETP {}", p["ep"].get<int>(), p["etp"].get<int>()) : "";
  const int cp = p.contains("cp") ? p["cp"].get<int>() : 1;
  const std::string cp_dim = cp > 1 ? fmt::format(" x CP {}", cp) : "";
  std::cout << fmt::format("cuboid run: {} ranks (TP {}{} x PP {} x DP {}{}), backend {}, {} measured steps after {} warm-up\n",
                           ranks.size(), p["tp"].get<int>(), cp_dim, p["pp"].get<int>(), p["dp"].get<int>(), experts,
                           doc["environment"]["backend"].get<std::string>(),
                           doc["steps"].get<int>(), doc["warmup"].get<int>());
  std::cout << (cp > 1 ? "rank  tp cp pp dp   iter(s)  spread(s)  compute(s)   comm(s)  TFLOP/s  loss\n"
                       : "rank  tp pp dp   iter(s)  spread(s)  compute(s)   comm(s)  TFLOP/s  loss\n");
  for (const auto& r : ranks) {
    const auto& it = r["iteration"];
    const auto& loss = r["loss"];
    std::string l = "-";
    if (!loss.empty() && !loss.back().is_null()) l = fmt::format("{:.4f}", loss.back().get<double>());
    const std::string cp_col = cp > 1 ? fmt::format(" {:>2}", r["coord"]["cp"].get<int>()) : "";
    std::cout << fmt::format("{:>4} {:>3}{} {:>2} {:>2} {:>9.4f} {:>10.4f} {:>11.4f} {:>9.4f} {:>8.3f}  {}\n",
                             r["rank"].get<int>(), r["coord"]["tp"].get<int>(), cp_col, r["coord"]["pp"].get<int>(),
                             r["coord"]["dp"].get<int>(), it["median_s"].get<double>(),
                             it["max_s"].get<double>() - it["min_s"].get<double>(), r["compute_s"].get<double>(),
                             r["communication_s"].get<double>(), r["achieved_tflops"].get<double>(), l);
  }
  std::cout << fmt::format("iteration time (slowest rank, median): {:.4f} s\n", doc["iteration_time_s"].get<double>());
}

}  // namespace

namespace {
int run_started(const PlanFile& pf, const RunOptions& o, const ModelSpec& model, const ParallelPlan& plan,
                const Fault& fault, const LaunchInfo& launch, World& world, const std::string& fingerprint,
                const std::string& mpi_wait, const std::string& host_memory);
}  // namespace

int run_plan(const PlanFile& pf, const RunOptions& o) {
  ModelSpec model = pf.model;
  ParallelPlan plan = pf.plan;
  scale_down(model, plan, o);
  if (o.steps <= 0) throw InputError(kCl, "--steps", "must be at least 1", "give --steps 1 or more");
  if (o.warmup < 0) throw InputError(kCl, "--warmup", "must not be negative", "give --warmup 0 or more");
  check_timeout_flag(o.timeout_s);
  const Fault fault = parse_fault(o.inject_fault);
  check_mpi_wait_word(o.mpi_wait);

  const LaunchInfo launch = detect_launch(process_environment());
  // Refuse a wrong world before starting anything.
  check_executable(model, plan, pf.source);
  // The CPU backend emulates the quantized GEMMs (operands rounded to FP8 on
  // the host, an f32 GEMM); the CUDA backend runs per-tensor FP8 through
  // cuBLASLt, and MXFP8 only through that host emulation, whose timings would
  // be the host's.
  if (plan.precision == Precision::mxfp8 && o.backend != "cpu")
    throw InputError(pf.source, "parallel.precision",
                     "the " + o.backend + " backend runs no MXFP8 GEMMs (cuBLASLt's block-scaled FP8 needs Blackwell; "
                     "the cpu backend emulates them)",
                     "run with --backend cpu, or plan with --precision fp8-current");
  if (!o.out_path.empty()) check_output_paths(std::vector<OutputPath>{{"--out", o.out_path}});
  check_world_size(launch.world_size, plan, pf.source);
  // The executor's step is Adam's (exec/step.cpp); validate prices the run so.
  if (plan.optimizer == OptimizerKind::muon && launch.rank == 0)
    std::cerr << "cuboid: run: the executor steps with Adam; this plan's Muon step is priced, not run (cuboid "
                 "validate compares the run with the plan as Adam)\n";
  World world = start_world(launch, o.backend, o.timeout_s);
  check_world_size(world.exchange->size(), plan, pf.source);
  const std::string mpi_wait = apply_mpi_wait(world, o.mpi_wait);
  // After MPI's start-up, so that no library's own mallopt undoes it.
  const std::string host_memory = hold_freed_host_memory();
  // A rank with another plan file (or other sizes) would call other
  // collectives and hang the job: refuse before any work.
  const std::string fingerprint = run_fingerprint(model, plan, pf.gpus_per_node, o);
  require_same_plan(*world.exchange, fingerprint, pf.source);

  // From here on a failure is usually one rank's (out of memory on the stage
  // holding the most micro-batches, a device error): the others would wait
  // for it in a collective, and unwinding would wait for them (NCCL
  // teardown synchronises streams, MPI_Finalize is collective). So the
  // message is printed and the job ended first.
  const bool alone = world.exchange->size() == 1;
  try {
    return run_started(pf, o, model, plan, fault, launch, world, fingerprint, mpi_wait, host_memory);
  } catch (const std::exception& e) {
    if (alone) throw;
    end_job(e.what());
  }
}

namespace {

// The sharded forward pass against the unsharded one, before any step;
// its figures go to `check_json`. False: the check failed (said on rank 0).
bool check_forward(Backend& backend, ProcessGroups& groups, const ModelSpec& model, const ParallelPlan& plan,
                   OpTimer& timer, const Fault& fault, int rank, nlohmann::json& check_json) {
  const CheckResult c = check_sharded_forward(backend, groups, model, plan, timer, fault.kind == Fault::flip_shard);
  check_json = {{"passed", c.passed()},
                {"attention_relative_error", c.attention_error},
                {"layer_relative_error", c.layer_error},
                {"tolerance", c.tolerance}};
  if (rank == 0) {
    std::cout << fmt::format("check: sharded forward (TP {}{}{}{}) vs unsharded reference: attention block error {:.3g}, "
                             "layer output error {:.3g}, tolerance {:.3g} ({}): {}\n",
                             plan.tp, plan.sequence_parallel && plan.tp > 1 ? ", sequence parallel" : "",
                             plan.cp > 1 ? fmt::format(", CP {} ring attention over {} chunks", plan.cp, 2 * plan.cp)
                                         : "",
                             model.moe.enabled() ? fmt::format(", MoE layer with EP {} of {} experts", plan.ep,
                                                               model.moe.num_experts)
                                                 : "",
                             c.attention_error, c.layer_error, c.tolerance,
                             plan.precision == Precision::bf16
                                 ? std::string(to_string(backend.compute_dtype()))
                                 : fmt::format("{}, {} GEMMs against the unquantized layer",
                                               to_string(backend.compute_dtype()), to_string(plan.precision)),
                             c.passed() ? "PASSED" : "FAILED");
    std::cout.flush();
  }
  if (!c.passed() && rank == 0)
    std::cerr << "cuboid: run --check FAILED: the sharded forward pass differs from the unsharded one "
                 "(a sharding bug in the executor or backend)\n";
  return c.passed();
}

// --inject-fault on its rank, at the first measured step.
void inject_fault(const Fault& fault, int rank, OpTimer& timer) {
  if (fault.kind == Fault::kill) std::raise(SIGKILL);
  if (fault.kind == Fault::fail)
    throw ExecError(__FILE__, __LINE__, rank, "injected failure",
                    "this rank threw (as cudaMalloc running out of memory would)");
  if (fault.kind == Fault::hang)
    timer.run(mem_desc("injected_hang", Pass::forward, 0), [] {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    });
}

// The warm-up and measured steps; each step's loss.
std::vector<double> run_steps(StepRunner& runner, OpTimer& timer, const RunOptions& o, const Fault& fault, int rank) {
  std::vector<double> losses;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    const bool measured = i >= o.warmup;
    if (measured && i == o.warmup && rank == fault.rank) inject_fault(fault, rank, timer);
    losses.push_back(runner.step(i, measured));
  }
  return losses;
}

// After the steps: the weights every TP rank holds a copy of (the norms)
// and every DP replica's weights must still agree (unreduced partial
// gradients would let them drift apart). Its figures go to
// check_json["after_steps"]. False: the check failed (said on rank 0).
bool check_after_steps(StepRunner& runner, HostExchange& exchange, const Backend& backend, const RunOptions& o,
                       int rank, nlohmann::json& check_json) {
  const StepRunner::ReplicaDrift mine = runner.replica_drift();
  double tp_drift = 0, dp_drift = 0;
  for (const std::string& text : exchange.all_gather(fmt::format("{:.17g} {:.17g}", mine.tp_norms, mine.dp_weights))) {
    const auto space = text.find(' ');
    tp_drift = std::max(tp_drift, std::stod(text.substr(0, space)));
    dp_drift = std::max(dp_drift, std::stod(text.substr(space + 1)));
  }
  const double tol = check_tolerance(backend.compute_dtype());
  const bool passed = tp_drift <= tol && dp_drift <= tol;
  check_json["after_steps"] = {{"passed", passed},
                               {"steps", o.warmup + o.steps},
                               {"tp_replicated_weights_relative_drift", tp_drift},
                               {"dp_replica_relative_drift", dp_drift},
                               {"tolerance", tol}};
  if (rank == 0) {
    std::cout << fmt::format("check: after {} steps, the norms' weights across TP ranks drift {:.3g}, the DP "
                             "replicas' weights {:.3g}, tolerance {:.3g}: {}\n",
                             o.warmup + o.steps, tp_drift, dp_drift, tol, passed ? "PASSED" : "FAILED");
    std::cout.flush();
  }
  if (!passed && rank == 0)
    std::cerr << "cuboid: run --check FAILED: weights that every TP rank or DP replica holds the same differ "
                 "after the steps (a gradient reduction missing in the executor)\n";
  return passed;
}

// The model and plan as run (the sizes --layers / --seq-length left).
void add_model_and_plan(nlohmann::json& doc, const ModelSpec& model, const ParallelPlan& plan,
                        const StepRunner& runner) {
  doc["model"] = {{"name", model.name}, {"num_layers", model.num_layers}, {"hidden_size", model.hidden_size},
                  {"num_attention_heads", model.num_attention_heads}, {"ffn_hidden_size", model.ffn_hidden_size},
                  {"vocab_size", model.vocab_size}};
  doc["plan"] = plan_layout_json(plan);
  doc["plan"]["num_micro_batches"] = plan.num_micro_batches();
  doc["plan"]["seq_length"] = runner.dims().seq * plan.cp;
  doc["plan"]["world_size"] = plan.world_size();
  if (plan.cp > 1) doc["plan"]["cp"] = plan.cp;
  // The linear layers' GEMMs ran quantized (absent: the backend's own dtype).
  if (plan.precision != Precision::bf16) doc["plan"]["precision"] = std::string(to_string(plan.precision));
  if (model.moe.enabled()) {
    doc["plan"]["ep"] = plan.ep;
    doc["plan"]["etp"] = plan.expert_tp();
    doc["model"]["num_experts"] = model.moe.num_experts;
    doc["model"]["experts_per_token"] = model.moe.experts_per_token;
  }
}

// The MPI library's first line (up to a comma).
std::string mpi_library_version() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int lib_len = 0;
  MPI_Get_library_version(lib, &lib_len);
  std::string lib_version(lib, static_cast<std::size_t>(lib_len));
  if (const auto nl = lib_version.find_first_of("\r\n,"); nl != std::string::npos) lib_version.resize(nl);
  return lib_version;
}

// Every rank's figures (rank_json texts, gathered on rank 0), their hosts and
// the slowest rank's median iteration.
void add_ranks(nlohmann::json& doc, const std::vector<std::string>& all, nlohmann::json& hosts) {
  doc["ranks"] = nlohmann::json::array();
  double iteration = 0;
  for (const std::string& text : all) {
    nlohmann::json r = nlohmann::json::parse(text);
    iteration = std::max(iteration, r["iteration"]["median_s"].get<double>());
    if (std::find(hosts.begin(), hosts.end(), r["hostname"]) == hosts.end()) hosts.push_back(r["hostname"]);
    doc["ranks"].push_back(std::move(r));
  }
  doc["iteration_time_s"] = iteration;
}

struct RunContext {
  const PlanFile& pf;
  const RunOptions& o;
  const ModelSpec& model;
  const ParallelPlan& plan;
  const LaunchInfo& launch;
  const std::string& fingerprint;
  const std::string& mpi_wait;
  const std::string& host_memory;
};

// What `cuboid run` writes (schema kMeasurementsSchema), on rank 0.
nlohmann::json measurements(const RunContext& run, const Backend& backend, const StepRunner& runner,
                            const std::vector<std::string>& all, const nlohmann::json& check_json) {
  const PlanFile& pf = run.pf;
  const RunOptions& o = run.o;
  nlohmann::json doc;
  doc["schema"] = kMeasurementsSchema;
  doc["generator"] = std::string("cuboid ") + CUBOID_VERSION;
  doc["plan_file"] = pf.source;
  // The cluster the plan was made for, so that cuboid validate can refuse
  // measurements compared against another cluster's card.
  doc["cluster"] = {{"name", pf.cluster_name}, {"source_file", pf.cluster_source_file}, {"nodes", pf.nodes},
                    {"gpus_per_node", pf.gpus_per_node}, {"gpu", pf.gpu_name}};
  doc["plan_fingerprint"] = run.fingerprint;
  add_model_and_plan(doc, run.model, run.plan, runner);
  int mpi_major = 0, mpi_minor = 0;
  MPI_Get_version(&mpi_major, &mpi_minor);
  nlohmann::json hosts = nlohmann::json::array();
  add_ranks(doc, all, hosts);
  doc["environment"] = {{"backend", backend.name()},
                        {"compute_dtype", std::string(to_string(backend.compute_dtype()))},
                        // Accumulated and DP-reduced in fp32 (Megatron's main_grad), whatever compute_dtype.
                        {"grad_dtype", "f32"},
                        {"device", o.backend == "cpu" ? "cpu (one core per rank)" : "cuda device (LOCAL_RANK)"},
                        {"launcher", std::string(to_string(run.launch.launcher))},
                        {"mpi_wait", run.mpi_wait},
                        {"host_memory", run.host_memory},
                        {"mpi_version", fmt::format("{}.{}", mpi_major, mpi_minor)},
                        {"mpi_library", mpi_library_version()},
                        {"cuboid_version", CUBOID_VERSION},
                        {"hostnames", hosts}};
  if (const HostInfo host = read_host_info(); !host.empty()) doc["environment"]["host"] = host_to_json(host);
  doc["steps"] = o.steps;
  doc["warmup"] = o.warmup;
  doc["timeout_s"] = o.timeout_s;
  if (!check_json.is_null()) doc["check"] = check_json;
  return doc;
}

int run_started(const PlanFile& pf, const RunOptions& o, const ModelSpec& model, const ParallelPlan& plan,
                const Fault& fault, const LaunchInfo& launch, World& world, const std::string& fingerprint,
                const std::string& mpi_wait, const std::string& host_memory) {
  std::unique_ptr<Backend> backend = make_backend(o.backend, backend_options(launch, o.backend));
  const RankMapping mapping(plan, pf.gpus_per_node);
  // The watchdog from before the communicators exist: ncclCommInitRank and
  // ncclCommSplit wait for every peer, and a rank that never comes would
  // hang them.
  Watchdog watchdog(launch.rank, o.timeout_s);
  if (fault.kind == Fault::stall_setup && launch.rank == fault.rank)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // never reaches the communicators
  watchdog.enter("creating the communicators (ncclCommInitRank / MPI_Comm_dup)");
  attach_device_world(world, *backend);
  watchdog.enter("splitting the TP, PP and DP groups (ncclCommSplit / MPI_Comm_split)");
  ProcessGroups groups = make_process_groups(std::move(world.comm), mapping, model.moe.enabled(),
                                             model.moe.enabled() && plan.ep > 1 &&
                                                 plan.moe_dispatcher == MoeDispatcher::flex);
  watchdog.leave();
  const int rank = groups.world->rank();
  OpTimer timer(*backend, &watchdog);

  nlohmann::json check_json;
  if (o.check && !check_forward(*backend, groups, model, plan, timer, fault, rank, check_json)) return 1;

  StepOptions step_options;
  step_options.dropout = o.dropout;
  if (plan.trainer.ddp_bucket_params > 0) step_options.dp_bucket_elements = plan.trainer.ddp_bucket_params;
  StepRunner runner(*backend, groups, model, plan, timer, step_options);
  const std::vector<double> losses = run_steps(runner, timer, o, fault, rank);
  if (o.check && !check_after_steps(runner, *world.exchange, *backend, o, rank, check_json)) return 1;

  const nlohmann::json mine = rank_json(world, groups, runner, timer, losses);
  const std::vector<std::string> all = world.exchange->gather(mine.dump(), 0);
  if (rank == 0) {
    const RunContext run{pf, o, model, plan, launch, fingerprint, mpi_wait, host_memory};
    const nlohmann::json doc = measurements(run, *backend, runner, all, check_json);
    if (!o.out_path.empty()) write_output_file(o.out_path, doc.dump(2) + "\n");
    print_summary(doc);
    if (!o.out_path.empty()) std::cout << "measurements written to " << o.out_path << "\n";
  }
  return 0;
}

}  // namespace

}  // namespace cuboid::exec
