// Calibration from what `cuboid run` measured inside the step (run_calibration.hpp).
#include "cuboid/report/run_calibration.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/stats.hpp"
#include "cuboid/report/validate.hpp"

namespace cuboid {

namespace {

const std::string kSweep = "sweep";

// Times measured for one key, and the files they came from.
struct Figures {
  std::vector<double> times_ns;
  std::set<std::string> files;

  void add(double t, const std::string& file) {
    times_ns.push_back(t);
    files.insert(file);
  }
  std::string source() const {
    std::string list;
    for (const std::string& f : files) list += (list.empty() ? "" : ", ") + f;
    return (files.size() == 1 ? "measured in run " : "measured in runs ") + list;
  }
};

using GemmKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

bool executor_only(const std::string& name) {
  for (const NamedReason& r : executor_only_ops())
    if (name == r.name) return true;
  return false;
}

bool single_node(const Measurements& m) {
  for (const MeasuredRank& r : m.ranks)
    if (r.coord.node != m.ranks.front().coord.node) return false;
  return true;
}

// The measured samples of one table merged into the base card's: a measured
// size replaces the sweep's sample of that size, and a sweep sample that
// contradicts a measured one (slower below it, faster above it) is dropped,
// since the measured figures win. Returns the samples sorted by size.
std::vector<SizeSample> merge_samples(const std::vector<SizeSample>& sweep, std::vector<SizeSample> measured,
                                      int& dropped) {
  std::sort(measured.begin(), measured.end(), [](const SizeSample& a, const SizeSample& b) { return a.bytes < b.bytes; });
  std::vector<SizeSample> out = measured;
  dropped = 0;
  for (const SizeSample& s : sweep) {
    bool keep = true;
    for (const SizeSample& m : measured) {
      if (s.bytes == m.bytes || (s.bytes < m.bytes && s.time_ns > m.time_ns) ||
          (s.bytes > m.bytes && s.time_ns < m.time_ns))
        keep = false;
    }
    if (keep)
      out.push_back(s);
    else
      ++dropped;
  }
  std::stable_sort(out.begin(), out.end(), [](const SizeSample& a, const SizeSample& b) { return a.bytes < b.bytes; });
  return out;
}

}  // namespace

RunCalibration calibration_from_runs(const std::vector<Measurements>& runs, const Calibration* base, Statistic stat,
                                     const std::string& created_by) {
  if (runs.empty())
    throw InputError("command line", "--from-measurements", "no measurements file given",
                     "give one or more files written by cuboid run --out");
  for (const Measurements& m : runs) {
    // A card's GEMM samples are the backend's own GEMMs; a quantized run's
    // linear GEMMs are FP8 (on the CPU: emulated on the host).
    if (m.plan.precision != Precision::bf16)
      throw InputError(m.source, "plan.precision",
                       fmt::format("is {}: the run's linear GEMMs ran quantized, and a card's GEMM samples are the "
                                   "backend's own",
                                   to_string(m.plan.precision)),
                       "calibrate from a bf16 run of the same layout (cuboid calibrate sweeps FP8 GEMMs itself "
                       "on a GPU that has them)");
    if (m.backend != runs.front().backend)
      throw InputError(m.source, "environment.backend",
                       fmt::format("is {}, but {} ran on {}", m.backend, runs.front().source, runs.front().backend),
                       "calibrate from runs of one backend");
    if (base != nullptr && m.backend != base->backend)
      throw InputError(m.source, "environment.backend",
                       fmt::format("is {}, but the card passed with --cluster was calibrated on {}", m.backend,
                                   base->backend),
                       "give a card calibrated on the run's backend, or one without a calibration section");
  }
  RunCalibration out;
  Calibration& cal = out.calibration;
  if (base != nullptr) cal = *base;
  cal.backend = runs.front().backend;
  if (base == nullptr) {
    cal.device = runs.front().device.empty() ? cal.backend : runs.front().device;
    cal.activation_bytes_per_element = cal.backend == "cpu" ? 4 : 2;
    cal.ranks_per_core = 1;  // the step's own times: core sharing is in them
    for (const Measurements& m : runs) cal.ranks = std::max(cal.ranks, m.plan.world_size);
  }
  // A sweep's card keeps its own command beside the one that overlaid it.
  cal.created_by = base != nullptr && !base->created_by.empty()
                       ? base->created_by + "; measured entries from runs: " + created_by
                       : created_by;
  if (runs.front().host) cal.host = runs.front().host;
  for (const Measurements& m : runs)
    if (m.host && runs.front().host && *m.host != *runs.front().host)
      out.notes.push_back(fmt::format("{} ran on another host than {} ({}); the card records the first", m.source,
                                      runs.front().source, host_differences(*runs.front().host, *m.host)));

  std::map<GemmKey, Figures> gemms;
  std::map<CollectiveKey, std::map<double, Figures>> collectives;
  std::set<std::string> skipped;
  for (const Measurements& m : runs) {
    const bool one_node = single_node(m);
    if (!one_node) out.notes.push_back(m.source + ": ranks on several nodes; its collectives are not taken (tier)");
    for (const MeasuredRank& r : m.ranks) {
      for (const MeasuredOp& op : r.ops) {
        if (op.calls_per_step <= 0 || executor_only(op.name)) continue;
        const double per_call_ns = pick(op.time_per_step, stat) * 1e9 / static_cast<double>(op.calls_per_step);
        if (!(per_call_ns > 0)) {
          skipped.insert(op.name + " (a time of 0)");
          continue;
        }
        if (op.kind == OpKind::gemm) {
          gemms[{op.m, op.n, op.k, op.batch}].add(per_call_ns / cal.ranks_per_core, m.source);
        } else if (op.kind == OpKind::collective && one_node && op.collective && op.group_size >= 2 &&
                   op.bytes_per_call > 0) {
          // The data-parallel collectives ran on buffers as the step leaves them (CollectiveKey::cold).
          const CollectiveKey key{*op.collective, "intra_node", op.group_size, op.group == Group::dp};
          collectives[key][op.bytes_per_call].add(per_call_ns, m.source);
        }
      }
    }
  }

  for (GemmSample& g : cal.gemms)
    if (g.source.empty()) g.source = kSweep;
  for (const auto& [key, f] : gemms) {
    const auto [mm, n, k, batch] = key;
    GemmSample s{mm, n, k, batch, median_of(f.times_ns), f.source()};
    const auto same =
        std::find_if(cal.gemms.begin(), cal.gemms.end(), [&s](const GemmSample& g) { return same_problem(g, s); });
    if (same != cal.gemms.end())
      *same = s;
    else
      cal.gemms.push_back(s);
    ++out.gemms_measured;
  }
  for (auto& [name, kc] : cal.kernels)
    if (kc.source.empty()) kc.source = kSweep;
  for (auto& [key, cc] : cal.collectives)
    if (cc.source.empty()) cc.source = kSweep;

  for (const auto& [key, by_size] : collectives) {
    const std::string field =
        fmt::format("collectives.{}.{}.{}", to_string(key.collective), key.tier, key.group_size);
    std::vector<SizeSample> measured;
    std::set<std::string> files;
    for (const auto& [bytes, f] : by_size) {
      measured.push_back(SizeSample{bytes, median_of(f.times_ns)});
      files.insert(f.files.begin(), f.files.end());
    }
    if (const int pooled = make_monotone(measured); pooled > 0)
      out.notes.push_back(fmt::format("{}: {} of {} measured times pooled (time fell as the size grew)", field, pooled,
                                      measured.size()));
    const auto it = cal.collectives.find(key);
    int dropped = 0;
    std::vector<SizeSample> samples =
        merge_samples(it != cal.collectives.end() ? it->second.samples : std::vector<SizeSample>{}, measured, dropped);
    if (dropped > 0)
      out.notes.push_back(fmt::format("{}: {} sweep samples dropped (the measured times contradict them)", field,
                                      dropped));
    Figures names;
    for (const std::string& f : files) names.files.insert(f);
    try {
      CollectiveCalibration cc = fit_collective(key.collective, key.group_size, samples, "cuboid calibrate", field);
      cc.source = names.source() + (it != cal.collectives.end() && samples.size() > measured.size()
                                        ? fmt::format(" ({} sizes; the other sizes: sweep)", measured.size())
                                        : "");
      cal.collectives[key] = std::move(cc);
      out.collective_samples += static_cast<int>(measured.size());
    } catch (const InputError& e) {
      out.notes.push_back(fmt::format("{}: not calibrated from the runs ({}){}", field, e.what(),
                                      it != cal.collectives.end() ? "; the sweep's table stays" : ""));
    }
  }
  for (const std::string& s : skipped) out.notes.push_back("not taken: " + s);
  if (out.gemms_measured == 0 && out.collective_samples == 0)
    throw InputError(runs.front().source, "ranks[].ops",
                     "has no GEMM or collective time to calibrate from",
                     "give a measurements file of a run that timed its ops (cuboid run --out)");
  return out;
}

namespace {

using GemmEntryKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, GemmFormat>;

// One GEMM table from several cards' tables: each shape's time by the
// statistic over the cards that measured it, the source of the first.
std::vector<GemmSample> merge_gemm_tables(const std::vector<const std::vector<GemmSample>*>& tables, Statistic stat) {
  std::map<GemmEntryKey, std::vector<double>> times;
  std::map<GemmEntryKey, GemmSample> first;
  for (const std::vector<GemmSample>* t : tables)
    for (const GemmSample& g : *t) {
      const GemmEntryKey key{g.m, g.n, g.k, g.batch, g.format};
      times[key].push_back(g.time_ns);
      first.try_emplace(key, g);
    }
  std::vector<GemmSample> out;
  for (auto& [key, t] : times) {
    GemmSample g = first.at(key);
    g.time_ns = pick(std::move(t), stat);
    out.push_back(std::move(g));
  }
  return out;
}

// Samples of one series from several cards: each size's time by the
// statistic over the cards that measured it, sorted by size and made
// monotone (the minimum or median of monotone series can still fall where
// the cards measured different sizes). Returns how many times were pooled.
std::vector<SizeSample> merge_series(const std::vector<const std::vector<SizeSample>*>& series, Statistic stat,
                                     int& pooled) {
  std::map<double, std::vector<double>> times;
  for (const std::vector<SizeSample>* s : series)
    for (const SizeSample& x : *s) times[x.bytes].push_back(x.time_ns);
  std::vector<SizeSample> out;
  for (auto& [bytes, t] : times) out.push_back(SizeSample{bytes, pick(std::move(t), stat)});
  pooled = make_monotone(out);
  return out;
}

std::map<std::string, KernelCalibration> merge_kernel_tables(
    const std::vector<const std::map<std::string, KernelCalibration>*>& tables, Statistic stat,
    const std::string& where, std::vector<std::string>& notes) {
  std::map<std::string, std::vector<const std::vector<SizeSample>*>> by_name;
  std::map<std::string, std::string> source;
  for (const auto* t : tables)
    for (const auto& [name, kc] : *t) {
      by_name[name].push_back(&kc.samples);
      source.try_emplace(name, kc.source);
    }
  std::map<std::string, KernelCalibration> out;
  for (const auto& [name, series] : by_name) {
    int pooled = 0;
    const std::string field = "kernels." + name + where;
    KernelCalibration kc = fit_kernel(merge_series(series, stat, pooled), "cuboid calibrate --merge", field);
    kc.source = source.at(name);
    if (pooled > 0) notes.push_back(fmt::format("{}: {} merged times pooled (time fell as the size grew)", field, pooled));
    out.emplace(name, std::move(kc));
  }
  return out;
}

}  // namespace

Calibration merge_calibrations(const std::vector<Calibration>& cards, const std::vector<std::string>& sources,
                               Statistic stat, const std::string& created_by, std::vector<std::string>& notes) {
  if (cards.size() < 2)
    throw InputError("command line", "--merge", fmt::format("gives {} card(s)", cards.size()),
                     "give two or more calibrated cards of the same machine and plans");
  const Calibration& a = cards.front();
  for (std::size_t i = 1; i < cards.size(); ++i) {
    const Calibration& b = cards[i];
    auto differs = [&](const std::string& field, const std::string& mine, const std::string& first) {
      if (mine != first)
        throw InputError(sources[i], "calibration." + field,
                         fmt::format("is {}, but {} has {}", mine, sources.front(), first),
                         "merge cards calibrated alike (the same backend, ranks per core and operand pool)");
    };
    differs("backend", b.backend, a.backend);
    differs("ranks_per_core", fmt::format("{:g}", b.ranks_per_core), fmt::format("{:g}", a.ranks_per_core));
    differs("activation_bytes_per_element", std::to_string(b.activation_bytes_per_element),
            std::to_string(a.activation_bytes_per_element));
    differs("gemm_operand_pool_bytes", fmt::format("{:.0f} bytes", b.gemm_operand_pool_bytes),
            fmt::format("{:.0f} bytes", a.gemm_operand_pool_bytes));
    if (b.host && a.host && *b.host != *a.host)
      notes.push_back(fmt::format("{} was calibrated on another host than {} ({}); the card records the first",
                                  sources[i], sources.front(), host_differences(*a.host, *b.host)));
  }
  Calibration out = a;
  out.created_by = created_by;
  std::vector<const std::vector<GemmSample>*> gemms;
  std::vector<const std::map<std::string, KernelCalibration>*> kernels;
  std::map<CollectiveKey, std::vector<const std::vector<SizeSample>*>> collectives;
  std::map<CollectiveKey, std::string> collective_source;
  for (const Calibration& c : cards) {
    gemms.push_back(&c.gemms);
    kernels.push_back(&c.kernels);
    for (const auto& [key, cc] : c.collectives) {
      collectives[key].push_back(&cc.samples);
      collective_source.try_emplace(key, cc.source);
    }
  }
  out.gemms = merge_gemm_tables(gemms, stat);
  out.kernels = merge_kernel_tables(kernels, stat, "", notes);
  out.collectives.clear();
  for (const auto& [key, series] : collectives) {
    int pooled = 0;
    const std::string field =
        fmt::format("collectives.{}.{}.{}{}", to_string(key.collective), key.tier, key.group_size, key.cold ? ".cold" : "");
    CollectiveCalibration cc = fit_collective(key.collective, key.group_size, merge_series(series, stat, pooled),
                                              "cuboid calibrate --merge", field);
    cc.source = collective_source.at(key);
    if (pooled > 0) notes.push_back(fmt::format("{}: {} merged times pooled (time fell as the size grew)", field, pooled));
    out.collectives.emplace(key, std::move(cc));
  }
  // The other operand pools by their bytes (a pool only some cards have: theirs).
  out.other_pools.clear();
  std::map<double, std::pair<std::vector<const std::vector<GemmSample>*>,
                             std::vector<const std::map<std::string, KernelCalibration>*>>>
      pools;
  for (const Calibration& c : cards)
    for (const OperandPoolTables& t : c.other_pools) {
      pools[t.gemm_operand_pool_bytes].first.push_back(&t.gemms);
      pools[t.gemm_operand_pool_bytes].second.push_back(&t.kernels);
    }
  for (const auto& [bytes, tables] : pools) {
    OperandPoolTables& t = out.other_pools.emplace_back();
    t.gemm_operand_pool_bytes = bytes;
    t.gemms = merge_gemm_tables(tables.first, stat);
    t.kernels = merge_kernel_tables(tables.second, stat, fmt::format(" (operand pool {:.1f} MiB)", bytes / (1 << 20)),
                                    notes);
  }
  return out;
}

}  // namespace cuboid
