// cuboid's speed benchmarks (not tests): analytical candidates per second on
// one core, and the wall time of full searches. Run through tools/bench.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuboid/cluster.hpp"
#include "cuboid/estimator.hpp"
#include "cuboid/model.hpp"
#include "cuboid/planner.hpp"
#include "cuboid/topology.hpp"

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

}  // namespace

int main() {
  const Case cases[] = {
      {"gpt-512b on 1024 A100", "models/gpt-512b.json", "topologies/dgx-a100-superpod.json", 128, false},
      {"llama3.1-405b on 16384 H100 (RoCE)", "models/llama3.1-405b.json", "topologies/h100-roce-24k.json", 2048, true},
      {"llama3-70b on 32 A100", "models/llama3-70b.json", "topologies/dgx-a100-4node.json", 4, false},
  };
  for (const Case& c : cases) bench_case(c);
  return 0;
}
