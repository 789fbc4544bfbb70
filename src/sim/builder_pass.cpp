// The task graph of one iteration, played a pass at a time: the ops of each
// unit, their TP, CP and EP collectives, ZeRO-3's gathers and reductions, and
// the templates that stamp a recorded pass out for every micro-batch.
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

std::string step_name(Direction d, int mb, int chunk, int v) {
  std::string s = d == Direction::forward ? "F" : "B";
  s += std::to_string(mb);
  if (v > 1) s += "." + std::to_string(chunk);
  return s;
}

Builder::PassState& Builder::pass(Direction d, int mb, int vs) {
  return passes_[pass_index(d, mb, vs, shape_.mbs, shape_.vs_count)];
}

bool Builder::can_add(int stage, std::size_t idx) {
  const auto us = static_cast<std::size_t>(stage);
  if (!traffic_.messages.complete(traffic_.messages.point(stage, static_cast<int>(idx) - 1))) return false;  // the previous point's messages
  if (!input_ready(stage, order_[us][idx])) return false;
  // A combined pair starts once the backward's input is there too.
  if (!pair_first_.empty() && pair_first_[us][idx] != 0) return input_ready(stage, order_[us][idx + 1]);
  return true;
}

bool Builder::input_ready(int stage, const ScheduleStep& st) const {
  const int vs = st.chunk * shape_.pp + stage;
  const int from_vs = st.dir == Direction::forward ? vs - 1 : vs + 1;
  if (from_vs < 0 || from_vs >= shape_.vs_count) return true;
  const PassState& src = passes_[pass_index(st.dir, st.micro_batch, from_vs, shape_.mbs, shape_.vs_count)];
  return stage_of(from_vs) == stage ? src.added : src.ready != kNoTask;
}

void Builder::add_input(int stage, const ScheduleStep& st, std::vector<TaskId>& entry) const {
  const int vs = st.chunk * shape_.pp + stage;
  const int from_vs = st.dir == Direction::forward ? vs - 1 : vs + 1;
  if (from_vs < 0 || from_vs >= shape_.vs_count) return;
  const PassState& src = passes_[pass_index(st.dir, st.micro_batch, from_vs, shape_.mbs, shape_.vs_count)];
  if (stage_of(from_vs) == stage) {
    const auto e = end_of(src);
    entry.insert(entry.end(), e.begin(), e.end());
  } else {
    entry.push_back(src.ready);
  }
}

void Builder::flush(Chain& ch) {
  if (!ch.pending) return;
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  const TaskId t = emit_compute(r.compute, ch.pending_ns, ch.deps, meta_of(Category::compute, kThreadCompute, ch.stage),
                                ch.pending_held_ns);
  if (traced(ch.stage)) {
    TraceLabel& l = labels_[t];
    l.category = "compute";
    l.parts = std::move(ch.parts);
    const auto& [p0, f0, n0] = l.parts.front();
    const auto& [p1, f1, n1] = l.parts.back();
    const std::string& first = p0->ops[f0].name;
    const std::string& last = p1->ops[f1 + n1 - 1].name;
    l.name = first == last ? first : first + ".." + last;
  }
  ch.parts.clear();
  if (ch.first == kNoTask) ch.first = t;
  ch.last_compute = t;
  ch.deps.clear();
  ch.deps.push_back(t);
  ch.pending = false;
  ch.pending_ns = 0;
  ch.pending_held_ns = 0;
}

TaskId Builder::add_tp(Chain& ch, const Item& it, const Program& prog, const std::vector<TaskId>& deps) {
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  if (it.group == Group::ep) {
    // An MoE all-to-all: on the network, on the TP stream.
    const TaskId t = emit_collective(it.collective, it.own_dispatch ? r.ep_dispatch_group : r.ep_group, it.bytes, r.tp, deps,
                                     meta_of(Category::ep, kThreadTp, ch.stage));
    label(t, ch.stage, prog.ops[it.name_op].name, "ep");
    return t;
  }
  if (it.group == Group::cp) {
    // A CP exchange: on the network (its group may leave the node), on the
    // TP stream (a layer's TP and CP collectives never run at once).
    const TaskId t = emit_collective(it.collective, r.cp_group, it.bytes, r.tp, deps,
                                     meta_of(Category::cp, kThreadTp, ch.stage));
    label(t, ch.stage, prog.ops[it.name_op].name, "cp");
    return t;
  }
  const TaskMeta mt = meta_of(Category::tp, kThreadTp, ch.stage);
  TaskId t;
  if (pacing_.tp_fast) {
    // Priced once per item: the probe's cache is a map, and TP tasks are many.
    if (it.probe_ns < 0) it.probe_ns = pacing_.tp_probe.time_ns(it.collective, it.bytes);
    t = emit_compute(r.tp, it.probe_ns, deps, mt);
  } else {
    t = emit_collective(it.collective, r.tp_group, it.bytes, r.tp, deps, mt);
  }
  label(t, ch.stage, prog.ops[it.name_op].name, "tp");
  return t;
}

void Builder::play(Chain& ch, const Program& prog, std::size_t first, std::size_t end) {
  end = std::min(end, prog.items.size());
  for (std::size_t i = first; i < end; ++i) {
    const Item& it = prog.items[i];
    switch (it.kind) {
      case ItemKind::compute:
        ch.pending = true;
        // Under an async collective: the collective's uncontended time
        // (static, so the task keeps one fixed duration and the run stays
        // deterministic; a contended collective would hold the SMs longer).
        ch.pending_ns += it.reduced_ns >= 0 && ch.overlap_ns >= 0
                             ? overlapped_time_ns(ch.overlap_ns, it.reduced_ns, it.duration_ns)
                             : it.duration_ns;
        if (pacing_.held_sms > 0) {
          ch.pending_held_ns += it.reduced_held_ns >= 0 && ch.overlap_ns >= 0
                                    ? overlapped_time_ns(ch.overlap_ns, it.reduced_held_ns, it.held_ns)
                                    : it.held_ns;
        }
        if (traced(ch.stage)) ch.parts.emplace_back(&prog, it.first_op, it.num_ops);
        break;
      case ItemKind::collective: {
        flush(ch);
        const TaskId t = add_tp(ch, it, prog, ch.deps);
        ch.deps.clear();
        ch.deps.push_back(t);
        break;
      }
      case ItemKind::async: {
        flush(ch);
        ch.async.push_back(add_tp(ch, it, prog, ch.deps));
        // (a CP exchange takes no SMs from the block under it: reduced_ns -1)
        if (it.group == Group::tp && it.probe_ns < 0 && pacing_.overlap_sms > 0) it.probe_ns = pacing_.tp_probe.time_ns(it.collective, it.bytes);
        ch.overlap_ns = it.probe_ns;
        break;
      }
      case ItemKind::join:
        ch.overlap_ns = -1;
        flush(ch);
        ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
        ch.async.clear();
        break;
    }
  }
}

void Builder::add_step(int stage, std::size_t idx) {
  const auto us = static_cast<std::size_t>(stage);
  // The gathers the aligned schedule issues before this step, from the host's point.
  if (!gathers_ahead_.empty())
    for (const int c : gathers_ahead_[us][idx]) issue_chunk_gathers(stage, c, stage_end_[us]);
  if (!pair_first_.empty()) {
    if (pair_first_[us][idx] != 0) return play_combined(stage, idx);
    if (idx > 0 && pair_first_[us][idx - 1] != 0) return;  // played with the forward before it
  }
  const ScheduleStep& st = order_[us][idx];
  const int vs = st.chunk * shape_.pp + stage;
  // The entry dependencies: the stage's previous pass and, as Megatron's p2p
  // is synchronous, the messages of the point before this pass.
  std::vector<TaskId>& entry = scratch_.entry;
  entry.assign(stage_end_[us].begin(), stage_end_[us].end());
  const auto blocking = traffic_.messages.block_of(traffic_.messages.point(stage, static_cast<int>(idx) - 1));
  entry.insert(entry.end(), blocking.begin(), blocking.end());
  // The input from the neighbouring virtual stage.
  add_input(stage, st, entry);
  const bool last_mb = st.micro_batch == shape_.mbs - 1;
  const StepWhen when = step_.grad_when();
  const bool reduce_now = reduces() && (when == StepWhen::every_backward_buckets || when == StepWhen::zero3_units ||
                                        (when == StepWhen::last_backward_buckets && last_mb));
  // --overlap-param-gather: a chunk's first forward gathers its parameters
  // (the step before this iteration's), played op by op; the first chunk's
  // were gathered under the step (Builder::optimizer_step).
  const bool gather_now = st.dir == Direction::forward && st.micro_batch == 0 && step_.gathers_in_next_forward() &&
                          !(st.chunk == 0 && step_.gathers_in_step());
  PassState& out = pass(st.dir, st.micro_batch, vs);
  out.end_off = static_cast<std::uint32_t>(ends_.size());
  if (stamp_ && !traced(stage) && !gather_now) {
    stamp(pass_template(stage, st, reduce_now), stage, entry, ends_);
  } else {
    const ChunkGathers* gathers = nullptr;
    if (gather_now) {
      issue_chunk_gathers(stage, st.chunk, stage_end_[us]);  // unless the schedule issued them ahead
      gathers = &chunk_gathers_[us][static_cast<std::size_t>(st.chunk)];
    }
    play_pass(stage, st, reduce_now, entry, gathers);
    ends_.insert(ends_.end(), scratch_.chain.deps.begin(), scratch_.chain.deps.end());
  }
  out.end_len = static_cast<std::uint32_t>(ends_.size() - out.end_off);
  out.added = true;
  const auto end = end_of(out);
  stage_end_[us].assign(end.begin(), end.end());
}

PassTemplate& Builder::pass_template(int stage, const ScheduleStep& st, bool reduce_now) {
  if (templates_.empty()) {
    templates_.reserve(static_cast<std::size_t>(shape_.pp * shape_.v * 4));
    for (int i = 0; i < shape_.pp * shape_.v * 4; ++i) templates_.emplace_back(&arena_);
  }
  const int key = ((stage * shape_.v + st.chunk) * 2 + (st.dir == Direction::forward ? 0 : 1)) * 2 + (reduce_now ? 1 : 0);
  PassTemplate& pt = templates_[static_cast<std::size_t>(key)];
  if (!pt.recorded) {
    recording_ = &pt;
    const std::vector<TaskId> entry{PassTemplate::kEntryRef};
    play_pass(stage, st, reduce_now, entry);
    PassTemplate::to_refs(scratch_.chain.deps, pt.end);
    recording_ = nullptr;
    pt.recorded = true;
  }
  return pt;
}

TaskId Builder::emit_compute(StreamId stream, TimeNs ns, const std::vector<TaskId>& deps, const TaskMeta& mt,
                             TimeNs held_ns) {
  if (recording_ == nullptr) return tag(eng_->add_compute(stream, ns, deps, 0, held_ns), mt);
  const TaskId t = recording_->record(stream, ns, deps, mt);
  recording_->tasks.back().held_ns = held_ns;
  return t;
}

TaskId Builder::emit_collective(Collective c, GroupId group, double bytes, StreamId stream, const std::vector<TaskId>& deps,
                                const TaskMeta& mt, bool dp_reduction) {
  if (recording_ == nullptr) {
    const StreamId streams[1] = {stream};
    const TaskId t = tag(eng_->add_collective(c, group, bytes, streams, deps), mt);
    if (dp_reduction) traffic_.dp_tasks[mt.stage].push_back(t);
    count_played(mt.stage, group, c, bytes);
    return t;
  }
  const TaskId t = emit_compute(stream, 0, deps, mt);
  PassTemplate::Task& rt = recording_->tasks.back();
  rt.compute = false;
  rt.op = c;
  rt.group = group;
  rt.bytes = bytes;
  rt.dp_reduction = dp_reduction;
  return t;
}

// The recorded pass's engine calls, with the entry dependencies and ids
// filled in; its end dependencies are appended to `end`.
void Builder::stamp(const PassTemplate& pt, int stage, const std::vector<TaskId>& entry, std::pmr::vector<TaskId>& end) {
  const auto base = static_cast<TaskId>(eng_->num_tasks());
  const auto add = [&](const PassTemplate::Task& t, std::span<const TaskId> ds) {
    TaskId id;
    if (t.compute) {
      id = eng_->add_compute(t.stream, t.duration_ns, ds, 0, t.held_ns);
    } else {
      const StreamId streams[1] = {t.stream};
      id = eng_->add_collective(t.op, t.group, t.bytes, streams, ds);
      if (t.dp_reduction) traffic_.dp_tasks[static_cast<std::size_t>(stage)].push_back(id);
      count_played(stage, t.group, t.op, t.bytes);
    }
    tag(id, t.meta);
  };
  const std::span<const TaskId> e = pt.stamp(base, entry, scratch_.stamp_deps, add);
  end.insert(end.end(), e.begin(), e.end());
}

// Transformer Engine's DefaultOffloadSynchronizer (offload.hpp): a forward
// waits for the copies due before its layer; a backward first issues the
// reload due at its layer on the copy stream, after the compute issued so
// far, then waits for its own layer's reload.
void Builder::offload_before(Chain& ch, const Unit& unit, bool fwd) {
  if (offload_.offloaded == 0 || unit.layer < 0) return;
  std::vector<TaskId>& copies = scratch_.host_copies;
  if (fwd) {
    if (const int i = offload_.due_before(unit.layer); i >= 0) {
      flush(ch);
      ch.deps.push_back(copies[static_cast<std::size_t>(i)]);
    }
    return;
  }
  if (const int i = offload_.reload_issued_at(unit.layer); i >= 0) {
    flush(ch);
    const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
    const TaskId t = emit_compute(r.offload, reload_ns_[static_cast<std::size_t>(i)], ch.deps,
                                  meta_of(Category::offload, kThreadHostCopy, ch.stage));
    label(t, ch.stage, "reload layer " + std::to_string(i), "offload");
    copies[static_cast<std::size_t>(i)] = t;
  }
  if (offload_.offloads(unit.layer)) {
    flush(ch);
    ch.deps.push_back(copies[static_cast<std::size_t>(unit.layer)]);
  }
}

// An offloaded layer's copies to host memory once its forward ends.
void Builder::offload_after(Chain& ch, const Unit& unit, bool fwd) {
  if (!fwd || !offload_.offloads(unit.layer)) return;
  flush(ch);
  const Representative& r = representatives_[static_cast<std::size_t>(ch.stage)];
  const auto i = static_cast<std::size_t>(unit.layer);
  const TaskId t = emit_compute(r.offload, offload_ns_[i], ch.deps, meta_of(Category::offload, kThreadHostCopy, ch.stage));
  label(t, ch.stage, "offload " + unit.name, "offload");
  scratch_.host_copies[i] = t;
}

void Builder::issue_chunk_gathers(int stage, int chunk, const std::vector<TaskId>& deps) {
  const auto us = static_cast<std::size_t>(stage);
  ChunkGathers& g = chunk_gathers_[us][static_cast<std::size_t>(chunk)];
  if (g.issued) return;
  g.issued = true;
  // Megatron-Core's buckets of this chunk in forward order, issued back to
  // back on the DP stream.
  const auto& units = work_.units[us][static_cast<std::size_t>(chunk)];
  const double bucket = step_.bucket_params(stage, chunk);
  const std::string name = "param all-gather " + step_name(Direction::forward, 0, chunk, shape_.v);
  std::vector<TaskId> after = deps;
  double held = 0;
  bool open = false;
  for (std::size_t k = 0; k < units.size(); ++k) {
    if (!open) g.starts.push_back(k);
    open = true;
    held += units[k].params;
    if (held >= bucket || k + 1 == units.size()) {
      open = false;
      const TaskId t = param_gather(stage, held, after, name);
      if (t != kNoTask) after.assign(1, t);
      g.tasks.push_back(t);
      held = 0;
    }
  }
}

void Builder::play_pass(int stage, const ScheduleStep& st, bool reduce_now, const std::vector<TaskId>& entry,
                        const ChunkGathers* gathers) {
  const auto us = static_cast<std::size_t>(stage);
  const bool fwd = st.dir == Direction::forward;
  // One chain object reused by every pass: its vectors keep their capacity
  // instead of being allocated and freed per pass.
  Chain& ch = scratch_.chain;
  ch.stage = stage;
  ch.deps.assign(entry.begin(), entry.end());
  ch.async.clear();
  ch.overlap_ns = -1;
  ch.pending_ns = 0;
  ch.pending_held_ns = 0;
  ch.pending = false;
  ch.parts.clear();
  ch.first = kNoTask;
  ch.last_compute = kNoTask;

  const auto& units = work_.units[us][static_cast<std::size_t>(st.chunk)];
  const int zero = reduces() ? plan_.zero_stage : 0;
  scratch_.host_copies.assign(static_cast<std::size_t>(offload_.offloaded), kNoTask);
  if (zero >= 3) {
    play_zero3(stage, st, reduce_now);
  } else {
    const double bucket = step_.bucket_params(stage, st.chunk);
    double acc = 0;
    // The chunk's gathers (issue_chunk_gathers), bucket b's units waiting for gather b.
    static const ChunkGathers kNone;
    const ChunkGathers& g = fwd && gathers != nullptr ? *gathers : kNone;
    std::size_t next_bucket = 0;
    for (std::size_t k = 0; k < units.size(); ++k) {
      const std::size_t u = fwd ? k : units.size() - 1 - k;
      if (next_bucket < g.starts.size() && g.starts[next_bucket] == k) {
        if (g.tasks[next_bucket] != kNoTask) {
          flush(ch);
          ch.deps.push_back(g.tasks[next_bucket]);
        }
        ++next_bucket;
      }
      offload_before(ch, units[u], fwd);
      play(ch, fwd ? *units[u].fwd : *units[u].bwd);
      offload_after(ch, units[u], fwd);
      if (!fwd && reduce_now) {
        acc += units[u].params;
        if (acc >= bucket || k + 1 == units.size()) {
          flush(ch);
          std::vector<TaskId> deps = ch.deps;
          deps.insert(deps.end(), ch.async.begin(), ch.async.end());
          dp_bucket(stage, acc, deps, "grad bucket " + step_name(st.dir, st.micro_batch, st.chunk, shape_.v));
          acc = 0;
        }
      }
    }
  }
  flush(ch);
  ch.deps.insert(ch.deps.end(), ch.async.begin(), ch.async.end());
  if (traced(stage) && ch.first != kNoTask) {
    spans_.push_back(StepSpan{stage, ch.first, ch.last_compute, step_name(st.dir, st.micro_batch, st.chunk, shape_.v), fwd});
  }
}

// ZeRO-3, part by part (zero3.hpp decides which parts gather, where the
// gathers are issued and where the host waits). A gather is issued when the
// host reaches the part that issues it: without zero3_sync once the compute
// before that part is issued (FSDP2's CPU thread runs ahead of the GPU), so
// it depends on the chain so far; with it after a full wait for the device
// (torch.cuda.synchronize, modelled as a dependency on everything issued),
// then the buffer's zero fill on the compute stream (DeepSpeed v0.5.4
// _allgather_param: torch.zeros of the whole tensor, then synchronize). The
// list form's per-rank copies are launched by the host right after the
// collective: with zero3_sync nothing else is queued on the device, so they
// hold the compute stream (host time); a reduce-scatter's, launched while
// the device works through a backward, delay only the collective, so they
// sit before it on the DP stream. Gathers and reduce-scatters share the DP
// stream: c10d runs every collective of a process group on its one NCCL
// stream, one after another.
void Builder::play_zero3(int stage, const ScheduleStep& st, bool reduce_now) {
  const auto us = static_cast<std::size_t>(stage);
  const bool fwd = st.dir == Direction::forward;
  const auto& units = work_.units[us][static_cast<std::size_t>(st.chunk)];
  std::vector<const Part*>& parts = scratch_.zero3_parts;
  parts.clear();
  scratch_.zero3_uses.clear();
  scratch_.zero3_units.clear();
  for (std::size_t k = 0; k < units.size(); ++k) {
    const Unit& unit = units[fwd ? k : units.size() - 1 - k];
    for (const Part& pt : fwd ? unit.fwd_parts : unit.bwd_parts) {
      parts.push_back(&pt);
      scratch_.zero3_uses.push_back(Zero3Use{pt.params, pt.tensor});
      scratch_.zero3_units.push_back(&unit);
    }
  }
  Zero3Pass z{representatives_[us], plan_zero3_pass(scratch_.zero3_uses, plan_.trainer), stage,
              step_name(st.dir, st.micro_batch, st.chunk, shape_.v)};
  scratch_.gathers.assign(parts.size(), kNoTask);
  const TrainerSettings& ts = plan_.trainer;
  const bool reducing = !fwd && reduce_now;
  Chain& ch = scratch_.chain;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Part& pt = *parts[k];
    const std::span<const std::uint32_t> issued = z.plan.issued_at(k);
    for (const std::uint32_t j : issued) {
      if (j == k) zero3_gather(z, j);  // not prefetched: fetched now
    }
    if (z.plan.waits[k]) {
      zero3_drain(z);
      const TaskId b = emit_compute(kNoStream, 0, z.deps, meta_of(Category::none, kThreadCompute, stage));
      ch.deps.assign(1, b);
      ch.async.clear();
    }
    if (ts.zero3_fetch_norm && pt.params > 0) {
      // The norm's kernel reads the tensor; formatting it waits for the compute stream.
      flush(ch);
      const TimeNs ns = memory_bound_time_ns(topo_.cluster().gpu, pt.params * step_.param_bytes_per_param());
      const TaskId nrm = emit_compute(z.me.compute, ns, ch.deps, z.host_meta);
      label(nrm, stage, "zero3_fetch_norm " + pt.name, "dp");
      ch.deps.assign(1, nrm);
    }
    for (const std::uint32_t j : issued) {
      if (j != k) zero3_gather(z, j);  // the prefetch window
    }
    if (!ts.zero3_sync) {
      flush(ch);
      if (z.plan.gathered[k]) ch.deps.push_back(scratch_.gathers[k]);
    }
    if (reducing && ts.zero3_reduce_bucket_params > 0) zero3_fill_bucket(z, pt);
    const Unit& unit = *scratch_.zero3_units[k];
    if (k == 0 || scratch_.zero3_units[k - 1] != &unit) offload_before(ch, unit, fwd);
    play(ch, *pt.prog);
    if (reducing && pt.grads > 0) {
      flush(ch);
      z.end_deps.assign(ch.deps.begin(), ch.deps.end());
      z.end_deps.insert(z.end_deps.end(), ch.async.begin(), ch.async.end());
      if (ts.zero3_reduce_bucket_params > 0) {
        for (const std::vector<double>& bucket : z.after) zero3_reduce(z, bucket, z.end_deps);
        if (z.held_current) z.held_deps = z.end_deps;
        z.held_current = false;
      } else {
        zero3_reduce(z, pt.grad_tensors, z.end_deps, pt.expert_grads);
      }
    }
    if (k + 1 == parts.size() || scratch_.zero3_units[k + 1] != &unit) offload_after(ch, unit, fwd);
  }
  if (z.acc > 0) zero3_reduce(z, z.held, z.held_deps);
}

Builder::Zero3Pass::Zero3Pass(const Representative& r, Zero3PassPlan p, int s, std::string name)
    : me(r),
      plan(std::move(p)),
      stage(s),
      dp_meta(meta_of(Category::dp, kThreadDp, s)),
      host_meta(meta_of(Category::dp, kThreadCompute, s)),
      pass_name(std::move(name)) {}

void Builder::zero3_drain(Zero3Pass& z) {
  Chain& ch = scratch_.chain;
  flush(ch);
  z.deps.assign(ch.deps.begin(), ch.deps.end());
  z.deps.insert(z.deps.end(), ch.async.begin(), ch.async.end());
  if (z.dp_tail != kNoTask) z.deps.push_back(z.dp_tail);
}

void Builder::zero3_gather(Zero3Pass& z, std::size_t j) {
  const TrainerSettings& ts = plan_.trainer;
  const GpuProfile& gpu = topo_.cluster().gpu;
  Chain& ch = scratch_.chain;
  const Part& pt = *scratch_.zero3_parts[j];
  const double bytes = step_.gathered_bytes(pt.params, pt.quantized);
  if (ts.zero3_sync) {
    zero3_drain(z);
    const TaskId zf = emit_compute(z.me.compute, memory_bound_time_ns(gpu, bytes), z.deps, z.host_meta);
    label(zf, z.stage, "zero3_zero_fill " + pt.name, "dp");
    ch.deps.assign(1, zf);
    ch.async.clear();
  }
  const double own = pt.expert > 0 ? step_.gathered_bytes(pt.params - pt.expert, pt.quantized - pt.expert_quantized)
                                   : bytes;
  TaskId g = emit_collective(Collective::all_gather, z.me.dp_group, own, z.me.dp, ch.deps, z.dp_meta);
  label(g, z.stage, "zero3_gather " + pt.name, "dp");
  if (pt.expert > 0) {
    // The experts' bucket, after the rest on the same stream.
    g = emit_collective(Collective::all_gather, shape_.expert_group ? z.me.edp_group : z.me.dp_group,
                        step_.gathered_bytes(pt.expert, pt.expert_quantized), z.me.dp, ch.deps, z.dp_meta);
    label(g, z.stage, "zero3_gather " + pt.name + " (experts)", "dp");
  }
  scratch_.gathers[j] = g;
  z.dp_tail = g;
  if (ts.zero3_list_collectives) {
    flush(ch);
    const TaskId h = emit_compute(z.me.compute, list_collective_copies_ns(gpu, bytes, shape_.dp), ch.deps, z.host_meta);
    label(h, z.stage, "zero3_gather_copies " + pt.name, "dp");
    ch.deps.assign(1, h);
  }
}

// One reduce-scatter per tensor (zero3_reduce_per_tensor) or of them all,
// each after its list-form copies; the DP stream runs them in turn.
void Builder::zero3_reduce(Zero3Pass& z, const std::vector<double>& tensors, const std::vector<TaskId>& after,
                           double experts) {
  const TrainerSettings& ts = plan_.trainer;
  double all = 0;
  for (const double t : tensors) all += t;
  const std::size_t n = ts.zero3_reduce_per_tensor ? tensors.size() : 1;
  for (std::size_t i = 0; i < n; ++i) {
    const double bytes = (ts.zero3_reduce_per_tensor ? tensors[i] : all) * step_.grad_bytes_per_param();
    z.deps.assign(after.begin(), after.end());
    if (ts.zero3_list_collectives) {
      const TaskId c =
          emit_compute(z.me.dp, list_collective_copies_ns(topo_.cluster().gpu, bytes, shape_.dp), z.deps, z.dp_meta);
      label(c, z.stage, "grad reduce copies " + z.pass_name, "dp");
      z.deps.assign(1, c);
    }
    const TaskId t = emit_collective(Collective::reduce_scatter, z.me.dp_group, bytes, z.me.dp, z.deps, z.dp_meta,
                                     /*dp_reduction=*/true);
    label(t, z.stage, "grad bucket " + z.pass_name, "dp");
    z.dp_tail = t;
  }
  if (experts > 0) {
    z.deps.assign(after.begin(), after.end());
    const TaskId t = emit_collective(Collective::reduce_scatter, shape_.expert_group ? z.me.edp_group : z.me.dp_group,
                                     experts * step_.grad_bytes_per_param(), z.me.dp, z.deps, z.dp_meta,
                                     /*dp_reduction=*/true);
    label(t, z.stage, "grad bucket " + z.pass_name + " (experts)", "dp");
    z.dp_tail = t;
  }
}

// DeepSpeed's bucket is reduced when the next gradient would overflow it,
// from the hook of the parameter whose gradient arrives: the host runs the
// hooks of a part as it issues the part's backward, so the reduction starts
// with the part, after the gradients it holds.
void Builder::zero3_fill_bucket(Zero3Pass& z, const Part& pt) {
  Chain& ch = scratch_.chain;
  const auto bucket = static_cast<double>(plan_.trainer.zero3_reduce_bucket_params);
  z.after.clear();
  flush(ch);
  for (const double t : pt.grad_tensors) {
    if (z.acc > 0 && z.acc + t > bucket) {
      if (z.held_current) {
        z.after.push_back(z.held);
      } else {
        z.held_deps.insert(z.held_deps.end(), ch.deps.begin(), ch.deps.end());
        zero3_reduce(z, z.held, z.held_deps);
      }
      z.acc = 0;
      z.held.clear();
      z.held_deps.clear();
    }
    z.acc += t;
    z.held.push_back(t);
    z.held_current = true;
  }
}

}  // namespace cuboid::sim::detail
