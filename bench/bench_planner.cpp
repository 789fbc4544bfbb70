// cuboid's speed benchmarks (not tests): analytical candidates per second on
// one core, and the wall time of full searches. Run through tools/bench.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <time.h>

#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/search/planner.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/core/topology.hpp"

using namespace cuboid;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Case {
  const char* name;
  const char* model;
  const char* cluster;
  int nodes;
  bool uneven;
};

void bench_case(const Case& c) {
  const ModelSpec m = load_model(c.model);
  const Cluster cl = load_cluster(c.cluster, c.nodes);
  const Topology topo(cl);
  PlannerOptions o;
  o.uneven_stages = c.uneven;

  // Full search, all cores, as `cuboid plan` runs it (analytical + top 32 simulated).
  auto t0 = Clock::now();
  const SearchResult r = search_plans(m, topo, o);
  const double search_s = seconds_since(t0);

  // One core, analytical scoring of every candidate (the planner's cached
  // Estimator, as each search thread runs it).
  SearchResult enumerated;
  const std::vector<ParallelPlan> plans = enumerate_plans(m, topo, o, enumerated);
  std::size_t evaluated = 0;
  double checksum = 0;
  Estimator score(m, topo);
  t0 = Clock::now();
  do {
    for (const ParallelPlan& p : plans) checksum += score(p).iteration_time_s;
    evaluated += plans.size();
  } while (seconds_since(t0) < 1.0);
  const double one_core_s = seconds_since(t0);

  // One core, the whole analytical search (enumeration, validation, caches, scoring).
  PlannerOptions one = o;
  one.threads = 1;
  one.simulate_top = 0;
  t0 = Clock::now();
  const SearchResult a = search_plans(m, topo, one);
  const double analytical_s = seconds_since(t0);

  std::printf("%-34s %6d GPUs %7zu candidates | one core: scoring %8.0f candidates/s, analytical search %6.3f s | "
              "all cores + top %d simulated: %6.3f s (best %.2f s, checksum %.3g)\n",
              c.name, cl.total_gpus(), plans.size(), static_cast<double>(evaluated) / one_core_s, analytical_s,
              o.simulate_top, search_s, r.fitting.empty() ? 0.0 : r.fitting.front().iteration_time_s, checksum + (a.fitting.empty() ? 0 : 1));
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct SimRun {
  double wall = 0;
  double cpu = 0;
  long page_faults = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One iteration of one plan in the discrete-event simulator, `runs` times in
// this process, each from scratch (a new network, task graph and engine).
// The first run is what `cuboid simulate` pays in a fresh process (its
// tables' pages are new to the process); the later ones reuse memory the
// process already has, as the planner's re-ranking does, simulation after
// simulation.
// With BENCH_JSON=FILE, each simulation case also appends one JSON object (a
// line) to FILE: what tools/bench decides from instead of the printed line.
void write_json_line(const char* name, int gpus, const sim::SimResult& first, const std::vector<SimRun>& done,
                     double peak_rss_mib) {
  const char* path = std::getenv("BENCH_JSON");
  if (path == nullptr || *path == '\0') return;
  nlohmann::json runs = nlohmann::json::array();
  for (const SimRun& r : done) runs.push_back({{"wall_s", r.wall}, {"cpu_s", r.cpu}, {"page_faults", r.page_faults}});
  const nlohmann::json j = {{"case", name},
                            {"gpus", gpus},
                            {"tasks", first.tasks},
                            {"events", first.events},
                            {"flows", first.flows},
                            {"iteration_s", first.estimate.iteration_time_s},
                            {"peak_rss_mib", peak_rss_mib},
                            {"runs", runs}};
  std::ofstream out(path, std::ios::app);
  out << j.dump() << '\n';
  if (!out) throw std::runtime_error(std::string("bench_planner: cannot write ") + path);
}

void bench_simulation(const char* name, const char* model, const char* cluster, int nodes, ParallelPlan plan, int runs,
                      std::optional<int> gpus_per_node = std::nullopt) {
  const ModelSpec m = load_model(model);
  const Cluster cl = load_cluster(cluster, nodes, gpus_per_node);
  const Topology topo(cl);
  plan.seq_length = plan.seq_length > 0 ? plan.seq_length : m.seq_length;
  if (const auto bad = check_plan(plan, m, cl)) throw std::invalid_argument(describe(*bad, m, cl));
  std::vector<SimRun> done;
  sim::SimResult first;
  for (int i = 0; i < runs; ++i) {
    rusage ru0{};
    getrusage(RUSAGE_SELF, &ru0);
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    sim::SimResult r = sim::run_simulation(m, topo, plan);
    SimRun run;
    run.cpu = cpu_seconds() - cpu0;
    run.wall = seconds_since(t0);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    run.page_faults = ru.ru_minflt - ru0.ru_minflt;
    done.push_back(run);
    if (i == 0) first = std::move(r);
  }
  // CPU time as well as wall time: on a shared machine the wall clock also
  // counts other processes' turns. Peak RSS is the whole process's so far
  // (run one case per process, `bench_planner sim CASE`, for the simulator's own).
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double events = static_cast<double>(first.events);
  std::printf("%-40s %6d GPUs  %9llu tasks %9llu events %7llu flows  %.3f s host, %.3f s cpu (%.2f M events/s per cpu s)  "
              "%4.0f MiB peak RSS, %ld page faults  -> %.2f s per iteration\n",
              name, cl.total_gpus(), static_cast<unsigned long long>(first.tasks),
              static_cast<unsigned long long>(first.events), static_cast<unsigned long long>(first.flows), done[0].wall,
              done[0].cpu, events / done[0].cpu / 1e6, static_cast<double>(ru.ru_maxrss) / 1024.0, done[0].page_faults,
              first.estimate.iteration_time_s);
  write_json_line(name, cl.total_gpus(), first, done, static_cast<double>(ru.ru_maxrss) / 1024.0);
  if (runs < 2) return;
  std::vector<double> cpu;
  for (std::size_t i = 1; i < done.size(); ++i) cpu.push_back(done[i].cpu);
  const double med = median(cpu);
  const auto [lo, hi] = std::minmax_element(cpu.begin(), cpu.end());
  std::printf("%-40s runs 2-%d in the same process: median %.3f s cpu (%.2f M events/s per cpu s), "
              "range %.3f-%.3f s, %ld page faults in the last\n",
              "", runs, med, events / med / 1e6, *lo, *hi, done.back().page_faults);
}

}  // namespace

// `bench_planner`: everything; `bench_planner planner`: the planner only;
// `bench_planner sim [gpt-1t|llama3.1-405b|deepseek-v3|deepseek-v3-overlap|llama3.1-405b-gb200 [RUNS]]`: only the simulator (one
// case, RUNS times in this process, default 1), e.g. to measure its peak
// memory alone.
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const std::string sim_case = argc > 2 ? argv[2] : "";
  const int runs = argc > 3 ? std::atoi(argv[3]) : 1;
  if ((!only.empty() && only != "sim" && only != "planner") || runs < 1 || argc > 4) {
    std::fprintf(stderr, "usage: bench_planner [planner | sim [gpt-1t|llama3.1-405b|deepseek-v3|deepseek-v3-overlap|"
                         "llama3.1-405b-gb200 [RUNS]]]\n");
    return 2;
  }
  const Case cases[] = {
      {"gpt-512b on 1024 A100", "models/gpt-512b.json", "topologies/dgx-a100-superpod.json", 128, false},
      {"llama3.1-405b on 16384 H100 (RoCE)", "models/llama3.1-405b.json", "topologies/h100-roce-24k.json", 2048, true},
      {"llama3-70b on 32 A100", "models/llama3-70b.json", "topologies/dgx-a100-4node.json", 4, false},
      {"deepseek-v3 on 2048 H100 (RoCE)", "models/deepseek-v3.json", "topologies/h100-roce-24k.json", 256, true},
  };
  if (only != "sim") {
    for (const Case& c : cases) bench_case(c);
    if (only == "planner") return 0;
    std::printf("\n== simulator: one iteration, one core\n");
  }
  ParallelPlan gpt1t;
  gpt1t.tp = 8;
  gpt1t.pp = 64;
  gpt1t.dp = 6;
  gpt1t.global_batch = 3072;
  gpt1t.micro_batch = 1;
  gpt1t.sequence_parallel = true;
  gpt1t.recompute = Recompute::selective;
  if (sim_case.empty() || sim_case == "gpt-1t") {
    bench_simulation("gpt-1t TP8 PP64 DP6, batch 3072", "models/gpt-1t.json", "topologies/dgx-a100-superpod.json", 384,
                     gpt1t, runs);
  }
  ParallelPlan l405;
  l405.tp = 8;
  l405.pp = 16;
  l405.dp = 128;
  l405.global_batch = 2048;
  l405.seq_length = 8192;
  l405.first_stage_layers = 7;
  l405.last_stage_layers = 7;
  l405.sequence_parallel = true;
  l405.zero_stage = 1;
  l405.recompute = Recompute::full;
  if (sim_case.empty() || sim_case == "llama3.1-405b") {
    bench_simulation("llama3.1-405b TP8 PP16 DP128, seq 8192", "models/llama3.1-405b.json",
                     "topologies/h100-roce-24k.json", 2048, l405, runs);
  }
  // DeepSeek-V3's own layout (PP 16 with 3 + 14 x 4 + 2 layers, EP 64, no
  // TP, ZeRO 1) at 4M tokens per iteration.
  ParallelPlan v3;
  v3.pp = 16;
  v3.dp = 128;
  v3.ep = 64;
  v3.etp = 1;
  v3.first_stage_layers = 3;
  v3.last_stage_layers = 2;
  v3.global_batch = 1024;
  v3.seq_length = 4096;
  v3.zero_stage = 1;
  v3.recompute = Recompute::none;
  if (sim_case.empty() || sim_case == "deepseek-v3") {
    bench_simulation("deepseek-v3 PP16 EP64 DP128, seq 4096", "models/deepseek-v3.json",
                     "topologies/h100-roce-24k.json", 256, v3, runs);
  }
  // The combined 1F1B schedule of the EP overlap (PP 1, played unstamped):
  // TP 4 (SP) x DP 512, EP 256 with DeepEP (flex), 8 micro-batches.
  ParallelPlan v3o;
  v3o.tp = 4;
  v3o.dp = 512;
  v3o.ep = 256;
  v3o.etp = 1;
  v3o.moe_dispatcher = MoeDispatcher::flex;
  v3o.moe_ep_overlap = true;
  v3o.global_batch = 4096;
  v3o.seq_length = 4096;
  v3o.sequence_parallel = true;
  v3o.zero_stage = 1;
  v3o.recompute = Recompute::none;
  if (sim_case.empty() || sim_case == "deepseek-v3-overlap") {
    bench_simulation("deepseek-v3 TP4 DP512 EP256 flex, EP overlap", "models/deepseek-v3.json",
                     "topologies/h100-roce-24k.json", 256, v3o, runs);
  }
  // The best plan `cuboid plan --model models/llama3.1-405b.json --cluster
  // topologies/gb200-nvl72.json --nodes 256 --gpus-per-node 64` finds: 256
  // racks of 16 trays, TP 8 x CP 4 inside each rack.
  ParallelPlan gb;
  gb.tp = 8;
  gb.cp = 4;
  gb.pp = 2;
  gb.dp = 256;
  gb.virtual_stages = 9;
  gb.schedule = Schedule::interleaved;
  gb.global_batch = 512;
  gb.seq_length = 8192;
  gb.sequence_parallel = true;
  gb.zero_stage = 1;
  gb.recompute = Recompute::none;
  if (sim_case.empty() || sim_case == "llama3.1-405b-gb200") {
    bench_simulation("llama3.1-405b TP8 CP4 PP2 DP256 on GB200", "models/llama3.1-405b.json",
                     "topologies/gb200-nvl72.json", 256, gb, runs, 64);
  }
  return 0;
}
