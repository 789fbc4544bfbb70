#!/usr/bin/env python3
# Megatron-Bridge v0.6.0 configuration for the cuboid plan in seed-zero3.plan.json (schema cuboid.plan/1):
#   llama3-70b on DGX A100 x4: 4 nodes x 8 A100-SXM4-80GB; TP 4 x PP 4 x DP 2, micro-batch 1, global batch 64 x 8192 tokens
# Fields: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py, models/gpt_provider.py,
# recipes/common.py@v0.6.0 and the Megatron-Core configs they extend (NVIDIA/Megatron-LM@cd4afffa).
# Add: the dataset (cfg.dataset.blend, or mock data), the tokenizer (cfg.tokenizer), train_iters,
# the optimizer's learning rate and schedule (cfg.optimizer, cfg.scheduler) and checkpoint
# directories (cfg.checkpoint.save / load).
# torchrun on each of the 4 nodes (NODE_RANK 0..3, MASTER_ADDR = node 0):
#   torchrun --nnodes 4 --nproc_per_node 8 --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port 6000 cuboid_plan.py
# Slurm: one torchrun per node, rendezvous on the first node:
#   MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
#   srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:6000" --rdzv_id "$SLURM_JOB_ID" cuboid_plan.py
# Megatron FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset.
import torch
import torch.nn.functional as F
from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.recipes.common import _pretrain_common
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain
from megatron.core.transformer.enums import AttnBackend


def cuboid_plan():
    cfg = _pretrain_common()
    # llama3-70b: vocabulary 128256 from the tokenizer, padded by Megatron
    cfg.model = GPTModelProvider(
        tensor_model_parallel_size=4,
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        sequence_parallel=True,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        num_layers=80,
        hidden_size=8192,
        ffn_hidden_size=28672,
        num_attention_heads=64,
        num_query_groups=8,
        kv_channels=128,
        seq_length=8192,
        position_embedding_type="rope",
        rotary_base=500000,
        rope_scaling=False,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=128,
        attention_backend=AttnBackend.auto,
        gradient_accumulation_fusion=False,
    )
    cfg.mixed_precision = "bf16_mixed"
    cfg.dist.use_tp_pp_dp_mapping = False
    cfg.ddp.use_distributed_optimizer = True
    cfg.optimizer.use_distributed_optimizer = True
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    cfg.ddp.megatron_fsdp_main_grads_dtype = torch.float32
    cfg.ddp.overlap_grad_reduce = True
    cfg.ddp.overlap_param_gather = True
    cfg.ddp.grad_reduce_in_fp32 = True
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = 64
    cfg.dataset.seq_length = 8192
    return cfg


if __name__ == "__main__":
    pretrain(cuboid_plan(), forward_step)
