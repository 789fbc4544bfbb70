// The discrete-event simulator of one training iteration.
//
// What is played (builder.cpp), per simulated GPU (one per pipeline stage):
// * the schedule's passes in its order (schedule.hpp); a pass is the op list
//   of its units (embedding on the first virtual stage, transformer layers,
//   LM head on the last; workload.hpp) compiled into compute segments and TP
//   collectives (program.cpp). Compute times are cost.hpp's op_time_ns,
//   scaled per stage by the GPU speed spread (the slowest of the GPUs the
//   simulated one stands for) and a straggler's slowdown.
// * TP collectives block the compute that follows them (Megatron runs them
//   on the compute stream), except in the backward of column-parallel layers
//   where Megatron overlaps them with the dgrad / wgrad GEMMs.
// * Recomputation: the layer's recompute ops (full: the whole forward with its
//   TP collectives; selective: the attention core) right before its backward.
// * Pipeline p2p: one send/recv per pass boundary on the PP streams of both
//   GPUs, from the producer's pass end and the receiver's previous pass end
//   (when Megatron posts the recv); the receiver's pass waits for it and the
//   sender's next pass too (Megatron's p2p is synchronous). Without sequence
//   parallelism the receiver all-gathers the TP shards (scatter-gather).
// * DP: gradient buckets (Megatron-core: max(40M, 1M x DP) parameters on the
//   first stage, one bucket per model chunk elsewhere) reduced at the
//   trainer's bytes per element (TrainerSettings) as the last micro-batch's
//   backward produces them (TrainerSettings::dp_overlap), or after the
//   stage's last backward; all-reduce without ZeRO, reduce-scatter with ZeRO
//   >= 1 (ZeRO-2/3: every micro-batch; ZeRO-1 all-reduces where the trainer
//   does). ZeRO-3 all-gathers each
//   unit's bf16 parameters before its forward and backward, one unit ahead.
//   Tied embeddings across stages: the embedding gradient all-reduce between
//   the first and last stage.
// * Then every stage's optimizer step (after a global join: the grad-norm
//   reduction synchronises all stages), its memory-bound kernels as
//   cost/optimizer_step.hpp lists them (50 B per parameter without ZeRO);
//   ZeRO-1/2 then all-gather the updated bf16 parameters. Which DP-side
//   collectives run, with what bytes and when: cost/step.hpp.
// The iteration time is when the last task ends. The breakdown: simulator.hpp.
#include "cuboid/sim/simulator.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <iterator>

#include "builder.hpp"
#include "busiest.hpp"
#include "cuboid/cost/flops.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/operand_pool.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/trace.hpp"

namespace cuboid::sim {

namespace {

using detail::Builder;
using detail::Category;
using detail::TaskMeta;

// What a link is, from the vertices it joins (its name is "<from>-><to>"):
// nvlink when it touches an NVSwitch, pcie between a GPU and a NIC, ib else.
enum class LinkKind { nvlink, pcie, ib };
constexpr std::array<std::string_view, 3> kLinkKindNames{"nvlink", "pcie", "ib"};

LinkKind edge_kind(const EdgeRecord& e) {
  const VertexKind a = e.lo_kind;
  const VertexKind b = e.hi_kind;
  if (a == VertexKind::nvswitch || b == VertexKind::nvswitch) return LinkKind::nvlink;
  if ((a == VertexKind::gpu && b == VertexKind::nic) || (a == VertexKind::nic && b == VertexKind::gpu)) return LinkKind::pcie;
  return LinkKind::ib;
}

// Both directions of an edge are one kind.
LinkKind link_kind(const Network& net, LinkId l) {
  return net.topology() == nullptr ? LinkKind::ib : edge_kind(net.topology()->edges()[l / 2]);
}

bool on_stage(const TaskMeta& t, int stage) {
  return t.stage == static_cast<std::uint16_t>(stage) || t.stage2 == static_cast<std::uint16_t>(stage);
}

// Walks [0, end] of one stage's GPU: each instant goes to the busy category of
// highest priority (optimizer, compute, TP, PP, DP, CP, EP, host copies),
// idle instants to bubble.
Breakdown critical_breakdown(const Engine& eng, std::span<const TaskMeta> meta, int stage, TimeNs end,
                             std::pmr::memory_resource* mem) {
  // Each task's start and end as one sortable word: time << 4 | start? << 3 |
  // category (at one instant ends first, as a stream runs a task after another).
  // The order of events at one instant does not matter (the sweep accounts
  // nothing between them), so plain integers sort them. Times are below
  // 2^59 ns (18 years). Grouped by trace thread, a stage's tasks are
  // mostly one stream's each, which runs them one after another: a group
  // is then sorted already, and the groups are merged instead of sorted.
  constexpr std::size_t kGroups = 8;
  std::pmr::vector<std::pmr::vector<std::uint64_t>> by_thread(kGroups, mem);  // the inner ones from mem too
  for (TaskId t = 0; t < meta.size(); ++t) {
    const TaskMeta& mt = meta[t];
    if (mt.category == Category::none || !on_stage(mt, stage) || !eng.done(t)) continue;
    if (eng.end_ns(t) <= eng.start_ns(t)) continue;
    const auto category = static_cast<std::uint64_t>(mt.category);
    std::pmr::vector<std::uint64_t>& g = by_thread[std::min<std::size_t>(mt.thread, kGroups - 1)];
    g.push_back(static_cast<std::uint64_t>(eng.start_ns(t)) << 4 | 8 | category);
    g.push_back(static_cast<std::uint64_t>(eng.end_ns(t)) << 4 | category);
  }
  std::pmr::vector<std::uint64_t> edges(mem);
  std::pmr::vector<std::uint64_t> merged(mem);  // swapped with edges: the same resource
  for (std::pmr::vector<std::uint64_t>& g : by_thread) {
    if (g.empty()) continue;
    if (!std::is_sorted(g.begin(), g.end())) std::sort(g.begin(), g.end());
    merged.clear();
    std::merge(edges.begin(), edges.end(), g.begin(), g.end(), std::back_inserter(merged));
    edges.swap(merged);
  }
  std::array<int, 8> active{};
  std::array<double, 9> ns{};  // per Category, [8] = bubble
  TimeNs at = 0;
  auto account = [&](TimeNs until) {
    if (until <= at) return;
    std::size_t category = 8;
    for (std::size_t c = 0; c < active.size(); ++c) {
      if (active[c] > 0) {
        category = c;
        break;
      }
    }
    ns[category] += static_cast<double>(until - at);
    at = until;
  };
  for (const std::uint64_t e : edges) {
    account(std::min(static_cast<TimeNs>(e >> 4), end));
    active[e & 7] += (e & 8) != 0 ? +1 : -1;
  }
  account(end);
  Breakdown b;
  b.optimizer_s = ns[0] * 1e-9;
  b.compute_s = ns[1] * 1e-9;
  b.tp_comm_s = ns[2] * 1e-9;
  b.pp_comm_s = ns[3] * 1e-9;
  b.dp_comm_s = ns[4] * 1e-9;
  b.cp_comm_s = ns[5] * 1e-9;
  b.ep_comm_s = ns[6] * 1e-9;
  b.offload_s = ns[7] * 1e-9;
  b.bubble_s = ns[8] * 1e-9;
  return b;
}

// Per-kind peaks over every link that carried bytes, and the 8 busiest links
// (highest peak first, ties in link order, as a stable sort would give).
// Only those 8 get names (a big fabric has ~6 links per GPU: naming and
// sorting them all would cost more than the simulation). The links stream
// past and nothing per link is kept; with folded rails they come per rail-0
// image, one per group of links that carry the same load.
void collect_links(SimResult& r, const Network& net, double tp_probe_peak) {
  detail::BusiestLinks<8> top;
  std::array<double, 3> peak{};  // per LinkKind
  if (net.rails_folded()) {
    // Per rail-0 image: its links share its figures and its kind (the
    // rotation maps GPUs, NICs and switches to their own kinds); they are
    // offered, in id order, only while the eight can still take them.
    const Topology& topo = *net.topology();
    const std::vector<std::uint32_t>& images = topo.rail0_slot_links();
    net.for_each_loaded_slot_stats([&](std::uint32_t slot, const LinkStats& st) {
      double& p = peak[static_cast<std::size_t>(link_kind(net, images[slot]))];
      p = std::max(p, st.peak_utilisation);
      for (const LinkId l : topo.rail0_slot_members(slot)) {  // in id order
        if (!top.could_take(st.peak_utilisation, l)) break;
        top.offer(l, st);
      }
    });
  } else {
    net.for_each_loaded_link_stats([&](LinkId l, const LinkStats& st) {
      double& p = peak[static_cast<std::size_t>(link_kind(net, l))];
      p = std::max(p, st.peak_utilisation);
      top.offer(l, st);
    });
  }
  r.peak_nvlink_utilisation = std::max(peak[0], tp_probe_peak);
  r.peak_pcie_utilisation = peak[1];
  r.peak_ib_utilisation = peak[2];
  r.busiest_links.clear();
  for (std::size_t i = 0; i < top.size(); ++i) {
    LinkUtilisation u;
    u.name = net.link_name(top[i].link);
    u.kind = std::string(kLinkKindNames[static_cast<std::size_t>(link_kind(net, top[i].link))]);
    u.capacity_Bps = top[i].stats.capacity_Bps;
    u.bytes = top[i].stats.bytes;
    u.peak_utilisation = top[i].stats.peak_utilisation;
    r.busiest_links.push_back(std::move(u));
  }
}

static_assert(static_cast<int>(TimelineRow::dp) == detail::kThreadDp &&
                  static_cast<int>(TimelineRow::host_copy) == detail::kThreadHostCopy &&
                  static_cast<int>(TimelineRow::ep_a2a) == detail::kThreadA2a &&
                  kTimelineRowNames.size() == detail::kThreadA2a + 1,
              "the timeline's rows are the trace's threads");

// The traced tasks of each stage (a p2p or the embedding all-reduce on both).
std::vector<std::vector<TaskId>> labelled_by_stage(const Builder& b) {
  const std::span<const TaskMeta> meta = b.meta();
  std::vector<std::vector<TaskId>> by_stage(b.representatives().size());
  for (const auto& [t, lbl] : b.labels()) {
    const TaskMeta& mt = meta[t];
    if (mt.stage != detail::kNoStage) by_stage[mt.stage].push_back(t);
    if (mt.stage2 != detail::kNoStage) by_stage[mt.stage2].push_back(t);
  }
  return by_stage;
}

// A step span's start and end: a combined step's (StepSpan::first2) from
// its earlier pass's start to its later one's end.
TimeNs span_start(const Engine& eng, const detail::StepSpan& s) {
  const TimeNs a = eng.start_ns(s.first);
  return s.first2 == detail::kNoTask ? a : std::min(a, eng.start_ns(s.first2));
}
TimeNs span_end(const Engine& eng, const detail::StepSpan& s) {
  const TimeNs a = eng.end_ns(s.last);
  return s.last2 == detail::kNoTask ? a : std::max(a, eng.end_ns(s.last2));
}

// The trace's step spans and stream tasks of every stage, without the
// compute segments and kernels inside the steps (timeline.hpp).
Timeline collect_timeline(const Builder& b, TimeNs end) {
  const Engine& eng = b.engine();
  const std::span<const TaskMeta> meta = b.meta();
  const std::vector<std::vector<TaskId>> by_stage = labelled_by_stage(b);
  Timeline tl;
  tl.end_ns = end;
  for (const auto& rep : b.representatives()) tl.stage_ranks.push_back(rep.rank);
  for (std::size_t stage = 0; stage < by_stage.size(); ++stage) {
    std::vector<TimelineBlock> steps;  // the compute stream runs them one after another
    for (const detail::StepSpan& s : b.spans()) {
      if (static_cast<std::size_t>(s.stage) != stage) continue;
      steps.push_back(TimelineBlock{static_cast<int>(stage), TimelineRow::compute, s.name,
                                    s.forward ? "forward" : "backward", span_start(eng, s), span_end(eng, s)});
    }
    std::sort(steps.begin(), steps.end(), [](const auto& x, const auto& y) { return x.start_ns < y.start_ns; });
    auto inside_a_step = [&steps](TimeNs start, TimeNs stop) {
      auto it = std::upper_bound(steps.begin(), steps.end(), start,
                                 [](TimeNs t, const TimelineBlock& s) { return t < s.start_ns; });
      return it != steps.begin() && std::prev(it)->end_ns >= stop;
    };
    std::vector<TimelineBlock> blocks;
    for (TaskId t : by_stage[stage]) {
      if (!eng.done(t)) continue;
      const TaskMeta& mt = meta[t];
      const TimeNs start = eng.start_ns(t);
      const TimeNs stop = eng.end_ns(t);
      if (mt.thread == detail::kThreadCompute && inside_a_step(start, stop)) continue;
      const detail::TraceLabel& lbl = b.labels().at(t);
      blocks.push_back(TimelineBlock{static_cast<int>(stage), static_cast<TimelineRow>(mt.thread), lbl.name, lbl.category,
                                     start, stop});
    }
    blocks.insert(blocks.end(), steps.begin(), steps.end());
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) {
      return std::pair(x.row, x.start_ns) < std::pair(y.row, y.start_ns);
    });
    std::move(blocks.begin(), blocks.end(), std::back_inserter(tl.blocks));
  }
  return tl;
}

std::vector<std::filesystem::path> write_trace(Builder& b, const ParallelPlan& plan, const SimOptions& opts) {
  const Engine& eng = b.engine();
  const std::span<const TaskMeta> meta = b.meta();
  const RankMapping map(plan, 1 << 30);  // only the (tp, pp, dp) coordinates are used
  std::vector<int> ranks = opts.trace_ranks;
  if (ranks.empty()) {
    for (const auto& r : b.representatives()) ranks.push_back(r.rank);
  }
  TraceWriter w;
  w.set_world_size(plan.world_size());
  // Tasks per stage, for the ranks that show it.
  const std::vector<std::vector<TaskId>> by_stage = labelled_by_stage(b);
  for (int rank : ranks) {
    if (rank < 0 || rank >= plan.world_size()) continue;
    const RankCoord c = map.coord(rank);
    const auto stage = static_cast<std::size_t>(c.pp);
    const int shown = b.representatives()[stage].rank;
    w.set_process_name(rank, "rank " + std::to_string(rank) + " (stage " + std::to_string(c.pp) + ", tp " +
                                 std::to_string(c.tp) + ", dp " + std::to_string(c.dp) + ")" +
                                 (shown == rank ? "" : " = simulated rank " + std::to_string(shown)));
    // The host-copy row only where the plan offloads, the a2a row only with
    // the EP overlap: other traces stay as they were.
    for (int thread = 0; thread < static_cast<int>(kTimelineRowNames.size()); ++thread) {
      if (thread == detail::kThreadHostCopy && !plan.offloads_activations()) continue;
      if (thread == detail::kThreadA2a && !(plan.moe_ep_overlap && plan.ep > 1)) continue;
      w.set_thread_name(rank, thread, std::string(kTimelineRowNames[static_cast<std::size_t>(thread)]), thread);
    }
    for (TaskId t : by_stage[stage]) {
      if (!eng.done(t)) continue;
      const detail::TraceLabel& lbl = b.labels().at(t);
      const TimeNs start = eng.start_ns(t);
      w.add_complete(rank, meta[t].thread, lbl.name, lbl.category, start, eng.end_ns(t) - start);
      if (!opts.trace_ops || lbl.parts.empty()) continue;
      if (lbl.parts.size() == 1 && std::get<2>(lbl.parts.front()) <= 1) continue;  // a single kernel: already shown
      TimeNs at = start;
      for (const auto& [prog, first, n] : lbl.parts) {
        for (std::uint32_t i = first; i < first + n; ++i) {
          const detail::OpSpan& op = prog->ops[i];
          w.add_complete(rank, meta[t].thread, op.name, "kernel", at, op.duration_ns);
          at += op.duration_ns;
        }
      }
    }
    for (const detail::StepSpan& s : b.spans()) {
      if (static_cast<std::size_t>(s.stage) != stage) continue;
      const TimeNs start = span_start(eng, s);
      w.add_complete(rank, 0, s.name, s.forward ? "forward" : "backward", start, span_end(eng, s) - start);
    }
  }
  if (opts.trace_per_rank) return w.write_per_rank(opts.trace_path);
  w.write(opts.trace_path);
  return {opts.trace_path};
}

}  // namespace

SimResult run_simulation(const ModelSpec& m, const Topology& card, const ParallelPlan& plan, const SimOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const Topology& topo = topology_for_plan(card, m, plan);
  Builder b(m, topo, plan, opts);
  b.build();
  Engine& eng = b.engine();
  const RunStats st = eng.run();
  if (st.tasks_unfinished > 0) {
    throw std::logic_error("simulate: " + std::to_string(st.tasks_unfinished) +
                           " tasks never ran (a dependency cycle in the task graph)");
  }

  SimResult r;
  r.tasks = eng.num_tasks();
  r.events = st.events;
  r.flows = st.flows;
  r.solves = st.solves;
  r.rails_folded = b.network().rails_folded();
  const TimeNs end = st.end_ns;
  const std::span<const TaskMeta> meta = b.meta();
  // Per stage: busy time per stream and when its last task ended.
  std::vector<TimeNs> stage_end(b.representatives().size(), 0);
  for (const auto& rep : b.representatives()) {
    StageStats s;
    s.stage = rep.stage;
    s.rank = rep.rank;
    s.compute_busy_s = static_cast<double>(eng.stream(rep.compute).busy_ns) * 1e-9;
    s.compute_factor = b.compute_factor(rep.stage);
    s.tp_busy_s = static_cast<double>(eng.stream(rep.tp).busy_ns) * 1e-9;
    s.pp_busy_s = static_cast<double>(eng.stream(rep.pp_fwd).busy_ns + eng.stream(rep.pp_bwd).busy_ns) * 1e-9;
    s.dp_busy_s = static_cast<double>(eng.stream(rep.dp).busy_ns) * 1e-9;
    r.stages.push_back(s);
  }
  for (TaskId t = 0; t < meta.size(); ++t) {
    const TaskMeta& mt = meta[t];
    if (mt.stage != detail::kNoStage) stage_end[mt.stage] = std::max(stage_end[mt.stage], eng.end_ns(t));
    if (mt.stage2 != detail::kNoStage) stage_end[mt.stage2] = std::max(stage_end[mt.stage2], eng.end_ns(t));
  }
  int critical = 0;
  for (std::size_t s = 0; s < stage_end.size(); ++s) {
    r.stages[s].end_s = static_cast<double>(stage_end[s]) * 1e-9;
    if (stage_end[s] > stage_end[static_cast<std::size_t>(critical)]) critical = static_cast<int>(s);
  }
  r.critical_rank = b.representatives()[static_cast<std::size_t>(critical)].rank;

  Estimate& e = r.estimate;
  e.plan = plan;
  e.simulated = true;
  e.iteration_time_s = static_cast<double>(end) * 1e-9;
  e.breakdown = critical_breakdown(eng, meta, critical, end, b.arena());
  e.gpu_spread = topo.cluster().gpu.speed_spread;
  e.gpu_spread_slowdown = spread_slowdown(e.gpu_spread, plan.world_size());
  fill_throughput(e, m, plan, topo.cluster().gpu);
  e.memory = memory_per_gpu(m, plan, topo.cluster().gpu);
  collect_links(r, b.network(), b.tp_probe_peak());
  if (!opts.trace_path.empty()) r.trace_files = write_trace(b, plan, opts);
  if (opts.timeline) r.timeline = collect_timeline(b, end);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace cuboid::sim
