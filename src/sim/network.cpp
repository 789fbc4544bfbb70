// Flow-level max-min network: flows and their rates. Rates are re-solved
// only on the connected component (links <-> flows) a starting or ending flow
// touches; a flow's remaining bytes are brought up to date lazily, only when
// its rate changes. Link classes: link_classes.cpp; routes: route_compile.cpp.
#include "cuboid/sim/network.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace cuboid::sim {

namespace {

bool pending_after(TimeNs ta, std::uint64_t sa, TimeNs tb, std::uint64_t sb) {
  return ta != tb ? ta > tb : sa > sb;
}

// Achievable fraction of the NIC line rate (nccl-tests busbw per NIC / line rate).
double nic_efficiency(const Cluster& c) {
  const double line_GBps = c.inter.nic_bandwidth_Gbps / 8.0;
  if (line_GBps <= 0 || c.inter.nic_busbw_GBps <= 0) return 1.0;
  return std::min(1.0, c.inter.nic_busbw_GBps / line_GBps);
}

}  // namespace

Network::Network(std::vector<double> link_capacity_Bps) {
  const std::size_t n = link_capacity_Bps.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (!(link_capacity_Bps[i] > 0)) throw std::invalid_argument("Network: link capacity must be > 0");
  }
  link_capacity_ = std::move(link_capacity_Bps);
  num_links_ = n;
  num_slots_ = n;
  init_classes();
}

Network::Network(const Topology& topo, NetworkOptions opts, std::pmr::memory_resource* mem)
    : topo_(&topo), opts_(opts), mem_(mem) {
  const Cluster& c = topo.cluster();
  const std::vector<EdgeRecord>& edges = topo.edges();
  if (edges.size() != boost::num_edges(topo.graph())) {
    throw std::logic_error("Network: topology edge ids are not 0..edges-1");
  }
  // Links 2 id (lower -> higher vertex) and 2 id + 1, as Topology::route_ids
  // numbers them; their capacities are read off the edges (capacity_of).
  num_links_ = 2 * edges.size();
  num_slots_ = num_links_;
  if (opts_.achievable_bandwidth) {
    if (c.intra.busbw_GBps > 0) intra_busbw_Bps_ = c.intra.busbw_GBps * 1e9;
    nic_eff_ = nic_efficiency(c);
  }
  init_classes();
}

void Network::throw_no_topology_link(LinkId l) const {
  throw std::out_of_range("Network: no topology link " + std::to_string(l));
}

std::pair<std::uint32_t, std::uint32_t> Network::link_ends(LinkId l) const {
  if (topo_ == nullptr || l >= num_links_) throw_no_topology_link(l);
  const EdgeRecord& e = topo_->edges()[l / 2];
  return l % 2 == 0 ? std::pair{e.lo, e.hi} : std::pair{e.hi, e.lo};
}

std::string Network::link_name(LinkId l) const {
  if (topo_ != nullptr && l < num_links_) {
    const auto& g = topo_->graph();
    const auto [from, to] = link_ends(l);
    return g[from].name + "->" + g[to].name;
  }
  return "link" + std::to_string(l);
}

FlowId Network::start_flow(std::span<const LinkUse> uses, double bytes, TimeNs now, std::uint64_t tag) {
  return start_flow(add_link_set(uses), bytes, now, tag);
}

FlowId Network::start_flow(LinkSetId set, double bytes, TimeNs now, std::uint64_t tag) {
  if (set >= sets_.size()) throw std::out_of_range("Network: link set out of range");
  FlowId f = 0;
  if (!free_flows_.empty()) {
    f = free_flows_.back();
    free_flows_.pop_back();
  } else {
    f = static_cast<FlowId>(flows_.size());
    flows_.emplace_back();
  }
  now_ = std::max(now_, now);
  Flow& fl = flows_[f];
  fl.set = set;
  fl.nuses = 0;
  fl.registered = false;
  fl.positions.clear();
  fl.shared.clear();
  fl.remaining = std::max(0.0, bytes);
  fl.total = fl.remaining;
  fl.rate = 0;
  fl.max_rate = 0;
  fl.updated_ns = now;
  fl.finish_ns = kNever;
  fl.tag = tag;
  fl.seq = counts_.next_seq++;
  fl.active = true;
  ++counts_.active;
  ++counts_.flows_started;
  const LinkSet& s = sets_[set];
  if (fl.remaining == 0 || s.classes.empty()) {
    fl.finish_ns = now;
    push_pending(f);
    return f;
  }
  fl.nuses = static_cast<std::uint32_t>(s.classes.size());
  // Only flows of conflicting sets can meet this one on a link: if none runs,
  // it is alone on all its links and skips them (the hot path of a mirrored
  // p2p or collective: hundreds of links). Else the ones off the lists join
  // them first, then this one, as if every flow had joined when it started.
  bool alone = true;
  for (LinkSetId c : s.conflicts) {
    for (FlowId g : sets_[c].active) {
      alone = false;
      if (!flows_[g].registered) register_flow(g);
    }
  }
  fl.apos = static_cast<std::uint32_t>(sets_[set].active.size());
  sets_[set].active.push_back(f);
  if (alone) {
    set_rate(f, s.cap, now);
    return f;
  }
  register_flow(f);
  if (fl.shared.empty()) {
    set_rate(f, s.cap, now);  // alone on all its links
    return f;
  }
  for (std::uint32_t i : fl.shared) solve_.dirty.push_back(set_class(fl, i));
  return f;
}

// Puts a flow on its links' lists; a link that already has a flow becomes
// shared by both (they take part in the solves of its component).
void Network::register_flow(FlowId f) {
  Flow& fl = flows_[f];
  const LinkSet& s = sets_[fl.set];
  fl.registered = true;
  fl.positions.resize(s.classes.size());
  const ClassId* classes = s.classes.data();
  for (std::uint32_t i = 0; i < fl.nuses; ++i) {
    FlowList& list = classes_.flows[classes[i]];
    fl.positions[i] = ListPosition{list.size(), kNotShared};
    list.push_back(FlowRef{f, i});
    if (list.size() >= 2) {
      if (list.size() == 2) add_shared(list[0].flow, list[0].use);
      add_shared(f, i);
    }
  }
}

void Network::flush() {
  if (solve_.dirty.empty()) return;
  solve_.seeds.swap(solve_.dirty);
  solve_.dirty.clear();
  solve_from(solve_.seeds, now_);
  solve_.seeds.clear();
}

void Network::add_shared(FlowId f, std::uint32_t use) {
  Flow& fl = flows_[f];
  fl.positions[use].spos = static_cast<std::uint32_t>(fl.shared.size());
  fl.shared.push_back(use);
}

void Network::remove_shared(FlowId f, std::uint32_t use) {
  Flow& fl = flows_[f];
  const std::uint32_t p = fl.positions[use].spos;
  const std::uint32_t last = fl.shared.back();
  fl.shared[p] = last;
  fl.positions[last].spos = p;
  fl.shared.pop_back();
  fl.positions[use].spos = kNotShared;
}

// A finished flow leaves its links: shared links become seeds of the
// re-solve and the flow is unregistered; what it carried goes to the links'
// totals at the next settle() (whenever the flow ran, each of its links
// carried at least weight * rate: the peak).
void Network::retire_flow(FlowId f) {
  Flow& fl = flows_[f];
  if (fl.nuses == 0) return;
  LinkSet& s = sets_[fl.set];
  const FlowId moved_active = s.active.back();
  s.active[fl.apos] = moved_active;
  flows_[moved_active].apos = fl.apos;
  s.active.pop_back();
  if (retired_.capacity() == 0) retired_.reserve(kRetiredMax);  // settled when full: never regrown
  retired_.push_back(Retired{fl.set, fl.total});
  s.retired_max_rate = std::max(s.retired_max_rate, fl.max_rate);
  if (!s.peak_dirty) {
    s.peak_dirty = true;
    peak_dirty_sets_.push_back(fl.set);
  }
  const ClassId* classes = s.classes.data();
  const std::uint32_t on_lists = fl.registered ? fl.nuses : 0;
  for (std::uint32_t i = 0; i < on_lists; ++i) {
    const ClassId c = classes[i];
    const std::uint32_t pos = fl.positions[i].pos;
    FlowList& list = classes_.flows[c];
    if (list.size() > 1) solve_.seeds.push_back(c);
    const FlowRef moved = list.back();
    if (moved.flow != f) {
      list[pos] = moved;
      flows_[moved.flow].positions[moved.use].pos = pos;
    }
    list.pop_back();
    if (list.size() == 1) remove_shared(list[0].flow, list[0].use);
  }
  fl.shared.clear();
  fl.nuses = 0;
  fl.registered = false;
  // Bounded memory: replay the finished flows' bytes now and then.
  if (retired_.size() >= kRetiredMax) settle();
}

TimeNs Network::next_completion() {
  flush();
  while (!pending_.empty()) {
    const Pending& p = pending_.front();
    const Flow& fl = flows_[p.flow];
    if (fl.active && fl.version == p.version) return p.finish_ns;
    std::pop_heap(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) {
      return pending_after(a.finish_ns, a.seq, b.finish_ns, b.seq);
    });
    pending_.pop_back();
  }
  return kNever;
}

void Network::push_pending(FlowId f) {
  Flow& fl = flows_[f];
  ++fl.version;
  if (fl.finish_ns == kNever) return;
  pending_.push_back(Pending{fl.finish_ns, fl.seq, f, fl.version});
  std::push_heap(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) {
    return pending_after(a.finish_ns, a.seq, b.finish_ns, b.seq);
  });
}

void Network::advance_to(TimeNs now, std::vector<std::uint64_t>& completed) {
  flush();
  now_ = std::max(now_, now);
  for (TimeNs t = next_completion(); t <= now && t != kNever; t = next_completion()) {
    solve_.seeds.clear();
    while (next_completion() == t) {
      const Pending p = pending_.front();
      std::pop_heap(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) {
        return pending_after(a.finish_ns, a.seq, b.finish_ns, b.seq);
      });
      pending_.pop_back();
      retire_flow(p.flow);
      Flow& fl = flows_[p.flow];
      fl.remaining = 0;
      fl.active = false;
      ++fl.version;
      --counts_.active;
      completed.push_back(fl.tag);
      free_flows_.push_back(p.flow);
    }
    if (!solve_.seeds.empty()) solve_from(solve_.seeds, t);
  }
}

double Network::rate_Bps(FlowId f) {
  flush();
  return flows_.at(f).active ? flows_[f].rate : 0.0;
}

void Network::set_rate(FlowId f, double rate, TimeNs now) {
  Flow& fl = flows_[f];
  if (fl.rate == rate && fl.finish_ns != kNever) return;
  fl.rate = rate;
  fl.max_rate = std::max(fl.max_rate, rate);
  if (rate <= 0) {
    fl.finish_ns = kNever;
  } else {
    const double ns = std::ceil(fl.remaining / rate * 1e9);
    fl.finish_ns = ns < 9e18 - static_cast<double>(now) ? now + static_cast<TimeNs>(ns) : kNever;
  }
  push_pending(f);
}

// The component being solved as a max-min problem: its classes are the
// constraints, its flows the variables. A class crossed by one flow only
// does not bind: its limit is part of that flow's set's cap (an implied
// constraint, so the solution is the same), which keeps a mirrored ring's
// hundreds of private links out of the solve.
struct Network::Component {
  Network& net;
  TimeNs now;
  std::uint32_t num_constraints() const { return static_cast<std::uint32_t>(net.solve_.comp_links.size()); }
  std::uint32_t num_variables() const { return static_cast<std::uint32_t>(net.solve_.comp_flows.size()); }
  double capacity(std::uint32_t c) const { return net.classes_.solve[net.solve_.comp_links[c]].capacity_Bps; }
  double bound(std::uint32_t v) const { return net.sets_[net.flows_[net.solve_.comp_flows[v]].set].cap; }
  template <typename F>
  void for_each_term(std::uint32_t c, F&& f) const {
    const FlowList& list = net.classes_.flows[net.solve_.comp_links[c]];
    if (list.size() < 2) return;  // a seed that became private: its flow's cap covers it
    for (const FlowRef& r : list) {
      const Flow& fl = net.flows_[r.flow];
      f(fl.comp, net.set_weight(fl, r.use));
    }
  }
  template <typename F>
  void for_each_constraint(std::uint32_t v, F&& f) const {
    const Flow& fl = net.flows_[net.solve_.comp_flows[v]];
    for (std::uint32_t s : fl.shared) f(net.classes_.solve[net.set_class(fl, s)].comp, net.set_weight(fl, s));
  }
  void fix(std::uint32_t v, double rate) { net.set_rate(net.solve_.comp_flows[v], rate, now); }
};

// Re-solves the component reachable from `seeds` through shared classes
// (links <-> flows), with every flow's remaining bytes brought up to `now`.
void Network::solve_from(std::span<const ClassId> seeds, TimeNs now) {
  ++counts_.solves;
  ++solve_.epoch;
  solve_.comp_links.clear();
  solve_.comp_flows.clear();
  for (ClassId c : seeds) {
    if (classes_.solve[c].epoch == solve_.epoch) continue;
    classes_.solve[c].epoch = solve_.epoch;
    solve_.comp_links.push_back(c);
  }
  for (std::size_t i = 0; i < solve_.comp_links.size(); ++i) {
    classes_.solve[solve_.comp_links[i]].comp = static_cast<std::uint32_t>(i);
    for (const FlowRef& r : classes_.flows[solve_.comp_links[i]]) {
      Flow& fl = flows_[r.flow];
      if (fl.epoch == solve_.epoch) continue;
      fl.epoch = solve_.epoch;
      solve_.comp_flows.push_back(r.flow);
      for (std::uint32_t s : fl.shared) {
        const ClassId c = set_class(fl, s);
        if (classes_.solve[c].epoch == solve_.epoch) continue;
        classes_.solve[c].epoch = solve_.epoch;
        solve_.comp_links.push_back(c);
      }
    }
  }
  // Bring remaining bytes up to now.
  const std::size_t nf = solve_.comp_flows.size();
  for (std::size_t i = 0; i < nf; ++i) {
    Flow& fl = flows_[solve_.comp_flows[i]];
    if (now > fl.updated_ns && fl.rate > 0) {
      fl.remaining = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now - fl.updated_ns) * 1e-9);
    }
    fl.updated_ns = now;
    fl.comp = static_cast<std::uint32_t>(i);
  }
  Component component{*this, now};
  solve_.solver.solve(component);
  for (std::size_t i = 0; i < solve_.comp_links.size(); ++i) {
    const ClassId c = solve_.comp_links[i];
    if (classes_.flows[c].size() < 2) continue;
    const double cap = classes_.solve[c].capacity_Bps;
    const double load = std::max(0.0, cap - solve_.solver.slack(static_cast<std::uint32_t>(i)));
    classes_.peak[c] = std::max(classes_.peak[c], std::min(1.0, load / cap));
  }
}

}  // namespace cuboid::sim
