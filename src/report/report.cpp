#include "cuboid/core/dispatch.hpp"
#include "cuboid/core/ep_overlap.hpp"
#include "cuboid/core/pipeline_layout.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/report/report.hpp"
#include "cuboid/core/workload.hpp"
#include "cuboid/cost/optimizer_step.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace cuboid {

namespace {

// What the plan's MoE token dispatcher does, in a line (docs/cost-model.md).
std::string dispatcher_words(const ParallelPlan& p, const Cluster& c) {
  switch (p.moe_dispatcher) {
    case MoeDispatcher::alltoall:
      return "alltoall (NCCL all-to-all of every top-k copy; Megatron-Core's MoEAlltoAllTokenDispatcher)";
    case MoeDispatcher::allgather:
      return "allgather (every rank's tokens all-gathered over EP, the outputs reduce-scattered in fp32; "
             "MoEAllGatherTokenDispatcher)";
    case MoeDispatcher::flex: {
      const RankMapping map(p, c.gpus_per_node);
      const int domains = map.nodes_spanned(map.ep_group(0, 0, 0));
      const int sms = flex_kernels(p.moe_flex, domains).sms;
      if (p.moe_flex.backend == FlexBackend::hybridep)
        return fmt::format("flex with HybridEP (a token once per NVLink domain over RDMA, then once per rank over "
                           "NVLink; its kernels hold {} SMs; MoEFlexTokenDispatcher)",
                           sms);
      return fmt::format("flex (DeepEP / HybridEP: a token once per node over RDMA, then once per rank over NVLink; "
                         "its kernels hold {} SMs; MoEFlexTokenDispatcher)",
                         sms);
    }
  }
  return "";
}


constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string ranks_str(const std::vector<int>& ranks) {
  // Compress runs with a constant stride: 0,4,8,12 -> "0-12 step 4".
  if (ranks.size() >= 3) {
    const int step = ranks[1] - ranks[0];
    bool uniform = step > 0;
    for (std::size_t i = 2; i < ranks.size() && uniform; ++i) uniform = ranks[i] - ranks[i - 1] == step;
    if (uniform)
      return step == 1 ? fmt::format("{}-{}", ranks.front(), ranks.back())
                       : fmt::format("{}-{} step {}", ranks.front(), ranks.back(), step);
  }
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

std::string nodes_str(const std::vector<int>& ranks, int gpus_per_node) {
  std::set<int> nodes;
  for (int r : ranks) nodes.insert(r / gpus_per_node);
  std::vector<int> v(nodes.begin(), nodes.end());
  return v.size() == 1 ? fmt::format("node {}", v[0]) : fmt::format("nodes {}", ranks_str(v));
}

// Each stage's decoder layers, its chunks' joined by "+": "2+3 / 3+3 / 3+2".
std::string stage_chunk_layers(const ParallelPlan& p, std::int64_t num_layers) {
  std::string out;
  for (int s = 0; s < p.pp; ++s) {
    if (s > 0) out += " / ";
    for (int c = 0; c < chunks_per_stage(p); ++c)
      out += (c > 0 ? "+" : "") + std::to_string(layers_in_chunk(p, num_layers, s, c));
  }
  return out;
}

}  // namespace

std::string ep_overlap_words(const Estimate& e) {
  const ParallelPlan& p = e.plan;
  const int m = static_cast<int>(p.num_micro_batches());
  std::string out =
      p.pp <= 1
          ? fmt::format("on (Megatron-Core's combined 1F1B: micro-batch i + 1's forward beside micro-batch i's "
                        "backward, each exchange on its own stream under the other pass's compute; {} of the {} "
                        "micro-batches paired)",
                        ep_overlap_pairs(m), p.num_micro_batches())
          : fmt::format("on (Megatron-Core's combined 1F1B in the interleaved schedule: each steady-state step runs "
                        "one model chunk's forward beside another's backward, each exchange on its own stream under "
                        "the other pass's compute; the warm-up one chunk step longer; {} of stage 0's {} chunk steps "
                        "combined, {} of the last stage's)",
                        ep_overlap_steps(p.pp, 0, m, chunks_per_stage(p)), m * chunks_per_stage(p),
                        ep_overlap_steps(p.pp, p.pp - 1, m, chunks_per_stage(p)));
  // Only when off: plans with the export's --delay-wgrad-compute print as before.
  if (!p.moe_delay_wgrad) out += "; each weight gradient inside its backward (no --delay-wgrad-compute)";
  if (!e.simulated)
    out += fmt::format("; hides {:.3f} s of the exchanges, the compute under them {:.3f} s slower for their SMs",
                       e.breakdown.ep_hidden_s, e.breakdown.ep_overlap_sm_s);
  return out;
}

std::string format_bytes_GiB(double bytes) { return fmt::format("{:.1f} GiB", bytes / kGiB); }

nlohmann::json estimate_to_json(const Estimate& e) {
  const ParallelPlan& p = e.plan;
  nlohmann::json j = plan_layout_json(p);
  j["num_micro_batches"] = p.num_micro_batches();
  j["first_stage_layers"] = p.first_stage_layers;
  j["last_stage_layers"] = p.last_stage_layers;
  // Only when set: other plans' JSON stays as it was.
  if (p.embedding_in_split) j["embedding_in_pipeline_split"] = true;
  if (p.loss_in_split) j["loss_in_pipeline_split"] = true;
  if (!p.pipeline_layout.empty()) j["pipeline_layout"] = pipeline_layout_string(p.pipeline_layout);
  j["flash_attention"] = p.flash_attention;
  j["grad_accum_fusion"] = p.grad_accum_fusion;
  // Only where another order tied: other plans' JSON stays as it was.
  if (!e.tied_orders.empty()) {
    j["tied_rank_orders"] = nlohmann::json::array();
    for (const RankOrder& o : e.tied_orders) j["tied_rank_orders"].push_back(o.str());
  }
  j["trainer"] = p.trainer.preset;
  j["dp_overlap"] = p.trainer.dp_overlap;
  j["dp_grad_bytes"] = p.trainer.dp_grad_bytes;
  // Only under Megatron-FSDP: other plans' JSON stays as it was.
  if (p.zero_stage >= 2 && p.trainer.fsdp_grad_bytes > 0) j["fsdp_grad_bytes"] = p.trainer.fsdp_grad_bytes;
  // Only when on: other plans' JSON stays as it was.
  if (p.trainer.cuda_graphs.on()) j["cuda_graphs"] = p.trainer.cuda_graphs.str();
  if (p.trainer.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (p.trainer.overlap_param_gather) j["overlap_param_gather"] = true;
  if (p.trainer.overlap_param_gather_with_optimizer_step) j["overlap_param_gather_with_optimizer_step"] = true;
  if (p.aligns_param_gather()) j["align_param_gather"] = true;
  if (p.trainer.ddp_bucket_params > 0) j["ddp_bucket_size"] = p.trainer.ddp_bucket_params;
  if (p.precision_aware_optimizer) j["precision_aware_optimizer"] = true;
  if (p.adam_moment_bytes != 4) j["adam_moment_bytes"] = p.adam_moment_bytes;
  if (p.optimizer != OptimizerKind::adam) j["optimizer"] = std::string(to_string(p.optimizer));
  if (p.fp8_attention) j["fp8_attention"] = true;
  if (e.interval) j["prediction_interval"] = interval_to_json(*e.interval);
  // Only where it prices something: other plans' JSON stays as it was.
  if (p.zero_stage == 3 && p.dp > 1) {
    j["zero3"] = zero3_to_json(p.trainer);
  }
  j["score"] = e.simulated ? "simulated" : "analytical";
  j["iteration_time_s"] = e.iteration_time_s;
  j["tokens_per_s"] = e.tokens_per_s;
  j["model_tflops_per_gpu"] = e.model_tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = e.hardware_tflops_per_gpu;
  j["mfu"] = e.mfu;
  j["hfu"] = e.hfu;
  j["memory_per_gpu_bytes"] = static_cast<std::int64_t>(e.memory.total_bytes);
  j["memory"] = {
      {"weights_and_optimizer_bytes", static_cast<std::int64_t>(e.memory.weight_and_optimizer_bytes)},
      {"activation_bytes", static_cast<std::int64_t>(e.memory.activation_bytes)},
      {"reserve_bytes", static_cast<std::int64_t>(e.memory.reserve_bytes)},
      {"capacity_bytes", static_cast<std::int64_t>(e.memory.capacity_bytes)},
      {"headroom_bytes", static_cast<std::int64_t>(e.memory.headroom_bytes())},
      {"peak_stage", e.memory.peak_stage},
      {"fits", e.memory.fits()},
  };
  j["breakdown"] = {
      {"compute", e.breakdown.compute_s},     {"tp_comm", e.breakdown.tp_comm_s},
      {"pp_comm", e.breakdown.pp_comm_s},     {"dp_comm", e.breakdown.dp_comm_s},
      {"bubble", e.breakdown.bubble_s},       {"optimizer", e.breakdown.optimizer_s},
  };
  // Only with offloading: other plans' JSON stays as it was.
  if (p.offloads_activations()) {
    j["breakdown"]["offload_wait"] = e.breakdown.offload_s;
    j["memory"]["host_activation_bytes"] = static_cast<std::int64_t>(e.memory.host_activation_bytes);
  }
  // Only with CP: other plans' JSON stays as it was.
  if (p.cp > 1) {
    j["cp"] = p.cp;
    j["cp_comm"] = std::string(to_string(p.cp_comm));
    j["breakdown"]["cp_comm"] = e.breakdown.cp_comm_s;
  }
  // Only for a mixture-of-experts model's plans.
  if (p.etp > 0) {
    j["ep"] = p.ep;
    j["etp"] = p.expert_tp();
    if (p.ep > 1) j["moe_dispatcher"] = std::string(to_string(p.moe_dispatcher));
    j["breakdown"]["ep_comm"] = e.breakdown.ep_comm_s;
    // Only with the EP overlap on: what it hid and what its SMs cost (estimated).
    if (p.moe_ep_overlap) {
      j["moe_ep_overlap"] = true;
      if (!p.moe_delay_wgrad) j["moe_delay_wgrad"] = false;
      if (!e.simulated) {
        j["breakdown"]["ep_hidden"] = e.breakdown.ep_hidden_s;
        j["breakdown"]["ep_overlap_sm"] = e.breakdown.ep_overlap_sm_s;
      }
    }
  }
  // Only with a spread, so that an even cluster's document stays as it was.
  if (e.gpu_spread > 0)
    j["gpu_spread"] = {{"sigma", e.gpu_spread}, {"gpus", p.world_size()}, {"expected_slowdown", e.gpu_spread_slowdown}};
  return j;
}

nlohmann::json search_to_json(const ModelSpec& m, const Cluster& c, const SearchResult& r,
                              const std::map<std::string, std::int64_t>& skipped, int top_k) {
  nlohmann::json j;
  j["model"] = m.name;
  j["cluster"] = c.name;
  j["nodes"] = c.nodes;
  j["gpus"] = c.total_gpus();
  j["global_batch"] = r.global_batch;
  j["seq_length"] = r.seq_length;
  j["candidates_scored"] = r.candidates;
  j["candidates_fitting"] = r.fitting_plans;
  j["candidates"] = nlohmann::json::array();
  for (std::size_t i = 0; i < r.fitting.size() && i < static_cast<std::size_t>(top_k); ++i)
    j["candidates"].push_back(estimate_to_json(r.fitting[i]));
  j["not_fitting"] = nlohmann::json::array();
  if (r.fitting.empty())
    for (const auto& e : r.not_fitting) j["not_fitting"].push_back(estimate_to_json(e));
  j["skipped"] = skipped;
  return j;
}

std::string format_interval(const Estimate& e) {
  if (!e.interval) return "";
  if (!e.interval->known) return "?";
  const int digits = e.interval->high_s >= 100 ? 1 : e.interval->high_s >= 10 ? 2 : 3;
  return fmt::format("{:.{}f}-{:.{}f}", e.interval->low_s, digits, e.interval->high_s, digits);
}

std::string format_plan_table(const std::vector<Estimate>& rows, std::size_t top_k) {
  const bool likely = !rows.empty() && rows.front().interval.has_value();
  // EP and ETP columns for a mixture-of-experts model's plans (they name their ETP).
  bool experts = false, dispatchers = false;
  for (const Estimate& e : rows) experts = experts || e.plan.etp > 0;
  // The token dispatcher where a row's experts span EP ranks (EP 1: "-").
  for (std::size_t i = 0; i < rows.size() && i < top_k; ++i) dispatchers = dispatchers || rows[i].plan.ep > 1;
  // The EP overlap's column where a row shown has it on.
  bool overlaps = false;
  for (std::size_t i = 0; i < rows.size() && i < top_k; ++i) overlaps = overlaps || rows[i].plan.moe_ep_overlap;
  const auto expert_cells = [&](const std::string& ep, const std::string& etp, const std::string& d,
                                const std::string& ov) {
    if (!experts) return std::string();
    return fmt::format("{:>3} {:>3} ", ep, etp) + (dispatchers ? fmt::format("{:>9} ", d) : std::string()) +
           (overlaps ? fmt::format("{:>3} ", ov) : std::string());
  };
  std::string out = fmt::format("{:>3} {:>3} {:>3} {}{:>3} {:>4} {:>3} {:>2} {:>4} {:>9} {:>3} {:>9} {:>9} {}{:>5} {:>10} {:>9} {:>5} {:>10} {:>9}\n",
                                "#", "TP", "CP", expert_cells("EP", "ETP", "dispatch", "ovl"),
                                "PP", "DP", "mb", "v", "ZeRO", "recompute", "SP", "order", "step(s)",
                                likely ? fmt::format("{:>13} ", "likely(s)") : std::string(), "score",
                                "tokens/s", "TFLOP/s", "MFU", "mem/GPU", "headroom");
  std::vector<std::string> tied;  // other rank orders folded into the rows shown
  for (std::size_t i = 0; i < rows.size() && i < top_k; ++i) {
    const Estimate& e = rows[i];
    const ParallelPlan& p = e.plan;
    if (!e.tied_orders.empty()) {
      for (const RankOrder& o : e.tied_orders)
        if (std::find(tied.begin(), tied.end(), o.str()) == tied.end()) tied.push_back(o.str());
    }
    out += fmt::format("{:>3} {:>3} {:>3} {}{:>3} {:>4} {:>3} {:>2} {:>4} {:>9} {:>3} {:>9} {:>9.3f} {}{:>5} {:>10.0f} {:>9.1f} {:>4.1f}% {:>10} {:>9}\n",
                       i + 1, p.tp, p.cp,
                       expert_cells(std::to_string(p.ep), std::to_string(p.expert_tp()),
                                    p.ep > 1 ? std::string(to_string(p.moe_dispatcher)) : std::string("-"),
                                    p.moe_ep_overlap ? "on" : "off"),
                       p.pp, p.dp, p.micro_batch, p.virtual_stages, p.zero_stage,
                       to_string(p.recompute), p.sequence_parallel ? "on" : "off",
                       p.order.str() + (e.tied_orders.empty() ? " " : "*"), e.iteration_time_s,
                       likely ? fmt::format("{:>13} ", format_interval(e)) : std::string(),
                       e.simulated ? "sim" : "est",
                       e.tokens_per_s, e.model_tflops_per_gpu, 100.0 * e.mfu,
                       format_bytes_GiB(e.memory.total_bytes), format_bytes_GiB(e.memory.headroom_bytes()));
  }
  if (!tied.empty())
    out += fmt::format("  * the same plan in rank order {} scores within {:g} % (one row; the trainers' tp-dp-pp where it ties)\n",
                       fmt::join(tied, " or "), 100 * kRankOrderTie);
  return out;
}

std::string format_estimate(const ModelSpec& m, const Cluster& c, const Estimate& e) {
  const ParallelPlan& p = e.plan;
  const Breakdown& b = e.breakdown;
  std::string out;
  out += fmt::format("{} on {} ({} nodes x {} {} = {} GPUs)\n", m.name, c.name, c.nodes, c.gpus_per_node, c.gpu.name,
                     c.total_gpus());
  out += fmt::format("plan: TP {}{} x PP {} x DP {}, micro-batch {}, {} micro-batches, global batch {} x {} tokens\n", p.tp,
                     p.cp > 1 ? fmt::format(" x CP {}", p.cp) : std::string(), p.pp, p.dp, p.micro_batch,
                     p.num_micro_batches(), p.global_batch, p.seq_length);
  if (p.etp > 0)
    out += fmt::format("      experts: EP {} x ETP {} x expert-DP {}: {} of the {} experts per rank, each {}; the busiest "
                       "EP rank at {:.2f} x the mean load\n",
                       p.ep, p.expert_tp(), p.expert_dp(), m.moe.num_experts / p.ep, m.moe.num_experts,
                       p.expert_tp() > 1 ? fmt::format("split over {} ranks", p.expert_tp()) : std::string("whole"),
                       ep_rank_load(m, p));
  if (p.etp > 0 && p.ep > 1)
    out += fmt::format("      token dispatcher: {}\n", dispatcher_words(p, c));
  // HybridEP's static budget and the paged stash (docs/cost-model.md "Rank capacity and paged stash").
  if (p.etp > 0 && p.moe_flex.rank_capacity_factor > 0)
    out += fmt::format("      static budget: {:.0f} token copies per EP rank (--moe-rank-capacity-factor {}), no host "
                       "sync; {}\n",
                       rank_budget_rows(m, p), p.moe_flex.rank_capacity_factor,
                       p.moe_flex.paged_stash
                           ? fmt::format("the experts' activations paged at {:.0f} rows a layer, one layer at the budget",
                                         saved_expert_rows(m, p))
                           : std::string("the experts' activations at the budget"));
  if (p.moe_ep_overlap) out += fmt::format("      EP overlap: {}\n", ep_overlap_words(e));
  if (p.cp > 1)
    out += fmt::format("      context parallel {}: {} tokens of each sequence per rank, {}\n", p.cp,
                       p.seq_per_rank(),
                       p.cp_comm == CpComm::a2a ? "Q, K, V and the output all-to-all'd (a2a)"
                                                : "K/V passed around a ring under the attention (p2p)");
  out += fmt::format("      schedule {}{}, ZeRO {}, recompute {}, sequence parallel {}, flash attention {}, "
                     "grad-accum fusion {}, rank order {}\n",
                     to_string(p.schedule),
                     p.virtual_stages > 1 ? fmt::format(" (v = {})", p.virtual_stages) : std::string(), p.zero_stage,
                     std::string(to_string(p.recompute)) +
                         (p.recompute == Recompute::selective && p.recompute_modules != 0
                              ? " (" + recompute_modules_string(p.recompute_modules) + ")"
                              : std::string()),
                     p.sequence_parallel ? "on" : "off", p.flash_attention ? "on" : "off",
                     p.grad_accum_fusion ? "on" : "off", p.order.str());
  // Only when not uniform 1: other plans print as they did.
  if (p.recompute == Recompute::full && p.recompute_layers_set())
    out += p.recompute_method == RecomputeMethod::block
               ? fmt::format("      recompute method block: the first {} layers of each model chunk recomputed, the "
                             "rest stored\n", p.recompute_num_layers)
               : fmt::format("      recompute method uniform: each model chunk's layers recomputed in groups of {}\n",
                             p.recompute_num_layers);
  // Only when not bf16: bf16 plans print as they did.
  if (p.precision != Precision::bf16)
    out += fmt::format("      precision {}: the linear layers' GEMMs in {}; {}embedding and LM head bf16{}\n",
                       to_string(p.precision), p.precision == Precision::nvfp4 ? "FP4" : "FP8",
                       p.fp8_attention_format() ? fmt::format("attention core in {} (cuDNN), ",
                                                              describe(*p.fp8_attention_format()))
                                                : std::string("attention, "),
                       p.fp8_param_gather ? "; FP8 weights all-gathered in FP8" : "");
  out += fmt::format("      trainer {}: DP reduction {} at {} bytes per gradient{}{}\n", p.trainer.preset,
                     p.trainer.dp_overlap ? "overlapped with the backward" : "after the backward",
                     p.grad_element_bytes(), p.zero_stage >= 2 && p.trainer.fsdp_grad_bytes > 0 ? " (Megatron-FSDP's)" : "",
                     p.zero_stage == 1 && p.dp > 1 && p.trainer.zero1_grad_all_reduce ? ", all-reduced (ZeRO-1)" : "");
  // Only when on: other plans print as they did.
  if (p.precision_aware_optimizer)
    out += fmt::format("      precision-aware optimizer (Transformer Engine's FusedAdam): {} bytes of optimizer states "
                       "per parameter{}, Adam's moments in {}\n",
                       p.optimizer_state_bytes(),
                       p.master_weight_remainders() ? " (master weights as 16-bit remainders of the bf16 weights)"
                                                    : "",
                       p.adam_moment_bytes == 2 ? "bf16" : "fp32");
  // Only when not Adam: other plans print as they did.
  if (p.optimizer == OptimizerKind::muon)
    out += fmt::format("      optimizer Muon: {} Newton-Schulz steps on each 2-D weight but the embedding and the LM "
                       "head, one fp32 momentum each{}\n",
                       kMuonNewtonSchulzSteps, p.zero_stage == 1 ? "; layer-wise over DP (gradients all-reduced, whole matrices per rank, "
                                           "the parameters gathered after the step)"
                                         : "");
  // Only when on: other plans print as they did.
  if (p.trainer.cuda_graphs.on() || p.trainer.tp_comm_overlap || p.trainer.overlap_param_gather ||
      p.trainer.ddp_bucket_params > 0) {
    std::string on;
    if (p.trainer.cuda_graphs.on()) on = "CUDA graphs " + p.trainer.cuda_graphs.str();
    if (p.trainer.tp_comm_overlap) on += (on.empty() ? "" : ", ") + std::string("TP comm overlapped with the GEMMs (userbuffers)");
    if (p.trainer.overlap_param_gather)
      on += fmt::format("{}parameter all-gather overlapped with the next forward{}{}", on.empty() ? "" : ", ",
                        p.aligns_param_gather() ? " (each chunk's issued one chunk ahead)" : "",
                        p.trainer.overlap_param_gather_with_optimizer_step
                            ? " (the first chunk's with the optimizer step)"
                            : "");
    if (p.trainer.ddp_bucket_params > 0)
      on += fmt::format("{}DDP buckets of {:.4g} M parameters", on.empty() ? "" : ", ",
                        static_cast<double>(p.trainer.ddp_bucket_params) / 1e6);
    out += fmt::format("      {}\n", on);
  }
  if (p.zero_stage == 3 && p.dp > 1) {
    const TrainerSettings& t = p.trainer;
    std::string ahead;
    if (t.zero3_prefetch_units > 0) ahead = fmt::format("{} unit(s)", t.zero3_prefetch_units);
    if (t.zero3_prefetch_params > 0)
      ahead += fmt::format("{}up to {:.3g} elements", ahead.empty() ? "" : ", ",
                           static_cast<double>(t.zero3_prefetch_params));
    out += fmt::format("      ZeRO-3: gathers per {}, prefetch {}{}{}{}\n",
                       t.zero3_unit == Zero3Unit::tensor ? "weight tensor" : "transformer block",
                       ahead.empty() ? "none" : ahead,
                       t.zero3_sync ? ", host waits for the device before each fetch" : "",
                       t.zero3_list_collectives ? ", list-form collectives (a copy kernel per rank)" : "",
                       t.zero3_fetch_norm ? ", a norm of each fetched tensor" : "");
    if (t.zero3_reduce_per_tensor) out += "      ZeRO-3: one gradient reduce-scatter per parameter tensor\n";
  }
  if (has_uneven_stages(p)) {
    out += fmt::format("      uneven stages: first {} layers, {} middle stages of {}, last {}\n",
                       layers_on_stage(p, m.num_layers, 0), p.pp - 2, layers_on_stage(p, m.num_layers, 1),
                       layers_on_stage(p, m.num_layers, p.pp - 1));
  }
  if (has_pipeline_layout(p)) {
    // Megatron-Core's split: the decoder layers of each stage's chunks.
    const std::string how = !p.pipeline_layout.empty() ? "layout " + pipeline_layout_string(p.pipeline_layout)
                            : p.embedding_in_split && p.loss_in_split ? "embedding and loss counted as layers"
                            : p.embedding_in_split                    ? "embedding counted as a layer"
                                                                      : "loss counted as a layer";
    out += fmt::format("      pipeline layout: {}; decoder layers of stage 0 / 1 / ... / {}: {}\n", how, p.pp - 1,
                       stage_chunk_layers(p, m.num_layers));
  }
  out += "\n";
  out += fmt::format("iteration time      {:10.3f} s   ({})\n", e.iteration_time_s,
                     e.simulated ? "discrete-event simulation" : "analytical estimate");
  if (e.interval) {
    if (e.interval->known)
      out += fmt::format("likely measured     {:10.3f} - {:.3f} s   ({})\n", e.interval->low_s, e.interval->high_s,
                         e.interval->basis);
    else
      out += fmt::format("likely measured        unknown   ({})\n", e.interval->basis);
  }
  out += fmt::format("throughput          {:10.0f} tokens/s\n", e.tokens_per_s);
  out += fmt::format("model TFLOP/s/GPU   {:10.1f}     MFU {:5.1f}%\n", e.model_tflops_per_gpu, 100 * e.mfu);
  out += fmt::format("hardware TFLOP/s/GPU{:10.1f}     HFU {:5.1f}%\n", e.hardware_tflops_per_gpu, 100 * e.hfu);
  out += "\nbreakdown of the iteration (critical path):\n";
  const double t = std::max(e.iteration_time_s, 1e-30);
  auto row = [&](const char* name, double s) {
    out += fmt::format("  {:<12}{:10.3f} s  {:5.1f}%\n", name, s, 100.0 * s / t);
  };
  row("compute", b.compute_s);
  row("TP comm", b.tp_comm_s);
  if (p.cp > 1) row("CP comm", b.cp_comm_s);
  if (p.ep > 1) row("EP comm", b.ep_comm_s);
  row("PP comm", b.pp_comm_s);
  row("DP comm", b.dp_comm_s);
  row("bubble", b.bubble_s);
  row("optimizer", b.optimizer_s);
  if (p.offloads_activations()) row("host copies", b.offload_s);
  if (e.gpu_spread > 0)
    out += fmt::format("  GPU speed spread sigma {:.2f}%: compute waits for the slowest GPU, the slowest of {} takes "
                       "x{:.4f} a median GPU's time (--gpu-spread 0: off)\n",
                       100 * e.gpu_spread, p.world_size(), e.gpu_spread_slowdown);
  const MemoryReport& mem = e.memory;
  out += fmt::format("\nmemory per GPU (peak on stage {}):\n", mem.peak_stage);
  out += fmt::format("  weights + optimizer {:>10}   ({:.2f} B parameters on this GPU)\n",
                     format_bytes_GiB(mem.weight_and_optimizer_bytes), mem.parameters / 1e9);
  out += fmt::format("  activations         {:>10}\n", format_bytes_GiB(mem.activation_bytes));
  out += fmt::format("  workspace reserve   {:>10}\n", format_bytes_GiB(mem.reserve_bytes));
  if (p.offload_layers > 0)
    out += fmt::format("  offloaded to host   {:>10}   (pinned host memory per GPU: {} layers' activations; {} per host)\n",
                       format_bytes_GiB(mem.host_activation_bytes), p.offload_layers,
                       format_bytes_GiB(mem.host_activation_bytes * c.host_gpus()));
  if (p.offload_modules != 0)
    out += fmt::format("  offloaded to host   {:>10}   (pinned host memory per GPU: {}'s saved tensors; {} per host)\n",
                       format_bytes_GiB(mem.host_activation_bytes), offload_modules_string(p.offload_modules),
                       format_bytes_GiB(mem.host_activation_bytes * c.host_gpus()));
  out += fmt::format("  total               {:>10} of {} -> {}\n", format_bytes_GiB(mem.total_bytes),
                     format_bytes_GiB(mem.capacity_bytes),
                     mem.fits() ? fmt::format("fits, {} headroom", format_bytes_GiB(mem.headroom_bytes()))
                                : fmt::format("DOES NOT FIT, {} over", format_bytes_GiB(-mem.headroom_bytes())));
  return out;
}

std::string format_mesh(const ParallelPlan& plan, const Cluster& c) {
  RankMapping map(plan, c.gpus_per_node);
  const int gpn = c.gpus_per_node;
  const int nodes_used = (plan.world_size() + gpn - 1) / gpn;
  std::string out = fmt::format(
      "TP {}{} x PP {} x DP {} = {} GPUs on {} node(s) x {} GPUs, rank order {} (first named = innermost{})\n"
      "cell = stage p, DP replica d, {}TP rank t\n\n",
      plan.tp, plan.cp > 1 ? fmt::format(" x CP {}", plan.cp) : std::string(), plan.pp, plan.dp, plan.world_size(),
      nodes_used, gpn, plan.order.str(),
      plan.cp <= 1                 ? std::string()
      : plan.order.cp_next_to_tp() ? "; CP next to TP, Megatron-Core's " + plan.order.megatron_name()
                                   : std::string("; CP inside DP"),
      plan.cp > 1 ? "CP rank c, " : "");
  constexpr int kMaxNodesShown = 16;
  out += fmt::format("{:>8}", "");
  for (int g = 0; g < gpn; ++g) out += fmt::format(" {:>11}", fmt::format("gpu{}", g));
  out += "\n";
  for (int n = 0; n < nodes_used && n < kMaxNodesShown; ++n) {
    out += fmt::format("{:>8}", fmt::format("node {}", n));
    for (int g = 0; g < gpn; ++g) {
      const int r = n * gpn + g;
      if (r >= plan.world_size()) {
        out += fmt::format(" {:>11}", "-");
        continue;
      }
      RankCoord k = map.coord(r);
      out += fmt::format(" {:>11}", plan.cp > 1 ? fmt::format("p{}d{}c{}t{}", k.pp, k.dp, k.cp, k.tp)
                                                : fmt::format("p{} d{} t{}", k.pp, k.dp, k.tp));
    }
    out += "\n";
  }
  if (nodes_used > kMaxNodesShown) out += fmt::format("   ... {} more nodes\n", nodes_used - kMaxNodesShown);

  auto section = [&](const char* title, const std::vector<std::vector<int>>& groups, bool flag_cross) {
    out += fmt::format("\n{} ({} groups of {}):\n", title, groups.size(), groups.empty() ? 0 : groups[0].size());
    int crossing = 0;
    for (const auto& g : groups) crossing += map.nodes_spanned(g) > 1 ? 1 : 0;
    constexpr std::size_t kMaxGroupsShown = 8;
    for (std::size_t i = 0; i < groups.size() && i < kMaxGroupsShown; ++i)
      out += fmt::format("  ranks {:<22} on {}\n", ranks_str(groups[i]), nodes_str(groups[i], gpn));
    if (groups.size() > kMaxGroupsShown) out += fmt::format("  ... {} more\n", groups.size() - kMaxGroupsShown);
    if (flag_cross && crossing > 0)
      out += fmt::format("  WARNING: {} of {} TP groups cross nodes: TP all-reduces leave NVLink for the inter-node fabric\n",
                         crossing, groups.size());
    else if (flag_cross)
      out += "  every TP group stays inside one node (NVLink)\n";
  };
  section("TP groups", map.tp_groups(), true);
  section("Pipelines (PP groups, stage 0 first)", map.pp_groups(), false);
  if (plan.cp > 1) section("CP groups (the ranks that split one sequence)", map.cp_groups(), false);
  section(plan.cp > 1 ? "DP groups (DP x CP: the gradient reduction)" : "DP groups", map.dp_groups(), false);
  if (plan.ep > 1) {
    section("EP groups (an MoE layer's dispatch and combine all-to-alls)", map.ep_groups(), false);
    const int edp = plan.expert_dp();
    if (edp > 1) {
      std::vector<std::vector<int>> groups;
      for (int s = 0; s < plan.pp; ++s)
        for (int e = 0; e < plan.ep; ++e)
          for (int t = 0; t < plan.expert_tp(); ++t) groups.push_back(map.expert_dp_group(s, e, t));
      section("expert-DP groups (the experts' gradient reduction)", groups, false);
    }
  }
  return out;
}

}  // namespace cuboid
