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
  class_solve_.resize(1);
  class_flows_.resize(1);
  class_size_.assign(1, static_cast<std::uint32_t>(num_slots_));
  class_sets_.resize(1);
  class_bytes_.assign(1, 0.0);
  class_peak_.assign(1, 0.0);
  class_first_group_.assign(1, kNoEntry);
  class_touch_.assign(1, 0);
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

// Checks the uses (nothing registered yet if one is bad), then registers them.
LinkSetId Network::add_link_set(std::span<const LinkUse> uses) {
  if (rails_folded()) {
    throw std::logic_error("Network: raw link sets (add_link_set, start_flow over uses) cannot join folded rails");
  }
  if (!merger_.sized_for(num_slots_)) merger_.begin(num_slots_, mem_);
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
  groups_.clear();
  use_group_.resize(links.size());
  const std::uint32_t cstamp = ++class_stamp_;
  if (class_touch_.size() < class_solve_.size()) class_touch_.resize(class_solve_.size(), 0);
  for (std::size_t i = 0; i < links.size(); ++i) {
    const LinkId l = links[i];
    const ClassId c = link_class_[l];
    const auto wbits = std::bit_cast<std::uint64_t>(merger_.weight(l));
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

// What a running flow has carried per route so far.
double Network::carried(const Flow& fl) const {
  const double left = std::max(0.0, fl.remaining - fl.rate * static_cast<double>(now_ - fl.updated_ns) * 1e-9);
  return fl.total - left;
}

}  // namespace cuboid::sim
