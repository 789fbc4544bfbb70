// TP collectives priced on a network of their own (tp_probe.hpp).
#include "tp_probe.hpp"

#include <algorithm>

#include "cuboid/sim/network.hpp"

namespace cuboid::sim::detail {

TpProbe::TpProbe(const Cluster& cluster, const std::vector<int>& group) : cluster_(&cluster) {
  const int gpn = std::max(1, cluster.gpus_per_node);
  local_ranks_.reserve(group.size());
  for (int r : group) local_ranks_.push_back(r % gpn);
}

TimeNs TpProbe::time_ns(Collective c, double bytes) {
  const auto key = std::make_pair(static_cast<int>(c), bytes);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  // One node of the same card is enough (the group never leaves its node),
  // and far cheaper to build than the whole fabric.
  if (!topo_) {
    Cluster one = *cluster_;
    one.nodes = 1;
    topo_ = std::make_unique<Topology>(one);
  }
  Network net(*topo_);
  Engine eng(net);
  CommGroup g;
  g.ranks = local_ranks_;
  const int first = g.ranks.front();
  const GroupId gid = eng.add_group(std::move(g));
  const StreamId s = eng.add_stream(first, StreamKind::tp);
  const StreamId streams[1] = {s};
  const TaskId t = eng.add_collective(c, gid, bytes, streams);
  eng.run();
  const TimeNs ns = eng.end_ns(t) - eng.start_ns(t);
  for (const LinkStats& st : net.all_link_stats()) peak_ = std::max(peak_, st.peak_utilisation);
  cache_.emplace(key, ns);
  return ns;
}

}  // namespace cuboid::sim::detail
