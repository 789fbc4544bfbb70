// The MoE MLP of one rank (moe.hpp): route, permute, dispatch, grouped
// expert GEMMs, combine, unpermute; and the way back.
#include "cuboid/exec/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::exec {

namespace {
std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// The first `n` elements of `b`, reallocated (contents lost) when it holds fewer.
DeviceSpan grown(Backend& be, DeviceBuffer& b, std::size_t n, DType dtype) {
  if (b.size() < n || b.dtype() != dtype) b = be.alloc(std::max<std::size_t>(n, 1), dtype);
  return DeviceSpan(b).subspan(0, n);
}

// The timer's record of a grouped GEMM: one GEMM per local expert over the
// `rows` token rows the experts share. The rows are the product's M
// (forward, dgrad) or its K (wgrad); that dimension is passed as 0. Listed at
// the mean rows per expert with `experts` as the batch, the FLOPs those of
// all rows.
OpDesc grouped_desc(const char* name, Pass pass, std::int64_t rows, std::int64_t experts, std::int64_t m,
                    std::int64_t n, std::int64_t k) {
  const std::int64_t per = std::max<std::int64_t>(1, rows / std::max<std::int64_t>(1, experts));
  const bool rows_are_m = m == 0;
  OpDesc desc = rows_are_m ? gemm_desc(name, pass, per, n, k, experts) : gemm_desc(name, pass, m, n, per, experts);
  desc.flops = 2.0 * static_cast<double>(rows) * static_cast<double>(rows_are_m ? n * k : m * n);
  return desc;
}
}  // namespace

MoeDims moe_dims(const ModelSpec& model, const ParallelPlan& plan, std::int64_t tokens) {
  MoeDims d;
  d.tokens = tokens;
  d.hidden = model.hidden_size;
  d.experts = model.moe.num_experts;
  d.topk = model.moe.experts_per_token;
  d.ffn = model.moe.expert_ffn_hidden_size;
  d.ep = plan.ep;
  d.gated = model.gated_mlp();
  d.precision = plan.precision;
  return d;
}

GemmQuantization gemm_quantization(Precision p, GemmRole role) {
  CUBOID_EXEC_REQUIRE(p == Precision::fp8_current || p == Precision::mxfp8, "gemm_quantization",
                      "the executor quantizes fp8-current and mxfp8 GEMMs only");
  GemmQuantization q;
  if (p == Precision::mxfp8) {
    q.scaling = QuantScaling::mx;
    return q;
  }
  q.scaling = QuantScaling::per_tensor;
  if (role == GemmRole::dgrad) q.a = Fp8Format::e5m2;
  if (role == GemmRole::wgrad) q.b = Fp8Format::e5m2;
  return q;
}

void linear_gemm(Backend& be, Precision precision, GemmRole role, Trans trans_a, Trans trans_b, std::int64_t m,
                 std::int64_t n, std::int64_t k, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                 DeviceSpan c) {
  if (precision == Precision::bf16)
    be.gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  else
    be.gemm_quantized(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, gemm_quantization(precision, role));
}

MoeParams expert_params_at(DeviceSpan flat, std::size_t offset, const MoeDims& d) {
  MoeParams p;
  const auto h = sz(d.hidden);
  for (std::int64_t e = 0; e < d.local_experts(); ++e) {
    p.fc1.push_back(flat.subspan(offset, h * sz(d.fc1_cols())));
    offset += h * sz(d.fc1_cols());
    p.fc2.push_back(flat.subspan(offset, sz(d.ffn) * h));
    offset += sz(d.ffn) * h;
  }
  return p;
}

MoeRunner::MoeRunner(Backend& backend, Communicator* ep, const MoeDims& dims, OpTimer& timer)
    : be_(backend), ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr), d_(dims), timer_(timer) {
  CUBOID_EXEC_REQUIRE(d_.ep == (ep_ != nullptr ? ep_->size() : 1), "MoeRunner",
                      "the EP group has " + std::to_string(ep_ != nullptr ? ep_->size() : 1) + " ranks, the plan " +
                          std::to_string(d_.ep));
}

template <typename F>
void MoeRunner::each_expert(const MoeActs& a, F&& f) const {
  std::int64_t first = 0;
  for (std::int64_t e = 0; e < d_.local_experts(); ++e) {
    const std::int64_t rows = a.expert_rows[sz(e)];
    if (rows > 0) f(e, first, rows);
    first += rows;
  }
}

// Top-k by logit (ties to the lower expert), probabilities the softmax of
// the k logits; the copies in expert order, each expert's in token order
// (Megatron's permute of the routing map, expert-major).
void MoeRunner::route(const std::vector<float>& logits, MoeActs& a) const {
  const std::int64_t T = d_.tokens, E = d_.experts, k = d_.topk;
  a.top_expert.assign(sz(T * k), 0);
  a.top_prob.assign(sz(T * k), 0.0f);
  std::vector<std::int32_t> order(sz(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int32_t x, std::int32_t y) {
      return row[x] > row[y] || (row[x] == row[y] && x < y);
    });
    const float top = row[order[0]];
    float sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(row[order[sz(j)]] - top);
    for (std::int64_t j = 0; j < k; ++j) {
      a.top_expert[sz(t * k + j)] = order[sz(j)];
      a.top_prob[sz(t * k + j)] = std::exp(row[order[sz(j)]] - top) / sum;
    }
  }
}

void MoeRunner::exchange_counts(MoeActs& a, Pass pass) {
  const std::int64_t E = d_.experts, L = d_.local_experts();
  const int ep = d_.ep;
  std::vector<float> per_expert(sz(E), 0.0f);
  for (const std::int32_t e : a.top_expert) per_expert[sz(e)] += 1.0f;
  a.send_rows.assign(sz(ep), 0);
  for (std::int64_t e = 0; e < E; ++e) a.send_rows[sz(e / L)] += static_cast<std::size_t>(per_expert[sz(e)]);
  // recv[s * L + l]: rows source s sends to local expert l.
  std::vector<float> recv = per_expert;
  if (ep_ != nullptr) {
    const DeviceSpan send = grown(be_, counts_send_, sz(E), DType::f32);
    const DeviceSpan got = grown(be_, counts_recv_, sz(E), DType::f32);
    be_.upload(per_expert, send);
    timer_.run(comm_desc(op::ep_a2a_counts, pass, Collective::all_to_all, Group::ep, static_cast<double>(E) * kFp32Bytes, ep),
               [&] { ep_->all_to_all(send, got, sz(L)); });
    recv = be_.download(got);
  }
  a.recv_rows.assign(sz(ep), 0);
  a.expert_rows.assign(sz(L), 0);
  for (int s = 0; s < ep; ++s)
    for (std::int64_t l = 0; l < L; ++l) {
      const auto n = static_cast<std::int64_t>(recv[sz(s * L + l)]);
      a.recv_rows[sz(s)] += sz(n);
      a.expert_rows[sz(l)] += n;
    }
  a.received = std::accumulate(a.expert_rows.begin(), a.expert_rows.end(), std::int64_t{0});
  if (L <= 1 || a.received == 0) return;
  // Received rows come source-major (s, l); the experts want (l, s).
  std::vector<std::int64_t> first_of(sz(L), 0);  // first sorted row of expert l
  for (std::int64_t l = 1; l < L; ++l) first_of[sz(l)] = first_of[sz(l - 1)] + a.expert_rows[sz(l - 1)];
  std::vector<std::int32_t> sort(sz(a.received)), unsort(sz(a.received));
  std::int64_t at = 0;
  for (int s = 0; s < ep; ++s)
    for (std::int64_t l = 0; l < L; ++l) {
      const auto n = static_cast<std::int64_t>(recv[sz(s * L + l)]);
      for (std::int64_t i = 0; i < n; ++i, ++at) {
        const std::int64_t to = first_of[sz(l)]++;
        sort[sz(to)] = static_cast<std::int32_t>(at);
        unsort[sz(at)] = static_cast<std::int32_t>(to);
      }
    }
  be_.upload_indices(sort, grown(be_, a.sort_ids, sz(a.received), DType::i32));
  be_.upload_indices(unsort, grown(be_, a.unsort_ids, sz(a.received), DType::i32));
}

void MoeRunner::dispatch(const char* name, Pass pass, ConstDeviceSpan send, std::span<const std::size_t> send_rows,
                         DeviceSpan recv, std::span<const std::size_t> recv_rows, std::int64_t width) {
  std::vector<std::size_t> sc(send_rows.begin(), send_rows.end()), rc(recv_rows.begin(), recv_rows.end());
  double bytes = 0;
  for (std::size_t& c : sc) {
    c *= sz(width);
    bytes += static_cast<double>(c);
  }
  for (std::size_t& c : rc) c *= sz(width);
  bytes *= static_cast<double>(dtype_bytes(send.dtype()));
  timer_.run(comm_desc(name, pass, Collective::all_to_all, Group::ep, bytes, d_.ep),
             [&] { ep_->all_to_all_v(send, sc, recv, rc); });
}

void MoeRunner::forward(const MoeParams& w, ConstDeviceSpan x, MoeActs& a, DeviceSpan y, Pass pass) {
  const std::int64_t T = d_.tokens, h = d_.hidden, E = d_.experts, L = d_.local_experts(), C = d_.copies();
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const DType cd = be_.compute_dtype();

  const DeviceSpan logits = grown(be_, logits_, sz(T * E), cd);
  timer_.run(gemm_desc(op::router, pass, T, E, h), [&] { be_.gemm(Trans::no, Trans::no, T, E, h, 1.0f, x, w.router, 0.0f, logits); });
  // The top-k on the host: the logits down, the copies' order and probabilities up.
  const DeviceSpan copy_probs = grown(be_, copy_probs_, sz(C), DType::f32);
  timer_.run(mem_desc(op::router_topk, pass, static_cast<double>(T * E) * (esz + kFp32Bytes)), [&] {
    route(be_.download(logits), a);
    std::vector<std::int32_t> perm;
    std::vector<float> probs;
    perm.reserve(sz(C));
    probs.reserve(sz(C));
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t i = 0; i < C; ++i)
        if (a.top_expert[sz(i)] == e) {
          perm.push_back(static_cast<std::int32_t>(i / d_.topk));
          probs.push_back(a.top_prob[sz(i)]);
        }
    be_.upload_indices(perm, grown(be_, a.perm_ids, sz(C), DType::i32));
    be_.upload(probs, copy_probs);
  });
  exchange_counts(a, pass);
  const std::int64_t R = a.received;

  // Copies in expert order; sent to the experts' ranks; sorted by local expert.
  const DeviceSpan permuted = grown(be_, permuted_, sz(C * h), cd);
  timer_.run(mem_desc(op::moe_permute, pass, 2.0 * static_cast<double>(C * h) * esz),
             [&] { be_.embedding_forward(a.perm_ids, x, permuted, C, h); });
  const DeviceSpan x_sorted = grown(be_, a.x_sorted, sz(R * h), cd);
  const DeviceSpan probs_sorted = grown(be_, a.probs_sorted, sz(R), DType::f32);
  DeviceSpan received = permuted, recv_probs = copy_probs;
  if (ep_ != nullptr) {
    received = L > 1 ? grown(be_, recv_, sz(R * h), cd) : x_sorted;
    recv_probs = L > 1 ? grown(be_, recv_probs_, sz(R), DType::f32) : probs_sorted;
    dispatch(op::ep_a2a_dispatch, pass, permuted, a.send_rows, received, a.recv_rows, h);
    dispatch(op::ep_a2a_probs, pass, copy_probs, a.send_rows, recv_probs, a.recv_rows, 1);
  }
  if (L > 1) {
    timer_.run(mem_desc(op::moe_sort, pass, 2.0 * static_cast<double>(R * h) * esz), [&] {
      if (R == 0) return;
      be_.embedding_forward(a.sort_ids, received, x_sorted, R, h);
      be_.embedding_forward(a.sort_ids, recv_probs, probs_sorted, R, 1);
    });
  } else if (ep_ == nullptr) {
    be_.copy(received, x_sorted);
    be_.copy(recv_probs, probs_sorted);
  }

  // The local experts.
  const std::int64_t F = d_.ffn, F1 = d_.fc1_cols();
  const DeviceSpan fc1 = grown(be_, a.fc1, sz(R * F1), cd);
  const DeviceSpan act = grown(be_, a.act, sz(R * F), cd);
  const DeviceSpan act_scaled = grown(be_, a.act_scaled, sz(R * F), cd);
  const DeviceSpan y_sorted = grown(be_, y_sorted_, sz(R * h), cd);
  timer_.run(grouped_desc(op::expert_fc1, pass, R, L, 0, F1, h), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, n, F1, h, 1.0f, x_sorted.subspan(sz(r0 * h), sz(n * h)), w.fc1[sz(e)], 0.0f,
               fc1.subspan(sz(r0 * F1), sz(n * F1)));
    });
  });
  timer_.run(mem_desc(op::expert_act, pass, static_cast<double>(R * F) * (d_.gated ? 4.0 : 3.0) * esz), [&] {
    if (R == 0) return;
    if (d_.gated)
      be_.swiglu_forward(fc1, act, R, F);
    else
      be_.gelu_forward(fc1, act);
    be_.copy(act, act_scaled);
    be_.scale_rows(act_scaled, probs_sorted, R, F);
  });
  timer_.run(grouped_desc(op::expert_fc2, pass, R, L, 0, h, F), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::forward, Trans::no, Trans::no, n, h, F, 1.0f, act_scaled.subspan(sz(r0 * F), sz(n * F)), w.fc2[sz(e)], 0.0f,
               y_sorted.subspan(sz(r0 * h), sz(n * h)));
    });
  });

  // Back to the source order, to the source ranks, and summed per token.
  DeviceSpan y_received = y_sorted;
  if (L > 1) {
    y_received = grown(be_, recv_, sz(R * h), cd);
    timer_.run(mem_desc(op::moe_unsort, pass, 2.0 * static_cast<double>(R * h) * esz), [&] {
      if (R > 0) be_.embedding_forward(a.unsort_ids, y_sorted, y_received, R, h);
    });
  }
  DeviceSpan y_copies = y_received;
  if (ep_ != nullptr) {
    y_copies = permuted;
    dispatch(op::ep_a2a_combine, pass, y_received, a.recv_rows, y_copies, a.send_rows, h);
  }
  timer_.run(mem_desc(op::moe_unpermute, pass, static_cast<double>(C * h + T * h) * esz), [&] {
    be_.fill(y, 0.0f);
    be_.embedding_backward(y_copies, a.perm_ids, y, C, h);
  });
}

void MoeRunner::backward(const MoeParams& w, const MoeParams& g, ConstDeviceSpan x, MoeActs& a, ConstDeviceSpan dy,
                         DeviceSpan dx) {
  const Pass bw = Pass::backward;
  const std::int64_t T = d_.tokens, h = d_.hidden, E = d_.experts, L = d_.local_experts(), C = d_.copies();
  const std::int64_t R = a.received, F = d_.ffn, F1 = d_.fc1_cols();
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const DType cd = be_.compute_dtype();

  // Each copy's gradient is its token's; to the experts' ranks; sorted.
  const DeviceSpan d_copies = grown(be_, permuted_, sz(C * h), cd);
  timer_.run(mem_desc(op::moe_unpermute_bwd, bw, 2.0 * static_cast<double>(C * h) * esz),
             [&] { be_.embedding_forward(a.perm_ids, dy, d_copies, C, h); });
  DeviceSpan d_received = d_copies;
  if (ep_ != nullptr) {
    d_received = grown(be_, recv_, sz(R * h), cd);
    dispatch(op::ep_a2a_combine_bwd, bw, d_copies, a.send_rows, d_received, a.recv_rows, h);
  }
  DeviceSpan d_y = d_received;
  if (L > 1) {
    d_y = grown(be_, d_sorted_, sz(R * h), cd);
    timer_.run(mem_desc(op::moe_unsort_bwd, bw, 2.0 * static_cast<double>(R * h) * esz), [&] {
      if (R > 0) be_.embedding_forward(a.sort_ids, d_received, d_y, R, h);
    });
  }

  // The experts, backward.
  const DeviceSpan d_act = grown(be_, d_act_, sz(R * F), cd);
  const DeviceSpan d_fc1 = grown(be_, d_fc1_, sz(R * F1), cd);
  const DeviceSpan d_probs = grown(be_, d_probs_, sz(R), DType::f32);
  const DeviceSpan d_x_sorted = grown(be_, y_sorted_, sz(R * h), cd);
  timer_.run(grouped_desc(op::expert_fc2_dgrad, bw, R, L, 0, F, h), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, n, F, h, 1.0f, d_y.subspan(sz(r0 * h), sz(n * h)), w.fc2[sz(e)], 0.0f,
               d_act.subspan(sz(r0 * F), sz(n * F)));
    });
  });
  timer_.run(grouped_desc(op::expert_fc2_wgrad, bw, R, L, F, h, 0), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, F, h, n, 1.0f, ConstDeviceSpan(a.act_scaled).subspan(sz(r0 * F), sz(n * F)),
               d_y.subspan(sz(r0 * h), sz(n * h)), 1.0f, g.fc2[sz(e)]);
    });
  });
  timer_.run(mem_desc(op::expert_act_bwd, bw, static_cast<double>(R * F) * (d_.gated ? 6.0 : 4.0) * esz), [&] {
    if (R == 0) return;
    // d prob = <d act_scaled, act>; d act = prob * d act_scaled.
    be_.row_dot(d_act, ConstDeviceSpan(a.act).subspan(0, sz(R * F)), d_probs, R, F);
    be_.scale_rows(d_act, ConstDeviceSpan(a.probs_sorted).subspan(0, sz(R)), R, F);
    if (d_.gated)
      be_.swiglu_backward(d_act, ConstDeviceSpan(a.fc1).subspan(0, sz(R * F1)), d_fc1, R, F);
    else
      be_.gelu_backward(d_act, ConstDeviceSpan(a.fc1).subspan(0, sz(R * F1)), d_fc1);
  });
  timer_.run(grouped_desc(op::expert_fc1_dgrad, bw, R, L, 0, h, F1), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::dgrad, Trans::no, Trans::yes, n, h, F1, 1.0f, d_fc1.subspan(sz(r0 * F1), sz(n * F1)), w.fc1[sz(e)], 0.0f,
               d_x_sorted.subspan(sz(r0 * h), sz(n * h)));
    });
  });
  timer_.run(grouped_desc(op::expert_fc1_wgrad, bw, R, L, h, F1, 0), [&] {
    each_expert(a, [&](std::int64_t e, std::int64_t r0, std::int64_t n) {
      linear_gemm(be_, d_.precision, GemmRole::wgrad, Trans::yes, Trans::no, h, F1, n, 1.0f, ConstDeviceSpan(a.x_sorted).subspan(sz(r0 * h), sz(n * h)),
               d_fc1.subspan(sz(r0 * F1), sz(n * F1)), 1.0f, g.fc1[sz(e)]);
    });
  });

  // Back to the source order and ranks: the copies' input and probability gradients.
  DeviceSpan d_x_received = d_x_sorted, d_probs_received = d_probs;
  if (L > 1) {
    d_x_received = grown(be_, recv_, sz(R * h), cd);
    d_probs_received = grown(be_, d_probs_recv_, sz(R), DType::f32);
    timer_.run(mem_desc(op::moe_sort_bwd, bw, 2.0 * static_cast<double>(R * h) * esz), [&] {
      if (R == 0) return;
      be_.embedding_forward(a.unsort_ids, d_x_sorted, d_x_received, R, h);
      be_.embedding_forward(a.unsort_ids, d_probs, d_probs_received, R, 1);
    });
  }
  DeviceSpan d_x_copies = d_x_received, d_copy_probs = d_probs_received;
  if (ep_ != nullptr) {
    d_x_copies = d_copies;
    d_copy_probs = grown(be_, copy_probs_, sz(C), DType::f32);
    dispatch(op::ep_a2a_dispatch_bwd, bw, d_x_received, a.recv_rows, d_x_copies, a.send_rows, h);
    dispatch(op::ep_a2a_probs_bwd, bw, d_probs_received, a.recv_rows, d_copy_probs, a.send_rows, 1);
  }
  timer_.run(mem_desc(op::moe_permute_bwd, bw, static_cast<double>(C * h + 2 * T * h) * esz), [&] {
    be_.fill(dx, 0.0f);
    be_.embedding_backward(d_x_copies, a.perm_ids, dx, C, h);
  });

  // The router: the softmax over each token's k logits, backward, on the host.
  const DeviceSpan dlogits = grown(be_, dlogits_, sz(T * E), cd);
  timer_.run(mem_desc(op::router_topk_bwd, bw, static_cast<double>(T * E) * (esz + kFp32Bytes)), [&] {
    const std::vector<float> gp = be_.download(d_copy_probs);
    // Copy j of the expert-major order is (token, slot) i: the same walk as the forward's.
    std::vector<float> g_slot(sz(C), 0.0f);
    std::size_t j = 0;
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t i = 0; i < C; ++i)
        if (a.top_expert[sz(i)] == e) g_slot[sz(i)] = gp[j++];
    std::vector<float> dl(sz(T * E), 0.0f);
    for (std::int64_t t = 0; t < T; ++t) {
      float dot = 0;
      for (std::int64_t k = 0; k < d_.topk; ++k) dot += a.top_prob[sz(t * d_.topk + k)] * g_slot[sz(t * d_.topk + k)];
      for (std::int64_t k = 0; k < d_.topk; ++k) {
        const std::size_t i = sz(t * d_.topk + k);
        dl[sz(t * E + a.top_expert[i])] = a.top_prob[i] * (g_slot[i] - dot);
      }
    }
    be_.upload(dl, dlogits);
  });
  timer_.run(gemm_desc(op::router_dgrad, bw, T, h, E),
             [&] { be_.gemm(Trans::no, Trans::yes, T, h, E, 1.0f, dlogits, w.router, 1.0f, dx); });
  timer_.run(gemm_desc(op::router_wgrad, bw, h, E, T),
             [&] { be_.gemm(Trans::yes, Trans::no, h, E, T, 1.0f, x, dlogits, 1.0f, g.router); });
}

}  // namespace cuboid::exec
