#!/usr/bin/env python3
# Megatron-Bridge v0.6.0 configuration for the cuboid plan in gpt3-interleaved.plan.json (schema cuboid.plan/1):
#   gpt3-175b on DGX A100 x4: 4 nodes x 8 A100-SXM4-80GB; TP 8 x PP 4 x DP 1, micro-batch 1, global batch 64 x 2048 tokens
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
# TP > 1: also export CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).
import torch.nn.functional as F
from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.recipes.common import _pretrain_common
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain
from megatron.core.transformer.enums import AttnBackend


def cuboid_plan():
    cfg = _pretrain_common()
    # gpt3-175b: vocabulary 50257 from the tokenizer, padded by Megatron
    cfg.model = GPTModelProvider(
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=3,
        overlap_p2p_comm=True,
        batch_p2p_comm=False,
        context_parallel_size=1,
        sequence_parallel=True,
        recompute_granularity="selective",
        num_layers=96,
        hidden_size=12288,
        ffn_hidden_size=49152,
        num_attention_heads=96,
        num_query_groups=96,
        kv_channels=128,
        seq_length=2048,
        position_embedding_type="learned_absolute",
        normalization="LayerNorm",
        gated_linear_unit=False,
        activation_func=F.gelu,
        add_bias_linear=True,
        share_embeddings_and_output_weights=True,
        make_vocab_size_divisible_by=128,
        attention_backend=AttnBackend.auto,
        gradient_accumulation_fusion=False,
    )
    cfg.mixed_precision = "bf16_mixed"
    cfg.dist.use_tp_pp_dp_mapping = False
    cfg.ddp.use_distributed_optimizer = False
    cfg.optimizer.use_distributed_optimizer = False
    cfg.ddp.use_megatron_fsdp = False
    cfg.ddp.data_parallel_sharding_strategy = "no_shard"
    cfg.ddp.overlap_grad_reduce = False
    cfg.ddp.overlap_param_gather = False
    cfg.ddp.grad_reduce_in_fp32 = True
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = 64
    cfg.dataset.seq_length = 2048
    return cfg


if __name__ == "__main__":
    pretrain(cuboid_plan(), forward_step)
