// Flow-level max-min network. Rates are re-solved only on the connected
// component (links <-> flows) a starting or ending flow touches; a flow's
// remaining bytes are brought up to date lazily, only when its rate changes.
#include "cuboid/sim/network.hpp"

#include <algorithm>
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
  link_flows_.resize(n);
  link_sets_head_.assign(n, kNoEntry);
  link_sets_tail_.assign(n, kNoEntry);
  link_solve_.resize(n);
  link_bytes_.assign(n, 0.0);
  link_peak_.assign(n, 0.0);
  link_latency_ns_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (!(link_capacity_Bps[i] > 0)) throw std::invalid_argument("Network: link capacity must be > 0");
    link_solve_[i].capacity_Bps = link_capacity_Bps[i];
  }
}

Network::Network(const Topology& topo, NetworkOptions opts) : topo_(&topo), opts_(opts) {
  const auto& g = topo.graph();
  const Cluster& c = topo.cluster();
  const double nic_eff = nic_efficiency(c);
  const auto n_edges = boost::num_edges(g);
  link_flows_.resize(2 * n_edges);
  link_sets_head_.assign(2 * n_edges, kNoEntry);
  link_sets_tail_.assign(2 * n_edges, kNoEntry);
  link_solve_.resize(2 * n_edges);
  link_bytes_.assign(2 * n_edges, 0.0);
  link_peak_.assign(2 * n_edges, 0.0);
  link_latency_ns_.resize(2 * n_edges);
  link_ends_.resize(2 * n_edges);
  for (auto [it, end] = boost::edges(g); it != end; ++it) {
    const auto lo = std::min(boost::source(*it, g), boost::target(*it, g));
    const auto hi = std::max(boost::source(*it, g), boost::target(*it, g));
    const LinkInfo& info = g[*it];
    // Links 2 id (lower -> higher vertex) and 2 id + 1, as Topology::route_ids numbers them.
    const std::size_t i = info.id;
    if (i >= n_edges || link_ends_[2 * i] != std::pair<std::uint32_t, std::uint32_t>{}) {
      throw std::logic_error("Network: topology edge ids are not 0..edges-1");
    }
    double cap = info.bandwidth_Bps;
    if (opts_.achievable_bandwidth) {
      const bool intra = g[lo].kind == VertexKind::nvswitch || g[hi].kind == VertexKind::nvswitch;
      if (intra && c.intra.busbw_GBps > 0) cap = c.intra.busbw_GBps * 1e9;
      if (!intra) cap *= nic_eff;
    }
    for (int dir = 0; dir < 2; ++dir) {
      const std::size_t l = 2 * i + static_cast<std::size_t>(dir);
      link_solve_[l].capacity_Bps = cap;
      link_latency_ns_[l] = info.latency_ns;
      // Names are built when asked (a 16k-GPU fabric has ~100k links).
      link_ends_[l] = dir == 0 ? std::pair{static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(hi)}
                               : std::pair{static_cast<std::uint32_t>(hi), static_cast<std::uint32_t>(lo)};
    }
  }
}

std::string Network::link_name(LinkId l) const {
  if (topo_ != nullptr && l < link_ends_.size()) {
    const auto& g = topo_->graph();
    return g[link_ends_[l].first].name + "->" + g[link_ends_[l].second].name;
  }
  return "link" + std::to_string(l);
}

LinkStats Network::link_stats(LinkId l) const {
  if (l >= link_solve_.size()) throw std::out_of_range("Network: link id out of range");
  settle();
  double bytes = link_bytes_[l];
  for (const FlowRef& r : link_flows_[l]) {
    const Flow& fl = flows_[r.flow];
    const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
    bytes += set_weight(fl, r.use) * (fl.total - left);
  }
  // A running flow off the lists is alone on its links (tests ask mid-run).
  for (const Flow& fl : active_ > 0 ? std::span<const Flow>(flows_) : std::span<const Flow>()) {
    if (!fl.active || fl.registered || fl.nuses == 0) continue;
    const LinkSet& s = sets_[fl.set];
    for (std::uint32_t i = 0; i < s.len; ++i) {
      if (set_links_[s.off + i] != l) continue;
      const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
      bytes += set_weights_[s.off + i] * (fl.total - left);
    }
  }
  return LinkStats{link_solve_[l].capacity_Bps, bytes, link_peak_[l]};
}

// Replays the finished flows' bytes in finish order (each link's total is
// the same sum, in the same order, as when retire_flow added them) and takes
// each set's largest finished rate into its links' peaks (a max: order-free;
// and min(1, w * r / c) rises with r, so the largest rate gives the peak).
void Network::settle() const {
  if (!retired_.empty()) settle_bytes();
  for (LinkSetId id : peak_dirty_sets_) {
    LinkSet& s = sets_[id];
    s.peak_dirty = false;
    for (std::uint32_t i = 0; i < s.len; ++i) {
      const LinkId l = set_links_[s.off + i];
      const double util = std::min(1.0, set_weights_[s.off + i] * s.retired_max_rate / link_solve_[l].capacity_Bps);
      link_peak_[l] = std::max(link_peak_[l], util);
    }
  }
  peak_dirty_sets_.clear();
}

// A link's total after a batch is a pure function of its total before, and
// of its signature: which sets of the batch cross it, with which weight. Its
// finished flows arrive in finish order: x += w1 * t1, x += w2 * t2, ...
// Links with the same signature and the same total before (a mirrored p2p
// set's ~400 links have a handful of distinct signatures) end with the same
// total, so each (signature, total) group is replayed once, merging its sets'
// flows by finish position, and copied to its links: bit for bit the sums of
// adding every flow to every link, at a fraction of the cost (it was a
// twentieth of a GPT-1T iteration).
void Network::settle_bytes() const {
  // The batch grouped by set (first-finish order), each set's flows in finish order.
  if (set_batch_.size() < sets_.size()) set_batch_.resize(sets_.size(), kNoEntry);
  batch_sets_.clear();
  batch_off_.clear();
  for (const Retired& r : retired_) {
    std::uint32_t& b = set_batch_[r.set];
    if (b == kNoEntry) {
      b = static_cast<std::uint32_t>(batch_sets_.size());
      batch_sets_.push_back(r.set);
      batch_off_.push_back(0);
    }
    ++batch_off_[b];
  }
  const std::size_t nb = batch_sets_.size();
  std::uint32_t sum = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::uint32_t n = batch_off_[b];
    batch_off_[b] = sum;
    sum += n;
  }
  batch_off_.push_back(sum);
  batch_totals_.resize(retired_.size());
  batch_pos_.resize(retired_.size());
  batch_fill_.assign(batch_off_.begin(), batch_off_.end() - 1);
  for (std::uint32_t k = 0; k < retired_.size(); ++k) {
    const std::uint32_t at = batch_fill_[set_batch_[retired_[k].set]]++;
    batch_totals_[at] = retired_[k].total;
    batch_pos_[at] = k;
  }
  // Each touched link's signature: (batch set, weight) entries, latest set first.
  if (sig_head_.size() < link_solve_.size()) sig_head_.assign(link_solve_.size(), kNoEntry);
  sig_entries_.clear();
  touched_.clear();
  for (std::uint32_t b = 0; b < nb; ++b) {
    const LinkSet& s = sets_[batch_sets_[b]];
    for (std::uint32_t i = 0; i < s.len; ++i) {
      const LinkId l = set_links_[s.off + i];
      if (sig_head_[l] == kNoEntry) touched_.push_back(l);
      sig_entries_.push_back(SigEntry{b, set_weights_[s.off + i], sig_head_[l]});
      sig_head_[l] = static_cast<std::uint32_t>(sig_entries_.size() - 1);
    }
  }
  const auto same_signature = [this](LinkId a, LinkId b) {
    std::uint32_t ea = sig_head_[a];
    std::uint32_t eb = sig_head_[b];
    while (ea != kNoEntry && eb != kNoEntry) {
      const SigEntry& x = sig_entries_[ea];
      const SigEntry& y = sig_entries_[eb];
      if (x.batch != y.batch || std::bit_cast<std::uint64_t>(x.weight) != std::bit_cast<std::uint64_t>(y.weight)) return false;
      ea = x.next;
      eb = y.next;
    }
    return ea == eb;
  };
  // Replays a link's flows from `start`: its sets' flows merged by finish position.
  const auto replay = [this](LinkId l, double start) {
    double x = start;
    const std::uint32_t first = sig_head_[l];
    if (sig_entries_[first].next == kNoEntry) {  // one set: its flows in order
      const SigEntry& e = sig_entries_[first];
      for (std::uint32_t k = batch_off_[e.batch]; k < batch_off_[e.batch + 1]; ++k) x += e.weight * batch_totals_[k];
      return x;
    }
    merge_cursor_.clear();
    for (std::uint32_t e = first; e != kNoEntry; e = sig_entries_[e].next) {
      merge_cursor_.push_back(MergeCursor{batch_off_[sig_entries_[e].batch], batch_off_[sig_entries_[e].batch + 1],
                                          sig_entries_[e].weight});
    }
    while (true) {
      MergeCursor* next = nullptr;
      for (MergeCursor& c : merge_cursor_) {
        if (c.at < c.end && (next == nullptr || batch_pos_[c.at] < batch_pos_[next->at])) next = &c;
      }
      if (next == nullptr) return x;
      x += next->weight * batch_totals_[next->at];
      ++next->at;
    }
  };
  groups_.clear();
  group_index_.clear();
  for (LinkId l : touched_) {
    const double start = link_bytes_[l];
    std::uint64_t h = std::bit_cast<std::uint64_t>(start) * 0x9E3779B97F4A7C15ull;
    for (std::uint32_t e = sig_head_[l]; e != kNoEntry; e = sig_entries_[e].next) {
      h = (h ^ sig_entries_[e].batch) * 0xFF51AFD7ED558CCDull;
      h = (h ^ std::bit_cast<std::uint64_t>(sig_entries_[e].weight)) * 0xC4CEB9FE1A85EC53ull;
      h ^= h >> 29;
    }
    auto [it, fresh] = group_index_.try_emplace(h, kNoEntry);
    std::uint32_t g = it->second;
    while (g != kNoEntry && !(std::bit_cast<std::uint64_t>(groups_[g].start) == std::bit_cast<std::uint64_t>(start) &&
                              same_signature(groups_[g].link, l))) {
      g = groups_[g].next;
    }
    if (g == kNoEntry) {
      groups_.push_back(Group{l, start, replay(l, start), it->second});
      g = static_cast<std::uint32_t>(groups_.size() - 1);
      it->second = g;
    }
    link_bytes_[l] = groups_[g].result;
  }
  for (LinkId l : touched_) sig_head_[l] = kNoEntry;
  for (LinkSetId id : batch_sets_) set_batch_[id] = kNoEntry;
  retired_.clear();
}

std::span<const LinkId> Network::route_links(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(src_gpu)) << 32) |
                            static_cast<std::uint32_t>(dst_gpu);
  auto it = route_cache_.find(key);
  if (it == route_cache_.end()) {
    route_scratch_.clear();
    topo_->route_ids(src_gpu, dst_gpu, route_scratch_);
    // Kept in fixed blocks, so the spans handed out stay valid.
    const std::size_t n = route_scratch_.size();
    if (route_blocks_.empty() || route_block_used_ + n > kRouteBlock) {
      route_blocks_.push_back(std::make_unique<LinkId[]>(std::max(kRouteBlock, n)));
      route_block_used_ = 0;
    }
    LinkId* links = route_blocks_.back().get() + route_block_used_;
    std::copy(route_scratch_.begin(), route_scratch_.end(), links);
    route_block_used_ += n;
    it = route_cache_.emplace(key, std::span<const LinkId>(links, n)).first;
  }
  return it->second;
}

TimeNs Network::route_latency_ns(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  route_scratch_.clear();
  topo_->route_ids(src_gpu, dst_gpu, route_scratch_);
  TimeNs ns = 0;
  for (LinkId l : route_scratch_) ns += link_latency_ns_[l];
  return ns;
}

// The same result as appending every route's links and merge_uses: each
// link's weights are summed in route order (merge_uses sums them in its sort's
// order; the collectives give all uses of one link the same weight, so the
// sums agree bit for bit), without sorting the ~10k uses of a mirrored phase.
void Network::compile_routes(std::span<const Route> routes, std::vector<LinkUse>& out) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  if (merge_weight_.size() != link_solve_.size()) {
    merge_weight_.assign(link_solve_.size(), 0.0);
    merge_seen_.assign((link_solve_.size() + 63) / 64, 0);
  }
  merge_links_.clear();
  auto add = [this](LinkId l, double w) {
    std::uint64_t& word = merge_seen_[l >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (l & 63);
    if ((word & bit) == 0) {
      word |= bit;
      merge_links_.push_back(l);
      merge_weight_[l] = w;
    } else {
      merge_weight_[l] += w;
    }
  };
  for (const LinkUse& u : out) add(u.link, u.weight);
  for (const Route& r : routes) {
    route_scratch_.clear();
    topo_->route_ids(r.src_gpu, r.dst_gpu, route_scratch_);
    for (LinkId l : route_scratch_) add(l, r.weight);
  }
  out.clear();
  out.reserve(merge_links_.size());
  // Links in increasing id order: a big phase (a mirrored ring or p2p:
  // thousands of links) reads them off the bit set, cheaper than sorting
  // them; a small one sorts.
  if (merge_links_.size() * 16 >= merge_seen_.size()) {
    for (std::size_t w = 0; w < merge_seen_.size(); ++w) {
      for (std::uint64_t bits = merge_seen_[w]; bits != 0; bits &= bits - 1) {
        const auto l = static_cast<LinkId>(64 * w + static_cast<std::size_t>(std::countr_zero(bits)));
        out.push_back(LinkUse{l, merge_weight_[l]});
      }
      merge_seen_[w] = 0;
    }
    return;
  }
  std::sort(merge_links_.begin(), merge_links_.end());
  for (LinkId l : merge_links_) {
    out.push_back(LinkUse{l, merge_weight_[l]});
    merge_seen_[l >> 6] = 0;
  }
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

LinkSetId Network::add_link_set(std::span<const LinkUse> uses) {
  for (const LinkUse& u : uses) {
    if (u.link >= link_solve_.size()) throw std::out_of_range("Network: link id out of range");
  }
  LinkSet s;
  s.off = static_cast<std::uint32_t>(set_links_.size());
  s.cap = std::numeric_limits<double>::infinity();
  for (const LinkUse& u : uses) {
    if (!(u.weight > 0)) continue;
    s.cap = std::min(s.cap, link_solve_[u.link].capacity_Bps / u.weight);
    set_links_.push_back(u.link);
    set_weights_.push_back(u.weight);
  }
  s.len = static_cast<std::uint32_t>(set_links_.size() - s.off);
  // Its conflicts: every set that crosses one of its links (found once here,
  // through the per-link index), and itself.
  const auto id = static_cast<LinkSetId>(sets_.size());
  set_mark_.push_back(0);
  const std::uint32_t stamp = id + 1;
  for (std::uint32_t i = 0; i < s.len; ++i) {
    const LinkId l = set_links_[s.off + i];
    for (std::uint32_t e = link_sets_head_[l]; e != kNoEntry; e = link_set_entries_[e].next) {
      const LinkSetId other = link_set_entries_[e].set;
      if (set_mark_[other] == stamp) continue;
      set_mark_[other] = stamp;
      s.conflicts.push_back(other);
      sets_[other].conflicts.push_back(id);
    }
    const auto e = static_cast<std::uint32_t>(link_set_entries_.size());
    link_set_entries_.push_back(LinkSetEntry{id, kNoEntry});
    if (link_sets_tail_[l] == kNoEntry) link_sets_head_[l] = e;
    else link_set_entries_[link_sets_tail_[l]].next = e;
    link_sets_tail_[l] = e;
  }
  if (s.len > 0) s.conflicts.push_back(id);
  sets_.push_back(std::move(s));
  return id;
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
  fl.slots.clear();
  fl.shared.clear();
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
  const LinkSet& s = sets_[set];
  if (fl.remaining == 0 || s.len == 0) {
    fl.finish_ns = now;
    push_pending(f);
    return f;
  }
  fl.nuses = s.len;
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
  for (std::uint32_t i : fl.shared) dirty_.push_back(set_link(fl, i));
  return f;
}

// Puts a flow on its links' lists; a link that already has a flow becomes
// shared by both (they take part in the solves of its component).
void Network::register_flow(FlowId f) {
  Flow& fl = flows_[f];
  const LinkSet& s = sets_[fl.set];
  fl.registered = true;
  fl.slots.resize(s.len);
  const LinkId* links = set_links_.data() + s.off;
  for (std::uint32_t i = 0; i < s.len; ++i) {
    FlowList& list = link_flows_[links[i]];
    fl.slots[i] = Slot{list.size(), kNotShared};
    list.push_back(FlowRef{f, i});
    if (list.size() >= 2) {
      if (list.size() == 2) add_shared(list[0].flow, list[0].use);
      add_shared(f, i);
    }
  }
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
  fl.slots[use].spos = static_cast<std::uint32_t>(fl.shared.size());
  fl.shared.push_back(use);
}

void Network::remove_shared(FlowId f, std::uint32_t use) {
  Flow& fl = flows_[f];
  const std::uint32_t p = fl.slots[use].spos;
  const std::uint32_t last = fl.shared.back();
  fl.shared[p] = last;
  fl.slots[last].spos = p;
  fl.shared.pop_back();
  fl.slots[use].spos = kNotShared;
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
  retired_.push_back(Retired{fl.set, fl.total});
  s.retired_max_rate = std::max(s.retired_max_rate, fl.max_rate);
  if (!s.peak_dirty) {
    s.peak_dirty = true;
    peak_dirty_sets_.push_back(fl.set);
  }
  const LinkId* links = set_links_.data() + s.off;
  const std::uint32_t on_lists = fl.registered ? fl.nuses : 0;
  for (std::uint32_t i = 0; i < on_lists; ++i) {
    const LinkId l = links[i];
    const std::uint32_t pos = fl.slots[i].pos;
    FlowList& list = link_flows_[l];
    if (list.size() > 1) seeds_.push_back(l);
    const FlowRef moved = list.back();
    if (moved.flow != f) {
      list[pos] = moved;
      flows_[moved.flow].slots[moved.use].pos = pos;
    }
    list.pop_back();
    if (list.size() == 1) remove_shared(list[0].flow, list[0].use);
  }
  fl.shared.clear();
  fl.nuses = 0;
  fl.registered = false;
  // Bounded memory: replay the finished flows' bytes now and then.
  if (retired_.size() >= (std::size_t{1} << 16)) settle();
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
    if (link_solve_[l].epoch == epoch_) continue;
    link_solve_[l].epoch = epoch_;
    comp_links_.push_back(l);
  }
  for (std::size_t i = 0; i < comp_links_.size(); ++i) {
    link_solve_[comp_links_[i]].comp = static_cast<std::uint32_t>(i);
    for (const FlowRef& r : link_flows_[comp_links_[i]]) {
      Flow& fl = flows_[r.flow];
      if (fl.epoch == epoch_) continue;
      fl.epoch = epoch_;
      comp_flows_.push_back(r.flow);
      for (std::uint32_t s : fl.shared) {
        const LinkId l = set_link(fl, s);
        if (link_solve_[l].epoch == epoch_) continue;
        link_solve_[l].epoch = epoch_;
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
    const FlowList& list = link_flows_[comp_links_[i]];
    rem_[i] = link_solve_[comp_links_[i]].capacity_Bps;
    if (list.size() < 2) continue;  // a seed that became private: its flow's cap covers it
    double w = 0;
    for (const FlowRef& r : list) w += set_weight(flows_[r.flow], r.use);
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
    lheap_.push_back(LevelEntry{sets_[flows_[comp_flows_[i]].set].cap, static_cast<std::uint32_t>(nl + i)});
  }
  std::make_heap(lheap_.begin(), lheap_.end(), later);
  const auto freeze = [&](FlowId f, double level) {
    Flow& fl = flows_[f];
    fl.frozen = true;
    for (std::uint32_t s : fl.shared) {
      const double w = set_weight(fl, s);
      const std::uint32_t c = link_solve_[set_link(fl, s)].comp;
      rem_[c] -= w * level;
      wsum_[c] -= w;
      if (wsum_[c] <= 1e-12 * w) wsum_[c] = 0;
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
    for (const FlowRef& r : link_flows_[comp_links_[top.comp]]) {
      if (!flows_[r.flow].frozen) freeze(r.flow, level);
    }
  }
  for (std::size_t i = 0; i < nl; ++i) {
    const LinkId l = comp_links_[i];
    if (link_flows_[l].size() < 2) continue;
    const double cap = link_solve_[l].capacity_Bps;
    const double load = std::max(0.0, cap - rem_[i]);
    link_peak_[l] = std::max(link_peak_[l], std::min(1.0, load / cap));
  }
}

}  // namespace cuboid::sim
