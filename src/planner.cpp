#include "cuboid/planner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuboid/error.hpp"

namespace cuboid {

namespace {

std::vector<int> divisors(std::int64_t n) {
  std::vector<int> out;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(static_cast<int>(d));
    if (d * d != n) out.push_back(static_cast<int>(n / d));
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <typename T>
std::vector<T> fixed_or(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

}  // namespace

std::int64_t default_global_batch(std::int64_t seq_length, int total_gpus) {
  constexpr double kTargetTokens = 4.0 * 1024 * 1024;  // ~4M tokens: GPT-3 used 3.2M, Llama 3 started at 4M
  std::int64_t odd = total_gpus;
  while (odd % 2 == 0) odd /= 2;
  const double sequences = std::max(1.0, kTargetTokens / static_cast<double>(seq_length));
  const double power = std::max(0.0, std::round(std::log2(sequences / static_cast<double>(odd))));
  return odd * (std::int64_t{1} << static_cast<int>(power));
}

ParallelPlan plan_from_options(const ModelSpec& model, const Cluster& cluster, const PlannerOptions& o) {
  ParallelPlan p;
  p.tp = o.tp.value_or(1);
  p.pp = o.pp.value_or(1);
  if (o.dp) {
    p.dp = *o.dp;
  } else {
    const int tp_pp = p.tp * p.pp;
    p.dp = (tp_pp > 0 && cluster.total_gpus() % tp_pp == 0) ? cluster.total_gpus() / tp_pp : 1;
  }
  p.seq_length = o.seq_length.value_or(model.seq_length);
  p.global_batch = o.global_batch.value_or(default_global_batch(p.seq_length, cluster.total_gpus()));
  p.micro_batch = o.micro_batch.value_or(1);
  p.virtual_stages = o.virtual_stages.value_or(1);
  p.schedule = o.schedule.value_or(p.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
  p.zero_stage = o.zero_stage.value_or(0);
  p.recompute = o.recompute.value_or(Recompute::selective);
  p.sequence_parallel = o.sequence_parallel.value_or(p.tp > 1);
  p.flash_attention = o.flash_attention;
  p.order = o.order;
  validate_plan(p, model, cluster);
  return p;
}

SearchResult search_plans(const ModelSpec& model, const Topology& topo, const PlannerOptions& o) {
  const Cluster& cluster = topo.cluster();
  const int gpus = cluster.total_gpus();
  SearchResult result;
  result.seq_length = o.seq_length.value_or(model.seq_length);
  result.global_batch = o.global_batch.value_or(default_global_batch(result.seq_length, gpus));

  // Fixed dimensions are checked up front with the plan validator's messages,
  // so "--tp 3" fails with the reason instead of "no candidates".
  {
    ParallelPlan probe;
    probe.seq_length = result.seq_length;
    probe.global_batch = result.global_batch;
    probe.tp = o.tp.value_or(1);
    probe.pp = o.pp.value_or(1);
    // Virtual stages are only checkable here together with a fixed PP.
    probe.virtual_stages = o.pp ? o.virtual_stages.value_or(1) : 1;
    probe.schedule = probe.virtual_stages > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
    probe.micro_batch = o.micro_batch.value_or(1);
    probe.dp = o.dp.value_or(1);
    probe.zero_stage = o.zero_stage.value_or(0);
    Cluster relaxed = cluster;  // the GPU-count check is the search's job
    relaxed.nodes = 1;
    relaxed.gpus_per_node = probe.world_size();
    ParallelPlan checked = probe;
    checked.global_batch = probe.micro_batch * probe.dp;  // batch divisibility is checked per candidate
    validate_plan(checked, model, relaxed);
    if (o.tp && gpus % *o.tp != 0)
      throw InputError("command line", "--tp", "TP " + std::to_string(*o.tp) + " does not divide the " + std::to_string(gpus) + " GPUs of " + cluster.name,
                       "choose a TP that divides the GPU count");
  }

  const std::int64_t heads_gcd = std::gcd(std::gcd(model.num_attention_heads, model.num_kv_heads), model.ffn_hidden_size);
  std::vector<int> tps;
  for (int t : divisors(gpus))
    if (heads_gcd % t == 0 && (o.tp || t <= cluster.gpus_per_node)) tps.push_back(t);
  std::vector<int> micro_batches;
  for (int b = 1; b <= o.max_micro_batch; b *= 2) micro_batches.push_back(b);
  // With flash attention the attention scores are never stored, so selective
  // recomputation is the same plan as none: search it only when asked for.
  const std::vector<Recompute> recomputes =
      fixed_or(o.recompute, o.flash_attention ? std::vector<Recompute>{Recompute::none, Recompute::full}
                                              : std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full});

  auto skip = [&](const std::string& reason) {
    ++result.skipped;
    ++result.skip_reasons[reason];
  };

  for (int tp : fixed_or(o.tp, tps)) {
    for (int pp : fixed_or(o.pp, divisors(model.num_layers))) {
      if (gpus % (tp * pp) != 0) continue;  // not a factorisation of this cluster
      const int dp = gpus / (tp * pp);
      if (o.dp && *o.dp != dp) continue;
      for (int mb : fixed_or(o.micro_batch, micro_batches)) {
        if (result.global_batch % (static_cast<std::int64_t>(mb) * dp) != 0) {
          skip("global batch not divisible by micro-batch x DP");
          continue;
        }
        const std::int64_t m = result.global_batch / (static_cast<std::int64_t>(mb) * dp);
        // Virtual stages: 1 (1F1B or GPipe), or v > 1 with the interleaved schedule.
        std::vector<int> vs;
        if (o.virtual_stages) {
          vs = {*o.virtual_stages};
        } else {
          vs = {1};
          if (pp > 1 && (!o.schedule || *o.schedule == Schedule::interleaved))
            for (int v : divisors(model.num_layers / pp))
              if (v > 1) vs.push_back(v);
        }
        for (int v : vs) {
          Schedule schedule = v > 1 ? Schedule::interleaved : o.schedule.value_or(Schedule::one_f_one_b);
          if (v == 1 && schedule == Schedule::interleaved) continue;
          if (v > 1 && m % pp != 0) {
            skip("interleaving needs micro-batches divisible by PP");
            continue;
          }
          std::vector<int> zeros = dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0};
          if (o.zero_stage) zeros = {*o.zero_stage};
          std::vector<bool> sps = tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false};
          if (o.sequence_parallel) sps = {*o.sequence_parallel};
          for (int zero : zeros) {
            for (Recompute rc : recomputes) {
              for (bool sp : sps) {
                ParallelPlan p;
                p.tp = tp;
                p.pp = pp;
                p.dp = dp;
                p.micro_batch = mb;
                p.global_batch = result.global_batch;
                p.seq_length = result.seq_length;
                p.virtual_stages = v;
                p.schedule = schedule;
                p.zero_stage = zero;
                p.recompute = rc;
                p.sequence_parallel = sp;
                p.flash_attention = o.flash_attention;
                p.order = o.order;
                try {
                  validate_plan(p, model, cluster);
                } catch (const InputError& e) {
                  skip("invalid for " + e.field() + ": " + e.problem());
                  continue;
                }
                Estimate est = estimate(model, topo, p);
                ++result.candidates;
                if (est.memory.fits())
                  result.fitting.push_back(std::move(est));
                else
                  result.not_fitting.push_back(std::move(est));
              }
            }
          }
        }
      }
    }
  }

  // Best first; ties broken by less memory, then by the plan's order of
  // enumeration (stable) so results are deterministic.
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Estimate& a, const Estimate& b) {
    if (a.iteration_time_s != b.iteration_time_s) return a.iteration_time_s < b.iteration_time_s;
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  std::stable_sort(result.not_fitting.begin(), result.not_fitting.end(), [](const Estimate& a, const Estimate& b) {
    return a.memory.total_bytes < b.memory.total_bytes;
  });
  if (result.not_fitting.size() > 16) result.not_fitting.resize(16);
  return result;
}

}  // namespace cuboid
