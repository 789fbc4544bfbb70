// One transformer layer on one TP rank: forward, backward, recomputation.
// GEMMs are y = x W with W stored [in, out]; dgrad dx = dy W^T, wgrad
// dW += x^T dy (accumulated over micro-batches).
#include "cuboid/exec/layer.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cuboid/core/op_names.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::exec {

LayerDims layer_dims(const ModelSpec& model, const ParallelPlan& plan, float dropout) {
  LayerDims d;
  d.tp = plan.tp;
  d.cp = plan.cp;
  d.flash = plan.flash_attention;
  d.seq = (plan.seq_length > 0 ? plan.seq_length : model.seq_length) / plan.cp;
  d.micro_batch = plan.micro_batch;
  d.tokens = d.seq * d.micro_batch;
  d.sequence_parallel = plan.sequence_parallel && plan.tp > 1;
  d.local_tokens = d.sequence_parallel ? d.tokens / plan.tp : d.tokens;
  d.hidden = model.hidden_size;
  d.heads = model.num_attention_heads / plan.tp;
  d.kv_heads = model.num_kv_heads / plan.tp;
  d.head_dim = model.head_dim;
  d.ffn = model.ffn_hidden_size / plan.tp;
  d.vocab = padded_vocab_size(model.vocab_size, plan.tp) / plan.tp;
  d.gated = model.gated_mlp();
  d.rmsnorm = model.normalization == Normalization::rmsnorm;
  d.dropout = dropout;
  d.experts = model.moe.num_experts;
  d.precision = plan.precision;
  const LayerOps ops = transformer_layer_ops(model, plan, false);
  auto linear = [&](std::string_view name) {
    for (const Op& op : ops.forward) {
      if (op.name == name) return LayerDims::Linear{op.m, op.n, op.k};
    }
    throw std::logic_error("layer_dims: the workload's layer has no " + std::string(name));
  };
  d.qkv = linear(op::qkv);
  d.proj = linear(op::proj);
  d.fc1 = linear(op::fc1);
  d.fc2 = linear(op::fc2);
  return d;
}

std::size_t layer_param_count(const LayerDims& d, bool moe_layer) {
  const auto h = static_cast<std::size_t>(d.hidden);
  const std::size_t norms = d.rmsnorm ? 2 * h : 4 * h;
  const std::size_t mlp = moe_layer ? h * static_cast<std::size_t>(d.experts)
                                    : h * static_cast<std::size_t>(d.fc1_cols()) + static_cast<std::size_t>(d.ffn) * h;
  return norms + h * static_cast<std::size_t>(d.qkv_cols()) + static_cast<std::size_t>(d.q_cols()) * h + mlp;
}

LayerParams layer_params_at(DeviceSpan flat, std::size_t offset, const LayerDims& d, bool moe_layer) {
  const auto h = static_cast<std::size_t>(d.hidden);
  LayerParams p;
  auto take = [&](std::size_t n) {
    DeviceSpan s = flat.subspan(offset, n);
    offset += n;
    return s;
  };
  p.norm1_gamma = take(h);
  if (!d.rmsnorm) p.norm1_beta = take(h);
  p.w_qkv = take(h * static_cast<std::size_t>(d.qkv_cols()));
  p.w_proj = take(static_cast<std::size_t>(d.q_cols()) * h);
  p.norm2_gamma = take(h);
  if (!d.rmsnorm) p.norm2_beta = take(h);
  p.moe = moe_layer;
  if (moe_layer) {
    p.experts.router = take(h * static_cast<std::size_t>(d.experts));
    return p;
  }
  p.w_fc1 = take(h * static_cast<std::size_t>(d.fc1_cols()));
  p.w_fc2 = take(static_cast<std::size_t>(d.ffn) * h);
  return p;
}

void set_expert_params(LayerParams& p, DeviceSpan flat, std::size_t offset, const MoeDims& d) {
  MoeParams e = expert_params_at(flat, offset, d);
  p.experts.fc1 = std::move(e.fc1);
  p.experts.fc2 = std::move(e.fc2);
}

void init_layer_params(Backend& be, const LayerParams& p, std::uint64_t seed) {
  be.fill(p.norm1_gamma, 1.0f);
  be.fill(p.norm2_gamma, 1.0f);
  if (!p.norm1_beta.empty()) be.fill(p.norm1_beta, 0.0f);
  if (!p.norm2_beta.empty()) be.fill(p.norm2_beta, 0.0f);
  be.fill_random(p.w_qkv, mix64(seed + 1), kInitScale);
  be.fill_random(p.w_proj, mix64(seed + 2), kInitScale);
  if (p.moe) return;  // the router and the experts are drawn by the step runner (replicated differently)
  be.fill_random(p.w_fc1, mix64(seed + 3), kInitScale);
  be.fill_random(p.w_fc2, mix64(seed + 4), kInitScale);
}

namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// The rest of a buffer from `offset` (strided GEMMs address beyond one matrix).
ConstDeviceSpan from(ConstDeviceSpan s, std::int64_t offset) { return s.subspan(sz(offset), s.size() - sz(offset)); }
DeviceSpan from(DeviceSpan s, std::int64_t offset) { return s.subspan(sz(offset), s.size() - sz(offset)); }

// A linear layer's GEMMs as the workload describes them (core/workload.cpp
// add_gemm_backward): forward (m, n, k), dgrad (m, k, n), wgrad (k, n, m).
OpDesc linear_desc(const char* name, Pass pass, const LayerDims::Linear& l) { return gemm_desc(name, pass, l.m, l.n, l.k); }
OpDesc dgrad_desc(const char* name, const LayerDims::Linear& l) {
  return gemm_desc(name, Pass::backward, l.m, l.k, l.n);
}
OpDesc wgrad_desc(const char* name, const LayerDims::Linear& l) {
  return gemm_desc(name, Pass::backward, l.k, l.n, l.m);
}

}  // namespace

LayerRunner::LayerRunner(Backend& backend, Communicator* tp, const LayerDims& dims, OpTimer& timer,
                         const MoeDims* moe, Communicator* ep, Communicator* cp, const FlexGroups* flex)
    : be_(backend), tp_(tp), d_(dims), timer_(timer), cp_(cp) {
  if (moe != nullptr) moe_ = std::make_unique<MoeRunner>(backend, ep, *moe, timer, flex);
  if (d_.cp > 1) {
    CUBOID_EXEC_REQUIRE(d_.flash, "LayerRunner", "context parallelism runs the fused attention core (flash) only");
    CUBOID_EXEC_REQUIRE(cp_ != nullptr && cp_->size() == d_.cp, "LayerRunner",
                        "the CP group must have the plan's " + std::to_string(d_.cp) + " ranks");
    CUBOID_EXEC_REQUIRE(d_.seq % 2 == 0, "LayerRunner", "a CP rank's positions must split into two chunks");
    const auto kv_elems = sz(d_.tokens * 2 * d_.kv_cols());
    kv_a_ = be_.alloc(kv_elems);
    kv_b_ = be_.alloc(kv_elems);
    dkv_a_ = be_.alloc(kv_elems);
    dkv_b_ = be_.alloc(kv_elems);
    blk_out_ = be_.alloc(sz(d_.tokens * d_.q_cols()));
    blk_lse_ = be_.alloc(sz(d_.tokens * d_.heads), DType::f32);
  }
  if (d_.flash) delta_ = be_.alloc(sz(d_.tokens * d_.heads), DType::f32);
  const std::int64_t T = d_.tokens, h = d_.hidden;
  full_a_ = be_.alloc(sz(T * h));
  full_b_ = be_.alloc(sz(T * h));
  local_a_ = be_.alloc(sz(d_.local_tokens * h));
  local_b_ = be_.alloc(sz(d_.local_tokens * h));
  dqkv_ = be_.alloc(sz(T * d_.qkv_cols()));
  dctx_ = be_.alloc(sz(T * d_.q_cols()));
  const std::int64_t scores = d_.micro_batch * d_.heads * d_.seq * d_.seq;
  dprobs_ = be_.alloc(sz(scores));
  probs_tmp_ = be_.alloc(sz(scores));
  dfc1_ = be_.alloc(sz(T * d_.fc1_cols()));
  dact_ = be_.alloc(sz(T * d_.ffn));
  scratch_out_ = be_.alloc(sz(d_.local_tokens * h));
}

LayerActs LayerRunner::make_acts(AttentionMemory mem) {
  const std::int64_t T = d_.tokens, Tl = d_.local_tokens, h = d_.hidden;
  LayerActs a;
  a.norm1 = be_.alloc(sz(Tl * h));
  a.norm1_mean = be_.alloc(sz(Tl), DType::f32);
  a.norm1_rstd = be_.alloc(sz(Tl), DType::f32);
  if (d_.sequence_parallel) a.norm1_full = be_.alloc(sz(T * h));
  a.qkv = be_.alloc(sz(T * d_.qkv_cols()));
  if (d_.flash)
    a.lse = be_.alloc(sz(T * d_.heads), DType::f32);
  else if (mem == AttentionMemory::keep_probs)
    a.probs = be_.alloc(sz(d_.micro_batch * d_.heads * d_.seq * d_.seq));
  a.ctx = be_.alloc(sz(T * d_.q_cols()));
  a.mid = be_.alloc(sz(Tl * h));
  a.norm2 = be_.alloc(sz(Tl * h));
  a.norm2_mean = be_.alloc(sz(Tl), DType::f32);
  a.norm2_rstd = be_.alloc(sz(Tl), DType::f32);
  if (d_.sequence_parallel) a.norm2_full = be_.alloc(sz(T * h));
  a.fc1 = be_.alloc(sz(T * d_.fc1_cols()));
  a.act = be_.alloc(sz(T * d_.ffn));
  return a;
}

DeviceSpan LayerRunner::tp_reduce(const char* name, Pass pass, DeviceSpan full, DeviceSpan local) {
  if (d_.tp <= 1) return full;
  const double bytes = static_cast<double>(full.bytes());
  if (d_.sequence_parallel) {
    timer_.run(comm_desc(name, pass, Collective::reduce_scatter, Group::tp, bytes, d_.tp),
               [&] { tp_->reduce_scatter_sum(full, local, local.size()); });
    return local;
  }
  timer_.run(comm_desc(name, pass, Collective::all_reduce, Group::tp, bytes, d_.tp),
             [&] { tp_->all_reduce_sum(full, full.size()); });
  return full;
}

ConstDeviceSpan LayerRunner::tp_gather(const char* name, Pass pass, ConstDeviceSpan local, DeviceSpan full) {
  if (!d_.sequence_parallel) return local;
  timer_.run(comm_desc(name, pass, Collective::all_gather, Group::tp, static_cast<double>(full.bytes()), d_.tp),
             [&] { tp_->all_gather(local, full, local.size()); });
  return full;
}

void LayerRunner::norm_forward(const char* name, Pass pass, ConstDeviceSpan x, ConstDeviceSpan gamma,
                               ConstDeviceSpan beta, DeviceSpan y, DeviceSpan mean, DeviceSpan rstd) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / d_.hidden;
  timer_.run(mem_desc(name, pass, 2.0 * static_cast<double>(x.bytes())), [&] {
    if (d_.rmsnorm)
      be_.rmsnorm_forward(x, gamma, y, rstd, rows, d_.hidden, d_.norm_eps);
    else
      be_.layernorm_forward(x, gamma, beta, y, mean, rstd, rows, d_.hidden, d_.norm_eps);
  });
}

void LayerRunner::norm_backward(const char* name, ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma,
                                DeviceSpan dbeta) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / d_.hidden;
  timer_.run(mem_desc(name, Pass::backward, 3.0 * static_cast<double>(x.bytes())), [&] {
    if (d_.rmsnorm)
      be_.rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, rows, d_.hidden);
    else
      be_.layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, d_.hidden);
  });
}

// probs[b][head] = causal_softmax(Q K^T / sqrt(d)). Head j reads KV head
// j / (heads / kv_heads) (GQA); each GEMM call batches the heads that share
// their position u inside a KV group.
void LayerRunner::attention_scores(const LayerActs& a, DeviceSpan probs, Pass pass) {
  const std::int64_t s = d_.seq, b = d_.micro_batch, dh = d_.head_dim, n = d_.qkv_cols(), q = d_.q_cols();
  const std::int64_t gq = d_.heads / d_.kv_heads, ss = s * s;
  timer_.run(gemm_desc(op::attn_qk, pass, s, s, dh, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g;
        g.trans_b = Trans::yes;
        g.m = s, g.n = s, g.k = dh;
        g.lda = b * n, g.ldb = b * n, g.ldc = s;
        g.batch = d_.kv_heads;
        g.stride_a = gq * dh, g.stride_b = dh, g.stride_c = gq * ss;
        be_.gemm(g, 1.0f, from(ConstDeviceSpan(a.qkv), bi * n + u * dh), from(ConstDeviceSpan(a.qkv), bi * n + q + 0), 0.0f,
                 from(probs, (bi * d_.heads + u) * ss));
      }
  });
  const double elements = static_cast<double>(b * d_.heads * ss);
  timer_.run(mem_desc(op::attn_softmax, pass, 2.0 * elements * static_cast<double>(dtype_bytes(probs.dtype()))), [&] {
    be_.causal_softmax_forward(probs, probs, b * d_.heads, s, 1.0f / std::sqrt(static_cast<float>(dh)));
  });
}

void LayerRunner::forward(const LayerParams& w, ConstDeviceSpan x, LayerActs& a, DeviceSpan y, std::uint64_t seed,
                          AttentionMemory mem, Pass pass) {
  const std::int64_t T = d_.tokens, h = d_.hidden;
  const std::int64_t n = d_.qkv_cols(), q = d_.q_cols();
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const double local_elems = static_cast<double>(d_.local_tokens * h);

  // Attention block.
  norm_forward(op::norm_in, pass, x, w.norm1_gamma, w.norm1_beta, a.norm1, a.norm1_mean, a.norm1_rstd);
  const ConstDeviceSpan in1 = tp_gather(op::tp_ag_attn, pass, a.norm1, a.norm1_full);
  timer_.run(linear_desc(op::qkv, pass, d_.qkv), [&] { linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, T, n, h, 1.0f, in1, w.w_qkv, 0.0f, a.qkv); });
  if (d_.flash)
    flash_forward(a, pass);
  else
    unfused_attention_forward(a, mem, pass);
  timer_.run(linear_desc(op::proj, pass, d_.proj), [&] { linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, T, h, q, 1.0f, a.ctx, w.w_proj, 0.0f, full_a_); });
  const DeviceSpan attn_out = tp_reduce(d_.sequence_parallel ? op::tp_rs_attn : op::tp_ar_attn, pass, full_a_, local_a_);
  timer_.run(mem_desc(op::drop_add_attn, pass, 3.0 * local_elems * esz),
             [&] { be_.dropout_residual_forward(attn_out, x, a.mid, d_.dropout, mix64(seed + 11)); });

  // MLP block.
  norm_forward(op::norm_mlp, pass, a.mid, w.norm2_gamma, w.norm2_beta, a.norm2, a.norm2_mean, a.norm2_rstd);
  if (w.moe) {
    CUBOID_EXEC_REQUIRE(moe_ != nullptr, "LayerRunner", "an MoE layer on a runner made without experts");
    moe_->forward(w.experts, a.norm2, a.moe, local_a_, pass);
    timer_.run(mem_desc(op::drop_add_mlp, pass, 3.0 * local_elems * esz),
               [&] { be_.dropout_residual_forward(local_a_, a.mid, y, d_.dropout, mix64(seed + 12)); });
    return;
  }
  const ConstDeviceSpan in2 = tp_gather(op::tp_ag_mlp, pass, a.norm2, a.norm2_full);
  timer_.run(linear_desc(op::fc1, pass, d_.fc1),
             [&] { linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, T, d_.fc1_cols(), h, 1.0f, in2, w.w_fc1, 0.0f, a.fc1); });
  timer_.run(mem_desc(op::act, pass, static_cast<double>(T * d_.ffn) * (d_.gated ? 3.0 : 2.0) * esz), [&] {
    if (d_.gated)
      be_.swiglu_forward(a.fc1, a.act, T, d_.ffn);
    else
      be_.gelu_forward(a.fc1, a.act);
  });
  timer_.run(linear_desc(op::fc2, pass, d_.fc2),
             [&] { linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, T, h, d_.ffn, 1.0f, a.act, w.w_fc2, 0.0f, full_a_); });
  const DeviceSpan mlp_out = tp_reduce(d_.sequence_parallel ? op::tp_rs_mlp : op::tp_ar_mlp, pass, full_a_, local_a_);
  timer_.run(mem_desc(op::drop_add_mlp, pass, 3.0 * local_elems * esz),
             [&] { be_.dropout_residual_forward(mlp_out, a.mid, y, d_.dropout, mix64(seed + 12)); });
}

void LayerRunner::backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x, LayerActs& a,
                           ConstDeviceSpan dy, DeviceSpan dx, std::uint64_t seed, AttentionMemory mem) {
  const Pass bw = Pass::backward;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const double local_elems = static_cast<double>(d_.local_tokens * d_.hidden);

  // MLP block: y = mid + dropout(reduce(act(norm2(mid) W1) W2)).
  timer_.run(mem_desc(op::drop_add_mlp_bwd, bw, 2.0 * local_elems * esz),
             [&] { be_.dropout_backward(dy, local_b_, d_.dropout, mix64(seed + 12)); });
  DeviceSpan d_norm2 = local_a_;
  if (w.moe) {
    moe_->backward(w.experts, g.experts, a.norm2, a.moe, local_b_, local_a_);
  } else {
    d_norm2 = mlp_backward(w, g, a, bw);
  }
  norm_backward(op::norm_mlp_bwd, d_norm2, a.mid, w.norm2_gamma, a.norm2_mean, a.norm2_rstd, local_b_, g.norm2_gamma,
                g.norm2_beta);
  timer_.run(mem_desc(op::residual_add_bwd, bw, 3.0 * local_elems * esz), [&] { be_.add(local_b_, dy); });
  // local_b_ now holds d mid.
  attention_backward(w, g, x, a, dx, seed, mem);
}

// The dense MLP's backward from d out (local_b_) to d norm2 output (the span returned).
DeviceSpan LayerRunner::mlp_backward(const LayerParams& w, const LayerParams& g, LayerActs& a, Pass bw) {
  const std::int64_t T = d_.tokens, h = d_.hidden;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const ConstDeviceSpan d_fc2 = tp_gather(op::tp_ag_mlp_bwd, bw, local_b_, full_b_);
  timer_.run(dgrad_desc(op::fc2_dgrad, d_.fc2),
             [&] { linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, T, d_.ffn, h, 1.0f, d_fc2, w.w_fc2, 0.0f, dact_); });
  timer_.run(wgrad_desc(op::fc2_wgrad, d_.fc2),
             [&] { linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, d_.ffn, h, T, 1.0f, a.act, d_fc2, 1.0f, g.w_fc2); });
  timer_.run(mem_desc(op::act_bwd, bw, static_cast<double>(T * d_.ffn) * (d_.gated ? 5.0 : 3.0) * esz), [&] {
    if (d_.gated)
      be_.swiglu_backward(dact_, a.fc1, dfc1_, T, d_.ffn);
    else
      be_.gelu_backward(dact_, a.fc1, dfc1_);
  });
  const ConstDeviceSpan in2 = d_.sequence_parallel ? ConstDeviceSpan(a.norm2_full) : ConstDeviceSpan(a.norm2);
  timer_.run(dgrad_desc(op::fc1_dgrad, d_.fc1),
             [&] { linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, T, h, d_.fc1_cols(), 1.0f, dfc1_, w.w_fc1, 0.0f, full_a_); });
  timer_.run(wgrad_desc(op::fc1_wgrad, d_.fc1),
             [&] { linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, h, d_.fc1_cols(), T, 1.0f, in2, dfc1_, 1.0f, g.w_fc1); });
  return tp_reduce(d_.sequence_parallel ? op::tp_rs_mlp_bwd : op::tp_ar_mlp_bwd, bw, full_a_, local_a_);
}

// The attention block's backward from d mid (local_b_) to dx:
// mid = x + dropout(reduce(attn(norm1(x)) Wproj)).
void LayerRunner::attention_backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x, LayerActs& a,
                                     DeviceSpan dx, std::uint64_t seed, AttentionMemory mem) {
  const Pass bw = Pass::backward;
  const std::int64_t T = d_.tokens, h = d_.hidden;
  const std::int64_t n = d_.qkv_cols(), q = d_.q_cols();
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const double local_elems = static_cast<double>(d_.local_tokens * h);
  timer_.run(mem_desc(op::drop_add_attn_bwd, bw, 2.0 * local_elems * esz),
             [&] { be_.dropout_backward(local_b_, local_a_, d_.dropout, mix64(seed + 11)); });
  const ConstDeviceSpan d_proj = tp_gather(op::tp_ag_attn_bwd, bw, local_a_, full_b_);
  timer_.run(dgrad_desc(op::proj_dgrad, d_.proj),
             [&] { linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, T, q, h, 1.0f, d_proj, w.w_proj, 0.0f, dctx_); });
  timer_.run(wgrad_desc(op::proj_wgrad, d_.proj),
             [&] { linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, q, h, T, 1.0f, a.ctx, d_proj, 1.0f, g.w_proj); });

  timer_.run(mem_desc(op::dqkv_zero, bw, static_cast<double>(dqkv_.bytes())), [&] { be_.fill(dqkv_, 0.0f); });
  if (d_.flash)
    flash_backward(a);
  else
    unfused_attention_backward(a, mem);
  const ConstDeviceSpan in1 = d_.sequence_parallel ? ConstDeviceSpan(a.norm1_full) : ConstDeviceSpan(a.norm1);
  timer_.run(dgrad_desc(op::qkv_dgrad, d_.qkv),
             [&] { linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, T, h, n, 1.0f, dqkv_, w.w_qkv, 0.0f, full_a_); });
  timer_.run(wgrad_desc(op::qkv_wgrad, d_.qkv),
             [&] { linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, h, n, T, 1.0f, in1, dqkv_, 1.0f, g.w_qkv); });
  const DeviceSpan d_norm1 = tp_reduce(d_.sequence_parallel ? op::tp_rs_attn_bwd : op::tp_ar_attn_bwd, bw, full_a_, local_a_);
  norm_backward(op::norm_in_bwd, d_norm1, x, w.norm1_gamma, a.norm1_mean, a.norm1_rstd, dx, g.norm1_gamma,
                g.norm1_beta);
  timer_.run(mem_desc(op::residual_add_bwd, bw, 3.0 * local_elems * esz), [&] { be_.add(dx, local_b_); });
}

// --- the fused attention core ---------------------------------------------------
// Exact attention by blocks with the softmax's log-sum-exp (FlashAttention's
// arithmetic; a block's scores are formed in scratch, so its memory and
// speed are those of the GEMMs, not of a fused kernel). Rows of Q, K, V are
// positions x micro-batch ([s, b] order), heads along the columns.

// Where a block's keys and values lie: a [positions x b, ld] buffer, K from
// column k_col and V from v_col.
struct LayerRunner::KvView {
  ConstDeviceSpan data;
  std::int64_t ld = 0, k_col = 0, v_col = 0;
};
// Queries at positions [q0, q0 + nq) against keys [k0, k0 + nk); causal on a
// diagonal block (nq = nk, the same positions).
struct LayerRunner::Block {
  std::int64_t q0 = 0, nq = 0, k0 = 0, nk = 0;
  bool causal = false;
};

namespace {
constexpr int kTagKv = 0xC0;
constexpr int kTagDkv = 0xC1;
}  // namespace

// S = Q K^T of one block into probs_tmp_ ([b x heads, nq, nk]); head j reads
// KV head j / (heads / kv_heads), each GEMM call batching the heads that
// share their place u in a KV group.
void LayerRunner::block_scores(const LayerActs& a, const Block& blk, const KvView& kv) {
  const std::int64_t b = d_.micro_batch, dh = d_.head_dim, n = d_.qkv_cols();
  const std::int64_t heads = d_.heads, gq = d_.heads / d_.kv_heads, sc = blk.nq * blk.nk;
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t u = 0; u < gq; ++u) {
      GemmShape g;
      g.trans_b = Trans::yes;
      g.m = blk.nq, g.n = blk.nk, g.k = dh;
      g.lda = b * n, g.ldb = b * kv.ld, g.ldc = blk.nk;
      g.batch = d_.kv_heads;
      g.stride_a = gq * dh, g.stride_b = dh, g.stride_c = gq * sc;
      be_.gemm(g, 1.0f, from(ConstDeviceSpan(a.qkv), (blk.q0 * b + bi) * n + u * dh),
               from(kv.data, (blk.k0 * b + bi) * kv.ld + kv.k_col), 0.0f,
               from(DeviceSpan(probs_tmp_), (bi * heads + u) * sc));
    }
}

// out (row 0 = position q0, [nq x b, q]) and lse ([nq, b x heads]) of one block.
void LayerRunner::flash_block_forward(const LayerActs& a, const Block& blk, const KvView& kv, DeviceSpan out,
                                      DeviceSpan lse, Pass pass) {
  const std::int64_t b = d_.micro_batch, dh = d_.head_dim, q = d_.q_cols();
  const std::int64_t heads = d_.heads, gq = d_.heads / d_.kv_heads, sc = blk.nq * blk.nk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  timer_.run(attention_desc(op::attn_flash, pass, blk.nq, blk.nk, dh, b * heads, blk.causal), [&] {
    block_scores(a, blk, kv);
    be_.attention_softmax_lse(probs_tmp_, lse, b * heads, blk.nq, blk.nk, scale, blk.causal);
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g;  // O = P V
        g.m = blk.nq, g.n = dh, g.k = blk.nk;
        g.lda = blk.nk, g.ldb = b * kv.ld, g.ldc = b * q;
        g.batch = d_.kv_heads;
        g.stride_a = gq * sc, g.stride_b = dh, g.stride_c = gq * dh;
        be_.gemm(g, 1.0f, from(ConstDeviceSpan(probs_tmp_), (bi * heads + u) * sc),
                 from(kv.data, (blk.k0 * b + bi) * kv.ld + kv.v_col), 0.0f, from(out, bi * q + u * dh));
      }
  });
}

// The block's backward from dctx_ with the final O and lse: dQ into dqkv_,
// dK and dV into dkv (kv's layout), all accumulated. `first` computes delta
// = dO . O for every query first (the flash backward's preprocessing).
void LayerRunner::flash_block_backward(const LayerActs& a, const Block& blk, const KvView& kv, DeviceSpan dkv,
                                       bool first) {
  const Pass bw = Pass::backward;
  const std::int64_t b = d_.micro_batch, dh = d_.head_dim, n = d_.qkv_cols(), q = d_.q_cols();
  const std::int64_t heads = d_.heads, gq = d_.heads / d_.kv_heads, sc = blk.nq * blk.nk, bh = b * heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const ConstDeviceSpan qkv = a.qkv, dctx = dctx_;
  timer_.run(attention_desc(op::attn_flash_bwd, bw, blk.nq, blk.nk, dh, bh, blk.causal), [&] {
    if (first) be_.row_dot(dctx_, a.ctx, delta_, d_.tokens * heads, dh);
    block_scores(a, blk, kv);
    be_.attention_probs(probs_tmp_, from(ConstDeviceSpan(a.lse), blk.q0 * bh), bh, blk.nq, blk.nk, scale, blk.causal);
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        const std::int64_t s_at = (bi * heads + u) * sc, o_at = (blk.q0 * b + bi) * q + u * dh;
        const std::int64_t v_at = (blk.k0 * b + bi) * kv.ld + kv.v_col;
        GemmShape dv;  // dV += P^T dO
        dv.trans_a = Trans::yes;
        dv.m = blk.nk, dv.n = dh, dv.k = blk.nq;
        dv.lda = blk.nk, dv.ldb = b * q, dv.ldc = b * kv.ld;
        dv.batch = d_.kv_heads;
        dv.stride_a = gq * sc, dv.stride_b = gq * dh, dv.stride_c = dh;
        be_.gemm(dv, 1.0f, from(ConstDeviceSpan(probs_tmp_), s_at), from(dctx, o_at), 1.0f, from(dkv, v_at));
        GemmShape dp;  // dP = dO V^T
        dp.trans_b = Trans::yes;
        dp.m = blk.nq, dp.n = blk.nk, dp.k = dh;
        dp.lda = b * q, dp.ldb = b * kv.ld, dp.ldc = blk.nk;
        dp.batch = d_.kv_heads;
        dp.stride_a = gq * dh, dp.stride_b = dh, dp.stride_c = gq * sc;
        be_.gemm(dp, 1.0f, from(dctx, o_at), from(kv.data, v_at), 0.0f, from(DeviceSpan(dprobs_), s_at));
      }
    be_.attention_softmax_grad(dprobs_, probs_tmp_, from(ConstDeviceSpan(delta_), blk.q0 * bh), bh, blk.nq, blk.nk,
                               scale);
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        const std::int64_t s_at = (bi * heads + u) * sc, q_at = (blk.q0 * b + bi) * n + u * dh;
        const std::int64_t k_at = (blk.k0 * b + bi) * kv.ld + kv.k_col;
        GemmShape dq;  // dQ += dS K
        dq.m = blk.nq, dq.n = dh, dq.k = blk.nk;
        dq.lda = blk.nk, dq.ldb = b * kv.ld, dq.ldc = b * n;
        dq.batch = d_.kv_heads;
        dq.stride_a = gq * sc, dq.stride_b = dh, dq.stride_c = gq * dh;
        be_.gemm(dq, 1.0f, from(ConstDeviceSpan(dprobs_), s_at), from(kv.data, k_at), 1.0f, from(DeviceSpan(dqkv_), q_at));
        GemmShape dk;  // dK += dS^T Q
        dk.trans_a = Trans::yes;
        dk.m = blk.nk, dk.n = dh, dk.k = blk.nq;
        dk.lda = blk.nk, dk.ldb = b * n, dk.ldc = b * kv.ld;
        dk.batch = d_.kv_heads;
        dk.stride_a = gq * sc, dk.stride_b = gq * dh, dk.stride_c = dh;
        be_.gemm(dk, 1.0f, from(ConstDeviceSpan(dprobs_), s_at), from(qkv, q_at), 1.0f, from(dkv, k_at));
      }
  });
}

// Context parallelism: this rank holds chunks r and 2 cp - 1 - r of every
// sequence (positions [0, s/2) and [s/2, s) of its s = seq / cp), so its
// two chunks against themselves are one causal block. Ring step i brings
// the K/V of rank j = r - i (mod cp): an earlier rank (j < r) is seen whole
// by both query chunks through its first chunk only; a later one (j > r)
// by the second query chunk only, through both its chunks
// (AttnFuncWithCPAndKVP2P's three cases).
LayerRunner::Block LayerRunner::ring_block(int step) const {
  const std::int64_t s = d_.seq, half = s / 2;
  if (step == 0) return Block{0, s, 0, s, true};
  const int r = cp_->rank();
  const int j = (r - step + d_.cp) % d_.cp;
  if (j < r) return Block{0, s, 0, half, false};
  return Block{half, half, 0, s, false};
}

void LayerRunner::pack_kv(const LayerActs& a, DeviceSpan kv, Pass pass) {
  const std::int64_t n = d_.qkv_cols(), q = d_.q_cols(), kvc = 2 * d_.kv_cols();
  timer_.run(mem_desc(op::cp_kv_pack, pass, 2.0 * static_cast<double>(kv.bytes())),
             [&] { be_.copy_2d(from(ConstDeviceSpan(a.qkv), q), n, kv, kvc, d_.tokens, kvc, false); });
}

void LayerRunner::flash_forward(LayerActs& a, Pass pass) {
  const std::int64_t s = d_.seq, q = d_.q_cols(), kvc = 2 * d_.kv_cols(), bh = d_.micro_batch * d_.heads;
  if (d_.cp <= 1) {
    flash_block_forward(a, Block{0, s, 0, s, true}, KvView{a.qkv, d_.qkv_cols(), q, q + d_.kv_cols()}, a.ctx, a.lse,
                        pass);
    return;
  }
  const int r = cp_->rank(), next = (r + 1) % d_.cp, prev = (r + d_.cp - 1) % d_.cp;
  const auto count = sz(d_.tokens * kvc);
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  DeviceSpan cur = kv_a_, nxt = kv_b_;
  pack_kv(a, cur, pass);
  for (int i = 0; i < d_.cp; ++i) {
    // The K/V of this step goes on around the ring while the step runs (the
    // executor exchanges first, then computes: no overlap).
    if (i + 1 < d_.cp)
      timer_.run(comm_desc(op::cp_kv_p2p, pass, Collective::send_recv, Group::cp, static_cast<double>(cur.bytes()), d_.cp),
                 [&] { cp_->send_recv(cur, count, next, nxt, count, prev, kTagKv); });
    const Block blk = ring_block(i);
    flash_block_forward(a, blk, KvView{cur, kvc, 0, d_.kv_cols()}, blk_out_, blk_lse_, pass);
    const std::int64_t rows = blk.nq * bh;
    timer_.run(mem_desc(op::cp_out_correct, pass, 3.0 * static_cast<double>(rows * d_.head_dim) * esz), [&] {
      DeviceSpan out = DeviceSpan(a.ctx).subspan(sz(blk.q0 * bh * d_.head_dim), sz(rows * d_.head_dim));
      DeviceSpan lse = DeviceSpan(a.lse).subspan(sz(blk.q0 * bh), sz(rows));
      if (i == 0) {
        be_.copy(blk_out_, out);
        be_.copy(blk_lse_, lse);
      } else {
        be_.attention_merge(out, lse, blk_out_, blk_lse_, rows, d_.head_dim);
      }
    });
    if (i + 1 < d_.cp) std::swap(cur, nxt);
  }
}

// The backward goes around the ring again: step i recomputes the block of
// forward step i, its dQ added here and its dK/dV into the travelling dK/dV
// of rank j's K/V, which moves on with them (the first remote step starts
// it); after the last step each dK/dV goes one hop further, to its owner.
void LayerRunner::flash_backward(const LayerActs& a) {
  const Pass bw = Pass::backward;
  const std::int64_t s = d_.seq, n = d_.qkv_cols(), q = d_.q_cols(), kvc = 2 * d_.kv_cols();
  const KvView local{a.qkv, n, q, q + d_.kv_cols()};
  flash_block_backward(a, Block{0, s, 0, s, true}, local, dqkv_, true);
  if (d_.cp <= 1) return;
  const int r = cp_->rank(), next = (r + 1) % d_.cp, prev = (r + d_.cp - 1) % d_.cp;
  const auto count = sz(d_.tokens * kvc);
  const double bytes = static_cast<double>(kv_a_.bytes());
  DeviceSpan cur = kv_a_, nxt = kv_b_, dcur = dkv_a_, dnxt = dkv_b_;
  pack_kv(a, cur, bw);
  for (int i = 1; i < d_.cp; ++i) {
    const bool with_grads = i > 1;
    std::vector<P2pOp> ops{P2pOp::send(cur, count, next, kTagKv)};
    if (with_grads) ops.push_back(P2pOp::send(dcur, count, next, kTagDkv));
    ops.push_back(P2pOp::recv(nxt, count, prev, kTagKv));
    if (with_grads) ops.push_back(P2pOp::recv(dnxt, count, prev, kTagDkv));
    timer_.run(comm_desc(op::cp_kv_dkv_p2p_bwd, bw, Collective::send_recv, Group::cp, bytes * (with_grads ? 2 : 1),
                         d_.cp),
               [&] { cp_->exchange(ops); });
    std::swap(cur, nxt);
    if (with_grads) std::swap(dcur, dnxt);
    if (i == 1) timer_.run(mem_desc(op::dqkv_zero, bw, static_cast<double>(dcur.bytes())), [&] { be_.fill(dcur, 0.0f); });
    flash_block_backward(a, ring_block(i), KvView{cur, kvc, 0, d_.kv_cols()}, dcur, false);
  }
  timer_.run(comm_desc(op::cp_kv_dkv_p2p_bwd, bw, Collective::send_recv, Group::cp, bytes, d_.cp),
             [&] { cp_->send_recv(dcur, count, next, dnxt, count, prev, kTagDkv); });
  timer_.run(mem_desc(op::cp_grad_sum_bwd, bw, 3.0 * bytes),
             [&] { be_.copy_2d(dnxt, kvc, from(DeviceSpan(dqkv_), q), n, d_.tokens, kvc, true); });
}

// The unfused attention core: probs = causal_softmax(Q K^T / sqrt(d)), ctx = probs V.
void LayerRunner::unfused_attention_forward(LayerActs& a, AttentionMemory mem, Pass pass) {
  const std::int64_t s = d_.seq, b = d_.micro_batch, dh = d_.head_dim;
  const std::int64_t n = d_.qkv_cols(), q = d_.q_cols(), kv = d_.kv_cols(), gq = d_.heads / d_.kv_heads;
  DeviceSpan probs = mem == AttentionMemory::keep_probs ? DeviceSpan(a.probs) : DeviceSpan(probs_tmp_);
  attention_scores(a, probs, pass);
  const std::int64_t ss = s * s;
  timer_.run(gemm_desc(op::attn_av, pass, s, dh, s, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g;
        g.m = s, g.n = dh, g.k = s;
        g.lda = s, g.ldb = b * n, g.ldc = b * q;
        g.batch = d_.kv_heads;
        g.stride_a = gq * ss, g.stride_b = dh, g.stride_c = gq * dh;
        be_.gemm(g, 1.0f, from(probs, (bi * d_.heads + u) * ss), from(ConstDeviceSpan(a.qkv), bi * n + q + kv), 0.0f,
                 from(DeviceSpan(a.ctx), bi * q + u * dh));
      }
  });
}

// Its backward from dctx_ into dqkv_ (zeroed): dV = P^T dctx, dP = dctx V^T,
// dS = softmax'(dP), dQ = dS K, dK = dS^T Q.
void LayerRunner::unfused_attention_backward(LayerActs& a, AttentionMemory mem) {
  const Pass bw = Pass::backward;
  const std::int64_t s = d_.seq, b = d_.micro_batch, dh = d_.head_dim;
  const std::int64_t n = d_.qkv_cols(), q = d_.q_cols(), kv = d_.kv_cols(), gq = d_.heads / d_.kv_heads;
  const std::int64_t ss = s * s;
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  DeviceSpan probs = a.probs.empty() || mem == AttentionMemory::recompute_probs ? DeviceSpan(probs_tmp_) : DeviceSpan(a.probs);
  if (mem == AttentionMemory::recompute_probs) attention_scores(a, probs, bw);
  timer_.run(gemm_desc(op::attn_av_dgrad, bw, s, s, dh, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g1;  // dP = dctx V^T
        g1.trans_b = Trans::yes;
        g1.m = s, g1.n = s, g1.k = dh;
        g1.lda = b * q, g1.ldb = b * n, g1.ldc = s;
        g1.batch = d_.kv_heads;
        g1.stride_a = gq * dh, g1.stride_b = dh, g1.stride_c = gq * ss;
        be_.gemm(g1, 1.0f, from(ConstDeviceSpan(dctx_), bi * q + u * dh), from(ConstDeviceSpan(a.qkv), bi * n + q + kv), 0.0f,
                 from(DeviceSpan(dprobs_), (bi * d_.heads + u) * ss));
      }
  });
  timer_.run(gemm_desc(op::attn_av_wgrad, bw, s, dh, s, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g2;  // dV += P^T dctx
        g2.trans_a = Trans::yes;
        g2.m = s, g2.n = dh, g2.k = s;
        g2.lda = s, g2.ldb = b * q, g2.ldc = b * n;
        g2.batch = d_.kv_heads;
        g2.stride_a = gq * ss, g2.stride_b = gq * dh, g2.stride_c = dh;
        be_.gemm(g2, 1.0f, from(ConstDeviceSpan(probs), (bi * d_.heads + u) * ss), from(ConstDeviceSpan(dctx_), bi * q + u * dh),
                 1.0f, from(DeviceSpan(dqkv_), bi * n + q + kv));
      }
  });
  timer_.run(mem_desc(op::attn_softmax_bwd, bw, 3.0 * static_cast<double>(b * d_.heads * ss) * esz), [&] {
    be_.causal_softmax_backward(dprobs_, probs, dprobs_, b * d_.heads, s, 1.0f / std::sqrt(static_cast<float>(dh)));
  });
  timer_.run(gemm_desc(op::attn_qk_dgrad, bw, s, dh, s, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g3;  // dQ = dS K
        g3.m = s, g3.n = dh, g3.k = s;
        g3.lda = s, g3.ldb = b * n, g3.ldc = b * n;
        g3.batch = d_.kv_heads;
        g3.stride_a = gq * ss, g3.stride_b = dh, g3.stride_c = gq * dh;
        be_.gemm(g3, 1.0f, from(ConstDeviceSpan(dprobs_), (bi * d_.heads + u) * ss), from(ConstDeviceSpan(a.qkv), bi * n + q), 0.0f,
                 from(DeviceSpan(dqkv_), bi * n + u * dh));
      }
  });
  timer_.run(gemm_desc(op::attn_qk_wgrad, bw, s, dh, s, b * d_.heads), [&] {
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t u = 0; u < gq; ++u) {
        GemmShape g4;  // dK += dS^T Q
        g4.trans_a = Trans::yes;
        g4.m = s, g4.n = dh, g4.k = s;
        g4.lda = s, g4.ldb = b * n, g4.ldc = b * n;
        g4.batch = d_.kv_heads;
        g4.stride_a = gq * ss, g4.stride_b = gq * dh, g4.stride_c = dh;
        be_.gemm(g4, 1.0f, from(ConstDeviceSpan(dprobs_), (bi * d_.heads + u) * ss), from(ConstDeviceSpan(a.qkv), bi * n + u * dh), 1.0f,
                 from(DeviceSpan(dqkv_), bi * n + q));
      }
  });
}

void LayerRunner::recompute_backward(const LayerParams& w, const LayerParams& g, ConstDeviceSpan x,
                                     ConstDeviceSpan dy, DeviceSpan dx, std::uint64_t seed) {
  if (scratch_.qkv.empty()) scratch_ = make_acts(AttentionMemory::keep_probs);
  forward(w, x, scratch_, scratch_out_, seed, AttentionMemory::keep_probs, Pass::backward);
  backward(w, g, x, scratch_, dy, dx, seed, AttentionMemory::keep_probs);
}

}  // namespace cuboid::exec
