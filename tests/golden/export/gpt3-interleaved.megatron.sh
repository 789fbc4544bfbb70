#!/bin/bash
# Megatron-LM configuration for the cuboid plan in gpt3-interleaved.plan.json (schema cuboid.plan/1):
#   gpt3-175b on DGX A100 x4: 4 nodes x 8 A100-SXM4-80GB; TP 8 x PP 4 x DP 1, micro-batch 1, global batch 64 x 2048 tokens
# Flags: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64 (main, 2026). Add data, tokenizer,
# optimizer, learning-rate and checkpoint flags before running.
MEGATRON_ARGS=(
    # parallelism
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 8
    --sequence-parallel
    # batch
    --micro-batch-size 1
    --global-batch-size 64
    # activation recomputation
    --recompute-granularity selective
    # model shape (gpt3-175b; vocabulary 50257 from the tokenizer, padded by Megatron)
    --num-layers 96
    --hidden-size 12288
    --ffn-hidden-size 49152
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --position-embedding-type learned_absolute
    --normalization LayerNorm
    --make-vocab-size-divisible-by 128
    # precision and kernels
    --bf16
    --attention-backend auto
    --no-gradient-accumulation-fusion
)

# TP > 1: Megatron-LM wants CUDA_DEVICE_MAX_CONNECTIONS=1 (TP communication ordered before GEMMs).
export CUDA_DEVICE_MAX_CONNECTIONS=1

# torchrun on each of the 4 nodes (NODE_RANK 0..3, MASTER_ADDR = node 0):
#   torchrun --nnodes 4 --nproc_per_node 8 --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port 6000 pretrain_gpt.py "${MEGATRON_ARGS[@]}"
# Slurm: one torchrun per node, rendezvous on the first node.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:6000" --rdzv_id "$SLURM_JOB_ID" pretrain_gpt.py "${MEGATRON_ARGS[@]}"
