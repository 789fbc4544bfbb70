#include "cuboid/core/dispatch.hpp"

#include <algorithm>

#include "cuboid/core/element_bytes.hpp"

namespace cuboid {

namespace {

// C(a, k) / C(b, k) for a <= b: the chance that k draws without repeats from
// b items all miss the b - a others. 0 when a < k.
double choose_ratio(double a, double b, std::int64_t k) {
  double r = 1.0;
  for (std::int64_t i = 0; i < k; ++i) {
    if (a - static_cast<double>(i) <= 0) return 0.0;
    r *= (a - static_cast<double>(i)) / (b - static_cast<double>(i));
  }
  return r;
}

// C(n, k) as a double (small n: groups).
double choose(std::int64_t n, std::int64_t k) {
  if (k < 0 || k > n) return 0.0;
  double r = 1.0;
  for (std::int64_t i = 1; i <= k; ++i) r = r * static_cast<double>(n - k + i) / static_cast<double>(i);
  return r;
}

}  // namespace

double unit_hit_probability(const MoeSpec& moe, int units) {
  if (units <= 1) return 1.0;
  const std::int64_t e = moe.num_experts, k = moe.experts_per_token, u = units;
  const double per_unit = static_cast<double>(e) / static_cast<double>(u);
  const std::int64_t g = moe.router_groups, m = moe.router_group_topk;
  if (g > 1 && m > 0 && m < g && e % g == 0) {
    // Group-limited routing: the M groups first, then k of their M x E / G
    // experts.
    const double chosen = static_cast<double>(m * (e / g));
    if (u % g == 0) {
      // A unit inside one group: reached only if its group is chosen.
      const double p_group = static_cast<double>(m) / static_cast<double>(g);
      return p_group * (1.0 - choose_ratio(chosen - per_unit, chosen, k));
    }
    if (g % u == 0) {
      // A unit of c whole groups: j of them chosen with the hypergeometric
      // chance, then the k draws miss their j x E / G experts.
      const std::int64_t c = g / u;
      double miss = 0;
      for (std::int64_t j = 0; j <= std::min(c, m); ++j)
        miss += choose(c, j) * choose(g - c, m - j) / choose(g, m) *
                choose_ratio(chosen - static_cast<double>(j * (e / g)), chosen, k);
      return 1.0 - miss;
    }
  }
  return 1.0 - choose_ratio(static_cast<double>(e) - per_unit, static_cast<double>(e), k);
}

DispatchTraffic dispatch_traffic(MoeDispatcher d, const MoeSpec& moe, std::int64_t hidden, double tokens,
                                 EpSpread spread) {
  DispatchTraffic t;
  const double n = spread.ranks, nodes = spread.nodes, g = spread.per_node();
  const double k = static_cast<double>(moe.experts_per_token), e = static_cast<double>(moe.num_experts);
  const double h = static_cast<double>(hidden);
  if (spread.ranks <= 1) return t;
  switch (d) {
    case MoeDispatcher::alltoall:
      // token_dispatcher.py MoEAlltoAllTokenDispatcher.token_dispatch: the
      // permuted top-k copies, bf16.
      t.bytes_per_token = h * kBf16Bytes;
      t.node_copies = k * (n - g) / n;
      t.nvlink_copies = k * (g - 1) / g;
      break;
    case MoeDispatcher::allgather:
      // MoEAllGatherTokenDispatcher.token_dispatch: the hidden states (bf16),
      // the probabilities [tokens, experts] (fp32, as the alltoall's) and
      // the routing map (bool) gathered over the group.
      t.bytes_per_token = h * kBf16Bytes + e * (kFp32Bytes + kMaskBytes);
      t.node_copies = nodes - 1;
      t.nvlink_copies = nodes * (g - 1);
      break;
    case MoeDispatcher::flex:
      // fused_a2a.py fused_dispatch -> DeepEP Buffer.dispatch: the token
      // (bf16), its top-k indices (int64) and weights (fp32).
      t.bytes_per_token = h * kBf16Bytes + k * (8.0 + kFp32Bytes);
      t.node_copies = (nodes - 1) * unit_hit_probability(moe, spread.nodes);
      t.nvlink_copies = nodes * (g - 1) * unit_hit_probability(moe, spread.ranks);
      break;
  }
  t.nic_bytes = tokens * t.bytes_per_token * t.node_copies;
  t.nvlink_bytes = tokens * t.bytes_per_token * t.nvlink_copies;
  return t;
}

FlexKernels flex_kernels(const FlexSetting& setting, int domains) {
  FlexKernels k;
  if (setting.backend == FlexBackend::deepep) {
    k.nvlink_efficiency = kDeepEpNvlinkEfficiency;
    k.rdma_efficiency = kDeepEpRdmaEfficiency;
    k.sms = setting.sms > 0 ? setting.sms : kDeepEpSms;
    return k;
  }
  k.sms = setting.sms > 0 ? setting.sms : (domains > 1 ? kHybridEpSmsDomains : kHybridEpSmsOneDomain);
  const double f = std::clamp((static_cast<double>(k.sms) - 16.0) / 16.0, 0.0, 1.0);
  k.nvlink_efficiency =
      (kHybridEpNvlinkGBps16Sms + f * (kHybridEpNvlinkGBps32Sms - kHybridEpNvlinkGBps16Sms)) / kHybridEpMeasuredNvlinkBusbwGBps;
  k.rdma_efficiency = kHybridEpRdmaEfficiency;
  return k;
}

}  // namespace cuboid
