// Per-rank results <-> JSON, and the cross-rank combination on rank 0.
#include "cuboid/calibrate/results.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "cuboid/calibrate/gemm_sweep.hpp"

namespace cuboid::calibrate {

namespace {

Collective collective_from(const std::string& s) {
  for (Collective c : kSweptCollectives)
    if (to_string(c) == s) return c;
  return Collective::all_reduce;  // unreachable: written by to_json below
}

// The slowest rank's median: see results.hpp.
double slowest(const std::vector<double>& per_rank_medians) {
  return *std::max_element(per_rank_medians.begin(), per_rank_medians.end());
}

}  // namespace

namespace {

template <class Sample, class Same>
std::vector<Sample> combine(const std::vector<std::vector<Sample>>& repeats, Statistic stat, Same same) {
  if (repeats.empty()) return {};
  std::vector<Sample> out = repeats.front();
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::vector<double> times;
    for (const std::vector<Sample>& r : repeats) {
      if (r.size() != out.size() || !same(r[i], out[i]))
        throw std::logic_error("calibrate: repeated sweeps measured different samples");
      times.push_back(r[i].time_ns);
    }
    out[i].time_ns = pick(std::move(times), stat);
  }
  return out;
}

}  // namespace

std::vector<GemmSample> combine_repeats(const std::vector<std::vector<GemmSample>>& repeats, Statistic stat) {
  return combine(repeats, stat, same_problem);
}

std::vector<KernelMeasurement> combine_repeats(const std::vector<std::vector<KernelMeasurement>>& repeats,
                                               Statistic stat) {
  return combine(repeats, stat, [](const KernelMeasurement& a, const KernelMeasurement& b) {
    return a.name == b.name && a.bytes == b.bytes;
  });
}

void merge_layer_gemms(std::vector<GemmSample>& table, const std::vector<GemmSample>& layer) {
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, GemmFormat>, std::vector<double>> by_shape;
  for (const GemmSample& s : layer) by_shape[{s.m, s.n, s.k, s.batch, s.format}].push_back(s.time_ns);
  for (const auto& [shape, times] : by_shape) {
    const auto [m, n, k, batch, format] = shape;
    double mean = 0;
    for (const double t : times) mean += t / static_cast<double>(times.size());
    const GemmSample s{m, n, k, batch, mean, kTimedInLayer, format};
    const auto same = std::find_if(table.begin(), table.end(), [&s](const GemmSample& g) { return same_problem(g, s); });
    if (same == table.end())
      table.push_back(s);
    else if (same->source == s.source)
      same->time_ns = (same->time_ns + s.time_ns) / 2;
    else
      *same = s;
  }
}

namespace {

// "gemms": [m, n, k, batch, time_ns], then 1 sixth for an FP8 sample (else
// 0 where a source follows), then the source where it is not the sweep's
// (GemmSample::source); "kernels": [name, bytes, time_ns].
void tables_to_json(nlohmann::json& j, const std::vector<GemmSample>& gemms,
                    const std::vector<KernelMeasurement>& kernels) {
  nlohmann::json& g = j["gemms"] = nlohmann::json::array();
  for (const GemmSample& s : gemms) {
    nlohmann::json e = {s.m, s.n, s.k, s.batch, s.time_ns};
    if (s.format == GemmFormat::fp8 || !s.source.empty()) e.push_back(s.format == GemmFormat::fp8 ? 1 : 0);
    if (!s.source.empty()) e.push_back(s.source);
    g.push_back(std::move(e));
  }
  nlohmann::json& k = j["kernels"] = nlohmann::json::array();
  for (const KernelMeasurement& m : kernels) k.push_back({m.name, m.bytes, m.time_ns});
}

void tables_from_json(const nlohmann::json& j, std::vector<GemmSample>& gemms,
                      std::vector<KernelMeasurement>& kernels) {
  for (const auto& g : j.at("gemms")) {
    GemmSample s{g[0].get<std::int64_t>(), g[1].get<std::int64_t>(), g[2].get<std::int64_t>(),
                 g[3].get<std::int64_t>(), g[4].get<double>()};
    if (g.size() > 5 && g[5].get<int>() == 1) s.format = GemmFormat::fp8;
    if (g.size() > 6) s.source = g[6].get<std::string>();
    gemms.push_back(std::move(s));
  }
  for (const auto& k : j.at("kernels"))
    kernels.push_back(KernelMeasurement{k[0].get<std::string>(), k[1].get<double>(), k[2].get<double>()});
}

// Each GEMM shape and kernel size: the slowest rank's time.
void combine_tables(const std::vector<std::pair<const std::vector<GemmSample>*, const std::vector<KernelMeasurement>*>>& ranks,
                    CombinedTables& out) {
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, GemmFormat>, std::vector<double>> gemm;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, GemmFormat>, std::string> source;
  std::map<std::string, std::map<double, std::vector<double>>> kernel;
  for (const auto& [gemms, kernels] : ranks) {
    for (const GemmSample& s : *gemms) {
      gemm[{s.m, s.n, s.k, s.batch, s.format}].push_back(s.time_ns);
      source.try_emplace({s.m, s.n, s.k, s.batch, s.format}, s.source);
    }
    for (const KernelMeasurement& m : *kernels) kernel[m.name][m.bytes].push_back(m.time_ns);
  }
  for (const auto& [shape, times] : gemm)
    out.gemms.push_back(GemmSample{std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), std::get<3>(shape),
                                   slowest(times), source.at(shape), std::get<4>(shape)});
  for (const auto& [name, by_bytes] : kernel)
    for (const auto& [bytes, times] : by_bytes) out.kernels[name].push_back(SizeSample{bytes, slowest(times)});
}

}  // namespace

nlohmann::json to_json(const RankResults& r) {
  nlohmann::json j = {{"rank", r.rank}};
  tables_to_json(j, r.gemms, r.kernels);
  if (!r.other_pools.empty()) {
    nlohmann::json& pools = j["other_pools"] = nlohmann::json::array();
    for (const PoolResults& p : r.other_pools) {
      nlohmann::json e = {{"pool_bytes", p.pool_bytes}};
      tables_to_json(e, p.gemms, p.kernels);
      pools.push_back(std::move(e));
    }
  }
  nlohmann::json& c = j["collectives"] = nlohmann::json::array();
  for (const CollectiveRecord& x : r.collectives)
    c.push_back({{"collective", std::string(to_string(x.key.collective))},
                 {"tier", x.key.tier},
                 {"group_size", x.key.group_size},
                 {"cold", x.key.cold},
                 {"group", x.group},
                 {"size", x.m.size_bytes},
                 {"count", x.m.count},
                 {"time_ns", x.m.time_ns},
                 {"wrong", x.m.wrong}});
  return j;
}

RankResults rank_results_from_json(const nlohmann::json& j) {
  RankResults r;
  r.rank = j.at("rank").get<int>();
  tables_from_json(j, r.gemms, r.kernels);
  if (j.contains("other_pools"))
    for (const auto& e : j.at("other_pools")) {
      PoolResults p;
      p.pool_bytes = e.at("pool_bytes").get<std::size_t>();
      tables_from_json(e, p.gemms, p.kernels);
      r.other_pools.push_back(std::move(p));
    }
  for (const auto& c : j.at("collectives")) {
    CollectiveRecord x;
    x.key = CollectiveKey{collective_from(c.at("collective").get<std::string>()), c.at("tier").get<std::string>(),
                          c.at("group_size").get<int>(), c.at("cold").get<bool>()};
    x.group = c.at("group").get<std::string>();
    x.m = CollectiveMeasurement{x.key.collective, c.at("size").get<std::int64_t>(), c.at("count").get<std::int64_t>(),
                                c.at("time_ns").get<double>(), c.at("wrong").get<std::int64_t>()};
    r.collectives.push_back(std::move(x));
  }
  return r;
}

Combined combine(const std::vector<RankResults>& ranks) {
  Combined out;
  std::vector<std::pair<const std::vector<GemmSample>*, const std::vector<KernelMeasurement>*>> base;
  for (const RankResults& r : ranks) base.emplace_back(&r.gemms, &r.kernels);
  combine_tables(base, out);
  const std::size_t pools = ranks.empty() ? 0 : ranks.front().other_pools.size();
  for (std::size_t i = 0; i < pools; ++i) {
    CombinedPool& p = out.other_pools.emplace_back();
    p.pool_bytes = static_cast<double>(ranks.front().other_pools[i].pool_bytes);
    std::vector<std::pair<const std::vector<GemmSample>*, const std::vector<KernelMeasurement>*>> one;
    for (const RankResults& r : ranks) {
      if (r.other_pools.size() != pools || r.other_pools[i].pool_bytes != ranks.front().other_pools[i].pool_bytes)
        throw std::logic_error("calibrate: the ranks measured different operand pools");
      one.emplace_back(&r.other_pools[i].gemms, &r.other_pools[i].kernels);
    }
    combine_tables(one, p);
  }
  for (const RankResults& r : ranks) {
    for (const CollectiveRecord& x : r.collectives) {
      CollectiveTable& t = out.collectives[x.key];
      if (t.group.empty()) t.group = x.group;
      auto it = std::find_if(t.rows.begin(), t.rows.end(),
                             [&](const CollectiveRow& row) { return row.size_bytes == x.m.size_bytes; });
      if (it == t.rows.end()) {
        t.rows.push_back(CollectiveRow{x.m.size_bytes, x.m.count, 0, 0});
        it = t.rows.end() - 1;
      }
      it->time_ns = std::max(it->time_ns, x.m.time_ns);
      it->wrong += x.m.wrong;
      out.wrong += x.m.wrong;
    }
  }
  for (auto& [key, t] : out.collectives)
    std::sort(t.rows.begin(), t.rows.end(),
              [](const CollectiveRow& a, const CollectiveRow& b) { return a.size_bytes < b.size_bytes; });
  return out;
}

}  // namespace cuboid::calibrate
