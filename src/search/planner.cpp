// The search: enumerate the candidates (enumerate.cpp), score them on all
// cores, re-rank the best by simulation, fold rank-order ties into one row.
#include "cuboid/search/planner.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "cuboid/core/error.hpp"
#include "cuboid/sim/simulator.hpp"

namespace cuboid {

namespace {

bool same_but_order(const ParallelPlan& a, const ParallelPlan& b) {
  ParallelPlan x = a;
  x.order = b.order;
  return x == b;
}

// Plans that differ only in rank order often score alike (a dimension of size
// 1 or 2 placed differently crosses the same links). Within kRankOrderTie of
// each other they are one row: the trainers' order (Megatron's tp-dp-pp, which
// every export target expresses) when it is among them, else the fastest; the
// others are listed in tied_orders. `rows` are sorted by time within each of
// their two runs (simulated first, then analytical), so the rows a row can tie
// with are the kept rows just before it.
void fold_rank_order_ties(std::vector<Estimate>& rows) {
  const RankOrder trainers{};
  std::vector<Estimate> kept;
  kept.reserve(rows.size());
  for (Estimate& e : rows) {
    Estimate* twin = nullptr;
    for (auto it = kept.rbegin(); it != kept.rend() && it->simulated == e.simulated &&
                                  e.iteration_time_s <= it->iteration_time_s * (1 + kRankOrderTie);
         ++it) {
      if (same_but_order(it->plan, e.plan)) {
        twin = &*it;
        break;
      }
    }
    if (twin == nullptr) {
      kept.push_back(std::move(e));
      continue;
    }
    if (e.plan.order == trainers) {  // shown instead of the faster twin, in its place
      e.tied_orders = std::move(twin->tied_orders);
      e.tied_orders.push_back(twin->plan.order);
      *twin = std::move(e);
    } else {
      twin->tied_orders.push_back(e.plan.order);
    }
  }
  rows = std::move(kept);
}

}  // namespace

void attach_other_orders(Estimate& e, const SearchResult& r) {
  e.other_orders.clear();
  for (const Estimate& row : r.fitting) {
    if (row.plan.order == e.plan.order || !same_but_order(row.plan, e.plan)) continue;
    e.other_orders.push_back({row.plan.order, row.iteration_time_s, row.simulated});
    for (const RankOrder& o : row.tied_orders)
      if (o != e.plan.order) e.other_orders.push_back({o, row.iteration_time_s, row.simulated});
  }
  for (const RankOrder& o : e.tied_orders)
    if (std::none_of(e.other_orders.begin(), e.other_orders.end(), [&](const auto& x) { return x.order == o; }))
      e.other_orders.push_back({o, e.iteration_time_s, e.simulated});
  std::stable_sort(e.other_orders.begin(), e.other_orders.end(),
                   [](const auto& a, const auto& b) { return a.iteration_time_s < b.iteration_time_s; });
}

namespace {

// Every plan scored by the analytical estimate on `threads` cores. Each
// worker writes only its own slots, so the result does not depend on the
// thread count.
std::vector<Estimate> score_all(const ModelSpec& model, const Topology& topo, const std::vector<ParallelPlan>& plans,
                                unsigned threads, const PlannerOptions& o) {
  std::vector<Estimate> scored(plans.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  constexpr std::size_t kChunk = 256;
  auto worker = [&] {
    Estimator score(model, topo);  // per-thread caches
    for (;;) {
      const std::size_t begin = next.fetch_add(kChunk);
      if (begin >= plans.size()) return;
      const std::size_t end = std::min(plans.size(), begin + kChunk);
      for (std::size_t i = begin; i < end; ++i) scored[i] = score(plans[i]);
      done.fetch_add(end - begin);
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    if (o.progress) {
      // The calling thread reports progress and then helps.
      std::jthread reporter([&] {
        while (done.load() < plans.size()) {
          o.progress(done.load(), plans.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      worker();
    } else {
      worker();
    }
  }
  if (o.progress) o.progress(plans.size(), plans.size());
  return scored;
}

// The best k of `fitting` re-scored by the discrete-event simulator (in
// parallel; each worker writes its own slots, so the order does not depend
// on threads) and sorted again, simulated first.
void rerank_by_simulation(const ModelSpec& model, const Topology& topo, std::vector<Estimate>& fitting, std::size_t k,
                          unsigned threads) {
  std::atomic<std::size_t> next_sim{0};
  auto sim_worker = [&] {
    for (std::size_t i = next_sim.fetch_add(1); i < k; i = next_sim.fetch_add(1)) {
      try {
        fitting[i] = sim::simulate(model, topo, fitting[i].plan);
      } catch (const std::invalid_argument&) {
        // A plan the simulator cannot play keeps its analytical score.
      }
    }
  };
  const unsigned sim_threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(k)));
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < sim_threads; ++t) pool.emplace_back(sim_worker);
    sim_worker();
  }
  std::stable_sort(fitting.begin(), fitting.begin() + static_cast<std::ptrdiff_t>(k),
                   [](const Estimate& a, const Estimate& b) {
                     if (a.simulated != b.simulated) return a.simulated;
                     if (a.iteration_time_s != b.iteration_time_s) return a.iteration_time_s < b.iteration_time_s;
                     return a.memory.total_bytes < b.memory.total_bytes;
                   });
}

}  // namespace

SearchResult search_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& o) {
  SearchResult result;
  // 1. Enumerate (sequential, deterministic order).
  const std::vector<ParallelPlan> plans = enumerate_plans(model, topo, o, result);
  // 2. Score every plan on all cores.
  const unsigned threads = std::max(1u, std::min<unsigned>(o.threads > 0 ? static_cast<unsigned>(o.threads)
                                                                        : std::thread::hardware_concurrency(),
                                                           static_cast<unsigned>((plans.size() + 255) / 256)));
  std::vector<Estimate> scored = score_all(model, topo, plans, threads, o);
  result.candidates = static_cast<std::int64_t>(scored.size());
  for (Estimate& e : scored) {
    if (e.memory.fits())
      result.fitting.push_back(std::move(e));
    else
      result.not_fitting.push_back(std::move(e));
  }
  // Best first; ties broken by less memory, then by the plan's order of
  // enumeration (stable) so results are deterministic.
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Estimate& a, const Estimate& b) {
    if (a.iteration_time_s != b.iteration_time_s) return a.iteration_time_s < b.iteration_time_s;
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  // 3. Re-rank the best K with the discrete-event simulator.
  const std::size_t k =
      std::min<std::size_t>(result.fitting.size(), static_cast<std::size_t>(std::max(0, o.simulate_top)));
  if (k > 0) {
    rerank_by_simulation(model, topo, result.fitting, k, threads);
    for (std::size_t i = 0; i < k; ++i) result.simulated += result.fitting[i].simulated ? 1 : 0;
  }
  result.fitting_plans = static_cast<std::int64_t>(result.fitting.size());
  fold_rank_order_ties(result.fitting);
  std::stable_sort(result.not_fitting.begin(), result.not_fitting.end(), [](const Estimate& a, const Estimate& b) {
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  if (result.not_fitting.size() > 16) result.not_fitting.resize(16);
  return result;
}

}  // namespace cuboid
