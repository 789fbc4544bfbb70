#include "cuboid/core/tp_overlap.hpp"

#include <algorithm>
#include <string_view>

#include "cuboid/core/op_names.hpp"

namespace cuboid {

namespace {

bool is_tp(const Op& op, Collective c) { return op.kind == OpKind::collective && op.group == Group::tp && op.collective == c; }

// TE's layer names for the GEMMs the Megatron-Core spec builds with ub_name
// set (TELayerNormColumnParallelLinear qkv / fc1, TERowParallelLinear proj /
// fc2): the all-gather before, the reduce-scatter after.
bool gathers_before(std::string_view gemm, std::string_view comm) {
  return (gemm == op::qkv && comm == op::tp_ag_attn) || (gemm == op::fc1 && comm == op::tp_ag_mlp) ||
         (gemm == op::proj_dgrad && comm == op::tp_ag_attn_bwd) || (gemm == op::fc2_dgrad && comm == op::tp_ag_mlp_bwd);
}
bool scatters_after(std::string_view gemm, std::string_view comm) {
  return (gemm == op::proj && comm == op::tp_rs_attn) || (gemm == op::fc2 && comm == op::tp_rs_mlp);
}

}  // namespace

std::vector<UbOverlap> ub_overlaps(const std::vector<Op>& ops, int tp) {
  std::vector<UbOverlap> out;
  if (tp < 2) return out;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (i + 1 < ops.size() && is_tp(op, Collective::all_gather) && ops[i + 1].kind == OpKind::gemm &&
        gathers_before(ops[i + 1].name, op.name))
      out.push_back({i, i + 1, UbMethod::ring_exchange, tp, 0});
    if (i > 0 && is_tp(op, Collective::reduce_scatter) && ops[i - 1].kind == OpKind::gemm &&
        scatters_after(ops[i - 1].name, op.name))
      out.push_back({i, i - 1, UbMethod::pipeline, kUbPipelineSplits, kUbCommSms});
  }
  return out;
}

Op ub_chunk_gemm(const Op& gemm, int chunks) {
  Op c = gemm;
  c.m = std::max<std::int64_t>(1, gemm.m / chunks);
  c.flops = gemm.flops / chunks;
  c.bytes = gemm.bytes / chunks;
  return c;
}

double ub_chunk_bytes(const UbOverlap& u, double comm_bytes) { return comm_bytes / u.chunks; }

double ub_overlapped_ns(const UbOverlap& u, double chunk_gemm_ns, double chunk_comm_ns) {
  const double steps = static_cast<double>(u.chunks - 1) * std::max(chunk_gemm_ns, chunk_comm_ns);
  return chunk_gemm_ns + steps + (u.method == UbMethod::pipeline ? chunk_comm_ns : 0.0);
}

}  // namespace cuboid
