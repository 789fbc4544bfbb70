// DeepSpeed v0.16.4. Keys and types: microsoft/DeepSpeed deepspeed/runtime/config.py,
// runtime/zero/config.py, runtime/constants.py@v0.16.4; the pipeline engine
// (runtime/pipe/engine.py, module.py) reads only pipeline.activation_checkpoint_interval
// (and pipe_partitioned / grad_partitioned) from the config: stages and their split
// come from PipelineModule in the user's code, which the notes spell out.
// tests/data/trainer_options/deepspeed-v0.16.4.json holds the keys.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "export_common.hpp"

namespace cuboid::exporters {

namespace {

// Refuses a model or a parallel layout that ds_config.json cannot express.
void check_layout(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  if (pf.model.moe.enabled())
    refuse(pf, "model.moe",
           "DeepSpeed's config has no experts: its MoE layers (deepspeed.moe.layer.MoE, their expert-parallel "
           "size included) come from the model code",
           "export with --to megatron or --to megatron-bridge");
  refuse_mla_mtp(pf, "DeepSpeed's config");
  refuse_pipeline_layout(pf, "DeepSpeed's config");
  refuse_megatron_overlaps(pf, "DeepSpeed's config");
  refuse_precision_aware_optimizer(pf, "DeepSpeed's config",
                                   "its optimizers keep fp32 master weights and Adam moments of their own");
  refuse_muon(pf, "DeepSpeed's config", "its optimizers are its own");
  refuse_offload(pf, "DeepSpeed's config",
                 "its activation checkpointing's cpu_checkpointing moves checkpoints of a full recomputation, "
                 "not the saved activations of layers run without recomputation");
  if (p.cp > 1)
    refuse(pf, "parallel.cp",
           "DeepSpeed's config has no context parallelism: its sequence parallelism (DeepSpeed-Ulysses) comes from "
           "the model code, and the ring of K/V the plan was priced with is Transformer Engine's",
           "export with --to megatron or --to megatron-bridge, or plan with --cp 1");
  if (p.tp > 1)
    refuse(pf, "parallel.tp",
           "DeepSpeed's config has no tensor-parallel size: Megatron-style TP (and sequence parallelism) comes from "
           "the model code, e.g. Megatron-DeepSpeed's --tensor-model-parallel-size",
           "export with --to megatron, or plan with --tp 1");
  if (p.pp > 1 && p.schedule == Schedule::interleaved)
    refuse(pf, "parallel.schedule",
           "DeepSpeed's pipeline engine has no interleaved (virtual-stage) schedule; it runs one 1F1B schedule "
           "(TrainSchedule)",
           "plan with --schedule 1f1b, or export with --to megatron");
  if (p.pp > 1 && p.schedule == Schedule::gpipe)
    refuse(pf, "parallel.schedule", "DeepSpeed's pipeline engine has no GPipe schedule; it runs 1F1B (TrainSchedule)",
           "plan with --schedule 1f1b");
  if (p.pp > 1 && p.zero_stage >= 2)
    refuse(pf, "parallel.zero_stage",
           fmt::format("DeepSpeed's pipeline engine rejects ZeRO-{} (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                       "parallelism\", deepspeed/runtime/pipe/engine.py)",
                       p.zero_stage),
           "plan with --zero 0 or 1, or with --pp 1");
  if (has_uneven_stages(p))
    refuse(pf, "parallel.first_stage_layers",
           "DeepSpeed's PipelineModule splits layers by its own partition method (uniform, parameters, type:...), "
           "not by fixed first / last stage sizes",
           "plan without uneven stages");
  if (p.pp > 1 && p.dp > 1 && position(p.order, Dim::pp) < position(p.order, Dim::dp))
    refuse(pf, "parallel.rank_order",
           "DeepSpeed's PipeDataParallelTopology (axes pipe, data) puts data-parallel ranks inside pipelines, not "
           "rank order " + p.order.str(),
           "plan with --rank-order tp-dp-pp");
  if (p.recompute == Recompute::selective)
    refuse(pf, "parallel.recompute",
           "DeepSpeed has no selective (attention-core) recomputation; its activation checkpointing recomputes whole "
           "layers",
           "plan with --recompute none or full");
  refuse_recompute_layers(pf,
                          "DeepSpeed's pipeline engine checkpoints every layer of a stage "
                          "(pipeline.activation_checkpoint_interval counts the stage's embedding and head "
                          "among its layers), not Megatron-Core's block or uniform method of each model "
                          "chunk's decoder layers");
  if (p.recompute == Recompute::full && p.pp == 1)
    refuse(pf, "parallel.recompute",
           "without pipeline parallelism DeepSpeed's config cannot switch recomputation on (the model code calls "
           "deepspeed.checkpointing.checkpoint)",
           "plan with --recompute none, or with --pp > 1 where pipeline.activation_checkpoint_interval expresses it");
  if (p.grad_accum_fusion)
    refuse(pf, "parallel.grad_accum_fusion",
           "DeepSpeed's engine adds each micro-batch's gradients to its accumulation buffers in a separate pass, "
           "not inside the weight-gradient GEMMs, and the plan was priced with Megatron's fused accumulation",
           "plan with --grad-accum-fusion off (plan --for deepspeed does)");
}

// Which optimizer wrapper DeepSpeed picks (runtime/engine.py
// _do_optimizer_sanity_check): bf16 with ZeRO 0-1 and fp32 accumulation is
// the BF16_Optimizer (fp32 gradients, all-reduced after the last backward);
// ZeRO 1-3 otherwise the ZeRO optimizer, which reduces in the 16-bit dtype.
struct Optimizer {
  bool fp16;
  bool bf16_optimizer;
};

Optimizer optimizer(const ParallelPlan& p) {
  const bool fp16 = p.trainer.dp_grad_bytes == 2;
  return {fp16, !fp16 && p.zero_stage <= 1};
}

// Refuses a gradient reduction that DeepSpeed's optimizer wrapper would not run as priced.
void check_gradients(const PlanFile& pf, const Optimizer& o) {
  const ParallelPlan& p = pf.plan;
  if (!o.fp16 && p.zero_stage >= 2)
    refuse(pf, "trainer.dp_grad_bytes",
           fmt::format("DeepSpeed's ZeRO-{} optimizer with bf16 accumulates and reduces gradients in bf16, and the "
                       "plan was priced with fp32 gradients",
                       p.zero_stage),
           "plan with --trainer deepspeed-2021 (fp16 ZeRO, as DeepSpeed runs it), or with --zero 0 or 1");
  if (p.dp > 1 && p.trainer.dp_overlap && (p.pp > 1 || o.bf16_optimizer))
    refuse(pf, "trainer.dp_overlap",
           p.pp > 1 ? "DeepSpeed's pipeline engine reduces gradients after the last micro-batch's backward "
                      "(TrainSchedule's ReduceGrads), and the plan was priced with the reduction overlapped"
                    : "DeepSpeed's BF16_Optimizer all-reduces the gradients after the backward, and the plan was "
                      "priced with the reduction overlapped",
           "plan --for deepspeed (it prices DeepSpeed's reduction)");
  // runtime/bf16_optimizer.py@v0.16.4 __init__: the fp32 master weights and
  // the optimizer's states are partitioned over the data-parallel group
  // (fp32_groups_flat_partition) and the bf16 parameters all-gathered after the
  // step (all_gather_dp_groups), with ZeRO 0 as with ZeRO 1.
  if (p.dp > 1 && p.zero_stage == 0 && o.bf16_optimizer)
    refuse(pf, "parallel.zero_stage",
           "DeepSpeed with bf16 and ZeRO 0 runs its BF16_Optimizer, which partitions the fp32 master weights and "
           "Adam's moments over DP and all-gathers the parameters after the step, as ZeRO-1 does; the plan was "
           "priced with every rank holding the whole optimizer",
           "plan with --zero 1 (the same BF16_Optimizer, priced as it runs), or plan --for deepspeed");
  if (p.dp > 1 && p.zero_stage == 1 && o.bf16_optimizer && !p.trainer.zero1_grad_all_reduce)
    refuse(pf, "trainer.zero1_grad_all_reduce",
           "DeepSpeed's BF16_Optimizer all-reduces the full gradients with ZeRO-1, and the plan was priced with a "
           "reduce-scatter (Megatron's distributed optimizer)",
           "plan --for deepspeed (it prices DeepSpeed's reduction)");
}

nlohmann::ordered_json ds_config(const ParallelPlan& p, const Optimizer& o) {
  nlohmann::ordered_json j;
  j["train_batch_size"] = p.global_batch;
  j["train_micro_batch_size_per_gpu"] = p.micro_batch;
  // train_batch_size = micro batch x gradient accumulation x data-parallel ranks.
  j["gradient_accumulation_steps"] = p.num_micro_batches();
  if (o.fp16) j["fp16"] = {{"enabled", true}};
  else j["bf16"] = {{"enabled", true}};
  // Without it bf16 with ZeRO-1 accumulates gradients in bf16 (get_data_types).
  if (o.bf16_optimizer) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  j["zero_optimization"] = {{"stage", p.zero_stage}};
  // overlap_comm defaults to false for stages 1-2 and true for 3 (zero/config.py overlap_comm_valid).
  if (!o.bf16_optimizer && (p.zero_stage == 1 || p.zero_stage == 2))
    j["zero_optimization"]["overlap_comm"] = p.trainer.dp_overlap;
  if (p.zero_stage == 3 && p.trainer.zero3_unit == Zero3Unit::tensor) {
    // The ZeRO-3 settings the plan was priced with (deepspeed/runtime/zero/config.py keys).
    j["zero_optimization"]["stage3_param_persistence_threshold"] = p.trainer.zero3_persist_params;
    j["zero_optimization"]["stage3_prefetch_bucket_size"] = p.trainer.zero3_prefetch_params;
    j["zero_optimization"]["stage3_max_reuse_distance"] = p.trainer.zero3_reuse_params;
    j["zero_optimization"]["reduce_bucket_size"] = p.trainer.zero3_reduce_bucket_params;
  }
  // Read by the pipeline engine only when > 0; PipelineModule's own argument otherwise.
  if (p.pp > 1 && p.recompute == Recompute::full) j["pipeline"] = {{"activation_checkpoint_interval", 1}};
  return j;
}

// What the user's code and launch add to ds_config.json (stderr).
std::string notes(const PlanFile& pf) {
  const ParallelPlan& p = pf.plan;
  std::string out = header(pf, "#", "DeepSpeed v0.16.4");
  if (p.pp > 1) {
    out += fmt::format(
        "# The pipeline is built in the model code, not in ds_config.json (deepspeed/runtime/pipe/module.py@v0.16.4):\n"
        "#   model = PipelineModule(layers=[...], num_stages={0}, partition_method=\"type:DecoderLayer\",\n"
        "#                          activation_checkpoint_interval={1}, checkpointable_layers=[\"DecoderLayer\"],\n"
        "#                          loss_fn=...)\n"
        "# with DecoderLayer the class name of your transformer layer: \"type:\" balances those layers,\n"
        "# {2} per stage as planned; \"uniform\" would count the embedding, final norm and head as layers too.\n"
        "# checkpointable_layers keeps those out of activation checkpointing (module.py _is_checkpointable\n"
        "# checkpoints every layer with parameters otherwise, and a checkpointed embedding gets no gradient).\n"
        "# num_stages={0} on {3} GPUs gives {4} data-parallel pipelines (PipeDataParallelTopology).\n",
        p.pp, p.recompute == Recompute::full ? 1 : 0, pf.model.num_layers / p.pp, p.world_size(), p.dp);
  }
  // deepspeed/__init__.py initialize asserts the config comes either from
  // args.deepspeed_config or from config=, not both.
  out += "# In train.py (args from deepspeed.add_config_arguments(parser), which reads --deepspeed_config):\n"
         "#   engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=...)\n";
  out += "# Add: data loading, the tokenizer, the optimizer (an \"optimizer\" block or a client optimizer) and\n"
         "# checkpointing (engine.save_checkpoint / load_checkpoint).\n";
  out += fmt::format(
      "# Launch (a hostfile lists the {0} {2}s, {1} slots each):\n"
      "#   deepspeed --hostfile hostfile --num_nodes {0} --num_gpus {1} train.py --deepspeed --deepspeed_config "
      "ds_config.json\n",
      pf.hosts(), pf.host_gpus(), host_word(pf));
  return out;
}

}  // namespace

ExportResult deepspeed(const PlanFile& pf) {
  // deepspeed/runtime/config.py and constants.py@v0.16.4 have no FP8 or FP4
  // key: the config selects fp16 or bf16 only.
  if (pf.plan.precision != Precision::bf16)
    refuse_precision(pf,
                     "DeepSpeed v0.16.4's configuration has no quantized-GEMM setting (runtime/config.py reads "
                     "fp16 and bf16 sections only; FP8 layers would be the model code's own)",
                     "export with --to megatron or --to megatron-bridge");
  check_layout(pf);
  const Optimizer o = optimizer(pf.plan);
  check_gradients(pf, o);
  return {ds_config(pf.plan, o).dump(2) + "\n", notes(pf)};
}

}  // namespace cuboid::exporters
