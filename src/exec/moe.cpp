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
  d.dispatcher = plan.moe_dispatcher;
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

int EpLayout::nodes() const { return node.empty() ? 1 : *std::max_element(node.begin(), node.end()) + 1; }
int EpLayout::per_node() const { return node.empty() ? 1 : static_cast<int>(node.size()) / nodes(); }
int EpLayout::rank_at(int n, int l) const {
  for (std::size_t r = 0; r < node.size(); ++r)
    if (node[r] == n && local[r] == l) return static_cast<int>(r);
  throw ExecError(__FILE__, __LINE__, -1, "EpLayout", "no EP rank at node " + std::to_string(n) + ", local " +
                                                           std::to_string(l));
}

EpLayout ep_layout(const std::vector<int>& member_nodes) {
  EpLayout lay;
  std::vector<int> seen, count;
  for (const int m : member_nodes) {
    const auto it = std::find(seen.begin(), seen.end(), m);
    const auto n = static_cast<std::size_t>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(m);
      count.push_back(0);
    }
    lay.node.push_back(static_cast<int>(n));
    lay.local.push_back(count[n]++);
  }
  for (const int c : count)
    CUBOID_EXEC_REQUIRE(c == count.front(), "ep_layout",
                        "the flex dispatcher needs the same number of EP ranks on every node (" +
                            std::to_string(count.front()) + " and " + std::to_string(c) + ")");
  return lay;
}

FlexRoute flex_route(const std::vector<std::int32_t>& top_expert, std::int64_t topk, std::int64_t local_experts,
                     const EpLayout& lay, int /*me*/) {
  const int nodes = lay.nodes();
  const std::size_t ranks = lay.node.size();
  const std::int64_t tokens = static_cast<std::int64_t>(top_expert.size()) / topk;
  std::vector<std::vector<std::int32_t>> to(sz(nodes));
  FlexRoute r;
  r.per_rank.assign(ranks, 0);
  std::vector<char> hit_node(sz(nodes)), hit_rank(ranks);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::fill(hit_node.begin(), hit_node.end(), 0);
    std::fill(hit_rank.begin(), hit_rank.end(), 0);
    for (std::int64_t j = 0; j < topk; ++j) {
      const auto rank = static_cast<std::size_t>(top_expert[sz(t * topk + j)] / local_experts);
      hit_rank[rank] = 1;
      hit_node[sz(lay.node[rank])] = 1;
    }
    for (std::size_t q = 0; q < ranks; ++q) r.per_rank[q] += hit_rank[q] != 0 ? 1 : 0;
    for (int b = 0; b < nodes; ++b)
      if (hit_node[sz(b)] != 0) to[sz(b)].push_back(static_cast<std::int32_t>(t));
  }
  for (const auto& list : to) {
    r.per_node.push_back(list.size());
    r.token.insert(r.token.end(), list.begin(), list.end());
  }
  return r;
}

std::size_t FlexRoute::inter_node_tokens(const EpLayout& lay, int me) const {
  std::size_t n = 0;
  for (std::size_t b = 0; b < per_node.size(); ++b)
    if (static_cast<int>(b) != lay.node[sz(me)]) n += per_node[b];
  return n;
}

MoeRunner::MoeRunner(Backend& backend, Communicator* ep, const MoeDims& dims, OpTimer& timer, const FlexGroups* flex)
    : be_(backend), ep_(ep != nullptr && ep->size() > 1 ? ep : nullptr), d_(dims), timer_(timer) {
  CUBOID_EXEC_REQUIRE(d_.ep == (ep_ != nullptr ? ep_->size() : 1), "MoeRunner",
                      "the EP group has " + std::to_string(ep_ != nullptr ? ep_->size() : 1) + " ranks, the plan " +
                          std::to_string(d_.ep));
  if (ep_ != nullptr && d_.dispatcher == MoeDispatcher::flex) {
    CUBOID_EXEC_REQUIRE(flex != nullptr && flex->intra != nullptr && flex->rail != nullptr, "MoeRunner",
                        "the flex dispatcher needs the EP group's intra-node and rail groups");
    CUBOID_EXEC_REQUIRE(static_cast<int>(flex->layout.node.size()) == d_.ep &&
                            flex->intra->size() == flex->layout.per_node() && flex->rail->size() == flex->layout.nodes(),
                        "MoeRunner", "the flex groups do not match the EP group's layout");
    flex_ = flex;
  }
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
  // Per destination: its local experts' rows; with flex (DeepEP's notify)
  // also the tokens reaching it and those reaching its node.
  const std::int64_t W = flex() ? L + 2 : L;
  FlexRoute route;
  std::vector<float> send = per_expert;
  if (flex()) {
    const EpLayout& lay = flex_->layout;
    route = flex_route(a.top_expert, d_.topk, L, lay, ep_->rank());
    send.assign(sz(ep * W), 0.0f);
    for (int d = 0; d < ep; ++d) {
      for (std::int64_t l = 0; l < L; ++l) send[sz(d * W + l)] = per_expert[sz(d * L + l)];
      send[sz(d * W + L)] = static_cast<float>(route.per_rank[sz(d)]);
      send[sz(d * W + L + 1)] = static_cast<float>(route.per_node[sz(lay.node[sz(d)])]);
    }
  }
  // got[s * W + l]: rows source s sends to local expert l.
  std::vector<float> got = send;
  if (ep_ != nullptr) {
    const DeviceSpan sbuf = grown(be_, counts_send_, sz(ep * W), DType::f32);
    const DeviceSpan gbuf = grown(be_, counts_recv_, sz(ep * W), DType::f32);
    be_.upload(send, sbuf);
    timer_.run(comm_desc(op::ep_a2a_counts, pass, Collective::all_to_all, Group::ep,
                         static_cast<double>(ep * W) * kFp32Bytes, ep),
               [&] { ep_->all_to_all(sbuf, gbuf, sz(W)); });
    got = be_.download(gbuf);
  }
  std::vector<float> recv(sz(E));
  for (int s = 0; s < ep; ++s)
    for (std::int64_t l = 0; l < L; ++l) recv[sz(s * L + l)] = got[sz(s * W + l)];
  if (flex()) {
    const EpLayout& lay = flex_->layout;
    const int me = ep_->rank(), nodes = lay.nodes(), g = lay.per_node();
    MoeActs::Flex& f = a.flex;
    f.token = route.token;
    f.rail_send = route.per_node;
    f.rail_recv.assign(sz(nodes), 0);
    f.intra_recv.assign(sz(g), 0);
    f.from_source.assign(sz(ep), 0);
    for (int b = 0; b < nodes; ++b)
      f.rail_recv[sz(b)] = static_cast<std::size_t>(got[sz(lay.rank_at(b, lay.local[sz(me)]) * W + L + 1)]);
    for (int s = 0; s < ep; ++s) {
      f.from_source[sz(s)] = static_cast<std::size_t>(got[sz(s * W + L)]);
      f.intra_recv[sz(lay.local[sz(s)])] += f.from_source[sz(s)];
    }
    f.rail_sent = std::accumulate(f.rail_send.begin(), f.rail_send.end(), std::size_t{0});
    f.rail_received = std::accumulate(f.rail_recv.begin(), f.rail_recv.end(), std::size_t{0});
    f.intra_received = std::accumulate(f.intra_recv.begin(), f.intra_recv.end(), std::size_t{0});
    be_.upload_indices(f.token, grown(be_, f.token_ids, f.rail_sent, DType::i32));
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

namespace {
// An all-to-all with varying blocks of `rows[i]` rows of `width` elements.
void a2av(Communicator& c, ConstDeviceSpan send, const std::vector<std::size_t>& send_rows, DeviceSpan recv,
          const std::vector<std::size_t>& recv_rows, std::int64_t width) {
  std::vector<std::size_t> sc(send_rows), rc(recv_rows);
  for (std::size_t& v : sc) v *= sz(width);
  for (std::size_t& v : rc) v *= sz(width);
  c.all_to_all_v(send, sc, recv, rc);
}
std::size_t sum_except(const std::vector<std::size_t>& v, int skip) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (static_cast<int>(i) != skip) n += v[i];
  return n;
}
}  // namespace

// The rows this rank puts on the links (to other nodes, to its node's other
// ranks) in one direction of a flex exchange: out (dispatch-like) sends the
// first leg's rail_send and forwards intra_send; back sends the reverse.
double MoeRunner::flex_bytes(const MoeActs& a, std::int64_t width, DType dtype) const {
  const EpLayout& lay = flex_->layout;
  const int me = ep_->rank();
  const double rows = static_cast<double>(sum_except(a.flex.rail_send, lay.node[sz(me)]) +
                                          sum_except(a.flex.intra_send, lay.local[sz(me)]));
  return rows * static_cast<double>(width) * static_cast<double>(dtype_bytes(dtype));
}

void MoeRunner::flex_probs(MoeActs& a, Pass pass, DeviceSpan recv_probs) {
  MoeActs::Flex& f = a.flex;
  const EpLayout& lay = flex_->layout;
  const int me = ep_->rank(), nodes = lay.nodes(), g = lay.per_node(), my_node = lay.node[sz(me)];
  const std::int64_t k = d_.topk, L = d_.local_experts(), M = 2 * k;  // per token: k experts, k weights
  timer_.run(comm_desc(op::ep_flex_probs, pass, Collective::all_to_all, Group::ep, 0.0, d_.ep), [&] {
    // The source's rows: per token its experts (exact in f32) and weights.
    std::vector<float> meta(f.rail_sent * sz(M));
    for (std::size_t q = 0; q < f.rail_sent; ++q)
      for (std::int64_t j = 0; j < k; ++j) {
        const std::size_t i = sz(f.token[q] * k + j);
        meta[q * sz(M) + sz(j)] = static_cast<float>(a.top_expert[i]);
        meta[q * sz(M) + sz(k + j)] = a.top_prob[i];
      }
    const DeviceSpan first = grown(be_, first_meta_, f.rail_sent * sz(M), DType::f32);
    be_.upload(meta, first);
    const DeviceSpan leg1 = grown(be_, leg1_meta_, f.rail_received * sz(M), DType::f32);
    a2av(*flex_->rail, first, f.rail_send, leg1, f.rail_recv, M);
    // The forwarder: each row to every rank of this node holding one of its
    // experts, per local rank the source nodes in order.
    const std::vector<float> got1 = be_.download(leg1);
    std::vector<std::int32_t> fwd;
    f.intra_send.assign(sz(g), 0);
    for (int j = 0; j < g; ++j) {
      const int dest = lay.rank_at(my_node, j);
      for (std::size_t p = 0; p < f.rail_received; ++p) {
        bool hit = false;
        for (std::int64_t e = 0; e < k; ++e)
          hit = hit || static_cast<std::int64_t>(got1[p * sz(M) + sz(e)]) / L == dest;
        if (hit) {
          fwd.push_back(static_cast<std::int32_t>(p));
          ++f.intra_send[sz(j)];
        }
      }
    }
    f.intra_sent = fwd.size();
    be_.upload_indices(fwd, grown(be_, f.forward_ids, f.intra_sent, DType::i32));
    const DeviceSpan send2 = grown(be_, leg2_send_, f.intra_sent * sz(M), DType::f32);
    if (f.intra_sent > 0) be_.embedding_forward(f.forward_ids, leg1, send2, static_cast<std::int64_t>(f.intra_sent), M);
    const DeviceSpan leg2 = grown(be_, leg2_meta_, f.intra_received * sz(M), DType::f32);
    a2av(*flex_->intra, send2, f.intra_send, leg2, f.intra_recv, M);
    // The expert rank: the received rows are (local peer j, node b) blocks
    // of source (b, j)'s tokens; one row per local expert, source-major then
    // expert, as the alltoall dispatcher receives them.
    const std::vector<float> got2 = be_.download(leg2);
    std::vector<std::size_t> first_row(sz(d_.ep), 0);
    std::size_t at = 0;
    for (int j = 0; j < g; ++j)
      for (int b = 0; b < nodes; ++b) {
        const int src = lay.rank_at(b, j);
        first_row[sz(src)] = at;
        at += f.from_source[sz(src)];
      }
    std::vector<std::int32_t> expand, slot;
    std::vector<float> probs;
    for (int src = 0; src < d_.ep; ++src)
      for (std::int64_t l = 0; l < L; ++l) {
        const auto expert = static_cast<float>(me * L + l);
        for (std::size_t p = first_row[sz(src)]; p < first_row[sz(src)] + f.from_source[sz(src)]; ++p)
          for (std::int64_t j = 0; j < k; ++j)
            if (got2[p * sz(M) + sz(j)] == expert) {
              expand.push_back(static_cast<std::int32_t>(p));
              slot.push_back(static_cast<std::int32_t>(static_cast<std::int64_t>(p) * k + j));
              probs.push_back(got2[p * sz(M) + sz(k + j)]);
            }
      }
    CUBOID_EXEC_REQUIRE(static_cast<std::int64_t>(expand.size()) == a.received, "flex dispatch",
                        "the expert rows (" + std::to_string(expand.size()) + ") differ from the counts' (" +
                            std::to_string(a.received) + ")");
    be_.upload_indices(expand, grown(be_, f.expand_ids, expand.size(), DType::i32));
    be_.upload_indices(slot, grown(be_, f.slot_ids, slot.size(), DType::i32));
    be_.upload(probs, recv_probs.subspan(0, probs.size()));
    timer_.set_comm_bytes(flex_bytes(a, M, DType::f32));
  });
}

void MoeRunner::flex_out(const char* name, Pass pass, const MoeActs& a, ConstDeviceSpan first, DeviceSpan rows,
                         std::int64_t width) {
  const MoeActs::Flex& f = a.flex;
  const DType dt = first.dtype();
  timer_.run(comm_desc(name, pass, Collective::all_to_all, Group::ep, flex_bytes(a, width, dt), d_.ep), [&] {
    const DeviceSpan leg1 = grown(be_, leg1_, f.rail_received * sz(width), dt);
    a2av(*flex_->rail, first, f.rail_send, leg1, f.rail_recv, width);
    const DeviceSpan send2 = grown(be_, leg2_send_, f.intra_sent * sz(width), dt);
    if (f.intra_sent > 0)
      be_.embedding_forward(f.forward_ids, leg1, send2, static_cast<std::int64_t>(f.intra_sent), width);
    const DeviceSpan leg2 = grown(be_, leg2_, f.intra_received * sz(width), dt);
    a2av(*flex_->intra, send2, f.intra_send, leg2, f.intra_recv, width);
    if (a.received > 0) be_.embedding_forward(f.expand_ids, leg2, rows, a.received, width);
  });
}

void MoeRunner::flex_back(const char* name, Pass pass, const MoeActs& a, ConstDeviceSpan rows, ConstDeviceSpan ids,
                          std::int64_t per_row, DeviceSpan first, std::int64_t width) {
  const MoeActs::Flex& f = a.flex;
  const EpLayout& lay = flex_->layout;
  const int me = ep_->rank();
  const DType dt = rows.dtype();
  const double bytes = static_cast<double>(sum_except(f.intra_recv, lay.local[sz(me)]) +
                                           sum_except(f.rail_recv, lay.node[sz(me)])) *
                       static_cast<double>(width) * static_cast<double>(dtype_bytes(dt));
  timer_.run(comm_desc(name, pass, Collective::all_to_all, Group::ep, bytes, d_.ep), [&] {
    // Each token's rows summed at the expert rank, then at the forwarder.
    const DeviceSpan back2 = grown(be_, back2_, f.intra_received * sz(width), dt);
    be_.fill(back2, 0.0f);
    if (a.received > 0) be_.embedding_backward(rows, ids, back2, a.received, per_row);
    const DeviceSpan recv1 = grown(be_, back1_recv_, f.intra_sent * sz(width), dt);
    a2av(*flex_->intra, back2, f.intra_recv, recv1, f.intra_send, width);
    const DeviceSpan back1 = grown(be_, back1_, f.rail_received * sz(width), dt);
    be_.fill(back1, 0.0f);
    if (f.intra_sent > 0)
      be_.embedding_backward(recv1, f.forward_ids, back1, static_cast<std::int64_t>(f.intra_sent), width);
    a2av(*flex_->rail, back1, f.rail_recv, first, f.rail_send, width);
  });
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
    if (flex()) return;  // the flex exchange moves each token once per rank (flex_probs)
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
  // flex: each token once per node it goes to, in token order per node.
  const auto first_rows = static_cast<std::int64_t>(a.flex.rail_sent);
  const DeviceSpan permuted = flex() ? grown(be_, first_, sz(first_rows * h), cd) : grown(be_, permuted_, sz(C * h), cd);
  if (flex())
    timer_.run(mem_desc(op::moe_permute, pass, 2.0 * static_cast<double>(first_rows * h) * esz),
               [&] { be_.embedding_forward(a.flex.token_ids, x, permuted, first_rows, h); });
  else
    timer_.run(mem_desc(op::moe_permute, pass, 2.0 * static_cast<double>(C * h) * esz),
               [&] { be_.embedding_forward(a.perm_ids, x, permuted, C, h); });
  const DeviceSpan x_sorted = grown(be_, a.x_sorted, sz(R * h), cd);
  const DeviceSpan probs_sorted = grown(be_, a.probs_sorted, sz(R), DType::f32);
  DeviceSpan received = permuted, recv_probs = copy_probs;
  if (ep_ != nullptr) {
    received = L > 1 ? grown(be_, recv_, sz(R * h), cd) : x_sorted;
    recv_probs = L > 1 ? grown(be_, recv_probs_, sz(R), DType::f32) : probs_sorted;
    if (flex()) {
      flex_probs(a, pass, recv_probs);
      flex_out(op::ep_flex_dispatch, pass, a, permuted, received, h);
    } else {
      dispatch(op::ep_a2a_dispatch, pass, permuted, a.send_rows, received, a.recv_rows, h);
      dispatch(op::ep_a2a_probs, pass, copy_probs, a.send_rows, recv_probs, a.recv_rows, 1);
    }
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
  if (flex()) {
    // Summed per token at the expert rank, the forwarder, and here.
    flex_back(op::ep_flex_combine, pass, a, y_received, a.flex.expand_ids, h, permuted, h);
    timer_.run(mem_desc(op::moe_unpermute, pass, static_cast<double>(first_rows * h + T * h) * esz), [&] {
      be_.fill(y, 0.0f);
      be_.embedding_backward(permuted, a.flex.token_ids, y, first_rows, h);
    });
    return;
  }
  if (ep_ != nullptr) {
    y_copies = permuted;
    dispatch(op::ep_a2a_combine, pass, y_received, a.recv_rows, y_copies, a.send_rows, h);
  }
  timer_.run(mem_desc(op::moe_unpermute, pass, static_cast<double>(C * h + T * h) * esz), [&] {
    be_.fill(y, 0.0f);
    be_.embedding_backward(y_copies, a.perm_ids, y, C, h);
  });
}

// The softmax over each token's k logits, backward, on the host: the
// logits' gradients from the weights' (`g_slot`, [tokens, topk]).
void MoeRunner::router_logit_grads(const MoeActs& a, const std::vector<float>& g_slot, DeviceSpan dlogits) const {
  const std::int64_t T = d_.tokens, E = d_.experts;
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
}

void MoeRunner::backward(const MoeParams& w, const MoeParams& g, ConstDeviceSpan x, MoeActs& a, ConstDeviceSpan dy,
                         DeviceSpan dx) {
  const Pass bw = Pass::backward;
  const std::int64_t T = d_.tokens, h = d_.hidden, E = d_.experts, L = d_.local_experts(), C = d_.copies();
  const std::int64_t R = a.received, F = d_.ffn, F1 = d_.fc1_cols();
  const double esz = static_cast<double>(dtype_bytes(be_.compute_dtype()));
  const DType cd = be_.compute_dtype();

  // Each copy's gradient is its token's; to the experts' ranks; sorted.
  const auto first_rows = static_cast<std::int64_t>(a.flex.rail_sent);
  const DeviceSpan d_copies = flex() ? grown(be_, first_, sz(first_rows * h), cd) : grown(be_, permuted_, sz(C * h), cd);
  if (flex())
    timer_.run(mem_desc(op::moe_unpermute_bwd, bw, 2.0 * static_cast<double>(first_rows * h) * esz),
               [&] { be_.embedding_forward(a.flex.token_ids, dy, d_copies, first_rows, h); });
  else
    timer_.run(mem_desc(op::moe_unpermute_bwd, bw, 2.0 * static_cast<double>(C * h) * esz),
               [&] { be_.embedding_forward(a.perm_ids, dy, d_copies, C, h); });
  DeviceSpan d_received = d_copies;
  if (ep_ != nullptr) {
    d_received = grown(be_, recv_, sz(R * h), cd);
    if (flex())
      flex_out(op::ep_flex_combine_bwd, bw, a, d_copies, d_received, h);
    else
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
  // The router's logits' gradients (the softmax over each token's k logits, backward, on the host).
  const DeviceSpan dlogits = grown(be_, dlogits_, sz(T * E), cd);
  if (flex()) {
    // Summed per token on the way back; the weights' gradients per (token, slot).
    const DeviceSpan d_slot = grown(be_, first_meta_, sz(first_rows * d_.topk), DType::f32);
    flex_back(op::ep_flex_dispatch_bwd, bw, a, d_x_received, a.flex.expand_ids, h, d_copies, h);
    flex_back(op::ep_flex_probs_bwd, bw, a, d_probs_received, a.flex.slot_ids, 1, d_slot, d_.topk);
    timer_.run(mem_desc(op::moe_permute_bwd, bw, static_cast<double>(first_rows * h + 2 * T * h) * esz), [&] {
      be_.fill(dx, 0.0f);
      be_.embedding_backward(d_copies, a.flex.token_ids, dx, first_rows, h);
    });
    const DeviceSpan g_slot = grown(be_, copy_probs_, sz(C), DType::f32);
    timer_.run(mem_desc(op::router_topk_bwd, bw, static_cast<double>(T * E) * (esz + kFp32Bytes)), [&] {
      be_.fill(g_slot, 0.0f);
      if (first_rows > 0) be_.embedding_backward(d_slot, a.flex.token_ids, g_slot, first_rows, d_.topk);
      router_logit_grads(a, be_.download(g_slot), dlogits);
    });
  } else {
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
    timer_.run(mem_desc(op::router_topk_bwd, bw, static_cast<double>(T * E) * (esz + kFp32Bytes)), [&] {
      const std::vector<float> gp = be_.download(d_copy_probs);
      // Copy j of the expert-major order is (token, slot) i: the same walk as the forward's.
      std::vector<float> g_slot(sz(C), 0.0f);
      std::size_t j = 0;
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t i = 0; i < C; ++i)
          if (a.top_expert[sz(i)] == e) g_slot[sz(i)] = gp[j++];
      router_logit_grads(a, g_slot, dlogits);
    });
  }
  timer_.run(gemm_desc(op::router_dgrad, bw, T, h, E),
             [&] { be_.gemm(Trans::no, Trans::yes, T, h, E, 1.0f, dlogits, w.router, 1.0f, dx); });
  timer_.run(gemm_desc(op::router_wgrad, bw, h, E, T),
             [&] { be_.gemm(Trans::yes, Trans::no, h, E, T, 1.0f, x, dlogits, 1.0f, g.router); });
}

}  // namespace cuboid::exec
