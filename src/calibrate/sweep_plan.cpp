// What to measure, from the plans: GEMM shapes, kernel sizes, collective
// sizes and process-group shapes. Pure functions (tested in test_calibrate).
#include "cuboid/calibrate/sweep_plan.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/cost/memory.hpp"

namespace cuboid::calibrate {

std::vector<Op> executor_workload_ops(const ModelSpec& model, const ParallelPlan& plan) {
  const ParallelPlan& p = plan;  // the executor runs the plan's attention core, fused or not
  std::vector<Op> ops;
  auto append = [&ops](const LayerOps& l) {
    for (const auto* list : {&l.forward, &l.backward, &l.recompute}) ops.insert(ops.end(), list->begin(), list->end());
  };
  append(transformer_layer_ops(model, p));
  append(embedding_ops(model, p));
  append(lm_head_ops(model, p));
  return ops;
}

std::vector<GemmProblem> plan_gemm_problems(const ModelSpec& model, const ParallelPlan& plan) {
  std::set<GemmProblem> shapes;
  for (const Op& op : executor_workload_ops(model, plan))
    if (op.kind == OpKind::gemm) shapes.insert(GemmProblem{op.m, op.n, op.k, op.batch});
  return {shapes.begin(), shapes.end()};
}

std::vector<GemmProblem> gemm_grid(const std::vector<GemmProblem>& base, bool quick) {
  std::set<GemmProblem> out(base.begin(), base.end());
  auto scaled = [](std::int64_t v, int i) { return i < 0 ? std::max<std::int64_t>(1, v / 2) : i > 0 ? 2 * v : v; };
  for (const GemmProblem& s : base) {
    if (quick) {
      out.insert(GemmProblem{2 * s.m, 2 * s.n, 2 * s.k, s.batch});
      continue;
    }
    const int batch_lo = s.batch > 1 ? -1 : 0, batch_hi = s.batch > 1 ? 1 : 0;
    for (int im = -1; im <= 1; ++im)
      for (int in = -1; in <= 1; ++in)
        for (int ik = -1; ik <= 1; ++ik)
          for (int ib = batch_lo; ib <= batch_hi; ++ib)
            out.insert(GemmProblem{scaled(s.m, im), scaled(s.n, in), scaled(s.k, ik), scaled(s.batch, ib)});
  }
  return {out.begin(), out.end()};
}

std::vector<std::int64_t> size_ladder(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor,
                                      const std::string& field) {
  if (factor <= 1)
    throw InputError("command line", field, fmt::format("size step {} is not above 1", factor), "use a step of 2 or 4");
  if (min_bytes <= 0 || max_bytes < min_bytes)
    throw InputError("command line", field,
                     fmt::format("{} bytes is below the smallest size measured ({} bytes)", max_bytes, min_bytes),
                     fmt::format("give at least {}", min_bytes));
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = min_bytes; s <= max_bytes; s *= factor) {
    sizes.push_back(s);
    if (s > max_bytes / factor) break;
  }
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  return sizes;
}

std::vector<KernelScale> kernel_scales(const ParallelPlan& plan, std::int64_t seq_length, bool quick) {
  // With sequence parallelism a TP rank holds tokens / TP rows, with context
  // parallelism 2 x CP chunks: keep the shortened sequence a multiple of both.
  const std::int64_t align =
      (plan.sequence_parallel && plan.tp > 1 ? plan.tp : 1) * (plan.cp > 1 ? 2 * std::int64_t{plan.cp} : 1);
  std::vector<KernelScale> out;
  auto add = [&](int mb, std::int64_t seq) {
    seq = std::max(align, seq / align * align);
    const KernelScale k{mb, seq};
    const bool seen = std::any_of(out.begin(), out.end(), [&](const KernelScale& o) {
      return o.micro_batch == k.micro_batch && o.seq_length == k.seq_length;
    });
    if (!seen) out.push_back(k);
  };
  const int mb = plan.micro_batch;
  if (!quick) add(mb, seq_length / 4);
  add(mb, seq_length / 2);
  add(mb, seq_length);
  add(2 * mb, seq_length);
  if (!quick) add(4 * mb, seq_length);
  return out;
}

std::vector<GroupShape> plan_group_shapes(const ParallelPlan& plan, int gpus_per_node) {
  const RankMapping mapping(plan, gpus_per_node);
  std::vector<GroupShape> out;
  auto add = [&](Group g, const std::vector<std::vector<int>>& groups) {
    if (groups.empty() || groups.front().size() < 2) return;
    bool crosses = false;
    for (const auto& members : groups) crosses = crosses || mapping.nodes_spanned(members) > 1;
    out.push_back(GroupShape{g, static_cast<int>(groups.front().size()), crosses ? "inter_node" : "intra_node"});
  };
  add(Group::tp, mapping.tp_groups());
  add(Group::pp, mapping.pp_groups());
  add(Group::dp, mapping.dp_groups());
  if (plan.ep > 1) add(Group::ep, mapping.ep_groups());
  if (plan.ep > 1 && plan.moe_dispatcher == MoeDispatcher::flex) {
    const std::vector<int> members = mapping.ep_groups().front();
    const int nodes = mapping.nodes_spanned(members);
    const int per_node = static_cast<int>(members.size()) / nodes;
    if (nodes > 1 && per_node > 1) out.push_back(GroupShape{Group::ep, per_node, "intra_node", FlexLeg::intra});
    if (nodes > 1) out.push_back(GroupShape{Group::ep, nodes, "inter_node", FlexLeg::rail});
  }
  if (plan.cp > 1) add(Group::cp, mapping.cp_groups());
  return out;
}

}  // namespace cuboid::calibrate
