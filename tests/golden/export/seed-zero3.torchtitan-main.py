#!/usr/bin/env python3
# torchtitan main (b5bcd76c) configuration for the cuboid plan in seed-zero3.plan.json (schema cuboid.plan/1):
#   llama3-70b on DGX A100 x4: 4 nodes x 8 A100-SXM4-80GB; TP 4 x PP 4 x DP 2, micro-batch 1, global batch 64 x 8192 tokens
# Fields: pytorch/torchtitan torchtitan/config/configs.py@b5bcd76c (TrainingConfig, ParallelismConfig),
# torchtitan/trainer.py (Trainer.Config.activation_checkpoint), torchtitan/models/llama3/config_registry.py.
# For torchtitan v0.2.x use --to torchtitan.
# Model: llama3_70b() from torchtitan's llama3 config registry (80 layers, hidden 8192).
# Its rotary embedding applies Llama 3.1's frequency scaling (factor 8), which llama3-70b has not;
# the cost is the same, the numerics are Llama 3.1's.
# The base config brings its dataset, tokenizer (hf_assets_path), optimizer and checkpointing: set yours.
# Save as torchtitan_recipes/cuboid_plan.py in the torchtitan checkout and start on each of the 4 nodes:
#   torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:29500" \
#     -m torchtitan.train --module torchtitan_recipes.cuboid_plan --config cuboid_plan
from torchtitan.models.llama3.config_registry import llama3_70b
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.trainer import Trainer


def cuboid_plan() -> Trainer.Config:
    config = llama3_70b()
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 2
    config.parallelism.fsdp_reshard_after_forward = "always"
    config.parallelism.tensor_parallel_degree = 4
    config.parallelism.pipeline_parallel_degree = 4
    config.parallelism.pipeline_parallel_schedule = "1F1B"
    config.parallelism.pipeline_parallel_layers_per_stage = 20
    config.parallelism.pipeline_parallel_first_stage_less_layers = 0
    config.parallelism.pipeline_parallel_last_stage_less_layers = 0
    config.parallelism.num_pp_microbatches = 32
    config.parallelism.context_parallel_degree = 1
    config.parallelism.enable_sequence_parallel = True
    config.training.num_tokens_per_microbatch_per_dp_rank = 8192  # micro-batch 1 x 8192 tokens
    config.training.num_tokens_per_train_step = 524288  # global batch 64 x 8192 tokens
    config.training.max_context_length = 8192
    config.training.mixed_precision_param = "bfloat16"
    config.training.mixed_precision_reduce = "float32"
    config.activation_checkpoint = FullAC.Config()
    return config
