// The network's link classes (see Network's private part): the partition
// that each new link set refines, and the per-class byte totals and peaks
// behind the link statistics.
#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

#include "cuboid/sim/network.hpp"

namespace cuboid::sim {

// Every slot (link) in class 0 (crossed by no set).
void Network::init_classes() {
  link_class_ = ZeroedArray<ClassId>(num_slots_, mem_);
  classes_.solve.resize(1);
  classes_.flows.resize(1);
  classes_.members.assign(1, static_cast<std::uint32_t>(num_slots_));
  classes_.sets.resize(1);
  classes_.bytes.assign(1, 0.0);
  classes_.peak.assign(1, 0.0);
  classes_.first_group.assign(1, kNoEntry);
  classes_.touch.assign(1, 0);
}

// A class's bytes per link: the settled total, then the running flows on its
// list, then the running flows off the lists (alone on their links), in flow order.
double Network::class_bytes(ClassId c) const {
  double bytes = classes_.bytes[c];
  for (const FlowRef& r : classes_.flows[c]) {
    const Flow& fl = flows_[r.flow];
    bytes += set_weight(fl, r.use) * carried(fl);
  }
  if (counts_.active == 0 || c == 0) return bytes;
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
  return LinkStats{capacity_of(l), class_bytes(c), classes_.peak[c]};
}

std::vector<double> Network::class_totals() const {
  settle();
  std::vector<double> bytes(classes_.bytes.size());
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
      const double util = std::min(1.0, s.weight[i] * s.retired_max_rate / classes_.solve[c].capacity_Bps);
      classes_.peak[c] = std::max(classes_.peak[c], util);
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
  if (batch_.of_set.size() < sets_.size()) batch_.of_set.resize(sets_.size(), kNoEntry);
  batch_.sets.clear();
  batch_.off.clear();
  for (const Retired& r : retired_) {
    std::uint32_t& b = batch_.of_set[r.set];
    if (b == kNoEntry) {
      b = static_cast<std::uint32_t>(batch_.sets.size());
      batch_.sets.push_back(r.set);
      batch_.off.push_back(0);
    }
    ++batch_.off[b];
  }
  const std::size_t nb = batch_.sets.size();
  std::uint32_t sum = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::uint32_t n = batch_.off[b];
    batch_.off[b] = sum;
    sum += n;
  }
  batch_.off.push_back(sum);
  batch_.totals.resize(retired_.size());
  batch_.pos.resize(retired_.size());
  batch_.fill.assign(batch_.off.begin(), batch_.off.end() - 1);
  for (std::uint32_t k = 0; k < retired_.size(); ++k) {
    const std::uint32_t at = batch_.fill[batch_.of_set[retired_[k].set]]++;
    batch_.totals[at] = retired_[k].total;
    batch_.pos[at] = k;
  }
  // The classes the batch's sets cross, each once.
  if (classes_.touch.size() < classes_.solve.size()) classes_.touch.resize(classes_.solve.size(), 0);
  const std::uint32_t stamp = ++classes_.stamp;
  batch_.touched.clear();
  for (LinkSetId id : batch_.sets) {
    for (ClassId c : sets_[id].classes) {
      if (classes_.touch[c] == stamp) continue;
      classes_.touch[c] = stamp;
      batch_.touched.push_back(c);
    }
  }
  for (ClassId c : batch_.touched) {
    batch_.cursors.clear();
    for (const ClassSet& cs : classes_.sets[c]) {
      const std::uint32_t b = cs.set < batch_.of_set.size() ? batch_.of_set[cs.set] : kNoEntry;
      if (b != kNoEntry) batch_.cursors.push_back(MergeCursor{batch_.off[b], batch_.off[b + 1], cs.weight});
    }
    double x = classes_.bytes[c];
    if (batch_.cursors.size() == 1) {  // one set: its flows in order
      const MergeCursor& m = batch_.cursors.front();
      for (std::uint32_t k = m.at; k < m.end; ++k) x += m.weight * batch_.totals[k];
    } else {
      while (true) {
        MergeCursor* next = nullptr;
        for (MergeCursor& m : batch_.cursors) {
          if (m.at < m.end && (next == nullptr || batch_.pos[m.at] < batch_.pos[next->at])) next = &m;
        }
        if (next == nullptr) break;
        x += next->weight * batch_.totals[next->at];
        ++next->at;
      }
    }
    classes_.bytes[c] = x;
  }
  for (LinkSetId id : batch_.sets) batch_.of_set[id] = kNoEntry;
  retired_.clear();
}

// Checks the uses (nothing registered yet if one is bad), then registers them.
LinkSetId Network::add_link_set(std::span<const LinkUse> uses) {
  if (rails_folded()) {
    throw std::logic_error("Network: raw link sets (add_link_set, start_flow over uses) cannot join folded rails");
  }
  if (!merger_.sized_for(num_slots_)) merger_.begin(num_slots_, mem_);
  if (split_.link_mark.size() != num_links_) split_.link_mark.assign(num_links_, 0);  // first call
  const std::uint32_t stamp = ++split_.link_stamp;
  set_links_.clear();
  for (const LinkUse& u : uses) {
    if (u.link >= num_links_) throw std::out_of_range("Network: link id out of range");
    if (!(u.weight > 0)) continue;
    if (split_.link_mark[u.link] == stamp) {
      throw std::invalid_argument("Network: a link set lists link " + std::to_string(u.link) + " twice");
    }
    split_.link_mark[u.link] = stamp;
    set_links_.push_back(u.link);
    merger_.weight(u.link) = u.weight;
  }
  return register_links(set_links_);
}

// Registers the set of `links` (distinct slots, see slot_of: link ids unless
// folded), each with weight merger_.weight(slot). Refines the link classes by
// it (a class it crosses in part, or with two weights, splits; the sets
// crossing the old class cross the new one too), then lists the set's
// classes and conflicts.
LinkSetId Network::register_links(std::span<const LinkId> links) {
  const auto id = static_cast<LinkSetId>(sets_.size());
  LinkSet s;
  s.cap = std::numeric_limits<double>::infinity();
  // The set's links grouped by (class, weight; capacity for class 0).
  std::vector<SplitGroup>& groups = split_.groups;
  groups.clear();
  split_.use_group.resize(links.size());
  const std::uint32_t cstamp = ++classes_.stamp;
  if (classes_.touch.size() < classes_.solve.size()) classes_.touch.resize(classes_.solve.size(), 0);
  for (std::size_t i = 0; i < links.size(); ++i) {
    const LinkId l = links[i];
    const ClassId c = link_class_[l];
    const auto wbits = std::bit_cast<std::uint64_t>(merger_.weight(l));
    const std::uint64_t cbits = c == 0 ? std::bit_cast<std::uint64_t>(capacity_of(link_of_slot(l))) : 0;
    if (classes_.touch[c] != cstamp) {
      classes_.touch[c] = cstamp;
      classes_.first_group[c] = kNoEntry;
    }
    std::uint32_t g = classes_.first_group[c];
    while (g != kNoEntry && (groups[g].weight_bits != wbits || groups[g].capacity_bits != cbits)) g = groups[g].next;
    if (g == kNoEntry) {
      g = static_cast<std::uint32_t>(groups.size());
      groups.push_back(SplitGroup{c, wbits, cbits, 0, 0, classes_.first_group[c]});
      classes_.first_group[c] = g;
    }
    ++groups[g].count;
    split_.use_group[i] = g;
  }
  // Its bottleneck: a group's links share capacity and weight.
  for (const SplitGroup& g : groups) {
    const double cap = g.from == 0 ? std::bit_cast<double>(g.capacity_bits) : classes_.solve[g.from].capacity_Bps;
    s.cap = std::min(s.cap, cap / std::bit_cast<double>(g.weight_bits));
  }
  // Which groups leave their class (a split)? A class the set covers whole
  // stays with its first group; its other groups, and the groups of classes
  // it covers in part, become new classes.
  bool split = false;
  for (std::uint32_t i = 0; i < groups.size(); ++i) {
    SplitGroup& g = groups[i];
    std::uint32_t covered = 0;
    std::uint32_t first = i;
    std::uint32_t count = 0;
    for (std::uint32_t o = classes_.first_group[g.from]; o != kNoEntry; o = groups[o].next) {
      covered += groups[o].count;
      first = std::min(first, o);
      ++count;
    }
    const bool whole = g.from != 0 && covered == classes_.members[g.from];
    g.to = whole && first == i ? g.from : kNoEntry;
    split = split || (g.from != 0 && !(whole && count == 1));
  }
  // A split copies the old class's totals and flows: settle the totals first;
  // running flows leave the lists and come back on the refined classes.
  std::vector<FlowId> was_registered;
  if (split) {
    settle();
    if (counts_.active > 0) unregister_all(was_registered);
  }
  for (SplitGroup& g : groups) {
    if (g.to == g.from) continue;
    const auto n = static_cast<ClassId>(classes_.solve.size());
    g.to = n;
    const double capacity = g.from == 0 ? std::bit_cast<double>(g.capacity_bits) : classes_.solve[g.from].capacity_Bps;
    classes_.solve.push_back(ClassSolve{capacity, 0, 0});
    classes_.flows.emplace_back();
    classes_.members.push_back(g.count);
    classes_.members[g.from] -= g.count;
    classes_.bytes.push_back(classes_.bytes[g.from]);
    classes_.peak.push_back(classes_.peak[g.from]);
    classes_.first_group.push_back(kNoEntry);
    classes_.touch.push_back(0);
    // The sets crossing the old class cross this one too, with the same weight.
    std::vector<ClassSet> crossing = classes_.sets[g.from];
    for (const ClassSet& cs : crossing) {
      sets_[cs.set].classes.push_back(n);
      sets_[cs.set].weight.push_back(cs.weight);
    }
    crossing.push_back(ClassSet{id, std::bit_cast<double>(g.weight_bits)});
    classes_.sets.push_back(std::move(crossing));
  }
  for (const SplitGroup& g : groups) {
    if (g.to == g.from) classes_.sets[g.from].push_back(ClassSet{id, std::bit_cast<double>(g.weight_bits)});
  }
  for (std::size_t i = 0; i < links.size(); ++i) link_class_[links[i]] = groups[split_.use_group[i]].to;
  s.classes.reserve(groups.size());
  s.weight.reserve(groups.size());
  for (const SplitGroup& g : groups) {
    s.classes.push_back(g.to);
    s.weight.push_back(std::bit_cast<double>(g.weight_bits));
  }
  // Its conflicts: every set that crosses one of its classes, and itself.
  split_.set_mark.push_back(0);
  const std::uint32_t set_stamp = id + 1;
  split_.set_mark[id] = set_stamp;
  for (ClassId c : s.classes) {
    for (const ClassSet& cs : classes_.sets[c]) {
      if (split_.set_mark[cs.set] == set_stamp) continue;
      split_.set_mark[cs.set] = set_stamp;
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
      FlowList& list = classes_.flows[set_class(fl, i)];
      while (list.size() > 0) list.pop_back();
    }
    fl.registered = false;
    fl.shared.clear();
  }
}

// What a running flow has carried per route so far.
double Network::carried(const Flow& fl) const {
  const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
  return fl.total - left;
}

}  // namespace cuboid::sim
