// Flow-level max-min network. Rates are re-solved only on the connected
// component (links <-> flows) a starting or ending flow touches; a flow's
// remaining bytes are brought up to date lazily, only when its rate changes.
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

// Every slot (link) in class 0 (crossed by no set).
void Network::init_classes() {
  link_class_ = ZeroedArray<ClassId>(num_slots_, mem_);
  class_solve_.resize(1);
  class_flows_.resize(1);
  class_size_.assign(1, static_cast<std::uint32_t>(num_slots_));
  class_sets_.resize(1);
  class_bytes_.assign(1, 0.0);
  class_peak_.assign(1, 0.0);
  class_first_group_.assign(1, kNoEntry);
  class_touch_.assign(1, 0);
}

std::string Network::link_name(LinkId l) const {
  if (topo_ != nullptr && l < num_links_) {
    const auto& g = topo_->graph();
    const auto [from, to] = link_ends(l);
    return g[from].name + "->" + g[to].name;
  }
  return "link" + std::to_string(l);
}

// What a running flow has carried per route so far.
double Network::carried(const Flow& fl) const {
  const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
  return fl.total - left;
}

// A class's bytes per link: the settled total, then the running flows on its
// list, then the running flows off the lists (alone on their links), in flow order.
double Network::class_bytes(ClassId c) const {
  double bytes = class_bytes_[c];
  for (const FlowRef& r : class_flows_[c]) {
    const Flow& fl = flows_[r.flow];
    bytes += set_weight(fl, r.use) * carried(fl);
  }
  if (active_ == 0 || c == 0) return bytes;
  for (const Flow& fl : flows_) {
    if (!fl.active || fl.registered || fl.nuses == 0) continue;
    const LinkSet& s = sets_[fl.set];
    for (std::uint32_t i = 0; i < s.classes.size(); ++i) {
      if (s.classes[i] == c) bytes += s.weight[i] * carried(fl);
    }
  }
  return bytes;
}

LinkStats Network::link_stats(LinkId l) const {
  if (l >= num_links_) throw std::out_of_range("Network: link id out of range");
  settle();
  const ClassId c = class_of_link(l);
  return LinkStats{capacity_of(l), class_bytes(c), class_peak_[c]};
}

std::vector<double> Network::class_totals() const {
  settle();
  std::vector<double> bytes(class_bytes_.size());
  for (ClassId c = 0; c < bytes.size(); ++c) bytes[c] = class_bytes(c);
  return bytes;
}

std::vector<LinkStats> Network::all_link_stats() const {
  std::vector<LinkStats> out;
  out.reserve(num_links_);
  for_each_link_stats([&](LinkId, const LinkStats& st) { out.push_back(st); });
  return out;
}

// Replays the finished flows' bytes in finish order (each class's total is
// the same sum, in the same order, as adding every flow to every link when it
// ends) and takes each set's largest finished rate into its classes' peaks
// (a max: order-free; and min(1, w * r / c) rises with r, so the largest rate
// gives the peak).
void Network::settle() const {
  if (!retired_.empty()) settle_bytes();
  for (LinkSetId id : peak_dirty_sets_) {
    LinkSet& s = sets_[id];
    s.peak_dirty = false;
    for (std::uint32_t i = 0; i < s.classes.size(); ++i) {
      const ClassId c = s.classes[i];
      const double util = std::min(1.0, s.weight[i] * s.retired_max_rate / class_solve_[c].capacity_Bps);
      class_peak_[c] = std::max(class_peak_[c], util);
    }
  }
  peak_dirty_sets_.clear();
}

// A class's flows arrive in finish order: x += w1 * t1, x += w2 * t2, ...
// Each class the batch touches is replayed once, merging its sets' flows by
// finish position (its sets are what a link of it sees: one sum per class
// instead of one per link, bit for bit the same).
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
  // The classes the batch's sets cross, each once.
  if (class_touch_.size() < class_solve_.size()) class_touch_.resize(class_solve_.size(), 0);
  const std::uint32_t stamp = ++class_stamp_;
  touched_.clear();
  for (LinkSetId id : batch_sets_) {
    for (ClassId c : sets_[id].classes) {
      if (class_touch_[c] == stamp) continue;
      class_touch_[c] = stamp;
      touched_.push_back(c);
    }
  }
  for (ClassId c : touched_) {
    merge_cursor_.clear();
    for (const ClassSet& cs : class_sets_[c]) {
      const std::uint32_t b = cs.set < set_batch_.size() ? set_batch_[cs.set] : kNoEntry;
      if (b != kNoEntry) merge_cursor_.push_back(MergeCursor{batch_off_[b], batch_off_[b + 1], cs.weight});
    }
    double x = class_bytes_[c];
    if (merge_cursor_.size() == 1) {  // one set: its flows in order
      const MergeCursor& m = merge_cursor_.front();
      for (std::uint32_t k = m.at; k < m.end; ++k) x += m.weight * batch_totals_[k];
    } else {
      while (true) {
        MergeCursor* next = nullptr;
        for (MergeCursor& m : merge_cursor_) {
          if (m.at < m.end && (next == nullptr || batch_pos_[m.at] < batch_pos_[next->at])) next = &m;
        }
        if (next == nullptr) break;
        x += next->weight * batch_totals_[next->at];
        ++next->at;
      }
    }
    class_bytes_[c] = x;
  }
  for (LinkSetId id : batch_sets_) set_batch_[id] = kNoEntry;
  retired_.clear();
}

std::span<const LinkId> Network::route_links(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  return routes_.links(*topo_, src_gpu, dst_gpu);
}

TimeNs Network::route_latency_ns(int src_gpu, int dst_gpu) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  return topo_->route_latency_ns(src_gpu, dst_gpu);
}

// The same result as appending every route's links and merge_uses: each
// link's weights are summed in route order (merge_uses sums them in its sort's
// order; the collectives give all uses of one link the same weight, so the
// sums agree bit for bit), without sorting the thousands of uses of a mirrored phase.
[[gnu::always_inline]] inline void Network::merge_add(LinkId l, double w) {
  std::uint64_t& word = merge_seen_[l >> 6];
  const std::uint64_t bit = std::uint64_t{1} << (l & 63);
  if ((word & bit) == 0) {
    word |= bit;
    merge_links_.push_back(l);
    merge_weight_[l] = w;
  } else {
    merge_weight_[l] += w;
  }
}

// Adds the routes' links to the merge scratch: a bit set of the links seen,
// their summed weights (merge_weight_) and the list of them (merge_links_).
void Network::merge_routes(std::span<const Route> routes) {
  LinkId hops[Topology::kMaxRouteLinks];
  for (const Route& r : routes) {
    const std::size_t n = topo_->route_ids(r.src_gpu, r.dst_gpu, hops);
    for (std::size_t i = 0; i < n; ++i) merge_add(hops[i], r.weight);
  }
}

void Network::fold_rails() {
  if (topo_ == nullptr || !topo_->rail_symmetric()) {
    throw std::logic_error("Network: rail folding needs a rail-symmetric topology");
  }
  if (!sets_.empty()) throw std::logic_error("Network: rail folding must come before any link set");
  slot_of_ = topo_->rail0_slots().data();
  slot_link_ = topo_->rail0_slot_links().data();
  num_slots_ = topo_->rail0_slot_links().size();
  init_classes();  // no set yet: every slot in class 0, as every link was
}

// merge_routes over the routes from local GPU 0, each hop on its rail-0
// image; a hop all rails share takes the weight once per rail (added one by
// one: the same sum as the full list gives it, when its weights are equal).
// A whole list (rail0_part false): checks it has as many routes from each
// local GPU (a rotation-closed list has; the converse is the caller's
// promise) and skips the others. A rail-0 part: every route must start on
// local GPU 0.
void Network::merge_routes_folded(std::span<const Route> routes, bool rail0_part) {
  const int gpn = topo_->cluster().gpus_per_node;
  std::array<std::uint32_t, 64> from_local{};
  LinkId hops[Topology::kMaxRouteLinks];
  std::uint8_t fixed[Topology::kMaxRouteLinks];
  const int gpus = topo_->num_gpus();
  // GPU g is local GPU g mod gpn: a mask for the usual power of two (the
  // skipped routes then cost no load of their GPU's hop index).
  const bool pow2 = (gpn & (gpn - 1)) == 0;
  for (const Route& r : routes) {
    if (r.src_gpu < 0 || r.src_gpu >= gpus) (void)topo_->gpu_vertex(r.src_gpu);  // throws
    const int local = pow2 ? (r.src_gpu & (gpn - 1)) : topo_->local_index(r.src_gpu);
    if (rail0_part) {
      if (local != 0) {
        throw std::invalid_argument("Network: a rail-0 route list has a route from GPU " + std::to_string(r.src_gpu) +
                                    " (local GPU " + std::to_string(local) + ")");
      }
    } else {
      if (local < static_cast<int>(from_local.size())) ++from_local[static_cast<std::size_t>(local)];
      if (local != 0) continue;
    }
    const std::size_t n = topo_->route_ids_rail0(r.src_gpu, r.dst_gpu, hops, fixed);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t slot = slot_of_[hops[i]];
      merge_add(slot, r.weight);
      if (fixed[i] != 0) {
        for (int k = 1; k < gpn; ++k) merge_weight_[slot] += r.weight;
      }
    }
  }
  if (rail0_part) return;
  for (int i = 1; i < std::min<int>(gpn, static_cast<int>(from_local.size())); ++i) {
    if (from_local[static_cast<std::size_t>(i)] != from_local[0]) {
      throw std::logic_error("Network: a folded route list is not closed under the rail rotation");
    }
  }
}

// merge_links_ is empty after a merge_end; links left in it are those of a
// merge a throw cut short (a GPU out of range): their bits are cleared here.
void Network::merge_begin() {
  if (merge_weight_.size() != num_slots_) {
    merge_weight_ = ZeroedArray<double>(num_slots_, mem_);
    merge_seen_.assign((num_slots_ + 63) / 64, 0);
    merge_links_.clear();
  }
  for (LinkId l : merge_links_) merge_seen_[l >> 6] = 0;
  merge_links_.clear();
}

// The merged links in increasing id order into set_links_, the bit set
// cleared. A big phase (a mirrored ring or p2p: thousands of links) reads
// them off the bit set, cheaper than sorting them; a small one sorts.
void Network::merge_end() {
  set_links_.clear();
  if (merge_links_.size() * 16 >= merge_seen_.size()) {
    set_links_.reserve(merge_links_.size());
    for (std::size_t w = 0; w < merge_seen_.size(); ++w) {
      for (std::uint64_t bits = merge_seen_[w]; bits != 0; bits &= bits - 1) {
        set_links_.push_back(static_cast<LinkId>(64 * w + static_cast<std::size_t>(std::countr_zero(bits))));
      }
      merge_seen_[w] = 0;
    }
  } else {
    set_links_.assign(merge_links_.begin(), merge_links_.end());
    std::sort(set_links_.begin(), set_links_.end());
    for (LinkId l : set_links_) merge_seen_[l >> 6] = 0;
  }
  merge_links_.clear();
}

void Network::compile_routes(std::span<const Route> routes, std::vector<LinkUse>& out) {
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  if (rails_folded()) {
    // The merge scratch holds rail-0 slots; these are links. merge_uses
    // keeps each link's uses in order, so their weights are summed as
    // merge_add sums them.
    LinkId hops[Topology::kMaxRouteLinks];
    for (const Route& r : routes) {
      const std::size_t n = topo_->route_ids(r.src_gpu, r.dst_gpu, hops);
      for (std::size_t i = 0; i < n; ++i) out.push_back(LinkUse{hops[i], r.weight});
    }
    merge_uses(out);
    return;
  }
  merge_begin();
  for (const LinkUse& u : out) merge_add(u.link, u.weight);
  merge_routes(routes);
  merge_end();
  out.clear();
  out.reserve(set_links_.size());
  for (LinkId l : set_links_) out.push_back(LinkUse{l, merge_weight_[l]});
}

// Stable: a link's weights are summed in the order they were listed.
void Network::merge_uses(std::vector<LinkUse>& uses) {
  std::stable_sort(uses.begin(), uses.end(), [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
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

LinkSetId Network::add_route_set(std::span<const Route> routes) { return add_routes(routes, false); }

LinkSetId Network::add_rail0_route_set(std::span<const Route> rail0_routes) {
  if (!rails_folded()) throw std::logic_error("Network: add_rail0_route_set needs folded rails (fold_rails)");
  return add_routes(rail0_routes, true);
}

LinkSetId Network::add_routes(std::span<const Route> routes, bool rail0_part) {
  const bool cached = RouteSetCache::cacheable(routes);
  std::uint64_t key = 0;
  if (cached) {
    key = RouteSetCache::hash(routes);
    if (const std::optional<LinkSetId> set = route_sets_.find(key, routes, rail0_part)) return *set;
  }
  if (topo_ == nullptr) throw std::logic_error("Network: route_links needs a topology");
  merge_begin();
  if (rails_folded()) merge_routes_folded(routes, rail0_part);
  else merge_routes(routes);
  merge_end();
  const LinkSetId set = register_links(set_links_);
  if (cached) route_sets_.add(key, routes, rail0_part, set);
  return set;
}

// Checks the uses (nothing registered yet if one is bad), then registers them.
LinkSetId Network::add_link_set(std::span<const LinkUse> uses) {
  if (rails_folded()) {
    throw std::logic_error("Network: raw link sets (add_link_set, start_flow over uses) cannot join folded rails");
  }
  if (merge_weight_.size() != num_slots_) merge_begin();
  if (link_mark_.size() != num_links_) link_mark_.assign(num_links_, 0);  // first call
  const std::uint32_t stamp = ++link_stamp_;
  set_links_.clear();
  for (const LinkUse& u : uses) {
    if (u.link >= num_links_) throw std::out_of_range("Network: link id out of range");
    if (!(u.weight > 0)) continue;
    if (link_mark_[u.link] == stamp) {
      throw std::invalid_argument("Network: a link set lists link " + std::to_string(u.link) + " twice");
    }
    link_mark_[u.link] = stamp;
    set_links_.push_back(u.link);
    merge_weight_[u.link] = u.weight;
  }
  return register_links(set_links_);
}

// Registers the set of `links` (distinct slots, see slot_of: link ids unless
// folded), each with weight merge_weight_[slot]. Refines the link classes by
// it (a class it crosses in part, or with two weights, splits; the sets
// crossing the old class cross the new one too), then lists the set's
// classes and conflicts.
LinkSetId Network::register_links(std::span<const LinkId> links) {
  const auto id = static_cast<LinkSetId>(sets_.size());
  LinkSet s;
  s.cap = std::numeric_limits<double>::infinity();
  // The set's links grouped by (class, weight; capacity for class 0).
  groups_.clear();
  use_group_.resize(links.size());
  const std::uint32_t cstamp = ++class_stamp_;
  if (class_touch_.size() < class_solve_.size()) class_touch_.resize(class_solve_.size(), 0);
  for (std::size_t i = 0; i < links.size(); ++i) {
    const LinkId l = links[i];
    const ClassId c = link_class_[l];
    const auto wbits = std::bit_cast<std::uint64_t>(merge_weight_[l]);
    const std::uint64_t cbits = c == 0 ? std::bit_cast<std::uint64_t>(capacity_of(link_of_slot(l))) : 0;
    if (class_touch_[c] != cstamp) {
      class_touch_[c] = cstamp;
      class_first_group_[c] = kNoEntry;
    }
    std::uint32_t g = class_first_group_[c];
    while (g != kNoEntry && (groups_[g].weight_bits != wbits || groups_[g].capacity_bits != cbits)) g = groups_[g].next;
    if (g == kNoEntry) {
      g = static_cast<std::uint32_t>(groups_.size());
      groups_.push_back(SplitGroup{c, wbits, cbits, 0, 0, class_first_group_[c]});
      class_first_group_[c] = g;
    }
    ++groups_[g].count;
    use_group_[i] = g;
  }
  // Its bottleneck: a group's links share capacity and weight.
  for (const SplitGroup& g : groups_) {
    const double cap = g.from == 0 ? std::bit_cast<double>(g.capacity_bits) : class_solve_[g.from].capacity_Bps;
    s.cap = std::min(s.cap, cap / std::bit_cast<double>(g.weight_bits));
  }
  // Which groups leave their class (a split)? A class the set covers whole
  // stays with its first group; its other groups, and the groups of classes
  // it covers in part, become new classes.
  bool split = false;
  for (std::uint32_t i = 0; i < groups_.size(); ++i) {
    SplitGroup& g = groups_[i];
    std::uint32_t covered = 0;
    std::uint32_t first = i;
    std::uint32_t count = 0;
    for (std::uint32_t o = class_first_group_[g.from]; o != kNoEntry; o = groups_[o].next) {
      covered += groups_[o].count;
      first = std::min(first, o);
      ++count;
    }
    const bool whole = g.from != 0 && covered == class_size_[g.from];
    g.to = whole && first == i ? g.from : kNoEntry;
    split = split || (g.from != 0 && !(whole && count == 1));
  }
  // A split copies the old class's totals and flows: settle the totals first;
  // running flows leave the lists and come back on the refined classes.
  std::vector<FlowId> was_registered;
  if (split) {
    settle();
    if (active_ > 0) unregister_all(was_registered);
  }
  for (SplitGroup& g : groups_) {
    if (g.to == g.from) continue;
    const auto n = static_cast<ClassId>(class_solve_.size());
    g.to = n;
    class_solve_.push_back(ClassSolve{g.from == 0 ? std::bit_cast<double>(g.capacity_bits) : class_solve_[g.from].capacity_Bps, 0, 0});
    class_flows_.emplace_back();
    class_size_.push_back(g.count);
    class_size_[g.from] -= g.count;
    class_bytes_.push_back(class_bytes_[g.from]);
    class_peak_.push_back(class_peak_[g.from]);
    class_first_group_.push_back(kNoEntry);
    class_touch_.push_back(0);
    // The sets crossing the old class cross this one too, with the same weight.
    std::vector<ClassSet> crossing = class_sets_[g.from];
    for (const ClassSet& cs : crossing) {
      sets_[cs.set].classes.push_back(n);
      sets_[cs.set].weight.push_back(cs.weight);
    }
    crossing.push_back(ClassSet{id, std::bit_cast<double>(g.weight_bits)});
    class_sets_.push_back(std::move(crossing));
  }
  for (const SplitGroup& g : groups_) {
    if (g.to == g.from) class_sets_[g.from].push_back(ClassSet{id, std::bit_cast<double>(g.weight_bits)});
  }
  for (std::size_t i = 0; i < links.size(); ++i) link_class_[links[i]] = groups_[use_group_[i]].to;
  s.classes.reserve(groups_.size());
  s.weight.reserve(groups_.size());
  for (const SplitGroup& g : groups_) {
    s.classes.push_back(g.to);
    s.weight.push_back(std::bit_cast<double>(g.weight_bits));
  }
  // Its conflicts: every set that crosses one of its classes, and itself.
  set_mark_.push_back(0);
  const std::uint32_t set_stamp = id + 1;
  set_mark_[id] = set_stamp;
  for (ClassId c : s.classes) {
    for (const ClassSet& cs : class_sets_[c]) {
      if (set_mark_[cs.set] == set_stamp) continue;
      set_mark_[cs.set] = set_stamp;
      s.conflicts.push_back(cs.set);
      sets_[cs.set].conflicts.push_back(id);
    }
  }
  if (!s.classes.empty()) s.conflicts.push_back(id);
  sets_.push_back(std::move(s));
  if (split) {
    for (Flow& fl : flows_) {
      if (fl.active && fl.nuses > 0) fl.nuses = static_cast<std::uint32_t>(sets_[fl.set].classes.size());
    }
    for (FlowId f : was_registered) register_flow(f);
  }
  return id;
}

// Takes every running flow off the lists (in start order into `was`), as if
// none had met another: add_link_set puts them back on the refined classes.
void Network::unregister_all(std::vector<FlowId>& was) {
  for (FlowId f = 0; f < flows_.size(); ++f) {
    if (flows_[f].active && flows_[f].registered) was.push_back(f);
  }
  std::sort(was.begin(), was.end(), [this](FlowId a, FlowId b) { return flows_[a].seq < flows_[b].seq; });
  for (FlowId f : was) {
    Flow& fl = flows_[f];
    for (std::uint32_t i = 0; i < fl.nuses; ++i) {
      FlowList& list = class_flows_[set_class(fl, i)];
      while (list.size() > 0) list.pop_back();
    }
    fl.registered = false;
    fl.shared.clear();
  }
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
  fl.seq = start_seq_++;
  fl.active = true;
  ++active_;
  ++flows_started_;
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
  for (std::uint32_t i : fl.shared) dirty_.push_back(set_class(fl, i));
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
    FlowList& list = class_flows_[classes[i]];
    fl.positions[i] = ListPosition{list.size(), kNotShared};
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
    FlowList& list = class_flows_[c];
    if (list.size() > 1) seeds_.push_back(c);
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

// The component being solved as a max-min problem: its classes are the
// constraints, its flows the variables. A class crossed by one flow only
// does not bind: its limit is part of that flow's set's cap (an implied
// constraint, so the solution is the same), which keeps a mirrored ring's
// hundreds of private links out of the solve.
struct Network::Component {
  Network& net;
  TimeNs now;
  std::uint32_t num_constraints() const { return static_cast<std::uint32_t>(net.comp_links_.size()); }
  std::uint32_t num_variables() const { return static_cast<std::uint32_t>(net.comp_flows_.size()); }
  double capacity(std::uint32_t c) const { return net.class_solve_[net.comp_links_[c]].capacity_Bps; }
  double bound(std::uint32_t v) const { return net.sets_[net.flows_[net.comp_flows_[v]].set].cap; }
  template <typename F>
  void for_each_term(std::uint32_t c, F&& f) const {
    const FlowList& list = net.class_flows_[net.comp_links_[c]];
    if (list.size() < 2) return;  // a seed that became private: its flow's cap covers it
    for (const FlowRef& r : list) {
      const Flow& fl = net.flows_[r.flow];
      f(fl.comp, net.set_weight(fl, r.use));
    }
  }
  template <typename F>
  void for_each_constraint(std::uint32_t v, F&& f) const {
    const Flow& fl = net.flows_[net.comp_flows_[v]];
    for (std::uint32_t s : fl.shared) f(net.class_solve_[net.set_class(fl, s)].comp, net.set_weight(fl, s));
  }
  void fix(std::uint32_t v, double rate) { net.set_rate(net.comp_flows_[v], rate, now); }
};

// Re-solves the component reachable from `seeds` through shared classes
// (links <-> flows), with every flow's remaining bytes brought up to `now`.
void Network::solve_from(std::span<const ClassId> seeds, TimeNs now) {
  ++solves_;
  ++epoch_;
  comp_links_.clear();
  comp_flows_.clear();
  for (ClassId c : seeds) {
    if (class_solve_[c].epoch == epoch_) continue;
    class_solve_[c].epoch = epoch_;
    comp_links_.push_back(c);
  }
  for (std::size_t i = 0; i < comp_links_.size(); ++i) {
    class_solve_[comp_links_[i]].comp = static_cast<std::uint32_t>(i);
    for (const FlowRef& r : class_flows_[comp_links_[i]]) {
      Flow& fl = flows_[r.flow];
      if (fl.epoch == epoch_) continue;
      fl.epoch = epoch_;
      comp_flows_.push_back(r.flow);
      for (std::uint32_t s : fl.shared) {
        const ClassId c = set_class(fl, s);
        if (class_solve_[c].epoch == epoch_) continue;
        class_solve_[c].epoch = epoch_;
        comp_links_.push_back(c);
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
    fl.comp = static_cast<std::uint32_t>(i);
  }
  Component component{*this, now};
  solver_.solve(component);
  for (std::size_t i = 0; i < comp_links_.size(); ++i) {
    const ClassId c = comp_links_[i];
    if (class_flows_[c].size() < 2) continue;
    const double cap = class_solve_[c].capacity_Bps;
    const double load = std::max(0.0, cap - solver_.slack(static_cast<std::uint32_t>(i)));
    class_peak_[c] = std::max(class_peak_[c], std::min(1.0, load / cap));
  }
}

}  // namespace cuboid::sim
