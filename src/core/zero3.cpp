// ZeRO-3's gather schedule of a pass (see zero3.hpp). The rules follow
// DeepSpeed v0.5.4 deepspeed/runtime/zero/stage3.py
// (PartitionedParameterCoordinator: fetch_sub_module, prefetch_next_sub_modules,
// _keep_for_later) and FSDP2's one-unit-ahead prefetch; the settings that
// select them cite their sources in trainers/*.json.
#include "cuboid/core/zero3.hpp"

#include <unordered_map>

namespace cuboid {

Zero3PassPlan plan_zero3_pass(std::span<const Zero3Use> uses, const TrainerSettings& s) {
  const std::size_t n = uses.size();
  Zero3PassPlan p;
  p.gathered.assign(n, 0);
  p.waits.assign(n, 0);
  p.issue_begin.assign(n + 1, 0);
  p.issued.reserve(n);

  // A tensor stays gathered from one use to the next when the parameters of
  // the uses between hold fewer than zero3_reuse_params elements
  // (_keep_for_later: the trace's elements up to the reuse).
  std::vector<double> before(n + 1, 0.0);  // elements of uses [0, u)
  for (std::size_t u = 0; u < n; ++u) before[u + 1] = before[u] + uses[u].params;
  std::unordered_map<std::int64_t, std::size_t> previous;
  for (std::size_t u = 0; u < n; ++u) {
    bool gather = uses[u].params > 0;
    if (uses[u].tensor >= 0) {
      const auto it = previous.find(uses[u].tensor);
      if (it != previous.end() && s.zero3_reuse_params > 0 &&
          before[u] - before[it->second + 1] < static_cast<double>(s.zero3_reuse_params))
        gather = false;
      previous[uses[u].tensor] = u;
    }
    p.gathered[u] = gather ? 1 : 0;
  }

  std::vector<std::uint8_t> issued(n, 0);
  std::vector<std::size_t> issue_rank(n, 0);  // position in p.issued
  std::size_t waited = 0;                      // the first p.issued entries have been waited for
  auto issue = [&](std::size_t u) {
    issued[u] = 1;
    issue_rank[u] = p.issued.size();
    p.issued.push_back(static_cast<std::uint32_t>(u));
  };
  const bool prefetch = s.zero3_prefetch_units > 0 || s.zero3_prefetch_params > 0;
  // The window after u: the following gathered uses, until the count or the
  // elements bound is reached (the use that reaches it included).
  auto window = [&](std::size_t u, bool count_issued) {
    if (!prefetch) return;
    int count = 0;
    double elements = 0;
    for (std::size_t j = u + 1; j < n; ++j) {
      if (!p.gathered[j] || (!count_issued && issued[j])) continue;
      if (!issued[j]) issue(j);
      ++count;
      elements += uses[j].params;
      if (s.zero3_prefetch_units > 0 && count >= s.zero3_prefetch_units) break;
      if (s.zero3_prefetch_params > 0 && elements >= static_cast<double>(s.zero3_prefetch_params)) break;
    }
  };
  bool in_flight = false;  // zero3_sync: gathers issued since the last wait
  for (std::size_t u = 0; u < n; ++u) {
    p.issue_begin[u] = static_cast<std::uint32_t>(p.issued.size());
    if (p.gathered[u] && !issued[u]) {
      issue(u);  // not prefetched: fetched when reached
      in_flight = true;
    }
    if (!s.zero3_sync) {
      // FSDP2 / Megatron-FSDP: the window counts units already in flight.
      window(u, true);
      continue;
    }
    // fetch_sub_module: a parameter in flight is waited for with
    // _synchronize_communication, which completes every handle in flight
    // and then synchronises the device.
    if (p.gathered[u] && issue_rank[u] >= waited) {
      p.waits[u] = 1;
      waited = p.issued.size();
      in_flight = false;
    }
    // prefetch_next_sub_modules: only with nothing in flight, and only
    // parameters not yet available (get_params_to_prefetch).
    if (!in_flight) {
      const std::size_t before_window = p.issued.size();
      window(u, false);
      in_flight = p.issued.size() > before_window;
    }
  }
  p.issue_begin[n] = static_cast<std::uint32_t>(p.issued.size());
  return p;
}

}  // namespace cuboid
