// The executor's MoE MLP (src/exec/moe.cpp) on one rank, CPU backend: the
// routing and the forward against a by-hand reference, the backward against
// finite differences, and the new kernels it uses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/moe.hpp"
#include "cuboid/exec/op_timer.hpp"
#include "cuboid/exec/registry.hpp"

using namespace cuboid;
using namespace cuboid::exec;

namespace {

std::unique_ptr<Backend> cpu() {
  BackendOptions o;
  o.threads = 1;
  return make_backend("cpu", o);
}

std::vector<float> randoms(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (2.0f * uniform01(seed, i) - 1.0f) * scale;
  return v;
}

MoeDims small_dims(bool gated) {
  MoeDims d;
  d.tokens = 6;
  d.hidden = 4;
  d.experts = 4;
  d.topk = 2;
  d.ffn = 3;
  d.ep = 1;
  d.gated = gated;
  return d;
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double silu(double x) { return x / (1 + std::exp(-x)); }

// y[t] = sum over the token's top-k experts e of p_e * fc2_e(act(fc1_e(x[t]))),
// p the softmax of the k largest logits x[t] . router.
std::vector<double> reference_forward(const MoeDims& d, const std::vector<float>& x, const std::vector<float>& router,
                                      const std::vector<std::vector<float>>& fc1, const std::vector<std::vector<float>>& fc2) {
  const std::int64_t h = d.hidden, E = d.experts, F = d.ffn, F1 = d.fc1_cols();
  std::vector<double> y(static_cast<std::size_t>(d.tokens * h), 0.0);
  for (std::int64_t t = 0; t < d.tokens; ++t) {
    std::vector<double> logit(static_cast<std::size_t>(E), 0.0);
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t i = 0; i < h; ++i) logit[e] += x[t * h + i] * router[i * E + e];
    std::vector<int> order(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    double sum = 0;
    for (std::int64_t j = 0; j < d.topk; ++j) sum += std::exp(logit[order[j]] - logit[order[0]]);
    for (std::int64_t j = 0; j < d.topk; ++j) {
      const int e = order[j];
      const double p = std::exp(logit[e] - logit[order[0]]) / sum;
      std::vector<double> a(static_cast<std::size_t>(F));
      for (std::int64_t c = 0; c < F; ++c) {
        double u = 0, g = 0;
        for (std::int64_t i = 0; i < h; ++i) {
          g += x[t * h + i] * fc1[e][i * F1 + c];
          if (d.gated) u += x[t * h + i] * fc1[e][i * F1 + F + c];
        }
        a[c] = d.gated ? silu(g) * u : gelu(g);
      }
      for (std::int64_t o = 0; o < h; ++o) {
        double v = 0;
        for (std::int64_t c = 0; c < F; ++c) v += a[c] * fc2[e][c * h + o];
        y[t * h + o] += p * v;
      }
    }
  }
  return y;
}

struct Fixture {
  MoeDims d;
  std::unique_ptr<Backend> be = cpu();
  OpTimer timer{*be, nullptr};
  std::vector<float> x, router;
  std::vector<std::vector<float>> fc1, fc2;
  DeviceBuffer xb, routerb, experts, grads, router_grad, y;
  MoeParams w, g;

  explicit Fixture(bool gated) : d(small_dims(gated)) {
    x = randoms(static_cast<std::size_t>(d.tokens * d.hidden), 11, 1.0f);
    router = randoms(static_cast<std::size_t>(d.hidden * d.experts), 12, 1.0f);
    xb = be->alloc(x.size());
    be->upload(x, xb);
    routerb = be->alloc(router.size());
    be->upload(router, routerb);
    experts = be->alloc(d.expert_param_count());
    grads = be->alloc(d.expert_param_count(), DType::f32);
    be->fill(grads, 0.0f);
    router_grad = be->alloc(router.size(), DType::f32);
    be->fill(router_grad, 0.0f);
    w = expert_params_at(experts, 0, d);
    w.router = routerb;
    g = expert_params_at(grads, 0, d);
    g.router = router_grad;
    for (std::int64_t e = 0; e < d.experts; ++e) {
      fc1.push_back(randoms(w.fc1[e].size(), 20 + e, 0.5f));
      fc2.push_back(randoms(w.fc2[e].size(), 40 + e, 0.5f));
      be->upload(fc1.back(), w.fc1[e]);
      be->upload(fc2.back(), w.fc2[e]);
    }
    y = be->alloc(x.size());
  }
  // L = sum(y * r) for a fixed random r.
  double loss(const std::vector<float>& r) {
    MoeRunner runner(*be, nullptr, d, timer);
    MoeActs acts;
    be->upload(x, xb);
    be->upload(router, routerb);
    for (std::int64_t e = 0; e < d.experts; ++e) {
      be->upload(fc1[e], w.fc1[e]);
      be->upload(fc2[e], w.fc2[e]);
    }
    runner.forward(w, xb, acts, y);
    const std::vector<float> out = be->download(y);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += static_cast<double>(out[i]) * r[i];
    return l;
  }
};

}  // namespace

TEST_CASE("scale_rows and row_dot: by hand") {
  auto be = cpu();
  DeviceBuffer x = be->alloc(6), f = be->alloc(2, DType::f32), out = be->alloc(2, DType::f32);
  be->upload({1, 2, 3, 4, 5, 6}, x);
  be->upload({2, -1}, f);
  be->scale_rows(x, f, 2, 3);
  CHECK(be->download(x) == std::vector<float>{2, 4, 6, -4, -5, -6});
  DeviceBuffer b = be->alloc(6);
  be->upload({1, 0, 1, 0, 1, 0}, b);
  be->row_dot(x, b, out, 2, 3);
  CHECK(be->download(out) == std::vector<float>{8, -5});
  DeviceBuffer ids = be->alloc(2, DType::i32);
  CHECK_THROWS_WITH_AS(be->scale_rows(x, ids, 2, 3), doctest::Contains("factors must be f32"), ExecError);
  CHECK_THROWS_WITH_AS(be->row_dot(x, b, out, 3, 3), doctest::Contains("holds 6 elements, needs 9"), ExecError);
}

TEST_CASE("MoE forward (EP 1): top-2 routing and the experts against a by-hand reference, GeLU and SwiGLU") {
  for (bool gated : {false, true}) {
    CAPTURE(gated);
    Fixture f(gated);
    MoeRunner runner(*f.be, nullptr, f.d, f.timer);
    MoeActs acts;
    runner.forward(f.w, f.xb, acts, f.y);
    const std::vector<double> ref = reference_forward(f.d, f.x, f.router, f.fc1, f.fc2);
    const std::vector<float> got = f.be->download(f.y);
    for (std::size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-4));
    // Every token's two copies were computed: 12 rows over the 4 experts.
    CHECK(acts.received == f.d.tokens * f.d.topk);
    std::int64_t rows = 0;
    for (std::int64_t n : acts.expert_rows) rows += n;
    CHECK(rows == 12);
    for (std::int64_t t = 0; t < f.d.tokens; ++t)
      CHECK(acts.top_prob[t * 2] + acts.top_prob[t * 2 + 1] == doctest::Approx(1.0));
  }
}

TEST_CASE("MoE backward (EP 1): input, router and expert gradients against finite differences") {
  for (bool gated : {false, true}) {
    CAPTURE(gated);
    Fixture f(gated);
    const std::vector<float> r = randoms(f.x.size(), 99, 1.0f);
    MoeRunner runner(*f.be, nullptr, f.d, f.timer);
    MoeActs acts;
    runner.forward(f.w, f.xb, acts, f.y);
    DeviceBuffer dy = f.be->alloc(r.size()), dx = f.be->alloc(r.size());
    f.be->upload(r, dy);
    runner.backward(f.w, f.g, f.xb, acts, dy, dx);
    const std::vector<float> dxv = f.be->download(dx), drv = f.be->download(f.router_grad);
    const std::vector<float> dexp = f.be->download(f.grads);

    const float eps = 1e-3f;
    auto numeric = [&](float& v) {
      const float keep = v;
      v = keep + eps;
      const double up = f.loss(r);
      v = keep - eps;
      const double down = f.loss(r);
      v = keep;
      return (up - down) / (2.0 * eps);
    };
    // The routing is piecewise constant: a perturbation of 1e-3 keeps every
    // token's top-2 for these draws (checked: the same rows per expert).
    for (std::size_t i = 0; i < f.x.size(); ++i) CHECK(dxv[i] == doctest::Approx(numeric(f.x[i])).epsilon(2e-2).scale(1e-2));
    for (std::size_t i = 0; i < f.router.size(); ++i)
      CHECK(drv[i] == doctest::Approx(numeric(f.router[i])).epsilon(2e-2).scale(1e-2));
    // Expert 0's FC1 and expert 3's FC2, element by element (laid out per expert: fc1 then fc2).
    const std::size_t fc1_n = f.w.fc1[0].size(), fc2_n = f.w.fc2[0].size();
    for (std::size_t i = 0; i < fc1_n; ++i) CHECK(dexp[i] == doctest::Approx(numeric(f.fc1[0][i])).epsilon(2e-2).scale(1e-2));
    const std::size_t at3 = 3 * (fc1_n + fc2_n) + fc1_n;
    for (std::size_t i = 0; i < fc2_n; ++i)
      CHECK(dexp[at3 + i] == doctest::Approx(numeric(f.fc2[3][i])).epsilon(2e-2).scale(1e-2));
  }
}

TEST_CASE("MoE: the EP group must match the plan's EP") {
  auto be = cpu();
  OpTimer timer(*be, nullptr);
  MoeDims d = small_dims(false);
  d.ep = 2;
  CHECK_THROWS_WITH_AS(MoeRunner(*be, nullptr, d, timer), doctest::Contains("the EP group has 1 ranks, the plan 2"),
                       ExecError);
}

// The flex dispatcher's first leg (DeepEP's internode dispatch): EP 4 over 2
// nodes x 2 ranks, 8 experts, 2 per rank (expert e on EP rank e / 2; ranks 0
// and 1 on node 0, 2 and 3 on node 1), top-2. Source rank 0's four tokens:
//   t0 -> experts 0, 1: rank 0 only           -> node 0
//   t1 -> experts 2, 5: ranks 1 and 2         -> nodes 0 and 1
//   t2 -> experts 4, 6: ranks 2 and 3         -> node 1 (once, for two ranks)
//   t3 -> experts 7, 3: ranks 3 and 1         -> nodes 1 and 0
// Node 0 gets t0, t1, t3; node 1 gets t1, t2, t3: 3 tokens cross the
// inter-node link, where alltoall sends 4 copies there (t1's expert 5, t2's
// 4 and 6, t3's 7). Per rank (a token once): rank 0 t0; rank 1 t1, t3;
// rank 2 t1, t2; rank 3 t2, t3.
TEST_CASE("MoE flex: each token crosses to a node once, to the sender's rail") {
  const EpLayout lay = ep_layout({0, 0, 1, 1});
  CHECK(lay.nodes() == 2);
  CHECK(lay.per_node() == 2);
  CHECK(lay.rank_at(1, 0) == 2);
  CHECK(lay.local == std::vector<int>{0, 1, 0, 1});
  const std::vector<std::int32_t> top{0, 1, 2, 5, 4, 6, 7, 3};
  const FlexRoute r = flex_route(top, 2, 2, lay, 0);
  CHECK(r.per_node == std::vector<std::size_t>{3, 3});
  CHECK(r.token == std::vector<std::int32_t>{0, 1, 3, 1, 2, 3});
  CHECK(r.per_rank == std::vector<std::size_t>{1, 2, 2, 2});
  CHECK(r.inter_node_tokens(lay, 0) == 3);
  // From rank 2 (node 1) the same tokens cross the other way: t0, t1, t3.
  CHECK(r.inter_node_tokens(lay, 2) == 3);
  // Megatron-Core's order with nodes interleaved in the group (ranks 0, 2 on
  // one node): the layout follows the members' nodes, not their order.
  const EpLayout mixed = ep_layout({5, 6, 5, 6});
  CHECK(mixed.node == std::vector<int>{0, 1, 0, 1});
  CHECK(mixed.local == std::vector<int>{0, 0, 1, 1});
  CHECK_THROWS_WITH_AS(ep_layout({0, 0, 1}), doctest::Contains("the same number of EP ranks on every node"),
                       ExecError);
}
