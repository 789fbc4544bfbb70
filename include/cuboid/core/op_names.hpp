#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The names of the ops the workload lists, the executor times, calibration
// keys its kernels by and validate matches: one constant each, so a typo is a
// compile error. char arrays, not string_view: they pass as const char* (the
// executor) and as std::string alike.
#include <array>
#include <cstddef>
#include <string_view>

namespace cuboid::op {

// Transformer layer, forward (workload.cpp layer_forward; the executor's layer.cpp).
inline constexpr char norm_in[] = "norm_in";
inline constexpr char tp_ag_attn[] = "tp_ag_attn";
inline constexpr char qkv[] = "qkv";
inline constexpr char qkv_bias[] = "qkv_bias";
inline constexpr char attn_qk[] = "attn_qk";
// ALiBi without flash attention: the broadcast bias copied into the score tensor
// that torch.baddbmm(beta=1) then reads (BigScience Megatron-DeepSpeed).
inline constexpr char attn_alibi_bias[] = "attn_alibi_bias";
inline constexpr char attn_softmax[] = "attn_softmax";
inline constexpr char attn_av[] = "attn_av";
inline constexpr char attn_ctx_copy[] = "attn_ctx_copy";
inline constexpr char attn_flash[] = "attn_flash";
// Context parallelism (workload.cpp add_cp_attention_*): the ring's K/V
// send/recv, and the a2a exchange's all-to-alls before and after attention.
inline constexpr char cp_kv_p2p[] = "cp_kv_p2p";
inline constexpr char cp_a2a_qkv[] = "cp_a2a_qkv";
inline constexpr char cp_a2a_out[] = "cp_a2a_out";
inline constexpr char cp_out_correct[] = "cp_out_correct";  // a ring step's output merged into the running one
inline constexpr char proj[] = "proj";
inline constexpr char tp_rs_attn[] = "tp_rs_attn";
inline constexpr char tp_ar_attn[] = "tp_ar_attn";
inline constexpr char drop_add_attn[] = "drop_add_attn";
inline constexpr char norm_mlp[] = "norm_mlp";
inline constexpr char tp_ag_mlp[] = "tp_ag_mlp";
inline constexpr char fc1[] = "fc1";
inline constexpr char act[] = "act";
inline constexpr char fc2[] = "fc2";
inline constexpr char tp_rs_mlp[] = "tp_rs_mlp";
inline constexpr char tp_ar_mlp[] = "tp_ar_mlp";
inline constexpr char drop_add_mlp[] = "drop_add_mlp";

// Mixture-of-experts MLP (workload.cpp add_moe_*, Megatron-Core's MoELayer
// with the alltoall token dispatcher): the router, the permutation of each
// token's top-k copies by expert, the all-to-alls over the EP group (tokens
// and their routing probabilities), the ETP all-gather / reduce-scatter, the
// sort by local expert, the grouped expert GEMMs, the way back, and the
// shared experts (a TP MLP beside the routed ones).
inline constexpr char router[] = "router";
inline constexpr char router_topk[] = "router_topk";
inline constexpr char moe_permute[] = "moe_permute";
inline constexpr char ep_a2a_counts[] = "ep_a2a_counts";
inline constexpr char ep_a2a_dispatch[] = "ep_a2a_dispatch";
inline constexpr char ep_a2a_probs[] = "ep_a2a_probs";
inline constexpr char etp_ag_dispatch[] = "etp_ag_dispatch";
inline constexpr char moe_sort[] = "moe_sort";
inline constexpr char expert_fc1[] = "expert_fc1";
inline constexpr char expert_act[] = "expert_act";
inline constexpr char expert_fc2[] = "expert_fc2";
inline constexpr char moe_unsort[] = "moe_unsort";
inline constexpr char etp_rs_combine[] = "etp_rs_combine";
inline constexpr char ep_a2a_combine[] = "ep_a2a_combine";
inline constexpr char moe_unpermute[] = "moe_unpermute";
inline constexpr char tp_ag_shared[] = "tp_ag_shared";
inline constexpr char shared_fc1[] = "shared_fc1";
inline constexpr char shared_act[] = "shared_act";
inline constexpr char shared_fc2[] = "shared_fc2";
inline constexpr char tp_rs_shared[] = "tp_rs_shared";
inline constexpr char shared_add[] = "shared_add";
// Per micro-batch beside the routing (add_router_balancing, add_host_sync):
// the auxiliary loss's second scoring, its token counts and their TP
// all-reduce, the loss-free bias's token counts, and the host's wait for the
// dispatcher's token counts (dropless routing).
inline constexpr char router_aux_scores[] = "router_aux_scores";
inline constexpr char router_aux_loss[] = "router_aux_loss";
inline constexpr char tp_ar_aux_counts[] = "tp_ar_aux_counts";
inline constexpr char router_bias_counts[] = "router_bias_counts";
inline constexpr char moe_host_sync[] = "moe_host_sync";
inline constexpr char router_aux_loss_bwd[] = "router_aux_loss_bwd";
// The allgather and flex dispatchers' exchanges (ParallelPlan::moe_dispatcher)
// in place of the all-to-alls: the tokens, their probabilities (and routing
// map), the way back.
inline constexpr char ep_ag_dispatch[] = "ep_ag_dispatch";
inline constexpr char ep_ag_probs[] = "ep_ag_probs";
inline constexpr char ep_rs_combine[] = "ep_rs_combine";
inline constexpr char ep_flex_dispatch[] = "ep_flex_dispatch";
inline constexpr char ep_flex_probs[] = "ep_flex_probs";
inline constexpr char ep_flex_combine[] = "ep_flex_combine";

// Its backward.
inline constexpr char router_dgrad[] = "router_dgrad";
inline constexpr char router_wgrad[] = "router_wgrad";
inline constexpr char router_topk_bwd[] = "router_topk_bwd";
inline constexpr char moe_permute_bwd[] = "moe_permute_bwd";
inline constexpr char ep_a2a_dispatch_bwd[] = "ep_a2a_dispatch_bwd";
inline constexpr char ep_a2a_probs_bwd[] = "ep_a2a_probs_bwd";
inline constexpr char etp_ag_dispatch_bwd[] = "etp_ag_dispatch_bwd";
inline constexpr char moe_sort_bwd[] = "moe_sort_bwd";
inline constexpr char expert_fc1_dgrad[] = "expert_fc1_dgrad";
inline constexpr char expert_fc1_wgrad[] = "expert_fc1_wgrad";
inline constexpr char expert_act_bwd[] = "expert_act_bwd";
inline constexpr char expert_fc2_dgrad[] = "expert_fc2_dgrad";
inline constexpr char expert_fc2_wgrad[] = "expert_fc2_wgrad";
inline constexpr char moe_unsort_bwd[] = "moe_unsort_bwd";
inline constexpr char etp_rs_combine_bwd[] = "etp_rs_combine_bwd";
inline constexpr char ep_a2a_combine_bwd[] = "ep_a2a_combine_bwd";
inline constexpr char ep_ag_dispatch_bwd[] = "ep_ag_dispatch_bwd";
inline constexpr char ep_ag_probs_bwd[] = "ep_ag_probs_bwd";
inline constexpr char ep_rs_combine_bwd[] = "ep_rs_combine_bwd";
inline constexpr char ep_flex_dispatch_bwd[] = "ep_flex_dispatch_bwd";
inline constexpr char ep_flex_probs_bwd[] = "ep_flex_probs_bwd";
inline constexpr char ep_flex_combine_bwd[] = "ep_flex_combine_bwd";
inline constexpr char moe_unpermute_bwd[] = "moe_unpermute_bwd";
inline constexpr char tp_ag_shared_bwd[] = "tp_ag_shared_bwd";
inline constexpr char shared_fc1_dgrad[] = "shared_fc1_dgrad";
inline constexpr char shared_fc1_wgrad[] = "shared_fc1_wgrad";
inline constexpr char shared_act_bwd[] = "shared_act_bwd";
inline constexpr char shared_fc2_dgrad[] = "shared_fc2_dgrad";
inline constexpr char shared_fc2_wgrad[] = "shared_fc2_wgrad";
inline constexpr char tp_rs_shared_bwd[] = "tp_rs_shared_bwd";
inline constexpr char router_grad_accum[] = "router_grad_accum";
inline constexpr char expert_fc1_grad_accum[] = "expert_fc1_grad_accum";
inline constexpr char expert_fc2_grad_accum[] = "expert_fc2_grad_accum";
inline constexpr char shared_fc1_grad_accum[] = "shared_fc1_grad_accum";
inline constexpr char shared_fc2_grad_accum[] = "shared_fc2_grad_accum";

// Multi-head latent attention (workload.cpp add_mla_*, Megatron-Core's
// MLASelfAttention): the low-rank down projections (duplicated on every TP
// rank, on its sequence shard), their norms, the all-gathers of the latents
// over TP, the column-parallel up projections.
inline constexpr char mla_q_down[] = "mla_q_down";
inline constexpr char mla_q_norm[] = "mla_q_norm";
inline constexpr char mla_kv_down[] = "mla_kv_down";
inline constexpr char mla_kv_norm[] = "mla_kv_norm";
inline constexpr char mla_ag_q[] = "mla_ag_q";
inline constexpr char mla_ag_kv[] = "mla_ag_kv";
inline constexpr char mla_q_up[] = "mla_q_up";
inline constexpr char mla_kv_up[] = "mla_kv_up";
// Its backward.
inline constexpr char mla_q_down_dgrad[] = "mla_q_down_dgrad";
inline constexpr char mla_q_down_wgrad[] = "mla_q_down_wgrad";
inline constexpr char mla_kv_down_dgrad[] = "mla_kv_down_dgrad";
inline constexpr char mla_kv_down_wgrad[] = "mla_kv_down_wgrad";
inline constexpr char mla_q_up_dgrad[] = "mla_q_up_dgrad";
inline constexpr char mla_q_up_wgrad[] = "mla_q_up_wgrad";
inline constexpr char mla_kv_up_dgrad[] = "mla_kv_up_dgrad";
inline constexpr char mla_kv_up_wgrad[] = "mla_kv_up_wgrad";
inline constexpr char mla_q_norm_bwd[] = "mla_q_norm_bwd";
inline constexpr char mla_kv_norm_bwd[] = "mla_kv_norm_bwd";
inline constexpr char mla_ag_q_bwd[] = "mla_ag_q_bwd";
inline constexpr char mla_ag_kv_bwd[] = "mla_ag_kv_bwd";
inline constexpr char mla_down_grad_sum[] = "mla_down_grad_sum";
inline constexpr char mla_grad_accum[] = "mla_grad_accum";

// A multi-token prediction module's own ops (workload.cpp mtp_ops; its
// embedding lookup, layer and LM head are the usual ones): the norms of the
// hidden state and of the next tokens' embedding, the 2h -> h projection.
inline constexpr char mtp_norms[] = "mtp_norms";
inline constexpr char mtp_eh_proj[] = "mtp_eh_proj";
inline constexpr char tp_rs_mtp[] = "tp_rs_mtp";
inline constexpr char mtp_eh_proj_dgrad[] = "mtp_eh_proj_dgrad";
inline constexpr char mtp_eh_proj_wgrad[] = "mtp_eh_proj_wgrad";
inline constexpr char tp_ag_mtp_bwd[] = "tp_ag_mtp_bwd";
inline constexpr char mtp_norms_bwd[] = "mtp_norms_bwd";

// GEMM backward: the forward GEMM's name + "_dgrad" / "_wgrad" (workload.cpp add_gemm_backward).
inline constexpr char qkv_dgrad[] = "qkv_dgrad";
inline constexpr char qkv_wgrad[] = "qkv_wgrad";
inline constexpr char proj_dgrad[] = "proj_dgrad";
inline constexpr char proj_wgrad[] = "proj_wgrad";
inline constexpr char fc1_dgrad[] = "fc1_dgrad";
inline constexpr char fc1_wgrad[] = "fc1_wgrad";
inline constexpr char fc2_dgrad[] = "fc2_dgrad";
inline constexpr char fc2_wgrad[] = "fc2_wgrad";
inline constexpr char attn_qk_dgrad[] = "attn_qk_dgrad";
inline constexpr char attn_qk_wgrad[] = "attn_qk_wgrad";
inline constexpr char attn_av_dgrad[] = "attn_av_dgrad";
inline constexpr char attn_av_wgrad[] = "attn_av_wgrad";
inline constexpr char logits_dgrad[] = "logits_dgrad";
inline constexpr char logits_wgrad[] = "logits_wgrad";

// Transformer layer, backward.
inline constexpr char drop_add_mlp_bwd[] = "drop_add_mlp_bwd";
inline constexpr char tp_ag_mlp_bwd[] = "tp_ag_mlp_bwd";
inline constexpr char fc2_grad_accum[] = "fc2_grad_accum";
inline constexpr char act_bwd[] = "act_bwd";
inline constexpr char tp_rs_mlp_bwd[] = "tp_rs_mlp_bwd";
inline constexpr char tp_ar_mlp_bwd[] = "tp_ar_mlp_bwd";
inline constexpr char fc1_grad_accum[] = "fc1_grad_accum";
inline constexpr char norm_mlp_bwd[] = "norm_mlp_bwd";
inline constexpr char residual_add_bwd[] = "residual_add_bwd";
inline constexpr char drop_add_attn_bwd[] = "drop_add_attn_bwd";
inline constexpr char tp_ag_attn_bwd[] = "tp_ag_attn_bwd";
inline constexpr char proj_grad_accum[] = "proj_grad_accum";
inline constexpr char attn_flash_bwd[] = "attn_flash_bwd";
inline constexpr char cp_kv_dkv_p2p_bwd[] = "cp_kv_dkv_p2p_bwd";  // K/V on, and the dK/dV summed so far
inline constexpr char cp_grad_sum_bwd[] = "cp_grad_sum_bwd";      // a ring step's dQ and dK/dV added to the running ones
inline constexpr char cp_a2a_out_bwd[] = "cp_a2a_out_bwd";
inline constexpr char cp_a2a_qkv_bwd[] = "cp_a2a_qkv_bwd";
inline constexpr char attn_softmax_bwd[] = "attn_softmax_bwd";
inline constexpr char attn_qk_scale_bwd[] = "attn_qk_scale_bwd";
inline constexpr char attn_qkv_grad_cat[] = "attn_qkv_grad_cat";
inline constexpr char tp_rs_attn_bwd[] = "tp_rs_attn_bwd";
inline constexpr char tp_ar_attn_bwd[] = "tp_ar_attn_bwd";
inline constexpr char qkv_bias_grad[] = "qkv_bias_grad";
inline constexpr char qkv_grad_accum[] = "qkv_grad_accum";
inline constexpr char norm_in_bwd[] = "norm_in_bwd";

// Embedding (first stage) and LM head (last stage).
inline constexpr char embed_lookup[] = "embed_lookup";
inline constexpr char tp_rs_embed[] = "tp_rs_embed";
inline constexpr char tp_ar_embed[] = "tp_ar_embed";
inline constexpr char embed_dropout[] = "embed_dropout";
inline constexpr char embed_dropout_bwd[] = "embed_dropout_bwd";
inline constexpr char tp_ag_embed_bwd[] = "tp_ag_embed_bwd";
inline constexpr char embed_grad[] = "embed_grad";
inline constexpr char norm_final[] = "norm_final";
inline constexpr char tp_ag_head[] = "tp_ag_head";
inline constexpr char logits[] = "logits";
inline constexpr char xent[] = "xent";
inline constexpr char tp_ar_xent_max[] = "tp_ar_xent_max";
inline constexpr char tp_ar_xent_sum[] = "tp_ar_xent_sum";
inline constexpr char tp_ar_xent_tgt[] = "tp_ar_xent_tgt";
inline constexpr char xent_bwd[] = "xent_bwd";
inline constexpr char tp_rs_head_bwd[] = "tp_rs_head_bwd";
inline constexpr char tp_ar_head_bwd[] = "tp_ar_head_bwd";
inline constexpr char logits_grad_accum[] = "logits_grad_accum";
inline constexpr char norm_final_bwd[] = "norm_final_bwd";

// Pipeline and data-parallel transfers (the executor's names; the simulator plays them as tasks).
inline constexpr char pp_recv_fwd[] = "pp_recv_fwd";
inline constexpr char pp_send_fwd[] = "pp_send_fwd";
inline constexpr char pp_recv_bwd[] = "pp_recv_bwd";
inline constexpr char pp_send_bwd[] = "pp_send_bwd";
// Batches of this step's sends with the next step's receives (Megatron's
// send_forward_recv_backward and the like; pipeline_exchange names them).
inline constexpr char pp_send_fwd_recv_bwd[] = "pp_send_fwd_recv_bwd";
inline constexpr char pp_send_bwd_recv_fwd[] = "pp_send_bwd_recv_fwd";
inline constexpr char pp_send_fwd_recv_fwd[] = "pp_send_fwd_recv_fwd";
inline constexpr char pp_send_bwd_recv_bwd[] = "pp_send_bwd_recv_bwd";
inline constexpr char pp_send_fwd_recv_fwd_bwd[] = "pp_send_fwd_recv_fwd_bwd";
inline constexpr char pp_send_fwd_bwd_recv_fwd_bwd[] = "pp_send_fwd_bwd_recv_fwd_bwd";
inline constexpr char pp_send_fwd_bwd_recv_fwd[] = "pp_send_fwd_bwd_recv_fwd";
inline constexpr char pp_send_fwd_bwd_recv_bwd[] = "pp_send_fwd_bwd_recv_bwd";
inline constexpr char pp_send_fwd_bwd[] = "pp_send_fwd_bwd";
inline constexpr char pp_send_bwd_recv_fwd_bwd[] = "pp_send_bwd_recv_fwd_bwd";
inline constexpr char pp_recv_fwd_bwd[] = "pp_recv_fwd_bwd";
inline constexpr char dp_ar_grads[] = "dp_ar_grads";
inline constexpr char dp_rs_grads[] = "dp_rs_grads";
inline constexpr char dp_ag_params[] = "dp_ag_params";

// Optimizer step, in Megatron's order (optimizer_step.hpp).
inline constexpr char grad_scale[] = "grad_scale";
inline constexpr char grad_cast[] = "grad_cast";
inline constexpr char grad_norm[] = "grad_norm";
inline constexpr char adam[] = "adam";
inline constexpr char param_copy[] = "param_copy";
inline constexpr char grad_zero[] = "grad_zero";

// Executor only: clears the QKV gradient before the attention backward.
inline constexpr char dqkv_zero[] = "dqkv_zero";
// Executor only: context parallelism's K and V copied out of the QKV output
// into one buffer to send around the ring (Transformer Engine's are separate tensors).
inline constexpr char cp_kv_pack[] = "cp_kv_pack";
// Executor only (for now): with sequence parallelism, the norms' weight
// gradients (partial sums over each TP rank's tokens) all-reduced over TP
// before the DP reduction, as Megatron's finalize_model_grads does.
inline constexpr char tp_ar_norm_grads[] = "tp_ar_norm_grads";

// FP8 / FP4 plans (workload.cpp quantize_linear_layers, precision.hpp): a
// quantizer's amax pass, its scale kernel and its cast (of a linear layer's
// input; of its output gradient in the backward), the amax all-reduced over
// TP where the tensor is all-gathered with SP, and the per-step cast of the
// weights (step.cpp); under ZeRO-3 with --fp8-param-gather, the columnwise
// copy of each weight gathered for a backward, made from the gathered
// rowwise FP8 data.
inline constexpr char fp8_amax[] = "fp8_amax";
inline constexpr char fp8_scale[] = "fp8_scale";
inline constexpr char fp8_cast[] = "fp8_cast";
inline constexpr char fp8_grad_cast[] = "fp8_grad_cast";
inline constexpr char tp_ar_amax[] = "tp_ar_amax";
inline constexpr char fp8_weight_cast[] = "fp8_weight_cast";
inline constexpr char fp8_weight_transpose[] = "fp8_weight_transpose";
// FP8 attention under delayed scaling (--fp8-attention): cuDNN writes the
// core's output and, in the backward, dQ, dK, dV in FP8, and Transformer
// Engine dequantizes them to bf16 for the layers around it.
inline constexpr char fp8_dequantize[] = "fp8_dequantize";

// Suffixes of a GEMM's backward ops.
inline constexpr char dgrad_suffix[] = "_dgrad";
inline constexpr char wgrad_suffix[] = "_wgrad";

// The pipeline exchanges the executor times (every PP op of a run), indexed
// by send forward | send backward << 1 | receive forward << 2 | receive
// backward << 3 (index 0: no exchange).
inline constexpr std::array<const char*, 16> pipeline_exchanges{
    "",
    pp_send_fwd,
    pp_send_bwd,
    pp_send_fwd_bwd,
    pp_recv_fwd,
    pp_send_fwd_recv_fwd,
    pp_send_bwd_recv_fwd,
    pp_send_fwd_bwd_recv_fwd,
    pp_recv_bwd,
    pp_send_fwd_recv_bwd,
    pp_send_bwd_recv_bwd,
    pp_send_fwd_bwd_recv_bwd,
    pp_recv_fwd_bwd,
    pp_send_fwd_recv_fwd_bwd,
    pp_send_bwd_recv_fwd_bwd,
    pp_send_fwd_bwd_recv_fwd_bwd,
};
constexpr const char* pipeline_exchange(bool send_fwd, bool send_bwd, bool recv_fwd, bool recv_bwd) {
  return pipeline_exchanges[(send_fwd ? 1u : 0u) | (send_bwd ? 2u : 0u) | (recv_fwd ? 4u : 0u) | (recv_bwd ? 8u : 0u)];
}
inline bool is_pipeline_exchange(std::string_view name) {
  for (std::size_t i = 1; i < pipeline_exchanges.size(); ++i)
    if (name == pipeline_exchanges[i]) return true;
  return false;
}

// Every name above, for checks.
inline constexpr std::array<std::string_view, 216> all{
    fp8_amax, fp8_scale, fp8_cast, fp8_grad_cast, tp_ar_amax, fp8_weight_cast, fp8_weight_transpose, fp8_dequantize,
    norm_in, tp_ag_attn, qkv, qkv_bias, attn_alibi_bias, attn_qk, attn_softmax, attn_av, attn_ctx_copy, attn_flash,
    proj, tp_rs_attn,
    tp_ar_attn, drop_add_attn, norm_mlp, tp_ag_mlp, fc1, act, fc2, tp_rs_mlp, tp_ar_mlp, drop_add_mlp, qkv_dgrad,
    qkv_wgrad, proj_dgrad, proj_wgrad, fc1_dgrad, fc1_wgrad, fc2_dgrad, fc2_wgrad, attn_qk_dgrad, attn_qk_wgrad,
    attn_av_dgrad, attn_av_wgrad, logits_dgrad, logits_wgrad, drop_add_mlp_bwd, tp_ag_mlp_bwd, fc2_grad_accum,
    act_bwd, tp_rs_mlp_bwd, tp_ar_mlp_bwd, fc1_grad_accum, norm_mlp_bwd, residual_add_bwd, drop_add_attn_bwd,
    tp_ag_attn_bwd, proj_grad_accum, attn_flash_bwd, attn_softmax_bwd, attn_qk_scale_bwd, attn_qkv_grad_cat,
    tp_rs_attn_bwd, tp_ar_attn_bwd, qkv_bias_grad, qkv_grad_accum, norm_in_bwd, embed_lookup, tp_rs_embed,
    tp_ar_embed, embed_dropout, embed_dropout_bwd, tp_ag_embed_bwd, embed_grad, norm_final, tp_ag_head, logits, xent,
    tp_ar_xent_max, tp_ar_xent_sum, tp_ar_xent_tgt, xent_bwd, tp_rs_head_bwd, tp_ar_head_bwd, logits_grad_accum,
    norm_final_bwd, pp_recv_fwd, pp_send_fwd, pp_recv_bwd, pp_send_bwd, pp_send_fwd_recv_bwd,
    pp_send_bwd_recv_fwd, pp_send_fwd_recv_fwd, pp_send_bwd_recv_bwd, pp_send_fwd_recv_fwd_bwd,
    pp_send_fwd_bwd_recv_fwd_bwd, pp_send_fwd_bwd_recv_fwd, pp_send_fwd_bwd_recv_bwd, pp_send_fwd_bwd,
    pp_send_bwd_recv_fwd_bwd, pp_recv_fwd_bwd, dp_ar_grads, dp_rs_grads,
    dp_ag_params, grad_scale, grad_cast, grad_norm, adam, param_copy, grad_zero, dqkv_zero, cp_kv_pack, tp_ar_norm_grads, cp_kv_p2p,
    cp_a2a_qkv, cp_a2a_out, cp_kv_dkv_p2p_bwd, cp_a2a_out_bwd, cp_a2a_qkv_bwd, cp_out_correct, cp_grad_sum_bwd,
    router, router_topk, moe_permute, ep_a2a_counts, ep_a2a_dispatch, ep_a2a_probs, etp_ag_dispatch, moe_sort, expert_fc1, expert_act, expert_fc2, moe_unsort, etp_rs_combine, ep_a2a_combine, moe_unpermute, tp_ag_shared, shared_fc1, shared_act, shared_fc2, tp_rs_shared, shared_add, router_dgrad, router_wgrad, router_topk_bwd, moe_permute_bwd, ep_a2a_dispatch_bwd, ep_a2a_probs_bwd, etp_ag_dispatch_bwd, moe_sort_bwd, expert_fc1_dgrad, expert_fc1_wgrad, expert_act_bwd, expert_fc2_dgrad, expert_fc2_wgrad, moe_unsort_bwd, etp_rs_combine_bwd, ep_a2a_combine_bwd, moe_unpermute_bwd, tp_ag_shared_bwd, shared_fc1_dgrad, shared_fc1_wgrad, shared_act_bwd, shared_fc2_dgrad, shared_fc2_wgrad, tp_rs_shared_bwd, router_grad_accum, expert_fc1_grad_accum, expert_fc2_grad_accum, shared_fc1_grad_accum, shared_fc2_grad_accum,
    ep_ag_dispatch, ep_ag_probs, ep_rs_combine, ep_flex_dispatch, ep_flex_probs, ep_flex_combine, ep_ag_dispatch_bwd,
    ep_ag_probs_bwd, ep_rs_combine_bwd, ep_flex_dispatch_bwd, ep_flex_probs_bwd, ep_flex_combine_bwd,
    mla_q_down, mla_q_norm, mla_kv_down, mla_kv_norm, mla_ag_q, mla_ag_kv, mla_q_up, mla_kv_up, mla_q_down_dgrad, mla_q_down_wgrad, mla_kv_down_dgrad, mla_kv_down_wgrad, mla_q_up_dgrad, mla_q_up_wgrad, mla_kv_up_dgrad, mla_kv_up_wgrad, mla_q_norm_bwd, mla_kv_norm_bwd, mla_ag_q_bwd, mla_ag_kv_bwd, mla_down_grad_sum, mla_grad_accum,
    mtp_norms, mtp_eh_proj, tp_rs_mtp, mtp_eh_proj_dgrad, mtp_eh_proj_wgrad, tp_ag_mtp_bwd, mtp_norms_bwd,
    router_aux_scores, router_aux_loss, tp_ar_aux_counts, router_bias_counts, moe_host_sync, router_aux_loss_bwd,
};

}  // namespace cuboid::op
