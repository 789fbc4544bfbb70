// Per-rank results <-> JSON, and the cross-rank combination on rank 0.
#include "cuboid/calibrate/results.hpp"

#include <algorithm>
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
    out[i].time_ns = stat == Statistic::min ? *std::min_element(times.begin(), times.end()) : median_of(std::move(times));
  }
  return out;
}

}  // namespace

std::vector<GemmSample> combine_repeats(const std::vector<std::vector<GemmSample>>& repeats, Statistic stat) {
  return combine(repeats, stat, [](const GemmSample& a, const GemmSample& b) {
    return a.m == b.m && a.n == b.n && a.k == b.k && a.batch == b.batch && a.format == b.format;
  });
}

std::vector<KernelMeasurement> combine_repeats(const std::vector<std::vector<KernelMeasurement>>& repeats,
                                               Statistic stat) {
  return combine(repeats, stat, [](const KernelMeasurement& a, const KernelMeasurement& b) {
    return a.name == b.name && a.bytes == b.bytes;
  });
}

nlohmann::json to_json(const RankResults& r) {
  nlohmann::json j = {{"rank", r.rank}};
  nlohmann::json& g = j["gemms"] = nlohmann::json::array();
  // [m, n, k, batch, time_ns], and 1 sixth for an FP8 sample.
  for (const GemmSample& s : r.gemms) {
    nlohmann::json e = {s.m, s.n, s.k, s.batch, s.time_ns};
    if (s.format == GemmFormat::fp8) e.push_back(1);
    g.push_back(std::move(e));
  }
  nlohmann::json& k = j["kernels"] = nlohmann::json::array();
  for (const KernelMeasurement& m : r.kernels) k.push_back({m.name, m.bytes, m.time_ns});
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
  for (const auto& g : j.at("gemms")) {
    GemmSample s{g[0].get<std::int64_t>(), g[1].get<std::int64_t>(), g[2].get<std::int64_t>(),
                 g[3].get<std::int64_t>(), g[4].get<double>()};
    if (g.size() > 5 && g[5].get<int>() == 1) s.format = GemmFormat::fp8;
    r.gemms.push_back(std::move(s));
  }
  for (const auto& k : j.at("kernels"))
    r.kernels.push_back(KernelMeasurement{k[0].get<std::string>(), k[1].get<double>(), k[2].get<double>()});
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
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, GemmFormat>, std::vector<double>> gemm;
  std::map<std::string, std::map<double, std::vector<double>>> kernel;
  for (const RankResults& r : ranks) {
    for (const GemmSample& s : r.gemms) gemm[{s.m, s.n, s.k, s.batch, s.format}].push_back(s.time_ns);
    for (const KernelMeasurement& m : r.kernels) kernel[m.name][m.bytes].push_back(m.time_ns);
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
  for (const auto& [shape, times] : gemm)
    out.gemms.push_back(GemmSample{std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), std::get<3>(shape),
                                   slowest(times), "", std::get<4>(shape)});
  for (const auto& [name, by_bytes] : kernel)
    for (const auto& [bytes, times] : by_bytes) out.kernels[name].push_back(SizeSample{bytes, slowest(times)});
  for (auto& [key, t] : out.collectives)
    std::sort(t.rows.begin(), t.rows.end(),
              [](const CollectiveRow& a, const CollectiveRow& b) { return a.size_bytes < b.size_bytes; });
  return out;
}

}  // namespace cuboid::calibrate
