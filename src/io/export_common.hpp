#pragma once
// Private to the exporters (src/io/export_*.cpp): the shared refusal, header
// and rank-order helpers, and one entry point per target.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuboid/io/export.hpp"

namespace cuboid::exporters {

[[noreturn]] void refuse(const PlanFile& pf, const std::string& field, const std::string& problem,
                         const std::string& fix);
// Refuses a model with multi-head latent attention or multi-token-prediction
// layers: only the Megatron-LM export writes them; `trainer` names the target.
void refuse_mla_mtp(const PlanFile& pf, std::string_view trainer);
// Refuses a plan with Megatron-Core's pipeline layout (the embedding or the
// loss counted as layers, or a layout string): only --to megatron writes it.
void refuse_pipeline_layout(const PlanFile& pf, std::string_view trainer);
// A plan priced with Megatron-Core's CUDA graphs (unless the trainer has
// them too), TP communication overlap or overlapped parameter gather, for a
// trainer without them.
void refuse_megatron_overlaps(const PlanFile& pf, std::string_view trainer, bool has_cuda_graphs = false);
// Refuses a plan that offloads activations to host memory
// (--offload-activations): only the Megatron-Core exports write it; `why`
// says what the target has instead.
void refuse_offload(const PlanFile& pf, std::string_view trainer, std::string_view why);
// Refuses a plan with Megatron-Core's partial full recomputation (a
// --recompute-method or --recompute-num-layers other than uniform 1): only
// the Megatron-LM, Megatron-Bridge and NeMo exports write it; `why` says
// what the target's checkpointing does instead.
void refuse_recompute_layers(const PlanFile& pf, std::string_view why);
// Refuses Megatron-Core's precision-aware optimizer (Transformer Engine's
// FusedAdam holding the optimizer's states, Adam's moments in bf16), which
// `trainer`'s optimizer does not have (`why`).
void refuse_precision_aware_optimizer(const PlanFile& pf, std::string_view trainer, std::string_view why);
// A Muon plan (ParallelPlan::optimizer) on a target without Megatron-Core's emerging optimizers.
void refuse_muon(const PlanFile& pf, std::string_view trainer, std::string_view why);
// Refuses FP8 attention (Megatron-Core's fp8_dot_product_attention), which
// `trainer`'s settings cannot turn on (`why`).
void refuse_fp8_attention(const PlanFile& pf, std::string_view trainer, std::string_view why);
// A plan that gives its own DDP bucket size (--ddp-bucket-size), to a target without one.
void refuse_ddp_bucket_size(const PlanFile& pf, std::string_view trainer, std::string_view why);

bool default_rank_order(const ParallelPlan& p);
// Index of `d` in the rank order, 0 = innermost.
int position(const RankOrder& order, Dim d);
// The two comment lines every export starts with; `target` names the trainer and its version.
std::string header(const PlanFile& pf, std::string_view comment, std::string_view target);
// Transformer layers per (virtual) pipeline stage.
std::int64_t layers_per_virtual_stage(const PlanFile& pf);
// Megatron-Core's position_embedding_type for the model ("learned_absolute" or
// "rope"); refuses an ALiBi model, which Megatron-Core cannot build. `trainer`
// names the target in the message.
std::string_view position_embedding_type(const PlanFile& pf, std::string_view trainer);
// The rotary base as the integer Megatron-style flags take; refuses a fractional one.
std::int64_t integral_rope_theta(const PlanFile& pf);
// Which layers are MoE layers as Megatron's --moe-layer-freq list expression
// ("[0]*3+[1]*58": 3 dense layers, then 58 MoE layers); "" when every layer is.
std::string moe_layer_pattern(const ModelSpec& m);
// Megatron-Core's rank orders: tp-dp-pp by default, tp-pp-dp where `option`
// asks for it; refuses any other. True for tp-pp-dp. `trainer` names the target.
bool megatron_tp_pp_dp(const PlanFile& pf, std::string_view trainer, std::string_view option);
// Refuses a ZeRO-1 plan priced with the gradients all-reduced in full
// (DeepSpeed's BF16_Optimizer): Megatron-Core's distributed optimizer
// reduce-scatters them. `trainer` names the target.
void refuse_zero1_all_reduce(const PlanFile& pf, std::string_view trainer);
// Megatron FSDP's data_parallel_sharding_strategy for ZeRO-2 or ZeRO-3.
std::string_view megatron_fsdp_strategy(int zero_stage);

// One setting of Megatron-Core's MoE layer under both its names: the
// Megatron-LM flag and the TransformerConfig field it sets.
struct McoreSetting {
  // number: 64; list: a list expression; word: a string (quoted in Python);
  // on: a switch, set without a value.
  enum class Kind { number, list, word, on };
  std::string_view flag, field;
  Kind kind = Kind::number;
  std::string value;
};
// The MoE layer's shape from the model card, in the order the exports write it.
std::vector<McoreSetting> moe_layer_settings(const ModelSpec& m);
// The MoE kernels cuboid prices, after the layer's shape: grouped GEMMs and
// the plan's token dispatcher.
std::vector<McoreSetting> moe_kernel_settings(const ParallelPlan& plan);

// Megatron-Core's quantized-GEMM settings for the plan's precision (Transformer
// Engine recipes as Megatron-Core d98e8a64 megatron/core/fp8_utils.py
// get_fp8_recipe builds them): format "hybrid" (E4M3 forward, E5M2 gradients)
// or "e4m3", recipe tensorwise / delayed / blockwise / mxfp8; NVFP4 is the
// fp4 format "e2m1" with recipe "nvfp4". The formats follow Megatron-Bridge
// v0.6.0's recipes (src/megatron/bridge/training/mixed_precision.py): hybrid
// for delayed, current and blockwise scaling, e4m3 for MXFP8. Delayed scaling
// keeps an amax history of 1024 steps and takes its maximum (Bridge's
// bf16_with_fp8_delayed_scaling_mixed and Megatron-LM's
// examples/llama/train_llama3_8b_h100_fp8.sh@d98e8a64); Megatron's own
// defaults (1, most_recent) are no recipe anyone runs.
struct McoreQuantization {
  bool fp4 = false;             // --fp4-format / fp4 rather than --fp8-format / fp8
  std::string_view format;      // "hybrid", "e4m3" or (fp4) "e2m1"
  std::string_view recipe;      // "tensorwise", "delayed", "blockwise", "mxfp8" or "nvfp4"
  int amax_history_len = 0;     // delayed scaling only, else 0
  std::string_view amax_compute_algo;  // delayed scaling only
};
// Precondition: the plan's precision is not bf16.
McoreQuantization mcore_quantization(Precision p);
// A target that writes no quantized GEMMs refuses a plan priced with them;
// `why` says what the trainer lacks, `fix` where to export instead.
[[noreturn]] void refuse_precision(const PlanFile& pf, const std::string& why, const std::string& fix);

// Keys and values as the format writes them.
using Fields = std::vector<std::pair<std::string, std::string>>;

// Whether the srun lines are comments or the commands the script runs.
enum class SlurmLines { comment, run };
// "torchrun ... SCRIPT ARGS" on each node and the srun line that starts it (bash).
std::string launch_lines(const PlanFile& pf, std::string_view script_and_args, std::string_view comment = "#",
                         SlurmLines slurm = SlurmLines::comment);
// What a launcher starts once: "node", or "host" where a node has several
// (a GB200 NVL72 rack's compute trays; PlanFile::hosts, host_gpus).
std::string_view host_word(const PlanFile& pf);

ExportResult megatron(const PlanFile& pf);
ExportResult deepspeed(const PlanFile& pf);
ExportResult torchtitan_v02(const PlanFile& pf);
ExportResult torchtitan_main(const PlanFile& pf);
ExportResult nemo1(const PlanFile& pf);
ExportResult megatron_bridge(const PlanFile& pf);

}  // namespace cuboid::exporters
