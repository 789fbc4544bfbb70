// The EP overlap (--moe-ep-overlap, core/ep_overlap.hpp) as the simulator
// plays it: with PP 1, Megatron-Core's combined 1F1B schedule runs micro-batch
// i + 1's forward beside micro-batch i's backward; with PP > 1 the
// interleaved schedule's steady state runs one (micro-batch, chunk)'s
// forward beside another's backward. Each layer pair in kEpPairOrder, the
// exchanges on the representative's a2a stream (holding SMs of its compute
// stream), the rest on its compute and TP streams.
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
    case EpNode::seg1:
    case EpNode::seg1w: return {s.ex0_end, s.ex1_begin};
    case EpNode::ex1: return {s.ex1_begin, s.ex1_end};
    case EpNode::seg2:
    case EpNode::seg2w: return {s.ex1_end, s.size};
  }
  return {0, 0};
}

}  // namespace

void Builder::pair_passes() {
  pair_first_.assign(static_cast<std::size_t>(shape_.pp), {});
  if (shape_.pp > 1) {
    // forward_backward_pipelining_with_interleaving (schedules.py at
    // d98e8a64): the steady state's forward step w + k and backward step k,
    // adjacent in the interleaved order, run as one combined step
    // (combined_1f1b_schedule_for_interleaved_pipelining); the warm-up's
    // forwards and the cool-down's backwards run alone.
    for (int s = 0; s < shape_.pp; ++s) {
      const auto us = static_cast<std::size_t>(s);
      const int w = warmup_steps(plan_.schedule, shape_.pp, s, shape_.mbs, shape_.v, true);
      const int steady = static_cast<int>(order_[us].size()) / 2 - w;
      pair_first_[us].assign(order_[us].size(), 0);
      for (int k = 0; k < steady; ++k) pair_first_[us][static_cast<std::size_t>(w + 2 * k)] = 1;
    }
    return;
  }
  // combined_1f1b_schedule_for_no_pipelining (Megatron-LM d98e8a64): the
  // first forward alone, then forward i + 1 with backward i, then the last
  // backward alone.
  StageOrder order;
  const int m = shape_.mbs;
  std::vector<char>& first = pair_first_[0];
  first.assign(static_cast<std::size_t>(2 * m), 0);
  order.push_back({Direction::forward, 0, 0});
  for (int i = 0; i + 1 < m; ++i) {
    first[order.size()] = 1;
    order.push_back({Direction::forward, i + 1, 0});
    order.push_back({Direction::backward, i, 0});
  }
  order.push_back({Direction::backward, m - 1, 0});
  order_[0] = std::move(order);
}

void Builder::play_node(Chain& ch, const Program& prog, std::size_t first, std::size_t end, bool exchange,
                        NodeItems items) {
  if (first >= end) return;
  if (!exchange) {
    if (items == NodeItems::all) {
      play(ch, prog, first, end);
    } else {
      // The weight-gradient compute items, or every other item, in order.
      const auto wanted = [&](std::size_t i) {
        const Item& it = prog.items[i];
        const bool wgrad = it.kind == ItemKind::compute && it.wgrad;
        return items == NodeItems::weight_grad ? wgrad : !wgrad;
      };
      for (std::size_t i = first; i < end;) {
        if (!wanted(i)) {
          ++i;
          continue;
        }
        std::size_t j = i + 1;
        while (j < end && wanted(j)) ++j;
        play(ch, prog, i, j);
        i = j;
      }
    }
    // Emitted now, so each stream queues the nodes in the pair's order.
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
      t = emit_compute(r.a2a, it.duration_ns, ch.deps, meta_of(Category::compute, kThreadA2a, ch.stage));
    } else if (it.kind == ItemKind::join) {
      ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
      ch.async.clear();
      continue;
    } else if (it.group == Group::ep) {
      t = emit_collective(it.collective, it.own_dispatch ? r.ep_dispatch_group : r.ep_group, it.bytes, r.a2a, ch.deps,
                          meta_of(Category::ep, kThreadA2a, ch.stage));
      label(t, ch.stage, prog.ops[it.name_op].name, "ep");
    } else {
      t = add_tp(ch, it, prog, ch.deps);
    }
    ch.deps.clear();
    ch.deps.push_back(t);
  }
}

void Builder::play_combined(int stage, std::size_t idx) {
  const auto us = static_cast<std::size_t>(stage);
  const ScheduleStep& fs = order_[us][idx];
  const ScheduleStep& bs = order_[us][idx + 1];
  // Both passes start after the stage's previous step and, with PP > 1, the
  // synchronous p2p before them, which brought both inputs.
  std::vector<TaskId>& entry = scratch_.entry;
  entry.assign(stage_end_[us].begin(), stage_end_[us].end());
  if (shape_.pp > 1) {
    const auto blocking = traffic_.messages.block_of(traffic_.messages.point(stage, static_cast<int>(idx) - 1));
    entry.insert(entry.end(), blocking.begin(), blocking.end());
    add_input(stage, fs, entry);
    add_input(stage, bs, entry);
  }
  Chain& f = scratch_.chain;
  Chain& b = scratch_.chain2;
  Chain& w = scratch_.chain3;
  std::vector<TaskId>& wgrad_ends = scratch_.wgrad_ends;
  wgrad_ends.clear();
  const bool delayed = plan_.moe_delay_wgrad;
  for (Chain* ch : {&f, &b, &w}) {
    ch->stage = stage;
    ch->deps.assign(entry.begin(), entry.end());
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
  const double bucket = step_.bucket_params(stage, bs.chunk);
  double acc = 0;
  // The units played together: (forward unit, backward unit), either may be
  // absent. PP 1: unit k's forward beside unit n - 1 - k's backward, the
  // embedding's forward with the head's backward, layer i with layer L - 1 - i.
  // PP > 1, as TransformerModelChunkSchedulePlan.run issues a chunk pair
  // (model_chunk_schedule_plan.py:231-316 at d98e8a64): the forward's
  // pre-process (embedding), the backward's post-process (head, MTP), the
  // forward chunk's layer i beside the backward chunk's layer n_b - 1 - i,
  // the backward's remaining layers, the forward's, the forward's
  // post-process, the backward's pre-process.
  const auto& fu = work_.units[us][static_cast<std::size_t>(fs.chunk)];
  const auto& bu = work_.units[us][static_cast<std::size_t>(bs.chunk)];
  std::vector<std::pair<const Unit*, const Unit*>> moves;
  if (shape_.pp == 1) {
    for (std::size_t k = 0; k < fu.size(); ++k) moves.emplace_back(&fu[k], &bu[bu.size() - 1 - k]);
  } else {
    // [pre, layers, post) of a chunk's units: the layers are those with an index.
    const auto bounds = [](const std::vector<Unit>& u) {
      std::size_t a = 0, z = u.size();
      while (a < z && u[a].layer < 0) ++a;
      while (z > a && u[z - 1].layer < 0) --z;
      return std::pair<std::size_t, std::size_t>{a, z};
    };
    const auto [fa, fz] = bounds(fu);
    const auto [ba, bz] = bounds(bu);
    const std::size_t nf = fz - fa, nb = bz - ba, both = std::min(nf, nb);
    for (std::size_t k = 0; k < fa; ++k) moves.emplace_back(&fu[k], nullptr);
    for (std::size_t k = bu.size(); k > bz; --k) moves.emplace_back(nullptr, &bu[k - 1]);
    for (std::size_t i = 0; i < both; ++i) moves.emplace_back(&fu[fa + i], &bu[bz - 1 - i]);
    for (std::size_t i = both; i < nb; ++i) moves.emplace_back(nullptr, &bu[bz - 1 - i]);
    for (std::size_t i = both; i < nf; ++i) moves.emplace_back(&fu[fa + i], nullptr);
    for (std::size_t k = fz; k < fu.size(); ++k) moves.emplace_back(&fu[k], nullptr);
    for (std::size_t k = ba; k > 0; --k) moves.emplace_back(nullptr, &bu[k - 1]);
  }
  std::size_t last_backward = 0;
  for (std::size_t k = 0; k < moves.size(); ++k)
    if (moves[k].second != nullptr) last_backward = k;
  for (std::size_t k = 0; k < moves.size(); ++k) {
    const Unit* fw = moves[k].first;
    const Unit* bw = moves[k].second;
    const EpSplit fsplit = fw != nullptr ? split_of(*fw->fwd, true) : EpSplit{};
    const EpSplit bsplit = bw != nullptr ? split_of(*bw->bwd, false) : EpSplit{};
    for (const EpPairStep& st : ep_pair_order(delayed)) {
      const Unit* u = st.backward ? bw : fw;
      if (u == nullptr) continue;
      const std::pair<std::size_t, std::size_t> range = node_range(st.backward ? bsplit : fsplit, st.node);
      const bool exchange = is_exchange(st.node);
      if (!st.backward || !delayed || exchange || st.node == EpNode::seg0) {
        play_node(st.backward ? b : f, st.backward ? *u->bwd : *u->fwd, range.first, range.second, exchange);
        continue;
      }
      if (st.node == EpNode::seg1 || st.node == EpNode::seg2) {
        play_node(b, *u->bwd, range.first, range.second, false, NodeItems::data_grad);
      } else {
        // A delayed weight gradient: after its data gradient, on the compute
        // stream; nothing of the pass waits for it but the gradients' reduction
        // and the stage's next step. The stream runs its tasks in order: the
        // latest one stands for every earlier one.
        w.deps.assign(b.deps.begin(), b.deps.end());
        play_node(w, *u->bwd, range.first, range.second, false, NodeItems::weight_grad);
        if (!w.deps.empty() && w.deps != b.deps) wgrad_ends.assign(w.deps.begin(), w.deps.end());
      }
    }
    if (reduce_now && bw != nullptr) {
      acc += bw->params;
      if (acc >= bucket || k == last_backward) {
        flush(b);
        std::vector<TaskId> deps = b.deps;
        deps.insert(deps.end(), b.async.begin(), b.async.end());
        deps.insert(deps.end(), wgrad_ends.begin(), wgrad_ends.end());
        dp_bucket(stage, acc, deps, "grad bucket " + step_name(bs.dir, bs.micro_batch, bs.chunk, shape_.v));
        acc = 0;
      }
    }
  }
  stage_end_[us].clear();
  for (Chain* ch : {&f, &b}) {
    flush(*ch);
    ch->deps.insert(ch->deps.end(), ch->async.begin(), ch->async.end());
    stage_end_[us].insert(stage_end_[us].end(), ch->deps.begin(), ch->deps.end());
  }
  stage_end_[us].insert(stage_end_[us].end(), wgrad_ends.begin(), wgrad_ends.end());
  for (Chain* ch : {&f, &b}) {
    const ScheduleStep& st = ch == &f ? fs : bs;
    PassState& out = pass(st.dir, st.micro_batch, st.chunk * shape_.pp + stage);
    out.end_off = static_cast<std::uint32_t>(ends_.size());
    // With PP > 1 each pass's output is sent after the pair (the p2p that
    // follows the combined step): both chains' ends.
    const std::vector<TaskId>& end = shape_.pp > 1 ? stage_end_[us] : ch->deps;
    ends_.insert(ends_.end(), end.begin(), end.end());
    out.end_len = static_cast<std::uint32_t>(ends_.size() - out.end_off);
    out.added = true;
  }
  if (traced(stage) && (f.first != kNoTask || b.first != kNoTask)) {
    StepSpan span{stage, f.first, f.last_compute,
                  step_name(fs.dir, fs.micro_batch, fs.chunk, shape_.v) + "+" +
                      step_name(bs.dir, bs.micro_batch, bs.chunk, shape_.v),
                  false};
    span.first2 = b.first;
    span.last2 = b.last_compute;
    if (span.first == kNoTask) {
      span.first = span.first2;
      span.last = span.last2;
    }
    spans_.push_back(std::move(span));
  }
}

}  // namespace cuboid::sim::detail
