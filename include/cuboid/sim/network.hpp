#pragma once
#ifndef CUBOID_LAYER_SIM
#error "cuboid/sim is not below this layer in the build (docs/architecture.md)"
#endif
// Flow-level network model: directed links with a capacity each, flows that
// cross a weighted set of links, bandwidth shared max-min fairly (progressive
// filling) and re-solved, per connected component, whenever a flow starts or
// ends. The engine asks it SimGrid's two questions: "when does your next flow
// drain?" (next_completion) and "advance to t" (advance_to).
//
// Flow = one rate variable r (bytes/s per route) loading each of its links
// with weight w: the link carries w * r. A plain point-to-point flow has
// weight 1 on every link of its route. A collective phase is one flow whose
// links are the union of its ring / tree edges (weight = how many of its
// edges cross that link): the edges of a ring advance in lockstep in NCCL, so
// one shared rate is both faithful and cheap (n edges, one variable). Mirrored
// groups (symmetry, see collective.hpp) add their routes' weights to the same
// variable: their links are loaded for real, but only the representative
// completion is tracked. Links that every set crosses alike form one class
// (see Network's private part): solves and totals are per class, so the
// thousands of links a mirrored group loads cost what a handful do.
#include <cstdint>
#include <limits>
#include <memory>
#include <memory_resource>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuboid/core/time.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/sim/flow_list.hpp"
#include "cuboid/sim/link_merger.hpp"
#include "cuboid/sim/maxmin.hpp"
#include "cuboid/sim/route_cache.hpp"
#include "cuboid/sim/zeroed_array.hpp"

namespace cuboid::sim {

// The simulator runs in core's time (core/time.hpp); sim::TimeNs stays a name for it.
using cuboid::TimeNs;
using cuboid::kNever;

using FlowId = std::uint32_t;

// One link of a flow and how many of the flow's routes cross it.
struct LinkUse {
  LinkId link = 0;
  double weight = 1.0;
};

struct NetworkOptions {
  // Scale each link to what NCCL achieves on it, so that an uncontended ring
  // reproduces nccl-tests bus bandwidth: GPU<->NVSwitch links get the card's
  // intra.busbw_GBps (instead of the NVLink line rate), every InfiniBand /
  // RoCE link (GPU-NIC, NIC-leaf, leaf-spine, spine-core) is multiplied by
  // nic_busbw / NIC line rate (e.g. 24 GB/s / 25 GB/s for HDR). Off: line rates.
  bool achievable_bandwidth = true;
};

// Per-link totals after (or during) a run.
struct LinkStats {
  double capacity_Bps = 0;      // as modelled (achievable, see NetworkOptions)
  double bytes = 0;             // carried so far, mirrors included
  double peak_utilisation = 0;  // max over time of load / capacity, in [0, 1] (finished flows
                                // and solves so far)
};

class Network {
 public:
  // Abstract links with the given capacities (bytes/s): for hand-built graphs
  // in tests and for custom fabrics. route_links() is unavailable.
  explicit Network(std::vector<double> link_capacity_Bps);
  // The cluster's fat tree: every undirected edge of the topology becomes two
  // directed links (lower->higher vertex id and back), each with the edge's
  // per-direction capacity (scaled by `opts`) and latency. `topo` must outlive this.
  // `mem`, when given, holds the per-link tables, the retired flows, the
  // route blocks and the cached route lists (not owned; must outlive the
  // network): a simulation passes its SimArena (huge_pages.hpp).
  explicit Network(const Topology& topo, NetworkOptions opts = {}, std::pmr::memory_resource* mem = nullptr);

  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;
  Network(Network&&) noexcept = default;
  // Not noexcept: the tables are std::pmr vectors, and moving into one on
  // another memory resource copies element by element (allocating).
  Network& operator=(Network&&) = default;
  ~Network() = default;

  const Topology* topology() const { return topo_; }
  const NetworkOptions& options() const { return opts_; }
  std::size_t num_links() const { return num_links_; }
  // "n0.gpu3->n0.nvswitch" for topology links, "link7" for abstract ones.
  std::string link_name(LinkId l) const;
  // The topology vertices a link goes from and to (networks built from a topology).
  // Throws std::out_of_range for abstract links.
  std::pair<std::uint32_t, std::uint32_t> link_ends(LinkId l) const;
  LinkStats link_stats(LinkId l) const;
  // Every link's stats at once (index = link id): one pass over the running
  // flows instead of one per link; the same numbers as link_stats(l).
  std::vector<LinkStats> all_link_stats() const;
  // Calls f(link, stats) for every link in id order: the same numbers as
  // all_link_stats without its vector (a big fabric has ~6 links per GPU).
  template <typename F>
  void for_each_link_stats(F&& f) const {
    for_each_link(false, f);
  }
  // The same for the links that carried bytes only (bytes > 0), skipping the
  // others' capacities: what a report of the loaded links reads.
  template <typename F>
  void for_each_loaded_link_stats(F&& f) const {
    for_each_link(true, f);
  }
  // Folded rails: calls f(slot, stats) for every rail-0 image whose links
  // carried bytes, in slot order: every link of the slot
  // (Topology::rail0_slot_members) reports these figures. A report of the
  // loaded links then costs a few per image instead of one per link.
  template <typename F>
  void for_each_loaded_slot_stats(F&& f) const {
    if (!rails_folded()) throw std::logic_error("Network: for_each_loaded_slot_stats needs folded rails");
    const std::vector<double> bytes = class_totals();
    for (std::uint32_t s = 0; s < num_slots_; ++s) {
      const ClassId c = link_class_[s];
      if (bytes[c] <= 0) continue;
      f(s, LinkStats{capacity_of(slot_link_[s]), bytes[c], classes_.peak[c]});
    }
  }
  // A link's modelled capacity (no settling: cheap).
  double link_capacity_Bps(LinkId l) const {
    if (l >= num_links_) throw std::out_of_range("Network: link id out of range");
    return capacity_of(l);
  }
  // Directed links of Topology::route(src, dst), in order (cached per pair;
  // the span stays valid as long as the Network).
  std::span<const LinkId> route_links(int src_gpu, int dst_gpu);
  // Sum of the hop latencies of that route (one alpha for one message).
  TimeNs route_latency_ns(int src_gpu, int dst_gpu);
  // Appends the links of `routes` to `out` and merges duplicates (sorted by
  // link, weights summed). The result is what start_flow wants.
  void compile_routes(std::span<const Route> routes, std::vector<LinkUse>& out);
  // Sorts uses by link and merges duplicates, each link's weights summed in
  // the order they are listed.
  static void merge_uses(std::vector<LinkUse>& uses);

  // Registers a set of link uses once (a collective phase, a raw flow); flows
  // over it then share its links, weights and bottleneck (min over its links
  // of capacity / weight), computed here once instead of at every start (a
  // mirrored phase has hundreds of links and starts once per micro-batch).
  // `uses` must be merged; uses of weight <= 0 are
  // dropped. Throws std::out_of_range for an unknown link and
  // std::invalid_argument for a link listed twice, before registering anything,
  // and std::logic_error once the rails are folded (a raw set's links are not
  // rotation-closed, and the folded tables hold only rail 0's links).
  LinkSetId add_link_set(std::span<const LinkUse> uses);
  // Rail folding (Topology::rail_symmetric fabrics; before any set): every
  // later add_route_set list must be closed under the rail rotation (with each
  // route, the same route with both ends rotated, same weight), as a
  // mirrored collective over all TP ranks of a rail-aligned layout is. Only
  // its routes from local GPU 0 are then walked, each hop loading its rail-0
  // image (a link all rails share, once per rail): by symmetry every rail
  // carries rail 0's load, so the solves, finish times and rail-0 figures are
  // those of the whole list, at 1/GPUs-per-node of the work. A link's stats
  // are its rail-0 image's, and the per-link tables hold the images only.
  // Raw link sets (add_link_set) are refused from then on.
  // Throws std::logic_error if the fabric is not rail-symmetric or sets exist.
  void fold_rails();
  bool rails_folded() const { return slot_of_ != nullptr; }
  // compile_routes and add_link_set in one: the set of a collective phase.
  // A list of RouteSetCache::kMinSize routes or more equal to an earlier one (same
  // pairs, weights and order) gives that set back: sets are immutable, and
  // flows over one set are as independent as flows over two equal ones.
  LinkSetId add_route_set(std::span<const Route> routes);
  // Folded networks: the set add_route_set gives for a rotation-closed list,
  // from that list's routes from local GPU 0 alone, in its order (a mirrored
  // collective need not build the other GPUs' routes at all). The closure
  // is the caller's to check (plan_collective counts each local GPU's
  // routes). Throws std::logic_error if the rails are not folded and
  // std::invalid_argument for a route from another local GPU.
  LinkSetId add_rail0_route_set(std::span<const Route> rail0_routes);
  std::size_t num_link_sets() const { return sets_.size(); }
  // Link classes in use (links every set crosses alike; class 0, the links
  // no set crosses, included): what solves and totals work on.
  std::size_t num_link_classes() const { return classes_.solve.size(); }
  // Starts a flow of `bytes` per route over `set` at time `now` (>= every
  // earlier call's time; no completion may be pending before `now`, see
  // next_completion). `tag` comes back on completion. A flow with no link, or
  // no bytes, drains at `now`. Rates are re-solved lazily (flush), so flows
  // started at the same instant share one solve.
  FlowId start_flow(LinkSetId set, double bytes, TimeNs now, std::uint64_t tag);
  // The same over `uses` (merged), registered as a new set (tests, one-offs).
  FlowId start_flow(std::span<const LinkUse> uses, double bytes, TimeNs now, std::uint64_t tag);
  // Re-solves the components touched since the last solve (at the latest time seen).
  void flush();
  // The earliest time an active flow drains (kNever if none). Flushes first.
  TimeNs next_completion();
  // Drains every flow whose finish time is <= now, appends their tags to
  // `completed` (in (finish time, flow start order) order), and re-solves the
  // rates of the components they leave.
  void advance_to(TimeNs now, std::vector<std::uint64_t>& completed);

  double rate_Bps(FlowId f);                // current rate per route of an active flow (flushes)
  std::size_t active_flows() const { return counts_.active; }
  std::uint64_t flows_started() const { return counts_.flows_started; }
  std::uint64_t solves() const { return counts_.solves; }  // component re-solves

 private:
  using ClassId = std::uint32_t;
  using FlowRef = sim::FlowRef;
  using FlowList = sim::FlowList;
  // Link classes. Two links that every registered set crosses alike (both or
  // neither, with the same weight) and of one capacity carry the same flows
  // at the same rates: their constraints in the max-min problem are copies,
  // their byte totals and peaks the same numbers. So flows, solves and totals
  // work on classes; a link's figures are its class's. add_link_set refines
  // the partition (a class the new set crosses only in part, or with two
  // weights, splits). Class 0 holds the links no set crosses. A mirrored
  // collective's thousands of links fall into a handful of classes.
  struct ClassSolve {         // what a re-solve reads and marks
    double capacity_Bps = 0;
    std::uint32_t epoch = 0;  // component search mark
    std::uint32_t comp = 0;   // index in the component being solved
  };
  struct ClassSet {           // a set crossing a class, and its weight on each of its links
    LinkSetId set = 0;
    double weight = 0;
  };
  struct LinkSet {
    std::vector<ClassId> classes;     // the classes it crosses (grows when one of them splits)
    std::vector<double> weight;   // its weight on each link of classes[i]
    double cap = 0;           // min over its links of capacity / weight
    double retired_max_rate = 0;  // max rate of its finished flows (link peaks)
    bool peak_dirty = false;  // finished flows not yet in the class peaks
    std::vector<LinkSetId> conflicts;  // the sets sharing a link with it, itself included
    std::vector<FlowId> active;        // its running flows (with bytes)
  };
  static constexpr std::uint32_t kNotShared = std::numeric_limits<std::uint32_t>::max();
  struct ListPosition {       // where a flow sits, per class it uses
    std::uint32_t pos = 0;    // index in classes_.flows[class]
    std::uint32_t spos = kNotShared;  // index in the flow's `shared`, if the class has other flows
  };
  struct Flow {
    LinkSetId set = 0;
    std::uint32_t nuses = 0;  // its set's class count, or 0 (no bytes: never on a link)
    std::uint32_t apos = 0;   // index in its set's `active`
    // On its classes' flow lists. A flow whose set shares no link with any
    // running flow's set is alone on every link: it skips the lists (its rate
    // is the set's cap) until a flow that may meet it starts (register_flow),
    // which leaves the lists exactly as if it had been on them all along.
    bool registered = false;
    std::vector<ListPosition> positions;  // per class use; capacity kept when the flow id is reused
    // Indices of class uses that other flows cross too. Only those take part
    // in a solve; the private ones are summarised by the set's `cap`.
    std::vector<std::uint32_t> shared;
    double remaining = 0;     // bytes per route at `updated_ns`
    double total = 0;
    double rate = 0;          // bytes/s per route
    double max_rate = 0;      // for link peak utilisation
    TimeNs updated_ns = 0;
    TimeNs finish_ns = kNever;
    std::uint64_t tag = 0;
    std::uint64_t seq = 0;    // start order, breaks finish-time ties
    std::uint32_t version = 0;
    std::uint32_t epoch = 0;
    std::uint32_t comp = 0;   // index in the component being solved
    bool active = false;
  };
  struct Pending {
    TimeNs finish_ns = 0;
    std::uint64_t seq = 0;
    FlowId flow = 0;
    std::uint32_t version = 0;
  };
  // A finished flow's bytes, added to its classes' totals later (settle), in
  // finish order: the same sums as adding them at once, without touching
  // every class of the set again when the flow ends.
  struct Retired {
    LinkSetId set = 0;
    double total = 0;
  };
  // Scratch of add_link_set: the set's links grouped by (old class, weight).
  struct SplitGroup {
    ClassId from = 0;
    std::uint64_t weight_bits = 0;
    std::uint64_t capacity_bits = 0;  // class 0 only: its links differ in capacity
    std::uint32_t count = 0;          // links of the set in it
    ClassId to = 0;                   // the class they end in
    std::uint32_t next = 0;           // the next group of the same old class
  };
  ClassId set_class(const Flow& fl, std::uint32_t use) const { return sets_[fl.set].classes[use]; }
  // Slots: what the per-link tables (classes, merge scratch) and the sets'
  // link lists are indexed by. Unfolded, a link's slot is its id; folded,
  // only the rail-0 images have slots (Topology::rail0_slots, in link id
  // order, so lists sorted by slot are sorted by image), and a link's slot
  // is its image's.
  std::uint32_t slot_of(LinkId l) const { return slot_of_ != nullptr ? slot_of_[l] : l; }
  LinkId link_of_slot(std::uint32_t s) const { return slot_link_ != nullptr ? slot_link_[s] : s; }
  // The class whose figures a link reports (folded: its rail-0 image's).
  ClassId class_of_link(LinkId l) const { return link_class_[slot_of(l)]; }
  double set_weight(const Flow& fl, std::uint32_t use) const { return sets_[fl.set].weight[use]; }
  // A link's capacity: a topology link's from its edge record (no per-link
  // table to fill), an abstract one's as given.
  double capacity_of(LinkId l) const {
    if (topo_ == nullptr) return link_capacity_[l];
    const EdgeRecord& e = topo_->edges()[l / 2];
    if (!opts_.achievable_bandwidth) return e.bandwidth_Bps;
    const bool intra = e.lo_kind == VertexKind::nvswitch || e.hi_kind == VertexKind::nvswitch;
    if (intra) return intra_busbw_Bps_ > 0 ? intra_busbw_Bps_ : e.bandwidth_Bps;
    return e.bandwidth_Bps * nic_eff_;
  }
  template <typename F>
  void for_each_link(bool loaded_only, F& f) const {
    const std::vector<double> bytes = class_totals();
    for (std::size_t l = 0; l < num_links_; ++l) {
      const ClassId c = class_of_link(static_cast<LinkId>(l));
      if (loaded_only && bytes[c] <= 0) continue;
      f(static_cast<LinkId>(l), LinkStats{capacity_of(static_cast<LinkId>(l)), bytes[c], classes_.peak[c]});
    }
  }
  [[noreturn]] void throw_no_topology_link(LinkId l) const;
  // Link classes and their totals (link_classes.cpp).
  void init_classes();
  LinkSetId register_links(std::span<const LinkId> links);
  void unregister_all(std::vector<FlowId>& was);
  double carried(const Flow& fl) const;
  double class_bytes(ClassId c) const;
  std::vector<double> class_totals() const;  // settles, then class_bytes of every class
  void settle() const;
  void settle_bytes() const;
  // Routes into link sets, rail folding (route_compile.cpp).
  void merge_routes(std::span<const Route> routes);
  void merge_routes_folded(std::span<const Route> routes, bool rail0_part);
  LinkSetId add_routes(std::span<const Route> routes, bool rail0_part);
  // Flows and rates (network.cpp).
  void register_flow(FlowId f);
  void retire_flow(FlowId f);
  void add_shared(FlowId f, std::uint32_t use);
  void remove_shared(FlowId f, std::uint32_t use);
  void solve_from(std::span<const ClassId> seeds, TimeNs now);
  void set_rate(FlowId f, double rate, TimeNs now);
  void push_pending(FlowId f);

  // Per link class (index: ClassId), parallel tables.
  struct ClassTables {
    std::vector<ClassSolve> solve;
    std::vector<FlowList> flows;
    std::vector<std::uint32_t> members;          // member slots (links, unless folded)
    std::vector<std::vector<ClassSet>> sets;     // the sets crossing it, in the order they were added
    // Totals; settle() brings them up to date (link_stats is const).
    mutable std::vector<double> bytes;
    mutable std::vector<double> peak;
    std::vector<std::uint32_t> first_group;      // register_links: its first SplitGroup
    mutable std::vector<std::uint32_t> touch;    // == stamp: seen by the current pass
    mutable std::uint32_t stamp = 0;
  };
  // Scratch of add_link_set and register_links.
  struct SplitScratch {
    std::vector<SplitGroup> groups;
    std::vector<std::uint32_t> use_group;  // per link of the set: its group
    std::vector<std::uint32_t> link_mark;  // the duplicate check (made on the first call)
    std::uint32_t link_stamp = 0;
    std::vector<std::uint32_t> set_mark;   // per set: the conflicts' check
  };
  // Scratch of settle_bytes: the retired flows grouped by set, and the
  // classes they touch.
  struct MergeCursor {
    std::uint32_t at = 0, end = 0;
    double weight = 0;
  };
  static constexpr std::uint32_t kNoEntry = std::numeric_limits<std::uint32_t>::max();
  struct SettleBatch {
    std::vector<std::uint32_t> of_set;  // per set: its index in `sets`, or kNoEntry
    std::vector<LinkSetId> sets;
    std::vector<std::uint32_t> off, fill, pos;
    std::vector<double> totals;
    std::vector<ClassId> touched;
    std::vector<MergeCursor> cursors;
  };
  // The re-solves: their seeds and the component being solved (kept to
  // avoid allocating per event).
  struct SolveState {
    std::vector<ClassId> seeds;
    std::vector<ClassId> dirty;  // seeds of the deferred solve
    std::vector<ClassId> comp_links;
    std::vector<FlowId> comp_flows;
    MaxMinSolver solver;
    std::uint32_t epoch = 0;
  };
  struct Counters {
    std::size_t active = 0;  // running flows
    std::uint64_t flows_started = 0;
    std::uint64_t solves = 0;
    std::uint64_t next_seq = 0;  // the next flow's start order
  };

  const Topology* topo_ = nullptr;
  NetworkOptions opts_;
  std::pmr::memory_resource* mem_ = nullptr;  // see the constructor; null: the default heap
  std::pmr::memory_resource* resource() const { return mem_ != nullptr ? mem_ : std::pmr::get_default_resource(); }
  // Folded: topo_->rail0_slots() and rail0_slot_links() (see slot_of).
  const std::uint32_t* slot_of_ = nullptr;
  const std::uint32_t* slot_link_ = nullptr;
  std::size_t num_links_ = 0;
  std::size_t num_slots_ = 0;
  // Per link: capacity (abstract networks only; see capacity_of), class.
  std::vector<double> link_capacity_;
  double intra_busbw_Bps_ = 0;  // topology networks: the card's intra.busbw (achievable rates)
  double nic_eff_ = 1;          // and nic_efficiency
  ZeroedArray<ClassId> link_class_;  // per slot; zero: class 0; pages a run never touches stay unmapped
  // Ends and latencies come from topo_->edges() (link l is edge l / 2, lower
  // vertex first when l is even): nothing to copy per link.
  ClassTables classes_;
  SplitScratch split_;
  mutable std::pmr::vector<Retired> retired_{resource()};
  static constexpr std::size_t kRetiredMax = std::size_t{1} << 16;  // settle() when this many wait
  mutable std::vector<LinkSetId> peak_dirty_sets_;
  mutable SettleBatch batch_;
  mutable std::vector<LinkSet> sets_;
  std::vector<Flow> flows_;
  std::vector<FlowId> free_flows_;
  std::vector<Pending> pending_;  // min-heap of predicted finish times (lazy deletion)
  RouteCache routes_{mem_};
  // Scratch for compile_routes and the sets: per link its summed weight, and a bit set of the listed links.
  LinkMerger merger_;               // per slot
  std::vector<LinkId> set_links_;  // the links to register: merger_'s (in id order) or add_link_set's (as given)
  RouteSetCache route_sets_{mem_};  // add_route_set's lists and their sets

  struct Component;  // solve_.comp_links and comp_flows as the solver sees them
  SolveState solve_;
  TimeNs now_ = 0;            // latest time seen (for link_stats of active flows)
  Counters counts_;
};

}  // namespace cuboid::sim
