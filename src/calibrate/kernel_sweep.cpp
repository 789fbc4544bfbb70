// Memory-bound kernels, fused attention blocks and grouped expert GEMMs timed
// inside the executor's layer at scaled sizes.
#include "cuboid/calibrate/kernel_sweep.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "cuboid/calibrate/gemm_sweep.hpp"
#include "cuboid/calibrate/step_cache.hpp"
#include "cuboid/calibrate/sweep_plan.hpp"
#include "cuboid/core/calibration.hpp"
#include "cuboid/exec/layer.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::calibrate {

namespace {

constexpr float kDropout = 0.1f;  // the step runner's default (StepOptions)

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// The median per-call time of `call` run alone: each rank of a core in its
// turn (the GEMM sweep's turns), warm-up calls first; `evict` (untimed)
// before each call when given.
template <class Call>
double time_alone(exec::Backend& be, exec::Communicator& world, const KernelSweepOptions& o,
                  exec::Watchdog* watchdog, const char* name, Call&& call, CacheEvictor* evict = nullptr) {
  exec::TimerEvent start = be.create_event(), stop = be.create_event();
  double ns = 0;
  for (int t = 0; t < o.turns; ++t) {
    world.barrier();
    if (t != o.turn) continue;
    if (watchdog != nullptr) watchdog->enter(name);
    std::vector<double> times;
    for (int i = 0; i < o.warmup_steps + o.measured_steps; ++i) {
      if (evict != nullptr) (*evict)();
      be.record(start);
      call();
      be.record(stop);
      if (i >= o.warmup_steps) times.push_back(static_cast<double>(be.elapsed_ns(start, stop)));
    }
    if (watchdog != nullptr) watchdog->leave();
    ns = median_of(std::move(times));
  }
  return ns;
}

// The embedding's backward as the step runner calls it: the gathered [T, h]
// gradient scatter-added into this rank's vocabulary shard (f32, the
// gradient buffer's type) at ids drawn over the whole vocabulary, so that
// a TP rank adds the share of rows its shard owns. Its sample is keyed by
// the workload's bytes (the trainer's dense table gradient).
double time_embedding_backward(exec::Backend& be, exec::Communicator* tp, exec::Communicator& world,
                               const exec::LayerDims& d, const KernelSweepOptions& o, exec::Watchdog* watchdog) {
  const int t = tp != nullptr ? tp->size() : 1, r = tp != nullptr ? tp->rank() : 0;
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::int64_t> id(0, d.vocab * t - 1);
  std::vector<std::int32_t> host(sz(d.tokens));
  for (std::int32_t& v : host) v = static_cast<std::int32_t>(id(gen) - d.vocab * r);
  exec::DeviceBuffer ids = be.alloc(sz(d.tokens), exec::DType::i32), dout = be.alloc(sz(d.tokens * d.hidden)),
                     table = be.alloc(sz(d.vocab * d.hidden), exec::DType::f32);
  be.upload_indices(host, ids);
  be.fill_random(dout, 7, 1e-2f);
  be.fill(table, 0.0f);
  return time_alone(be, world, o, watchdog, op::embed_grad,
                    [&] { be.embedding_backward(dout, ids, table, d.tokens, d.hidden); });
}

// How deep the sweep's layers go. In a CP 2 run of tiny-moe the busiest
// expert's share of a micro-batch's copies grew with depth and then held
// (max / mean by layer: 1.7-1.9, 2.2-2.4, 2.7-2.9, 2.6-2.8).
constexpr int kMaxDepth = 4;
// Whole passes through that depth an MoE layer is timed for (each depth's
// grouped GEMMs the median of their passes).
constexpr int kMoeDepthPasses = 3;

// One layer's ops timed forward + backward: per call, and the shape each
// GEMM ran at (OpDesc).
struct LayerTimes {
  std::map<std::string, double> per_call_ns;
  std::map<std::string, GemmProblem> gemm_shapes;
};

// Per-call median of every memory-bound op, fused attention block and
// GEMM of one layer forward + backward, `depth` layers deep (a stage's
// layers, at most kMaxDepth), each with weights of its own, so that a
// layer's weights pass through the caches between its calls as a step's
// do (one layer's weights timed again and again would stay cached where
// the step's are evicted by the other layers). The layer's input is what a
// run's layers see: the embedding's draw (the step runner's init scale;
// each rank its own tokens, a TP group's shared without SP); in an MoE
// layer then its own output, `depth` layers deep, each with a router and
// experts of its own, then again from the embedding. The router's split of
// the tokens among the experts, and with it the grouped GEMMs' time, hangs
// on it: hidden states grow alike layer by layer (the attention averages),
// and a run's deeper layers route more unevenly than its first. A grouped
// GEMM's sample is the mean over the depths of each depth's median, as a
// stage's step sums its layers.
LayerTimes time_layer(exec::Backend& be, exec::Communicator* tp, const exec::LayerDims& d, const exec::MoeDims* moe,
                      exec::Communicator* ep, exec::Communicator* cp, int world_rank, int depth,
                      const KernelSweepOptions& o, exec::Watchdog* watchdog, const exec::FlexGroups* flex) {
  exec::OpTimer timer(be, watchdog);
  exec::LayerRunner runner(be, tp, d, timer, moe, ep, d.cp > 1 ? cp : nullptr, flex);
  const bool is_moe = moe != nullptr;
  const std::size_t n_params = exec::layer_param_count(d, is_moe);
  depth = std::clamp(depth, 1, kMaxDepth);
  const std::size_t n_experts = is_moe ? moe->expert_param_count() : 1;
  exec::DeviceBuffer params = be.alloc(n_params * sz(depth)), grads = be.alloc(n_params * sz(depth));
  exec::DeviceBuffer experts = be.alloc(n_experts * sz(depth)), expert_grads = be.alloc(n_experts * sz(depth));
  std::vector<exec::LayerParams> w, g;
  for (int layer = 0; layer < depth; ++layer) {
    w.push_back(exec::layer_params_at(params, sz(layer) * n_params, d, is_moe));
    g.push_back(exec::layer_params_at(grads, sz(layer) * n_params, d, is_moe));
    exec::init_layer_params(be, w.back(), 99 + static_cast<std::uint64_t>(layer));
  }
  be.fill(grads, 0.0f);
  if (is_moe) {
    be.fill_random(experts, 97, exec::kInitScale);
    be.fill(expert_grads, 0.0f);
  }
  const std::size_t act = sz(d.local_tokens * d.hidden);
  exec::DeviceBuffer x0 = be.alloc(act), x = be.alloc(act), y = be.alloc(act), dy = be.alloc(act),
                     dx = be.alloc(act);
  be.fill_random(x0, 5 + static_cast<std::uint64_t>(world_rank), exec::kInitScale);
  if (tp != nullptr && tp->size() > 1 && d.local_tokens == d.tokens) tp->broadcast(x0, act, 0);
  be.fill_random(dy, 6, 1e-2f);
  exec::LayerActs acts = runner.make_acts(exec::AttentionMemory::keep_probs);
  // Warm-up: one pass through every layer (each layer's weights touched once).
  const int warmup = o.warmup_steps * depth;
  const int measured =
      std::max(is_moe ? kMoeDepthPasses * depth : depth, o.measured_steps);
  for (int i = 0; i < warmup + measured; ++i) {
    const int layer = i % depth;
    // A dense layer's input is the embedding's draw at every depth (the
    // norms keep a dense layer's input at the scale it had).
    be.copy(layer == 0 || !is_moe ? x0 : y, x);
    // The same router on every rank (the EP ranks' routing then matches a run's).
    if (is_moe) {
      be.fill_random(w[sz(layer)].experts.router, 98 + static_cast<std::uint64_t>(layer), exec::kInitScale);
      exec::set_expert_params(w[sz(layer)], experts, sz(layer) * n_experts, *moe);
      exec::set_expert_params(g[sz(layer)], expert_grads, sz(layer) * n_experts, *moe);
    }
    timer.begin_step(i >= warmup);
    const auto seed = static_cast<std::uint64_t>(i);
    runner.forward(w[sz(layer)], x, acts, y, seed, exec::AttentionMemory::keep_probs);
    runner.backward(w[sz(layer)], g[sz(layer)], x, acts, dy, dx, seed, exec::AttentionMemory::keep_probs);
    timer.end_step();
  }
  LayerTimes out;
  for (const auto& [name, st] : timer.stats()) {
    const bool timed = st.desc.kind == OpKind::memory_bound || st.desc.kind == OpKind::attention_core ||
                       st.desc.kind == OpKind::gemm;
    if (!timed || st.calls_per_step <= 0) continue;
    double seconds = median_of(st.step_seconds);
    if (st.desc.kind == OpKind::gemm && is_moe && depth > 1) {
      std::vector<std::vector<double>> by_depth(sz(depth));
      for (std::size_t j = 0; j < st.step_seconds.size(); ++j)
        by_depth[(j + sz(warmup)) % sz(depth)].push_back(st.step_seconds[j]);
      seconds = 0;
      for (std::vector<double>& v : by_depth) seconds += median_of(std::move(v)) / depth;
    }
    out.per_call_ns[name] = seconds * 1e9 / static_cast<double>(st.calls_per_step);
    if (st.desc.kind == OpKind::gemm)
      out.gemm_shapes[name] = GemmProblem{st.desc.m, st.desc.n, st.desc.k, st.desc.batch};
  }
  return out;
}

}  // namespace

LayerSweep run_kernel_sweep(exec::Backend& be, exec::Communicator* tp, exec::Communicator& world,
                            const ModelSpec& model, const ParallelPlan& plan, const KernelSweepOptions& o,
                            exec::Watchdog* watchdog, exec::Communicator* ep, exec::Communicator* cp,
                            const exec::FlexGroups* flex) {
  const std::int64_t seq = plan.seq_length > 0 ? plan.seq_length : model.seq_length;
  // A stage's layers: the depth the sweep's input reaches.
  const auto depth = static_cast<int>(std::max<std::int64_t>(1, model.num_layers / std::max(1, plan.pp)));
  LayerSweep out;
  for (const KernelScale& k : kernel_scales(plan, seq, o.quick)) {
    ParallelPlan scaled = plan;
    scaled.micro_batch = k.micro_batch;
    scaled.seq_length = k.seq_length;
    // Workload name -> the size a sample is keyed by (first occurrence):
    // Op::bytes, or a fused attention block's Op::flops (every block of the
    // CP ring has the same), or a grouped GEMM's Op::flops (the even split's:
    // the time is what the router's split of this input costs).
    // A grouped GEMM's table is keyed by its local experts too (grouped_kernel_name).
    std::map<std::string, double> bytes;
    std::map<std::string, std::string> table_name;
    // A dense GEMM's workload shapes by name: a name with one shape is keyed
    // by it (GemmSample), as the GEMM sweep's samples are.
    std::map<std::string, std::set<GemmProblem>> dense;
    for (const Op& op : executor_workload_ops(model, scaled)) {
      if (op.kind == OpKind::memory_bound) bytes.try_emplace(op.name, op.bytes);
      if (op.kind == OpKind::attention_core || (op.kind == OpKind::gemm && op.grouped))
        bytes.try_emplace(op.name, op.flops);
      if (op.kind == OpKind::gemm && op.grouped) table_name.try_emplace(op.name, grouped_kernel_name(op.name, op.batch));
      if (op.kind == OpKind::gemm && !op.grouped) dense[op.name].insert(GemmProblem{op.m, op.n, op.k, op.batch});
    }
    world.barrier();
    const exec::LayerDims d = exec::layer_dims(model, scaled, kDropout);
    const exec::MoeDims moe = exec::moe_dims(model, scaled, d.local_tokens);
    const LayerTimes times =
        time_layer(be, tp, d, model.moe.enabled() ? &moe : nullptr, ep, cp, world.rank(), depth, o, watchdog, flex);
    for (const auto& [name, t] : times.per_call_ns) {
      if (const auto shapes = dense.find(name); shapes != dense.end()) {
        // Timed at the workload's own shape, else not a sample of it.
        const GemmProblem ran = times.gemm_shapes.at(name);
        if (shapes->second.size() == 1 && *shapes->second.begin() == ran && t > 0)
          out.gemms.push_back(GemmSample{ran.m, ran.n, ran.k, ran.batch, t, kTimedInLayer});
        continue;
      }
      const auto it = bytes.find(name);
      if (it == bytes.end() || !(it->second > 0)) continue;
      const auto keyed = table_name.find(name);
      out.kernels.push_back(KernelMeasurement{keyed != table_name.end() ? keyed->second : name, it->second, t});
    }
    // A plan on the unfused attention core also has the fused core's blocks
    // timed, at its own attention shapes: --flash-attention is the planner's
    // to choose, and context parallelism runs the fused core only. Without
    // them a card calibrated on an unfused plan prices a CP plan's blocks
    // at the best GEMM's FLOP rate (the executor's block backward came out
    // 4x long: docs/calibration.md). Timed in a dense layer of the same
    // scale; the attention does not depend on the MLP.
    if (!scaled.flash_attention && scaled.cp == 1) {
      ParallelPlan fused = scaled;
      fused.flash_attention = true;
      std::map<std::string, double> flops;
      for (const Op& op : executor_workload_ops(model, fused))
        if (op.kind == OpKind::attention_core) flops.try_emplace(op.name, op.flops);
      world.barrier();
      const exec::LayerDims fd = exec::layer_dims(model, fused, kDropout);
      for (const auto& [name, t] :
           time_layer(be, tp, fd, nullptr, nullptr, nullptr, world.rank(), 1, o, watchdog, nullptr).per_call_ns)
        if (const auto it = flops.find(name); it != flops.end() && it->second > 0)
          out.kernels.push_back(KernelMeasurement{name, it->second, t});
    }
    if (const auto it = bytes.find(op::embed_grad); it != bytes.end() && it->second > 0)
      out.kernels.push_back(
          KernelMeasurement{op::embed_grad, it->second, time_embedding_backward(be, tp, world, d, o, watchdog)});
  }
  return out;
}

std::vector<KernelMeasurement> run_optimizer_sweep(exec::Backend& be, exec::Communicator& world,
                                                   const ModelSpec& model, const ParallelPlan& plan,
                                                   const KernelSweepOptions& o, exec::Watchdog* watchdog) {
  // This rank's shard: its stage's layers (embedding and head left out: the
  // layers dominate), divided over DP by the distributed optimizer.
  const exec::LayerDims d = exec::layer_dims(model, plan, kDropout);
  const bool moe = model.moe.enabled();
  const std::size_t per_layer =
      exec::layer_param_count(d, moe) + (moe ? exec::moe_dims(model, plan, d.local_tokens).expert_param_count() : 0);
  std::size_t shard = per_layer * static_cast<std::size_t>(std::max<std::int64_t>(1, model.num_layers / plan.pp));
  if (plan.zero_stage >= 1) shard /= static_cast<std::size_t>(plan.dp);
  const std::vector<double> scales = o.quick ? std::vector<double>{0.5, 1, 2} : std::vector<double>{0.25, 0.5, 1, 2, 4};
  const auto largest = static_cast<std::size_t>(static_cast<double>(shard) * scales.back());
  exec::DeviceBuffer params = be.alloc(largest, exec::DType::f32), m = be.alloc(largest, exec::DType::f32),
                     v = be.alloc(largest, exec::DType::f32), grads = be.alloc(largest);
  be.fill_random(params, 1, 0.02f);
  be.fill_random(grads, 2, 1e-3f);
  be.fill(m, 0.0f);
  be.fill(v, 0.0f);
  // The gradient buffer's kernels of the step runner (f32): the mean over
  // micro-batches and replicas, scaled in place, and the zeroing before the
  // next step.
  exec::DeviceBuffer buffer = be.alloc(largest, exec::DType::f32);
  be.fill(buffer, 1.0f);
  const exec::AdamConfig adam;
  // Once per step, after the backward: the step's working set has passed
  // through the caches since these buffers were last touched.
  CacheEvictor evict(be, o.step_memory_bytes);
  std::vector<KernelMeasurement> out;
  std::int64_t step = 1;
  for (double s : scales) {
    const auto n = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(shard) * s));
    // Keyed by the workload's own bytes for n parameters (one rank, ZeRO 0:
    // the buffer and the shard are the n elements; the executor's fp32
    // gradients and moments).
    std::map<std::string, double> bytes;
    for (const Op& k : optimizer_step_ops(static_cast<double>(n), 1, 0, OptimizerPrecision{})) bytes[k.name] = k.bytes;
    const double adam_ns = time_alone(be, world, o, watchdog, op::adam, [&] {
      be.adam_step(params.subspan(0, n), grads.subspan(0, n), m.subspan(0, n), v.subspan(0, n), adam, step++);
    }, &evict);
    // Scaled by 1 (a kernel all the same), so that no value drifts to denormals.
    const double scale_ns =
        time_alone(be, world, o, watchdog, op::grad_scale, [&] { be.scale(buffer.subspan(0, n), 1.0f); }, &evict);
    const double zero_ns =
        time_alone(be, world, o, watchdog, op::grad_zero, [&] { be.fill(buffer.subspan(0, n), 0.0f); }, &evict);
    out.push_back(KernelMeasurement{op::adam, bytes.at(op::adam), adam_ns});
    out.push_back(KernelMeasurement{op::grad_scale, bytes.at(op::grad_scale), scale_ns});
    out.push_back(KernelMeasurement{op::grad_zero, bytes.at(op::grad_zero), zero_ns});
  }
  return out;
}

}  // namespace cuboid::calibrate
