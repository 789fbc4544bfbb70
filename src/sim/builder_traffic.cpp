// The task graph of one iteration, between the passes: the pipeline's
// messages and the DP side that cost/step.hpp describes (gradient buckets,
// the tied embedding's all-reduce, the optimizer step and the gathers after it).
#include "builder.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cuboid/core/calibration.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/cost/speed_spread.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid::sim::detail {

// Creates a message once the sender and the receiver have both reached its
// point: the send/recv on both GPUs' PP streams and, without SP, the TP
// all-gather that rebuilds the activation from the shards (scatter-gather).
void Builder::try_message(std::uint32_t id) {
  Message& msg = traffic_.messages.message(id);
  if (msg.created) return;
  const auto uf = static_cast<std::size_t>(msg.from);
  const auto ur = static_cast<std::size_t>(msg.to);
  if (cursor_[uf] <= static_cast<std::size_t>(msg.send_pos)) return;
  if (msg.recv_pos >= 0 && cursor_[ur] <= static_cast<std::size_t>(msg.recv_pos)) return;
  msg.created = true;
  const bool fwd = msg.consumer.dir == Direction::forward;
  const Representative& me = representatives_[ur];
  const Representative& peer = representatives_[uf];
  auto pass_end = [&](int stage, int pos) {
    const ScheduleStep& st = order_[static_cast<std::size_t>(stage)][static_cast<std::size_t>(pos)];
    return end_of(pass(st.dir, st.micro_batch, st.chunk * shape_.pp + stage));
  };
  std::vector<TaskId>& deps = scratch_.message_deps;  // reused: one allocation for every message
  const auto sent = pass_end(msg.from, msg.send_pos);
  deps.assign(sent.begin(), sent.end());
  if (msg.recv_pos >= 0) {
    const auto e = pass_end(msg.to, msg.recv_pos);
    deps.insert(deps.end(), e.begin(), e.end());
  }
  const StreamId streams[2] = {fwd ? peer.pp_fwd : peer.pp_bwd, fwd ? me.pp_fwd : me.pp_bwd};
  const GroupId g = fwd ? traffic_.p2p_fwd_group[uf] : traffic_.p2p_bwd_group[uf];
  const double bytes = step_.pipeline_message_bytes();
  TaskId t = eng_->add_collective(Collective::send_recv, g, bytes, streams, deps, Algorithm::ring);
  // Named only when either side is traced (a name is two strings per message).
  const std::string name = traced(msg.to) || traced(msg.from)
                               ? (fwd ? "act " : "grad ") + step_name(msg.consumer.dir, msg.consumer.micro_batch,
                                                                      msg.consumer.chunk, shape_.v)
                               : std::string();
  tag(t, Category::pp, fwd ? kThreadPpFwd : kThreadPpBwd, msg.from, msg.to);
  label(t, msg.to, name, "pp");
  label(t, msg.from, name, "pp");
  passes_[msg.producer].p2p = t;
  traffic_.messages.add_to_block(traffic_.messages.point(msg.from, msg.send_pos), t);
  if (shape_.tp > 1 && !plan_.sequence_parallel) {
    const std::vector<TaskId> d{t};
    TaskId gt;
    if (pacing_.tp_fast) {
      gt = eng_->add_compute(me.tp, pacing_.tp_probe.time_ns(Collective::all_gather, bytes * shape_.tp), d);
    } else {
      const StreamId s1[1] = {me.tp};
      gt = eng_->add_collective(Collective::all_gather, me.tp_group, bytes * shape_.tp, s1, d);
    }
    tag(gt, Category::pp, kThreadTp, msg.to);
    label(gt, msg.to, "pp_gather " + name, "pp");
    t = gt;
  }
  passes_[msg.producer].ready = t;
  traffic_.messages.add_to_block(traffic_.messages.point(msg.to, msg.recv_pos), t);
}

void Builder::dp_bucket(int stage, double params, const std::vector<TaskId>& deps, const std::string& name) {
  if (!reduces() || params <= 0) return;
  const Representative& r = representatives_[static_cast<std::size_t>(stage)];
  const Collective c = step_.grad_collective();
  // An MoE model's bucket holds dense and expert gradients in the stage's
  // proportion; the experts' are reduced over expert-DP (Megatron keeps them
  // in buffers of their own), after the dense ones on the same stream.
  const double expert = shape_.expert_share.empty() ? 0.0 : params * shape_.expert_share[static_cast<std::size_t>(stage)];
  const double dense = params - expert;
  const double grad_bytes = step_.grad_bytes_per_param();
  if (shape_.dp > 1 && dense > 0) {
    const TaskId t = emit_collective(c, r.dp_group, dense * grad_bytes, r.dp, deps,
                                     meta_of(Category::dp, kThreadDp, stage), /*dp_reduction=*/true);
    label(t, stage, name, "dp");
  }
  if (shape_.edp > 1 && expert > 0) {
    const TaskId t = emit_collective(c, shape_.expert_group ? r.edp_group : r.dp_group, expert * grad_bytes,
                                     r.dp, deps, meta_of(Category::dp, kThreadDp, stage), /*dp_reduction=*/true);
    label(t, stage, name + " (experts)", "dp");
  }
}

TaskId Builder::param_gather(int stage, double params, const std::vector<TaskId>& deps, const std::string& name) {
  const Representative& r = representatives_[static_cast<std::size_t>(stage)];
  const StageParameters sp = stage_parameters(m_, plan_, stage);
  const StageParameters quantized = quantized_stage_weights(m_, plan_, stage);
  const double expert = shape_.expert_share.empty() ? 0.0 : params * shape_.expert_share[static_cast<std::size_t>(stage)];
  const double dense = params - expert;
  TaskId last = kNoTask;
  std::vector<TaskId> d = deps;
  if (shape_.dp > 1 && dense > 0 && sp.dense > 0) {
    const double bytes = step_.gathered_bytes(dense, quantized.dense * dense / sp.dense);
    last = emit_collective(Collective::all_gather, r.dp_group, bytes, r.dp, d, meta_of(Category::dp, kThreadDp, stage));
    label(last, stage, name, "dp");
    d.assign(1, last);
  }
  if (shape_.edp > 1 && expert > 0 && sp.expert > 0) {
    const double bytes = step_.gathered_bytes(expert, quantized.expert * expert / sp.expert);
    last = emit_collective(Collective::all_gather, shape_.expert_group ? r.edp_group : r.dp_group, bytes, r.dp, d,
                           meta_of(Category::dp, kThreadDp, stage));
    label(last, stage, name + " (experts)", "dp");
  }
  return last;
}

void Builder::count_played(int stage, GroupId group, Collective c, double bytes) {
  const Representative& r = representatives_[static_cast<std::size_t>(stage)];
  if (shape_.dp > 1 && group == r.dp_group)
    traffic_.played_bytes[played_index(stage, StepGroup::dp, c)] += bytes;
  else if (shape_.expert_group && group == r.edp_group)
    traffic_.played_bytes[played_index(stage, StepGroup::expert_dp, c)] += bytes;
}

void Builder::finish_iteration() {
  std::vector<TaskId> all;
  for (int s = 0; s < shape_.pp; ++s) {
    const auto us = static_cast<std::size_t>(s);
    // The last pass's outgoing message must be done too.
    const auto tail = traffic_.messages.block_of(traffic_.messages.point(s, static_cast<int>(order_[us].size()) - 1));
    stage_end_[us].insert(stage_end_[us].end(), tail.begin(), tail.end());
    if (reduces() && step_.grad_when() == StepWhen::after_backward) {
      dp_bucket(s, parameters_on_stage(m_, plan_, s), stage_end_[us], "grad reduce");
    }
    all.insert(all.end(), stage_end_[us].begin(), stage_end_[us].end());
    all.insert(all.end(), traffic_.dp_tasks[us].begin(), traffic_.dp_tasks[us].end());
  }
  // Tied embeddings across stages: Megatron all-reduces the word-embedding
  // gradient between the first and the last stage (fp32) after backward.
  if (const double bytes = step_.tied_embedding_bytes(); bytes > 0) {
    CommGroup g;
    g.ranks = {representatives_.front().rank, representatives_.back().rank};
    g.rail0_part = net_->rails_folded();
    g.cold_buffers = true;
    for (int d = 0; d < shape_.dp; ++d) {
      for (int t = 0; t < mirrored_tp(); ++t) {
        if (t == 0 && d == shape_.rep_dp) continue;
        g.mirrors.push_back({map_.rank_of_data(t, 0, d), map_.rank_of_data(t, shape_.pp - 1, d)});
      }
    }
    const GroupId gid = eng_->add_group(std::move(g));
    const StreamId streams[2] = {representatives_.front().dp, representatives_.back().dp};
    const TaskId t = eng_->add_collective(Collective::all_reduce, gid, bytes, streams, all);
    for (const int s : {0, shape_.pp - 1})
      traffic_.played_bytes[played_index(s, StepGroup::embedding, Collective::all_reduce)] += bytes;
    tag(t, Category::dp, kThreadDp, 0, shape_.pp - 1);
    label(t, 0, "embedding grad all-reduce", "dp");
    label(t, shape_.pp - 1, "embedding grad all-reduce", "dp");
    all.push_back(t);
  }
  // The optimizer step starts everywhere after the global gradient-norm
  // reduction, i.e. after every stage's gradients are reduced.
  const std::vector<TaskId> join{eng_->add_compute(kNoStream, 0, all)};
  tag(join.back(), Category::none, 0, -1);
  if (!step_.gathers_in_step())
    for (int s = 0; s < shape_.pp; ++s) optimizer_step(s, join);
}

// Stage `s`'s optimizer step after `deps` and, with the distributed
// optimizer, the gathers that follow it. With the first chunk's gather under
// the step (StepDescription::gathers_in_step) build() plays the step before
// the schedule instead, the step of the iteration before (the same cycle, cut
// elsewhere: the iteration starts at the global gradient norm's join): the
// first chunk's optimizer steps first, then its gathers are dispatched and
// the rest of the step runs beside them; the stage's first forward (its
// first chunk's) waits for both, and a later stage's gathers run on while
// it waits for the pipeline to fill.
void Builder::optimizer_step(int s, const std::vector<TaskId>& deps) {
  const GpuProfile& gpu = topo_.cluster().gpu;
  const Representative& r = representatives_[static_cast<std::size_t>(s)];
  const StageParameters sp = stage_parameters(m_, plan_, s);
  const StageParameters quantized = quantized_stage_weights(m_, plan_, s);
  const double params = sp.dense;
  // Megatron's step kernels (optimizer_step.cpp), the experts' on their expert-DP shard.
  const double f = compute_factor(s);
  const auto scaled = [f](TimeNs ns) {
    return f != 1.0 ? static_cast<TimeNs>(std::llround(static_cast<double>(ns) * f)) : ns;
  };
  TimeNs ns = scaled(step_.optimizer_ns(gpu, sp, s));
  if (step_.gathers_in_step()) {
    double chunk = 0;
    for (const Unit& u : work_.units[static_cast<std::size_t>(s)][0]) chunk += u.params;
    const double expert_share = shape_.expert_share.empty() ? 0.0 : shape_.expert_share[static_cast<std::size_t>(s)];
    const TimeNs first = std::min(ns, scaled(step_.first_chunk_step_ns(gpu, chunk * (1.0 - expert_share), s)));
    const TaskId opt0 = eng_->add_compute(r.compute, first, deps);
    tag(opt0, Category::optimizer, kThreadCompute, s);
    label(opt0, s, "optimizer step (first chunk)", "optimizer");
    const TaskId g = param_gather(s, chunk, {opt0}, "param all-gather (first chunk, under the step)");
    const TaskId after[1] = {opt0};
    const TaskId rest = eng_->add_compute(r.compute, ns - first, after);
    tag(rest, Category::optimizer, kThreadCompute, s);
    label(rest, s, "optimizer step", "optimizer");
    stage_end_[static_cast<std::size_t>(s)] = {rest};
    if (g != kNoTask) stage_end_[static_cast<std::size_t>(s)].push_back(g);
    return;
  }
  const TaskId opt = eng_->add_compute(r.compute, ns, deps);
  tag(opt, Category::optimizer, kThreadCompute, s);
  label(opt, s, "optimizer step", "optimizer");
  if (step_.gathers_after_step() && !step_.gathers_in_next_forward()) {
    // Distributed optimizer: gather the updated parameters (not overlapped), the
    // quantized ones in FP8 with --fp8-param-gather (StepDescription::gathered_bytes).
    const StreamId s1[1] = {r.dp};
    const std::vector<TaskId> d{opt};
    std::vector<TaskId> d2 = d;
    if (shape_.dp > 1) {
      const double bytes = step_.gathered_bytes(params, quantized.dense);
      const TaskId g = eng_->add_collective(Collective::all_gather, r.dp_group, bytes, s1, d);
      count_played(s, r.dp_group, Collective::all_gather, bytes);
      tag(g, Category::dp, kThreadDp, s);
      label(g, s, "param all-gather", "dp");
      d2 = {g};
    }
    if (sp.expert > 0 && shape_.edp > 1) {
      const GroupId group = shape_.expert_group ? r.edp_group : r.dp_group;
      const double bytes = step_.gathered_bytes(sp.expert, quantized.expert);
      const TaskId g = eng_->add_collective(Collective::all_gather, group, bytes, s1, d2);
      count_played(s, group, Collective::all_gather, bytes);
      tag(g, Category::dp, kThreadDp, s);
      label(g, s, "expert param all-gather", "dp");
    }
  }
}

}  // namespace cuboid::sim::detail
