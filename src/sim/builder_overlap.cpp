// The EP overlap (--moe-ep-overlap, core/ep_overlap.hpp) as the simulator
// plays it: with PP 1, Megatron-Core's combined 1F1B schedule runs micro-batch
// i + 1's forward beside micro-batch i's backward, each layer pair in
// kEpPairOrder, the exchanges on the representative's a2a stream (holding
// SMs of its compute stream), the rest on its compute and TP streams.
#include <algorithm>

#include "builder.hpp"
#include "cuboid/core/ep_overlap.hpp"

namespace cuboid::sim::detail {

namespace {

EpSplit split_of(const Program& p, bool forward) {
  return ep_split(p.items.size(), forward, [&p](std::size_t i) {
    const Item& it = p.items[i];
    return it.kind == ItemKind::collective && it.group == Group::ep;
  });
}

// The items of `node` under split s: [first, end).
std::pair<std::size_t, std::size_t> node_range(const EpSplit& s, EpNode node) {
  switch (node) {
    case EpNode::seg0: return {0, s.ex0_begin};
    case EpNode::ex0: return {s.ex0_begin, s.ex0_end};
    case EpNode::seg1: return {s.ex0_end, s.ex1_begin};
    case EpNode::ex1: return {s.ex1_begin, s.ex1_end};
    case EpNode::seg2: return {s.ex1_end, s.size};
  }
  return {0, 0};
}

}  // namespace

void Builder::pair_passes() {
  // combined_1f1b_schedule_for_no_pipelining (Megatron-LM d98e8a64): the
  // first forward alone, then forward i + 1 with backward i, then the last
  // backward alone.
  StageOrder order;
  const int m = shape_.mbs;
  pair_first_.assign(static_cast<std::size_t>(2 * m), 0);
  order.push_back({Direction::forward, 0, 0});
  for (int i = 0; i + 1 < m; ++i) {
    pair_first_[order.size()] = 1;
    order.push_back({Direction::forward, i + 1, 0});
    order.push_back({Direction::backward, i, 0});
  }
  order.push_back({Direction::backward, m - 1, 0});
  order_[0] = std::move(order);
}

void Builder::play_node(Chain& ch, const Program& prog, std::size_t first, std::size_t end, bool exchange) {
  if (first >= end) return;
  if (!exchange) {
    play(ch, prog, first, end);
    // Emitted now, so each stream queues the nodes in kEpPairOrder.
    flush(ch);
    return;
  }
  flush(ch);
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  for (std::size_t i = first; i < end; ++i) {
    const Item& it = prog.items[i];
    TaskId t = kNoTask;
    if (it.kind == ItemKind::compute) {
      // A kernel between the dispatch's exchanges (the host sync): on the
      // a2a stream, as Megatron-Core runs the dispatch node there.
      t = emit_compute(r.a2a, it.duration_ns, ch.deps, meta_of(Category::compute, kThreadTp, ch.stage));
    } else if (it.kind == ItemKind::join) {
      ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
      ch.async.clear();
      continue;
    } else if (it.group == Group::ep) {
      t = emit_collective(it.collective, it.own_dispatch ? r.ep_dispatch_group : r.ep_group, it.bytes, r.a2a, ch.deps,
                          meta_of(Category::ep, kThreadTp, ch.stage));
      label(t, ch.stage, prog.ops[it.name_op].name, "ep");
    } else {
      t = add_tp(ch, it, prog, ch.deps);
    }
    ch.deps.clear();
    ch.deps.push_back(t);
  }
}

void Builder::play_combined(std::size_t idx) {
  const ScheduleStep& fs = order_[0][idx];
  const ScheduleStep& bs = order_[0][idx + 1];
  Chain& f = scratch_.chain;
  Chain& b = scratch_.chain2;
  for (Chain* ch : {&f, &b}) {
    ch->stage = 0;
    ch->deps.assign(stage_end_[0].begin(), stage_end_[0].end());
    ch->async.clear();
    ch->overlap_ns = -1;
    ch->pending_ns = 0;
    ch->pending_held_ns = 0;
    ch->pending = false;
    ch->parts.clear();
    ch->first = kNoTask;
    ch->last_compute = kNoTask;
  }
  const StepWhen when = step_.grad_when();
  const bool reduce_now = reduces() && (when == StepWhen::every_backward_buckets || when == StepWhen::zero3_units ||
                                        (when == StepWhen::last_backward_buckets && bs.micro_batch == shape_.mbs - 1));
  const double bucket = step_.bucket_params(0, 0);
  double acc = 0;
  // Unit k's forward beside unit n - 1 - k's backward: the embedding's
  // forward with the head's backward, layer i with layer L - 1 - i
  // (TransformerModelChunkSchedulePlan.run pops the backward's layers).
  const auto& units = work_.units[0][0];
  const std::size_t n = units.size();
  for (std::size_t k = 0; k < n; ++k) {
    const Program& fp = *units[k].fwd;
    const Unit& bu = units[n - 1 - k];
    const Program& bp = *bu.bwd;
    const EpSplit fsplit = split_of(fp, true), bsplit = split_of(bp, false);
    for (const EpPairStep& st : kEpPairOrder) {
      const std::pair<std::size_t, std::size_t> range = node_range(st.backward ? bsplit : fsplit, st.node);
      play_node(st.backward ? b : f, st.backward ? bp : fp, range.first, range.second, is_exchange(st.node));
    }
    if (reduce_now) {
      acc += bu.params;
      if (acc >= bucket || k + 1 == n) {
        flush(b);
        std::vector<TaskId> deps = b.deps;
        deps.insert(deps.end(), b.async.begin(), b.async.end());
        dp_bucket(0, acc, deps, "grad bucket " + step_name(bs.dir, bs.micro_batch, 0, shape_.v));
        acc = 0;
      }
    }
  }
  stage_end_[0].clear();
  for (Chain* ch : {&f, &b}) {
    flush(*ch);
    ch->deps.insert(ch->deps.end(), ch->async.begin(), ch->async.end());
    const ScheduleStep& st = ch == &f ? fs : bs;
    PassState& out = pass(st.dir, st.micro_batch, 0);
    out.end_off = static_cast<std::uint32_t>(ends_.size());
    ends_.insert(ends_.end(), ch->deps.begin(), ch->deps.end());
    out.end_len = static_cast<std::uint32_t>(ends_.size() - out.end_off);
    out.added = true;
    stage_end_[0].insert(stage_end_[0].end(), ch->deps.begin(), ch->deps.end());
    if (traced(0) && ch->first != kNoTask)
      spans_.push_back(StepSpan{0, ch->first, ch->last_compute, step_name(st.dir, st.micro_batch, 0, shape_.v),
                                st.dir == Direction::forward});
  }
}

}  // namespace cuboid::sim::detail
