#include "cuboid/io/export_resolve.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <stdexcept>

#include "cuboid/core/error.hpp"
#include "resolve_common.hpp"

namespace cuboid {

namespace resolve {

std::int64_t to_int(const std::string& value, std::string_view what) {
  std::size_t used = 0;
  std::int64_t n = 0;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size())
    throw std::invalid_argument(fmt::format("{}: \"{}\" is not an integer", what, value));
  return n;
}

std::string probability(double p) { return fmt::format("{}", p); }

std::string ddp_bucket(std::int64_t params) {
  return params > 0 ? std::to_string(params) : std::string("max(40M, 1M x DP x CP)");
}

std::string full_recompute(std::string method, std::string num_layers) {
  method = unquote_value(method);
  if (method.empty() || method == "None" || method == "null") method = "none";
  if (num_layers.empty() || num_layers == "None" || num_layers == "null") num_layers = "none";
  return method == "uniform" && num_layers == "1" ? "full" : "full:" + method + ":" + num_layers;
}

std::string probability(const std::string& value, std::string_view what) {
  std::size_t used = 0;
  double p = 0;
  try {
    p = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size())
    throw std::invalid_argument(fmt::format("{}: \"{}\" is not a probability", what, value));
  return probability(p);
}

std::string unquote_value(const std::string& v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

bool truthy(const std::string& value) { return value == "True" || value == "true"; }

int launch_world(const std::string& text) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(R"(torchrun --nnodes (\d+) --nproc_per_node (\d+))")) ||
      std::regex_search(text, m, std::regex(R"(deepspeed --hostfile \S+ --num_nodes (\d+) --num_gpus (\d+))")))
    return static_cast<int>(to_int(m[1].str(), "nodes") * to_int(m[2].str(), "GPUs per node"));
  throw std::invalid_argument("the export has no launch line to take the world size from");
}

}  // namespace resolve

const ResolvedSetting* ResolvedRun::find(std::string_view name) const {
  for (const ResolvedSetting& s : settings)
    if (s.name == name) return &s;
  return nullptr;
}

ResolvedRun resolve_export(std::string_view target, const ExportResult& exported) {
  if (target == "megatron") return resolve::megatron_lm(exported);
  if (target == "megatron-bridge") return resolve::megatron_bridge(exported);
  if (target == "deepspeed") return resolve::deepspeed(exported);
  if (target == "nemo") return resolve::nemo1(exported);
  if (target == "torchtitan" || target == "torchtitan-main") return resolve::torchtitan(target, exported);
  throw InputError("command line", "--to", "no start-up model of export target \"" + std::string(target) + "\"",
                   "use one of the export targets");
}

std::vector<ResolvedSetting> priced_settings(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  const std::string why = "the plan file's parallel settings";
  auto str = [](auto v) { return fmt::format("{}", v); };
  auto yes = [](bool b) { return std::string(b ? "true" : "false"); };
  std::vector<ResolvedSetting> out = {
      {"world", str(pf.nodes * pf.gpus_per_node), "cluster.nodes x cluster.gpus_per_node"},
      {"tp", str(p.tp), why},
      {"pp", str(p.pp), why},
      {"cp", str(p.cp), why},
      {"dp", str(p.dp), why},
      {"cp_comm", std::string(to_string(p.cp_comm)), why},
      {"ep", str(p.ep), why},
      {"etp", str(p.expert_tp()), why},
      {"moe_dispatcher", std::string(to_string(p.moe_dispatcher)), why},
      {"moe_flex_backend", std::string(to_string(p.moe_flex.backend)), why},
      {"moe_rank_capacity_factor",
       p.moe_flex.rank_capacity_factor > 0 ? str(p.moe_flex.rank_capacity_factor) : std::string("None"), why},
      {"moe_paged_stash", yes(p.moe_flex.paged_stash), why},
      {"moe_ep_overlap", yes(p.moe_ep_overlap), why},
      {"moe_delay_wgrad", yes(p.moe_delay_wgrad), why},
      {"micro_batch", str(p.micro_batch), why},
      {"global_batch", str(p.global_batch), why},
      {"num_micro_batches", str(p.num_micro_batches()), why},
      {"virtual_stages", str(p.pp > 1 ? chunks_per_stage(p) : 1), why},
      {"schedule", p.pp == 1 ? "none" : p.schedule == Schedule::interleaved && p.virtual_stages > 1 ? "interleaved"
                                      : p.schedule == Schedule::gpipe                                ? "gpipe"
                                                                                                     : "1f1b",
       why},
      {"sequence_parallel", yes(p.sequence_parallel && p.tp > 1), why},
      {"recompute",
       p.recompute == Recompute::full
           ? resolve::full_recompute(std::string(to_string(p.recompute_method)), std::to_string(p.recompute_num_layers))
           : std::string(to_string(p.recompute)),
       why},
      {"zero_stage", str(p.zero_stage), why},
      {"zero1_grad_all_reduce", yes(p.trainer.zero1_grad_all_reduce), "trainer.zero1_grad_all_reduce"},
      {"dp_overlap", yes(p.trainer.dp_overlap), "trainer.dp_overlap"},
      {"overlap_param_gather_with_optimizer_step", yes(p.trainer.overlap_param_gather_with_optimizer_step),
       "trainer.overlap_param_gather_with_optimizer_step"},
      {"align_param_gather", yes(p.trainer.align_param_gather), "trainer.align_param_gather"},
      {"ddp_bucket_size", resolve::ddp_bucket(p.trainer.ddp_bucket_params), "trainer.ddp_bucket_size"},
      {"dp_grad_bytes", str(p.trainer.dp_grad_bytes), "trainer.dp_grad_bytes"},
      {"fsdp_grad_bytes", str(p.grad_element_bytes()), "trainer.fsdp_grad_bytes (Megatron-FSDP's gradients)"},
      {"grad_accum_fusion", yes(p.grad_accum_fusion), why},
      {"rank_order", p.order.str(), why},
      {"attention", p.flash_attention ? "fused" : "unfused", "parallel.flash_attention"},
      {"params_bytes", "2", "cuboid prices 16-bit parameters and activations"},
      {"precision", std::string(to_string(p.precision)), why},
      {"fp8_param_gather", yes(p.fp8_param_gather), why},
      {"fp8_attention", yes(p.fp8_attention), why},
      {"hidden_dropout", resolve::probability(pf.model.hidden_dropout), "the model card's hidden_dropout"},
      {"attention_dropout", resolve::probability(pf.model.attention_dropout), "the model card's attention_dropout"},
      {"optimizer", std::string(to_string(p.optimizer)), "parallel.optimizer"},
      {"precision_aware_optimizer", yes(p.precision_aware_optimizer), why},
      {"adam_moment_bytes", str(p.adam_moment_bytes), why},
      {"compile", "false", "cuboid prices eager kernels, each launched on its own"},
      {"async_tp", "false", "cuboid prices TP collectives as separate kernels"},
  };
  return out;
}

namespace {

// The order's dimensions of size > 1, inner to outer ("tp-dp-pp" with DP 1: "tp-pp").
std::string effective_order(const std::string& order, const ParallelPlan& p) {
  std::string out;
  std::size_t start = 0;
  while (start <= order.size()) {
    const std::size_t end = std::min(order.find('-', start), order.size());
    const std::string dim = order.substr(start, end - start);
    const int size = dim == "tp" ? p.tp : dim == "pp" ? p.pp : p.dp_cp();
    if (size > 1) out += (out.empty() ? "" : "-") + dim;
    start = end + 1;
  }
  return out;
}

}  // namespace

std::vector<RunMismatch> compare_with_plan(const ResolvedRun& run, const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  std::vector<RunMismatch> out;
  for (const std::string& failure : run.failures) out.push_back({"start-up", "starts", "fails", failure});
  const std::vector<ResolvedSetting> priced = priced_settings(pf);
  for (const ResolvedSetting& s : run.settings) {
    const std::string& n = s.name;
    // One data-parallel rank: nothing is reduced or sharded.
    if (p.dp_cp() == 1 && (n == "zero_stage" || n == "dp_overlap" || n == "dp_grad_bytes" || n == "fsdp_grad_bytes" ||
                           n == "zero1_grad_all_reduce" || n == "overlap_param_gather_with_optimizer_step"))
      continue;
    // Buckets only where the DP reduction overlaps the backward (else every chunk is one).
    if (n == "ddp_bucket_size" && (p.dp_cp() == 1 || !p.trainer.dp_overlap || p.zero_stage >= 3)) continue;
    if (n == "zero1_grad_all_reduce" && p.zero_stage != 1) continue;
    if ((n == "ep" || n == "etp" || n == "moe_dispatcher" || n == "moe_ep_overlap") && !pf.model.moe.enabled()) continue;
    if (n == "moe_delay_wgrad" && !(pf.model.moe.enabled() && p.moe_ep_overlap)) continue;
    if ((n == "moe_flex_backend" || n == "moe_rank_capacity_factor" || n == "moe_paged_stash") &&
        p.moe_dispatcher != MoeDispatcher::flex)
      continue;
    if (n == "cp_comm" && p.cp == 1) continue;
    // Only the interleaved schedule's overlapped gathers are aligned.
    if (n == "align_param_gather" && !p.interleaved_param_gathers()) continue;
    if (n == "fp8_param_gather" && p.precision == Precision::bf16) continue;
    const ResolvedSetting* want = nullptr;
    for (const ResolvedSetting& q : priced)
      if (q.name == n) want = &q;
    if (want == nullptr) {
      out.push_back({n, "(not priced)", s.value, s.source});
      continue;
    }
    bool same = n == "rank_order" ? effective_order(s.value, p) == effective_order(want->value, p)
                                  : s.value == want->value;
    // Selective recomputation of the attention core alone costs nothing with
    // a fused core, which recomputes inside its kernel: it prices as none.
    if (n == "recompute" && !same && p.flash_attention && p.recompute == Recompute::selective &&
        (p.recompute_modules == 0 || p.recompute_modules == static_cast<std::uint8_t>(RecomputeModule::core_attn)))
      same = s.value == "none";
    if (!same) out.push_back({n, want->value, s.value, s.source});
  }
  return out;
}

std::string describe(const std::vector<RunMismatch>& mismatches) {
  std::string out;
  for (const RunMismatch& m : mismatches)
    out += m.name == "start-up" ? fmt::format("start-up fails: {}\n", m.source)
                                : fmt::format("{}: priced {}, runs {} ({})\n", m.name, m.priced, m.runs, m.source);
  return out;
}

}  // namespace cuboid
