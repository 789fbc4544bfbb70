#!/bin/bash
# Megatron-LM configuration for the cuboid plan in seed-zero3.plan.json (schema cuboid.plan/1):
#   llama3-70b on DGX A100 x4: 4 nodes x 8 A100-SXM4-80GB; TP 4 x PP 4 x DP 2, micro-batch 1, global batch 64 x 8192 tokens
# Flags: NVIDIA/Megatron-LM megatron/training/arguments.py@d98e8a64 (main, 2026). Add data, tokenizer,
# optimizer, learning-rate and checkpoint flags before running.
MEGATRON_ARGS=(
    # parallelism
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 4
    --sequence-parallel
    --use-distributed-optimizer
    --use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads_params
    --ckpt-format fsdp_dtensor
    --megatron-fsdp-main-grads-dtype fp32
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 64
    # activation recomputation
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # model shape (llama3-70b; vocabulary 128256 from the tokenizer, padded by Megatron)
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --rotary-base 500000
    --normalization RMSNorm
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --make-vocab-size-divisible-by 128
    --hidden-dropout 0
    --attention-dropout 0
    # precision and kernels
    --bf16
    --attention-backend auto
    --no-gradient-accumulation-fusion
)

# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1.
unset CUDA_DEVICE_MAX_CONNECTIONS

# torchrun on each of the 4 nodes (NODE_RANK 0..3, MASTER_ADDR = node 0):
#   torchrun --nnodes 4 --nproc_per_node 8 --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port 6000 pretrain_gpt.py "${MEGATRON_ARGS[@]}"
# Slurm: one torchrun per node, rendezvous on the first node.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:6000" --rdzv_id "$SLURM_JOB_ID" pretrain_gpt.py "${MEGATRON_ARGS[@]}"
