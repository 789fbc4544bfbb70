#pragma once
// Private to the simulator: the uncontended time of a TP collective, played
// once per (collective, size) on a network of its own. The builder prices TP
// collectives this way when nothing else can touch their links
// (Builder::tp_isolated): the engine would give each exactly this time.
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "cuboid/core/topology.hpp"
#include "cuboid/sim/engine.hpp"

namespace cuboid::sim::detail {

class TpProbe {
 public:
  TpProbe() = default;
  // `cluster` must outlive the probe; `group` is the TP group's ranks (any
  // node's: only their local GPU index counts).
  TpProbe(const Cluster& cluster, const std::vector<int>& group);
  // The collective's duration, start to end, on an otherwise empty network.
  TimeNs time_ns(Collective c, double bytes);
  // Peak link utilisation over every probe so far (the TP links' peak).
  double peak_utilisation() const { return peak_; }

 private:
  const Cluster* cluster_ = nullptr;
  std::vector<int> local_ranks_;       // the group on the probe's one node
  std::unique_ptr<Topology> topo_;     // one node of the cluster, made on the first probe
  std::map<std::pair<int, double>, TimeNs> cache_;
  double peak_ = 0;
};

}  // namespace cuboid::sim::detail
