// NeMo 1.x at 8cfedd72: the YAML overlay on megatron_gpt_config.yaml, the
// model's start-up overrides (megatron_base_model.py) and the optimizer the
// overlay names, on Megatron-Core's parallel state.
#include <fmt/format.h>

#include <string>
#include <utility>

#include "resolve_common.hpp"

namespace cuboid::resolve {

namespace {

std::string nemo(std::string_view file_line, std::string_view what) {
  return fmt::format("nemo/collections/nlp/{}@8cfedd72: {}", file_line, what);
}
std::string yaml(int line, std::string_view what) {
  return fmt::format("examples/nlp/language_modeling/conf/megatron_gpt_config.yaml:{}@8cfedd72: {}", line, what);
}

}  // namespace

ResolvedRun nemo1(const ExportResult& e) {
  const ExportedOptions y = read_yaml_keys(e.text);
  auto has = [&](const char* key) { return y.count(key) > 0 && y.find(key)->second != "null"; };
  auto num = [&](const char* key, std::int64_t fallback) {
    return has(key) ? to_int(y.find(key)->second, key) : fallback;
  };
  // A key the overlay sets, or megatron_gpt_config.yaml's value at `line`.
  auto flag = [&](const char* key, bool fallback, int line) -> std::pair<bool, std::string> {
    if (has(key)) return {truthy(y.find(key)->second), std::string("the overlay's ") + key};
    if (line == 0) return {fallback, std::string(key) + " absent (off)"};
    return {fallback, yaml(line, std::string(key) + " default")};
  };
  Builder b("nemo");
  const std::int64_t world = num("trainer.num_nodes", 1) * num("trainer.devices", 1);
  b.set("world", world, "trainer.num_nodes x trainer.devices");
  const std::int64_t tp = num("model.tensor_model_parallel_size", 1);
  const std::int64_t pp = num("model.pipeline_model_parallel_size", 1);
  const std::int64_t cp = num("model.context_parallel_size", 1);
  b.set("tp", tp, "model.tensor_model_parallel_size (default 1)");
  b.set("pp", pp, "model.pipeline_model_parallel_size (default 1)");
  b.set("cp", cp, "model.context_parallel_size (default 1)");
  if (tp * pp * cp <= 0 || world % (tp * pp * cp) != 0) {
    b.fail(fmt::format("world {} is not divisible by TP x PP x CP = {} (parallel_state.py)", world, tp * pp * cp));
    return b.done();
  }
  const std::int64_t dp = world / (tp * pp * cp);
  b.set("dp", dp, "world / (TP x PP x CP): Megatron-Core's initialize_model_parallel (nlp_overrides.py:173)");
  if (cp > 1) b.set("cp_comm", y.count("model.cp_comm_type") ? y.find("model.cp_comm_type")->second : "p2p",
                    "model.cp_comm_type, TransformerConfig's p2p by default");
  const bool moe = has("model.num_moe_experts");
  if (moe) {
    const std::int64_t ep = num("model.expert_model_parallel_size", 1);
    b.set("ep", ep, "model.expert_model_parallel_size (default 1)");
    b.set("etp", tp, nemo("parts/nlp_overrides.py:173", "no expert tensor-parallel size is passed: ETP = TP"));
    b.set("moe_dispatcher", y.count("model.moe_token_dispatcher_type") ? y.find("model.moe_token_dispatcher_type")->second
                                                                        : "allgather",
          "model.moe_token_dispatcher_type, TransformerConfig's allgather by default");
  }
  const std::int64_t micro = num("model.micro_batch_size", 4);
  const std::int64_t global = num("model.global_batch_size", 8);
  b.set("micro_batch", micro, has("model.micro_batch_size") ? "model.micro_batch_size" : yaml(81, "micro_batch_size 4"));
  b.set("global_batch", global, has("model.global_batch_size") ? "model.global_batch_size" : yaml(82, "global_batch_size 8"));
  if (global % (micro * dp) != 0)
    b.fail(fmt::format("global batch {} is not divisible by micro-batch x DP = {} (Megatron-Core's "
                       "num_microbatches_calculator.py)", global, micro * dp));
  else
    b.set("num_micro_batches", global / (micro * dp), "global batch / (micro-batch x DP)");
  if (has("model.virtual_pipeline_model_parallel_size"))
    b.fail(nemo("models/language_modeling/megatron_gpt_model.py:194",
                "mcore_model_customize asserts virtual_pipeline_model_parallel_size is None"));
  b.set("virtual_stages", std::int64_t{1}, yaml(86, "virtual_pipeline_model_parallel_size null"));
  b.set("schedule", pp > 1 ? "1f1b" : "none", "Megatron-Core's get_forward_backward_func: 1F1B without virtual stages");
  const auto sp = flag("model.sequence_parallel", false, 224);
  b.set("sequence_parallel", sp.first && tp > 1,
        sp.second + "; " + nemo("models/language_modeling/megatron_base_model.py:1019", "turned off with TP 1"));
  const std::string granularity = y.count("model.activations_checkpoint_granularity")
                                      ? y.find("model.activations_checkpoint_granularity")->second
                                      : "null";
  std::string recompute = granularity == "null" ? "none" : granularity;
  // Handed to Megatron-Core's TransformerConfig as recompute_method /
  // recompute_num_layers (megatron_base_model.py:558-559@8cfedd72).
  if (granularity == "full") {
    const auto key = [&](const char* k) { return y.count(k) ? y.find(k)->second : std::string(); };
    recompute = full_recompute(key("model.activations_checkpoint_method"), key("model.activations_checkpoint_num_layers"));
  }
  b.set("recompute", recompute, yaml(198, "activations_checkpoint_granularity (default null: none)"));
  // The optimizer the overlay names (megatron_base_model.py:151-152).
  const std::string optim = y.count("model.optim.name") ? y.find("model.optim.name")->second : "fused_adam";
  const bool mcore_dist = optim == "mcore_distributed_optim";
  const bool dist_adam = optim == "distributed_fused_adam" || mcore_dist;
  const std::string osrc = nemo("models/language_modeling/megatron_base_model.py:151",
                                "model.optim.name " + optim + (dist_adam ? ": a distributed optimizer" : ""));
  b.set("optimizer", "adam", osrc);
  b.set("zero_stage", std::int64_t{dist_adam ? 1 : 0}, osrc);
  b.set("zero1_grad_all_reduce", !dist_adam, "Megatron-Core's distributed optimizer reduce-scatters");
  const auto o2 = flag("model.megatron_amp_O2", true, 152);
  if (mcore_dist) {
    const auto overlap = flag("model.optim.overlap_grad_sync", false, 0);
    b.set("dp_overlap", overlap.first,
          nemo("models/language_modeling/megatron_gpt_model.py:602", "overlap_grad_reduce = optim.overlap_grad_sync "
                                                                      "(default False)"));
    const std::string dtype = y.count("model.optim.grad_sync_dtype") ? y.find("model.optim.grad_sync_dtype")->second : "fp32";
    b.set("dp_grad_bytes", std::int64_t{dtype == "fp32" ? 4 : 2},
          nemo("models/language_modeling/megatron_gpt_model.py:601", "grad_reduce_in_fp32 = grad_sync_dtype == fp32 "
                                                                     "(default fp32)"));
  } else {
    // megatron_gpt_model.py:956-964 training_step: with O2 the main grads are
    // all-reduced after the backward with PP > 1 or SP; otherwise by the
    // wrapper's hooks during the backward.
    const bool after = !o2.first || pp > 1 || (sp.first && tp > 1);
    b.set("dp_overlap", !after, nemo("models/language_modeling/megatron_gpt_model.py:956",
                                     "all-reduced after the backward with PP > 1, SP or without O2"));
    b.set("dp_grad_bytes", std::int64_t{4}, "O2's fp32 main gradients");
  }
  // megatron_base_model.py:1038-1053: fusion dropped with DP > 1, PP 1 and no
  // distributed optimizer, and without O2.
  const auto fusion = flag("model.gradient_accumulation_fusion", false, 157);
  const bool fused = fusion.first && o2.first && !(dp > 1 && pp == 1 && !dist_adam);
  b.set("grad_accum_fusion", fused,
        fusion.second + "; " + nemo("models/language_modeling/megatron_base_model.py:1038",
                                    "dropped without O2, or with DP > 1, PP 1 and no distributed optimizer"));
  const auto tp_pp_dp = flag("model.use_tp_pp_dp_mapping", false, 0);
  b.set("rank_order", megatron_order(tp_pp_dp.first),
        nemo("parts/nlp_overrides.py:173", "tp-cp-ep-pp-dp with use_tp_pp_dp_mapping, else tp-cp-ep-dp-pp"));
  if (moe && tp_pp_dp.first && pp > 1 &&
      world / (tp * num("model.expert_model_parallel_size", 1) * pp) != dp)
    b.fail("megatron/core/parallel_state.py: with rank order tp-pp-dp and PP > 1 the experts' data-parallel size must "
           "equal the layers'");
  const auto te = flag("model.transformer_engine", false, 227);
  b.set("attention", te.first ? "fused" : "unfused",
        te.second + " (the mcore layer spec: Transformer Engine's fused attention, else the local unfused one)");
  b.set("params_bytes", std::int64_t{e.text.find("  precision: bf16\n") != std::string::npos ? 2 : 4},
        yaml(11, "trainer.precision bf16"));
  const auto fp8 = flag("model.fp8", false, 0);
  std::string precision = "bf16";
  if (fp8.first) precision = "fp8-delayed";  // NeMo 1.x's FP8 keys are delayed scaling's
  b.set("precision", precision, "model.fp8 (delayed scaling: fp8_amax_history_len / fp8_amax_compute_algo)");
  if (fp8.first) {
    const auto params = flag("model.fp8_params", false, 0);
    b.set("fp8_param_gather", params.first, "model.fp8_params");
  }
  b.set("hidden_dropout", probability(y.count("model.hidden_dropout") ? y.find("model.hidden_dropout")->second : "0.1",
                                      "hidden_dropout"),
        yaml(98, "hidden_dropout 0.1 unless set"));
  b.set("attention_dropout",
        probability(y.count("model.attention_dropout") ? y.find("model.attention_dropout")->second : "0.1",
                    "attention_dropout"),
        yaml(99, "attention_dropout 0.1 unless set"));
  return b.done();
}

}  // namespace cuboid::resolve
