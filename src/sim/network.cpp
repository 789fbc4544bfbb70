// Flow-level max-min network. Rates are re-solved only on the connected
// component (links <-> flows) a starting or ending flow touches; a flow's
// remaining bytes are brought up to date lazily, only when its rate changes.
#include "cuboid/sim/network.hpp"

#include <algorithm>
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
  links_.resize(link_capacity_Bps.size());
  link_latency_ns_.assign(link_capacity_Bps.size(), 0);
  for (std::size_t i = 0; i < links_.size(); ++i) {
    if (!(link_capacity_Bps[i] > 0)) throw std::invalid_argument("Network: link capacity must be > 0");
    links_[i].capacity_Bps = link_capacity_Bps[i];
  }
}

Network::Network(const Topology& topo, NetworkOptions opts) : topo_(&topo), opts_(opts) {
  const auto& g = topo.graph();
  const Cluster& c = topo.cluster();
  const double nic_eff = nic_efficiency(c);
  const auto n_edges = boost::num_edges(g);
  links_.resize(2 * n_edges);
  link_latency_ns_.resize(2 * n_edges);
  link_names_.resize(2 * n_edges);
  std::size_t i = 0;
  for (auto [it, end] = boost::edges(g); it != end; ++it, ++i) {
    const auto lo = std::min(boost::source(*it, g), boost::target(*it, g));
    const auto hi = std::max(boost::source(*it, g), boost::target(*it, g));
    const LinkInfo& info = g[*it];
    edge_index_.emplace(&info, static_cast<std::uint32_t>(i));
    double cap = info.bandwidth_Bps;
    if (opts_.achievable_bandwidth) {
      const bool intra = g[lo].kind == VertexKind::nvswitch || g[hi].kind == VertexKind::nvswitch;
      if (intra && c.intra.busbw_GBps > 0) cap = c.intra.busbw_GBps * 1e9;
      if (!intra) cap *= nic_eff;
    }
    for (int dir = 0; dir < 2; ++dir) {
      const std::size_t l = 2 * i + static_cast<std::size_t>(dir);
      links_[l].capacity_Bps = cap;
      link_latency_ns_[l] = info.latency_ns;
      link_names_[l] = dir == 0 ? g[lo].name + "->" + g[hi].name : g[hi].name + "->" + g[lo].name;
    }
  }
}

std::string Network::link_name(LinkId l) const {
  if (l < link_names_.size()) return link_names_[l];
  return "link" + std::to_string(l);
}

LinkStats Network::link_stats(LinkId l) const {
  const Link& k = links_.at(l);
  double bytes = k.bytes;
  for (const FlowRef& r : k.flows) {
    const Flow& fl = flows_[r.flow];
    const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
    bytes += fl.uses[r.use].weight * (fl.total - left);
  }
  return LinkStats{k.capacity_Bps, bytes, k.peak_utilisation};
}

std::span<const LinkId> Network::route_links(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(src_gpu)) << 32) |
                            static_cast<std::uint32_t>(dst_gpu);
  auto it = route_cache_.find(key);
  if (it == route_cache_.end()) {
    const auto& g = topo_->graph();
    const auto path = topo_->route(src_gpu, dst_gpu);
    std::vector<LinkId> links;
    links.reserve(path.size());
    auto cur = topo_->gpu_vertex(src_gpu);
    for (const auto& e : path) {
      const auto s = boost::source(e, g);
      const auto t = boost::target(e, g);
      const auto next = s == cur ? t : s;
      // Edge index through the property's address (stable: an undirected
      // adjacency_list keeps its edges in a list); direction 0 = lower->higher vertex.
      const auto pit = edge_index_.find(&g[e]);
      if (pit == edge_index_.end()) throw std::logic_error("Network: route edge not in graph");
      links.push_back(static_cast<LinkId>(2 * pit->second + (cur < next ? 0u : 1u)));
      cur = next;
    }
    it = route_cache_.emplace(key, std::move(links)).first;
  }
  return it->second;
}

TimeNs Network::route_latency_ns(int src_gpu, int dst_gpu) {
  TimeNs ns = 0;
  for (LinkId l : route_links(src_gpu, dst_gpu)) ns += link_latency_ns_[l];
  return ns;
}

void Network::compile_routes(std::span<const Route> routes, std::vector<LinkUse>& out) {
  for (const Route& r : routes) {
    for (LinkId l : route_links(r.src_gpu, r.dst_gpu)) out.push_back(LinkUse{l, r.weight});
  }
  merge_uses(out);
}

void Network::merge_uses(std::vector<LinkUse>& uses) {
  std::sort(uses.begin(), uses.end(), [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
  std::size_t w = 0;
  for (std::size_t i = 0; i < uses.size(); ++i) {
    if (w > 0 && uses[w - 1].link == uses[i].link) {
      uses[w - 1].weight += uses[i].weight;
    } else {
      uses[w++] = uses[i];
    }
  }
  uses.resize(w);
}

FlowId Network::start_flow(std::span<const LinkUse> uses, double bytes, TimeNs now, std::uint64_t tag) {
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
  fl.uses.clear();
  fl.shared.clear();
  fl.cap = std::numeric_limits<double>::infinity();
  fl.remaining = std::max(0.0, bytes);
  fl.total = fl.remaining;
  fl.rate = 0;
  fl.max_rate = 0;
  fl.updated_ns = now;
  fl.finish_ns = kNever;
  fl.tag = tag;
  fl.seq = start_seq_++;
  fl.active = true;
  ++active_;
  ++flows_started_;
  // Validate every link first, so a throw leaves no half-registered flow.
  for (const LinkUse& u : uses) {
    if (u.link >= links_.size()) throw std::out_of_range("Network: link id out of range");
  }
  // One pass: take each link's capacity into the flow's cap and register the
  // flow on the link (the hot path of a mirrored collective: hundreds of links).
  if (fl.remaining > 0) {
    fl.uses.reserve(uses.size());
    for (const LinkUse& u : uses) {
      if (!(u.weight > 0)) continue;
      Link& link = links_[u.link];
      fl.cap = std::min(fl.cap, link.capacity_Bps / u.weight);
      const auto i = static_cast<std::uint32_t>(fl.uses.size());
      fl.uses.push_back(Use{u.link, u.weight, static_cast<std::uint32_t>(link.flows.size()), kNotShared});
      link.flows.push_back(FlowRef{f, i});
      if (link.flows.size() >= 2) {
        if (link.flows.size() == 2) add_shared(link.flows[0].flow, link.flows[0].use);
        add_shared(f, i);
      }
    }
  }
  if (fl.uses.empty()) {
    fl.finish_ns = now;
    push_pending(f);
    return f;
  }
  if (fl.shared.empty()) {
    set_rate(f, fl.cap, now);  // alone on all its links
    return f;
  }
  for (std::uint32_t i : fl.shared) dirty_.push_back(fl.uses[i].link);
  return f;
}

void Network::flush() {
  if (dirty_.empty()) return;
  seeds_.swap(dirty_);
  dirty_.clear();
  solve_from(seeds_, now_);
  seeds_.clear();
}

void Network::add_shared(FlowId f, std::uint32_t use) {
  Flow& fl = flows_[f];
  fl.uses[use].spos = static_cast<std::uint32_t>(fl.shared.size());
  fl.shared.push_back(use);
}

void Network::remove_shared(FlowId f, std::uint32_t use) {
  Flow& fl = flows_[f];
  const std::uint32_t p = fl.uses[use].spos;
  const std::uint32_t last = fl.shared.back();
  fl.shared[p] = last;
  fl.uses[last].spos = p;
  fl.shared.pop_back();
  fl.uses[use].spos = kNotShared;
}

// A finished flow leaves its links: each link's totals take what it carried,
// shared links become seeds of the re-solve, and the flow is unregistered.
void Network::retire_flow(FlowId f) {
  Flow& fl = flows_[f];
  const double max_rate = fl.max_rate;
  const double total = fl.total;
  for (const Use& u : fl.uses) {
    Link& link = links_[u.link];
    link.bytes += u.weight * total;
    // Whenever the flow ran, its link carried at least weight * rate.
    link.peak_utilisation = std::max(link.peak_utilisation, std::min(1.0, u.weight * max_rate / link.capacity_Bps));
    auto& list = link.flows;
    if (list.size() > 1) seeds_.push_back(u.link);
    const FlowRef moved = list.back();
    if (moved.flow != f) {
      list[u.pos] = moved;
      flows_[moved.flow].uses[moved.use].pos = u.pos;
    }
    list.pop_back();
    if (list.size() == 1) remove_shared(list[0].flow, list[0].use);
  }
  fl.shared.clear();
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
    seeds_.clear();
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
      --active_;
      completed.push_back(fl.tag);
      free_flows_.push_back(p.flow);
    }
    if (!seeds_.empty()) solve_from(seeds_, t);
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

// Progressive filling on the component reachable from `seeds` through
// shared links: every unfrozen flow's rate rises together; the first link to
// fill (or the first flow to reach its own cap) freezes the flows crossing it
// at the current level; repeat. Weighted: a flow loads a link with weight x
// rate. A link crossed by one flow only is never in a component: its limit
// is part of that flow's cap (an implied constraint, so the solution is the
// same), which keeps a mirrored ring's hundreds of private links out of it.
void Network::solve_from(std::span<const LinkId> seeds, TimeNs now) {
  ++solves_;
  ++epoch_;
  comp_links_.clear();
  comp_flows_.clear();
  for (LinkId l : seeds) {
    if (links_[l].epoch == epoch_) continue;
    links_[l].epoch = epoch_;
    comp_links_.push_back(l);
  }
  for (std::size_t i = 0; i < comp_links_.size(); ++i) {
    Link& link = links_[comp_links_[i]];
    link.comp = static_cast<std::uint32_t>(i);
    for (const FlowRef& r : link.flows) {
      Flow& fl = flows_[r.flow];
      if (fl.epoch == epoch_) continue;
      fl.epoch = epoch_;
      comp_flows_.push_back(r.flow);
      for (std::uint32_t s : fl.shared) {
        const LinkId l = fl.uses[s].link;
        if (links_[l].epoch == epoch_) continue;
        links_[l].epoch = epoch_;
        comp_links_.push_back(l);
      }
    }
  }
  // Bring remaining bytes up to now.
  const std::size_t nf = comp_flows_.size();
  for (std::size_t i = 0; i < nf; ++i) {
    Flow& fl = flows_[comp_flows_[i]];
    if (now > fl.updated_ns && fl.rate > 0) {
      fl.remaining = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now - fl.updated_ns) * 1e-9);
    }
    fl.updated_ns = now;
    fl.frozen = false;
    fl.comp = static_cast<std::uint32_t>(i);
  }
  const std::size_t nl = comp_links_.size();
  rem_.assign(nl, 0.0);
  wsum_.assign(nl, 0.0);
  for (std::size_t i = 0; i < nl; ++i) {
    const Link& link = links_[comp_links_[i]];
    rem_[i] = link.capacity_Bps;
    if (link.flows.size() < 2) continue;  // a seed that became private: its flow's cap covers it
    double w = 0;
    for (const FlowRef& r : link.flows) w += flows_[r.flow].uses[r.use].weight;
    wsum_[i] = w;
  }
  // Each shared link saturates at level rem / wsum (rem: capacity minus what
  // frozen flows take; every unfrozen flow sits at the common level). Freezing
  // a flow at level x <= rem / wsum only raises its links' levels, so the heap
  // keys are lower bounds: a popped entry is checked against the link's
  // current level and pushed back if that is higher (lazy increase-key).
  // O((links + flows) log) per solve, plus the shared uses of frozen flows.
  lheap_.clear();
  const auto later = [](const LevelEntry& a, const LevelEntry& b) {
    return a.level != b.level ? a.level > b.level : a.comp > b.comp;
  };
  for (std::uint32_t i = 0; i < nl; ++i) {
    if (wsum_[i] > 0) lheap_.push_back(LevelEntry{rem_[i] / wsum_[i], i});
  }
  for (std::size_t i = 0; i < nf; ++i) {
    lheap_.push_back(LevelEntry{flows_[comp_flows_[i]].cap, static_cast<std::uint32_t>(nl + i)});
  }
  std::make_heap(lheap_.begin(), lheap_.end(), later);
  const auto freeze = [&](FlowId f, double level) {
    Flow& fl = flows_[f];
    fl.frozen = true;
    for (std::uint32_t s : fl.shared) {
      const Use& u = fl.uses[s];
      const std::uint32_t c = links_[u.link].comp;
      rem_[c] -= u.weight * level;
      wsum_[c] -= u.weight;
      if (wsum_[c] <= 1e-12 * u.weight) wsum_[c] = 0;
    }
    set_rate(f, level, now);
  };
  while (!lheap_.empty()) {
    std::pop_heap(lheap_.begin(), lheap_.end(), later);
    const LevelEntry top = lheap_.back();
    lheap_.pop_back();
    const double level = std::max(0.0, top.level);
    if (top.comp >= nl) {
      const FlowId f = comp_flows_[top.comp - nl];
      if (!flows_[f].frozen) freeze(f, level);
      continue;
    }
    if (wsum_[top.comp] <= 0) continue;  // every flow on it is frozen
    const double current = rem_[top.comp] / wsum_[top.comp];
    if (current > level * (1 + 1e-12) + 1e-9) {
      lheap_.push_back(LevelEntry{current, top.comp});
      std::push_heap(lheap_.begin(), lheap_.end(), later);
      continue;
    }
    for (const FlowRef& r : links_[comp_links_[top.comp]].flows) {
      if (!flows_[r.flow].frozen) freeze(r.flow, level);
    }
  }
  for (std::size_t i = 0; i < nl; ++i) {
    Link& link = links_[comp_links_[i]];
    if (link.flows.size() < 2) continue;
    const double load = std::max(0.0, link.capacity_Bps - rem_[i]);
    link.peak_utilisation = std::max(link.peak_utilisation, std::min(1.0, load / link.capacity_Bps));
  }
}

}  // namespace cuboid::sim
