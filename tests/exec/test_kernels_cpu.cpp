// The CPU backend's kernels against naive double-precision references:
// forwards compared value by value, backwards against central finite
// differences of L = sum(dy * f(x)), GEMM in every transpose combination,
// Adam against hand-computed steps, dropout's mask against its definition.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/cpu_backend.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/registry.hpp"

using namespace cuboid::exec;

namespace {

using Vec = std::vector<double>;

// Values in [-scale, scale), reproducible, independent of the backend's RNG.
std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (2.0f * uniform01(seed * 7919 + 13, i) - 1.0f) * scale;
  return v;
}

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

DeviceBuffer upload(Backend& backend, const std::vector<float>& host) {
  DeviceBuffer buffer = backend.alloc(host.size());
  backend.upload(host, buffer);
  return buffer;
}

DeviceBuffer upload_f32(Backend& backend, const std::vector<float>& host) {
  DeviceBuffer buffer = backend.alloc(host.size(), DType::f32);
  backend.upload(host, buffer);
  return buffer;
}

DeviceBuffer zeros(Backend& backend, std::size_t n) {
  DeviceBuffer buffer = backend.alloc(n);
  backend.fill(buffer, 0.0f);
  return buffer;
}

DeviceBuffer indices(Backend& backend, const std::vector<std::int32_t>& host) {
  DeviceBuffer buffer = backend.alloc(host.size(), DType::i32);
  backend.upload_indices(host, buffer);
  return buffer;
}

void check_close(const std::vector<float>& actual, const Vec& expected, double rtol, double atol,
                 const char* what) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO(what << "[" << i << "]: " << actual[i] << " vs " << expected[i]);
    CHECK(std::abs(static_cast<double>(actual[i]) - expected[i]) <=
          atol + rtol * std::abs(expected[i]));
  }
}

// d loss / d x by central differences (loss evaluated in double).
Vec numeric_grad(const std::function<double(const Vec&)>& loss, Vec x, double h = 1e-5) {
  Vec grad(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss(x);
    x[i] = saved - h;
    const double down = loss(x);
    x[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr double kFwdRtol = 1e-5;
constexpr double kFwdAtol = 1e-5;
constexpr double kGradRtol = 1e-3;
constexpr double kGradAtol = 1e-4;

// --- naive references (double) ---------------------------------------------------
Vec layernorm_ref(const Vec& x, const Vec& gamma, const Vec& beta, int rows, int cols,
                  double eps) {
  Vec y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < cols; ++c) mean += x[r * cols + c] / cols;
    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean) / cols;
    for (int c = 0; c < cols; ++c) {
      y[r * cols + c] = (x[r * cols + c] - mean) / std::sqrt(var + eps) * gamma[c] + beta[c];
    }
  }
  return y;
}

Vec rmsnorm_ref(const Vec& x, const Vec& gamma, int rows, int cols, double eps) {
  Vec y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ms = 0;
    for (int c = 0; c < cols; ++c) ms += x[r * cols + c] * x[r * cols + c] / cols;
    for (int c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] / std::sqrt(ms + eps) * gamma[c];
  }
  return y;
}

Vec causal_softmax_ref(const Vec& x, int batch, int s, double scale) {
  Vec y(x.size(), 0.0);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < s; ++i) {
      const double* xr = &x[(b * s + i) * s];
      double* yr = &y[(b * s + i) * s];
      double sum = 0;
      for (int j = 0; j <= i; ++j) sum += std::exp(scale * xr[j]);
      for (int j = 0; j <= i; ++j) yr[j] = std::exp(scale * xr[j]) / sum;
    }
  }
  return y;
}

double gelu_ref(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

Vec swiglu_ref(const Vec& x, int rows, int ffn) {
  Vec y(static_cast<std::size_t>(rows * ffn));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < ffn; ++c) {
      const double g = x[r * 2 * ffn + c];
      const double u = x[r * 2 * ffn + ffn + c];
      y[r * ffn + c] = g / (1 + std::exp(-g)) * u;
    }
  }
  return y;
}

double cross_entropy_ref(const Vec& logits, const std::vector<std::int32_t>& labels, int rows,
                         int vocab) {
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int c = 0; c < vocab; ++c) sum += std::exp(logits[r * vocab + c]);
    total += std::log(sum) - logits[r * vocab + labels[static_cast<std::size_t>(r)]];
  }
  return total / rows;
}

// Stored element (i, j) of op(M) where M is stored with row stride ld.
double op_at(const std::vector<float>& stored, std::int64_t offset, Trans t, std::int64_t ld,
             std::int64_t i, std::int64_t j) {
  return t == Trans::no ? stored[static_cast<std::size_t>(offset + i * ld + j)]
                        : stored[static_cast<std::size_t>(offset + j * ld + i)];
}

}  // namespace

// ---------------------------------------------------------------------------------
TEST_CASE("registry: cpu by name, unknown names rejected with the choices") {
  auto backend = make_backend("cpu");
  CHECK(backend->name() == "cpu");
  CHECK(backend->compute_dtype() == DType::f32);
  CHECK(backend_list().front().name == "cpu");
  try {
    (void)make_backend("tpu");
    FAIL("no exception");
  } catch (const cuboid::InputError& e) {
    CHECK(e.field() == "--backend");
    CHECK(std::string(e.problem()) == "unknown backend 'tpu'");
    CHECK(e.fix().find("cpu") != std::string::npos);
  }
  bool has_cuda = false;
  for (const BackendInfo& info : backend_list()) has_cuda = has_cuda || info.name == "cuda";
  if (!has_cuda) {
    try {
      (void)make_backend("cuda");
      FAIL("no exception");
    } catch (const cuboid::InputError& e) {
      CHECK(std::string(e.problem()) == "this build has no CUDA backend");
    }
  }
  BackendOptions two_threads;
  two_threads.threads = 2;
  CHECK(make_backend("cpu", two_threads)->name() == "cpu");
}

TEST_CASE("buffers: move-only ownership, spans, subspans, dtype conversions") {
  CpuBackend backend;
  static_assert(!std::is_copy_constructible_v<DeviceBuffer>);
  static_assert(std::is_nothrow_move_constructible_v<DeviceBuffer>);
  DeviceBuffer a = upload(backend, {1, 2, 3, 4, 5});
  DeviceBuffer b = std::move(a);
  CHECK(a.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  CHECK(b.size() == 5);
  CHECK(b.bytes() == 20);
  CHECK(backend.download(b.subspan(1, 3)) == std::vector<float>{2, 3, 4});
  CHECK_THROWS_AS((void)b.subspan(3, 3), ExecError);
  CHECK(backend.download(b.subspan(3)) == std::vector<float>{4, 5});
  CHECK(b.subspan(5).empty());
  CHECK_THROWS_AS((void)b.subspan(6), ExecError);
  CHECK(ConstDeviceSpan(b).subspan(1).subspan(1, 2).size() == 2);

  backend.scale(b.subspan(0, 2), 10.0f);
  DeviceBuffer c = upload(backend, {1, 1, 1, 1, 1});
  backend.add(b, c);
  CHECK(backend.download(b) == std::vector<float>{11, 21, 4, 5, 6});
  DeviceBuffer d = backend.alloc(5);
  backend.copy(b, d);
  CHECK(backend.download(d) == backend.download(b));

  DeviceBuffer ids = indices(backend, {3, -1, 7});
  CHECK(ids.dtype() == DType::i32);
  CHECK(backend.download(ids) == std::vector<float>{3, -1, 7});
  CHECK_THROWS_AS(backend.alloc(4, DType::bf16), ExecError);
  CHECK(backend.alloc(0).empty());
}

TEST_CASE("fill_random is deterministic, in range and seed-dependent") {
  CpuBackend backend;
  DeviceBuffer a = backend.alloc(1000);
  DeviceBuffer b = backend.alloc(1000);
  backend.fill_random(a, 42, 0.02f);
  backend.fill_random(b, 42, 0.02f);
  const auto va = backend.download(a);
  CHECK(va == backend.download(b));
  double mean = 0;
  for (float v : va) {
    CHECK(v >= -0.02f);
    CHECK(v < 0.02f);
    mean += v / 1000.0;
  }
  CHECK(std::abs(mean) < 0.002);
  backend.fill_random(b, 43, 0.02f);
  CHECK(va != backend.download(b));
}

TEST_CASE("gemm: all four transpose combinations against a naive product") {
  CpuBackend backend;
  const std::int64_t m = 5, n = 4, k = 3;
  for (Trans ta : {Trans::no, Trans::yes}) {
    for (Trans tb : {Trans::no, Trans::yes}) {
      CAPTURE(static_cast<int>(ta));
      CAPTURE(static_cast<int>(tb));
      const auto a = random_values(m * k, 1);
      const auto b = random_values(k * n, 2);
      const auto c0 = random_values(m * n, 3);
      const std::int64_t lda = ta == Trans::no ? k : m;
      const std::int64_t ldb = tb == Trans::no ? n : k;
      Vec expected(static_cast<std::size_t>(m * n));
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t p = 0; p < k; ++p) s += op_at(a, 0, ta, lda, i, p) * op_at(b, 0, tb, ldb, p, j);
          expected[static_cast<std::size_t>(i * n + j)] = 1.5 * s - 0.5 * c0[static_cast<std::size_t>(i * n + j)];
        }
      }
      DeviceBuffer da = upload(backend, a);
      DeviceBuffer db = upload(backend, b);
      DeviceBuffer dc = upload(backend, c0);
      backend.gemm(ta, tb, m, n, k, 1.5f, da, db, -0.5f, dc);
      check_close(backend.download(dc), expected, kFwdRtol, kFwdAtol, "C");
    }
  }
}

TEST_CASE("gemm: leading dimensions pick a column block out of a wider matrix") {
  CpuBackend backend;
  // A is the left 2 x 3 block of a stored 2 x 5 matrix; C the right 2 x 2 block of a 2 x 4.
  const std::vector<float> a = {1, 2, 3, 90, 91, 4, 5, 6, 92, 93};
  const std::vector<float> b = {1, 0, 0, 1, 1, 1};  // 3 x 2
  DeviceBuffer da = upload(backend, a);
  DeviceBuffer db = upload(backend, b);
  DeviceBuffer dc = upload(backend, {7, 7, 0, 0, 7, 7, 0, 0});
  GemmShape shape;
  shape.m = 2;
  shape.n = 2;
  shape.k = 3;
  shape.lda = 5;
  shape.ldc = 4;
  backend.gemm(shape, 1.0f, da, db, 0.0f, dc.subspan(2, 6));
  CHECK(backend.download(dc) == std::vector<float>{7, 7, 4, 5, 7, 7, 10, 11});
}

TEST_CASE("gemm: strided batch, including a broadcast operand (stride 0)") {
  CpuBackend backend;
  const std::int64_t batch = 3, m = 4, n = 3, k = 5;
  const auto a = random_values(batch * m * k, 4);
  const auto b = random_values(k * n, 5);  // one B for every batch entry
  DeviceBuffer da = upload(backend, a);
  DeviceBuffer db = upload(backend, b);
  DeviceBuffer dc = zeros(backend, batch * m * n);
  backend.gemm_strided_batched(Trans::no, Trans::no, m, n, k, 1.0f, da, m * k, db, 0, 0.0f, dc,
                               m * n, batch);
  Vec expected(static_cast<std::size_t>(batch * m * n));
  for (std::int64_t q = 0; q < batch; ++q) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          s += op_at(a, q * m * k, Trans::no, k, i, p) * op_at(b, 0, Trans::no, n, p, j);
        }
        expected[static_cast<std::size_t>(q * m * n + i * n + j)] = s;
      }
    }
  }
  check_close(backend.download(dc), expected, kFwdRtol, kFwdAtol, "C");

  // Attention shape: scores = Q K^T per head, packed strides.
  const auto q = random_values(batch * m * k, 6);
  const auto kk = random_values(batch * m * k, 7);
  DeviceBuffer dq = upload(backend, q);
  DeviceBuffer dk = upload(backend, kk);
  DeviceBuffer ds = zeros(backend, batch * m * m);
  backend.gemm_strided_batched(Trans::no, Trans::yes, m, m, k, 0.5f, dq, m * k, dk, m * k, 0.0f,
                               ds, m * m, batch);
  Vec scores(static_cast<std::size_t>(batch * m * m));
  for (std::int64_t h = 0; h < batch; ++h) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          s += q[static_cast<std::size_t>(h * m * k + i * k + p)] *
               kk[static_cast<std::size_t>(h * m * k + j * k + p)];
        }
        scores[static_cast<std::size_t>(h * m * m + i * m + j)] = 0.5 * s;
      }
    }
  }
  check_close(backend.download(ds), scores, kFwdRtol, kFwdAtol, "scores");
}

TEST_CASE("gemm: undersized operands are rejected with the operand named") {
  CpuBackend backend;
  DeviceBuffer a = backend.alloc(5);
  DeviceBuffer b = backend.alloc(6);
  DeviceBuffer c = backend.alloc(4);
  try {
    backend.gemm(Trans::no, Trans::no, 2, 2, 3, 1.0f, a, b, 0.0f, c);
    FAIL("no exception");
  } catch (const ExecError& e) {
    CHECK(e.op() == "gemm");
    CHECK(e.detail() == "A holds 5 elements, needs 6");
    CHECK(e.line() > 0);
    CHECK(std::string(e.what()).find("gemm: A holds 5 elements, needs 6 (") != std::string::npos);
  }
}

TEST_CASE("layernorm: forward, saved stats, backward against finite differences") {
  CpuBackend backend;
  const int rows = 3, cols = 7;
  const float eps = 1e-5f;
  const auto x = random_values(rows * cols, 10, 2.0f);
  auto gamma = random_values(cols, 11);
  for (float& g : gamma) g += 1.0f;
  const auto beta = random_values(cols, 12);
  const auto dy = random_values(rows * cols, 13);
  DeviceBuffer dx_in = upload(backend, x), dg = upload(backend, gamma), db = upload(backend, beta);
  DeviceBuffer y = backend.alloc(rows * cols);
  DeviceBuffer mean = backend.alloc(rows, DType::f32), rstd = backend.alloc(rows, DType::f32);
  backend.layernorm_forward(dx_in, dg, db, y, mean, rstd, rows, cols, eps);
  const Vec xd = to_double(x), gd = to_double(gamma), bd = to_double(beta), dyd = to_double(dy);
  check_close(backend.download(y), layernorm_ref(xd, gd, bd, rows, cols, eps), kFwdRtol, kFwdAtol, "y");

  DeviceBuffer ddy = upload(backend, dy);
  DeviceBuffer dx = backend.alloc(rows * cols);
  DeviceBuffer dgamma = zeros(backend, cols), dbeta = zeros(backend, cols);
  backend.layernorm_backward(ddy, dx_in, dg, mean, rstd, dx, dgamma, dbeta, rows, cols);
  check_close(backend.download(dx),
              numeric_grad([&](const Vec& v) { return dot(dyd, layernorm_ref(v, gd, bd, rows, cols, eps)); }, xd),
              kGradRtol, kGradAtol, "dx");
  check_close(backend.download(dgamma),
              numeric_grad([&](const Vec& v) { return dot(dyd, layernorm_ref(xd, v, bd, rows, cols, eps)); }, gd),
              kGradRtol, kGradAtol, "dgamma");
  const Vec dbeta_expected =
      numeric_grad([&](const Vec& v) { return dot(dyd, layernorm_ref(xd, gd, v, rows, cols, eps)); }, bd);
  check_close(backend.download(dbeta), dbeta_expected, kGradRtol, kGradAtol, "dbeta");

  SUBCASE("parameter gradients accumulate across calls") {
    backend.layernorm_backward(ddy, dx_in, dg, mean, rstd, dx, dgamma, dbeta, rows, cols);
    Vec twice = dbeta_expected;
    for (double& v : twice) v *= 2;
    check_close(backend.download(dbeta), twice, kGradRtol, kGradAtol, "dbeta x2");
  }
}

TEST_CASE("rmsnorm: forward and backward against finite differences") {
  CpuBackend backend;
  const int rows = 4, cols = 6;
  const float eps = 1e-6f;
  const auto x = random_values(rows * cols, 20, 1.5f);
  auto gamma = random_values(cols, 21);
  for (float& g : gamma) g += 1.0f;
  const auto dy = random_values(rows * cols, 22);
  DeviceBuffer dxin = upload(backend, x), dg = upload(backend, gamma);
  DeviceBuffer y = backend.alloc(rows * cols), rstd = backend.alloc(rows, DType::f32);
  backend.rmsnorm_forward(dxin, dg, y, rstd, rows, cols, eps);
  const Vec xd = to_double(x), gd = to_double(gamma), dyd = to_double(dy);
  check_close(backend.download(y), rmsnorm_ref(xd, gd, rows, cols, eps), kFwdRtol, kFwdAtol, "y");

  DeviceBuffer ddy = upload(backend, dy), dx = backend.alloc(rows * cols), dgamma = zeros(backend, cols);
  backend.rmsnorm_backward(ddy, dxin, dg, rstd, dx, dgamma, rows, cols);
  check_close(backend.download(dx),
              numeric_grad([&](const Vec& v) { return dot(dyd, rmsnorm_ref(v, gd, rows, cols, eps)); }, xd),
              kGradRtol, kGradAtol, "dx");
  check_close(backend.download(dgamma),
              numeric_grad([&](const Vec& v) { return dot(dyd, rmsnorm_ref(xd, v, rows, cols, eps)); }, gd),
              kGradRtol, kGradAtol, "dgamma");
}

TEST_CASE("causal softmax: masked, scaled forward; backward; in place") {
  CpuBackend backend;
  const int batch = 2, s = 5;
  const float scale = 0.35f;
  const auto x = random_values(batch * s * s, 30, 3.0f);
  const auto dy = random_values(batch * s * s, 31);
  DeviceBuffer dxin = upload(backend, x), y = backend.alloc(batch * s * s);
  backend.causal_softmax_forward(dxin, y, batch, s, scale);
  const Vec xd = to_double(x), dyd = to_double(dy);
  const auto yv = backend.download(y);
  check_close(yv, causal_softmax_ref(xd, batch, s, scale), kFwdRtol, kFwdAtol, "y");
  CHECK(yv[1] == 0.0f);   // row 0 sees only column 0
  CHECK(yv[0] == doctest::Approx(1.0f));

  DeviceBuffer ddy = upload(backend, dy), dx = backend.alloc(batch * s * s);
  backend.causal_softmax_backward(ddy, y, dx, batch, s, scale);
  const Vec expected =
      numeric_grad([&](const Vec& v) { return dot(dyd, causal_softmax_ref(v, batch, s, scale)); }, xd);
  check_close(backend.download(dx), expected, kGradRtol, kGradAtol, "dx");

  SUBCASE("in place") {
    backend.causal_softmax_forward(dxin, dxin, batch, s, scale);
    CHECK(backend.download(dxin) == yv);
    backend.causal_softmax_backward(ddy, dxin, ddy, batch, s, scale);
    check_close(backend.download(ddy), expected, kGradRtol, kGradAtol, "dx in place");
  }
}

TEST_CASE("fused attention pieces: softmax with its log-sum-exp, probabilities from it, the gradient, the merge") {
  CpuBackend backend;
  const int batch = 3, nq = 4, nk = 4;
  const float scale = 0.4f;
  const auto x = random_values(batch * nq * nk, 40, 3.0f);
  // Causal: the same probabilities as causal_softmax_forward, lse[i, bh] by hand.
  DeviceBuffer p = upload(backend, x), lse = backend.alloc(batch * nq, DType::f32);
  backend.attention_softmax_lse(p, lse, batch, nq, nk, scale, true);
  const auto pv = backend.download(p);
  check_close(pv, causal_softmax_ref(to_double(x), batch, nq, scale), kFwdRtol, kFwdAtol, "P");
  const auto lv = backend.download(lse);
  for (int bh = 0; bh < batch; ++bh)
    for (int i = 0; i < nq; ++i) {
      double sum = 0;
      for (int j = 0; j <= i; ++j) sum += std::exp(scale * x[(bh * nq + i) * nk + j]);
      CHECK(lv[i * batch + bh] == doctest::Approx(std::log(sum)).epsilon(1e-5));
    }
  // From the lse, the same probabilities again.
  DeviceBuffer again = upload(backend, x);
  backend.attention_probs(again, lse, batch, nq, nk, scale, true);
  CHECK(backend.download(again) == pv);
  // dS = scale P (dP - delta) with delta = sum_j dP_j P_j: the causal softmax's backward.
  const auto dp = random_values(batch * nq * nk, 41);
  std::vector<float> delta(batch * nq);
  for (int bh = 0; bh < batch; ++bh)
    for (int i = 0; i < nq; ++i) {
      float d = 0;
      for (int j = 0; j < nk; ++j) d += dp[(bh * nq + i) * nk + j] * pv[(bh * nq + i) * nk + j];
      delta[i * batch + bh] = d;
    }
  DeviceBuffer ds = upload(backend, dp), dl = backend.alloc(delta.size(), DType::f32), dref = backend.alloc(dp.size());
  backend.upload(delta, dl);
  backend.attention_softmax_grad(ds, p, dl, batch, nq, nk, scale);
  DeviceBuffer ddy = upload(backend, dp);
  backend.causal_softmax_backward(ddy, p, dref, batch, nq, scale);
  check_close(backend.download(ds), to_double(backend.download(dref)), kFwdRtol, kFwdAtol, "dS");

  // Two halves of the keys, each softmaxed alone and merged, equal the whole
  // (non-causal) softmax applied to V: the CP ring's out correction.
  const int rows = 5, cols = 3, keys = 6, half = keys / 2;
  const auto s = random_values(rows * keys, 42, 2.0f), v = random_values(keys * cols, 43);
  auto block = [&](int first, std::vector<float>& out, std::vector<float>& l) {
    std::vector<float> part(rows * half);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < half; ++j) part[r * half + j] = s[r * keys + first + j];
    DeviceBuffer sp = upload(backend, part), ls = backend.alloc(rows, DType::f32);
    backend.attention_softmax_lse(sp, ls, 1, rows, half, 1.0f, false);
    const auto pp = backend.download(sp);
    out.assign(rows * cols, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        for (int j = 0; j < half; ++j) out[r * cols + c] += pp[r * half + j] * v[(first + j) * cols + c];
    l = backend.download(ls);
  };
  std::vector<float> o1, l1, o2, l2;
  block(0, o1, l1);
  block(half, o2, l2);
  DeviceBuffer out = upload(backend, o1), lo = upload_f32(backend, l1), blk = upload(backend, o2), lb = upload_f32(backend, l2);
  backend.attention_merge(out, lo, blk, lb, rows, cols);
  Vec expected(rows * cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    double m = -1e30, z = 0;
    for (int j = 0; j < keys; ++j) m = std::max(m, static_cast<double>(s[r * keys + j]));
    for (int j = 0; j < keys; ++j) z += std::exp(s[r * keys + j] - m);
    for (int c = 0; c < cols; ++c)
      for (int j = 0; j < keys; ++j) expected[r * cols + c] += std::exp(s[r * keys + j] - m) / z * v[j * cols + c];
    CHECK(backend.download(lo)[r] == doctest::Approx(m + std::log(z)).epsilon(1e-5));
  }
  check_close(backend.download(out), expected, kFwdRtol, kFwdAtol, "merged output");

  // copy_2d: a column block between strided matrices, copied and accumulated.
  const auto src = random_values(4 * 5, 44);
  DeviceBuffer a = upload(backend, src), dst = zeros(backend, 4 * 3);
  backend.copy_2d(ConstDeviceSpan(a).subspan(1, 19), 5, dst, 3, 4, 3, false);
  backend.copy_2d(ConstDeviceSpan(a).subspan(1, 19), 5, dst, 3, 4, 3, true);
  const auto dv = backend.download(dst);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) CHECK(dv[r * 3 + c] == doctest::Approx(2.0f * src[r * 5 + 1 + c]));
  CHECK_THROWS_AS(backend.attention_softmax_lse(p, lse, batch, nq, nk + 1, scale, true), ExecError);
}

TEST_CASE("gelu: tanh approximation forward and backward") {
  CpuBackend backend;
  const auto x = random_values(33, 40, 4.0f);
  const auto dy = random_values(33, 41);
  DeviceBuffer dxin = upload(backend, x), y = backend.alloc(33);
  backend.gelu_forward(dxin, y);
  Vec expected(33);
  for (std::size_t i = 0; i < 33; ++i) expected[i] = gelu_ref(x[i]);
  check_close(backend.download(y), expected, kFwdRtol, kFwdAtol, "y");
  DeviceBuffer ddy = upload(backend, dy), dx = backend.alloc(33);
  backend.gelu_backward(ddy, dxin, dx);
  const Vec dyd = to_double(dy);
  check_close(backend.download(dx), numeric_grad([&](const Vec& v) {
                double s = 0;
                for (std::size_t i = 0; i < v.size(); ++i) s += dyd[i] * gelu_ref(v[i]);
                return s;
              }, to_double(x)),
              kGradRtol, kGradAtol, "dx");
}

// The CPU GeLU uses its own vectorisable exp (cost independent of the input):
// it must still match the tanh formula to float precision over the whole
// range, tails included, and stay finite for extreme inputs.
TEST_CASE("gelu: accurate to 1e-6 from -12 to 12 (relative; absolute 1e-9 |x| in the tail), finite beyond") {
  CpuBackend backend;
  constexpr std::size_t kPoints = 4801;
  Vec xs(kPoints);
  std::vector<float> x(kPoints);
  for (std::size_t i = 0; i < kPoints; ++i) {
    x[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(kPoints - 1);
    xs[i] = x[i];
  }
  DeviceBuffer dx_in = upload(backend, x), y = backend.alloc(kPoints);
  backend.gelu_forward(dx_in, y);
  const std::vector<float> got = backend.download(y);
  double worst = 0;
  for (std::size_t i = 0; i < kPoints; ++i) {
    const double ref = gelu_ref(xs[i]);
    // In the negative tail GeLU is x e^{2u} with |u| up to 90: float's
    // rounding of u alone (ulp(40) = 4e-6) limits the relative accuracy of
    // any float evaluation there, so the bound is 1e-6 relative plus an
    // absolute 1e-9 |x| (where |u| > 8 loses relative digits, GeLU is below 1e-7 |x|).
    worst = std::max(worst, std::fabs(got[i] - ref) / (std::fabs(ref) + 1e-3 * std::fabs(xs[i])));
  }
  CHECK(worst < 1e-6);
  const std::vector<float> extreme{-1e30f, -300.0f, -90.0f, 90.0f, 300.0f, 1e30f};
  DeviceBuffer ex = upload(backend, extreme), ey = backend.alloc(extreme.size());
  backend.gelu_forward(ex, ey);
  const std::vector<float> eg = backend.download(ey);
  for (std::size_t i = 0; i < extreme.size(); ++i) {
    CHECK(std::isfinite(eg[i]));
    if (extreme[i] > 0) CHECK(eg[i] == extreme[i]);
    // The exp argument is clamped at 87, so GeLU's tail floors at x / (1 + e^87) ~ x * 1.6e-38.
    if (extreme[i] < 0) CHECK(std::fabs(eg[i]) < 1e-7f);
  }
}

TEST_CASE("swiglu: [gate | up] halves forward and backward") {
  CpuBackend backend;
  const int rows = 3, ffn = 5;
  const auto x = random_values(rows * 2 * ffn, 50, 3.0f);
  const auto dy = random_values(rows * ffn, 51);
  DeviceBuffer dxin = upload(backend, x), y = backend.alloc(rows * ffn);
  backend.swiglu_forward(dxin, y, rows, ffn);
  const Vec xd = to_double(x), dyd = to_double(dy);
  check_close(backend.download(y), swiglu_ref(xd, rows, ffn), kFwdRtol, kFwdAtol, "y");
  DeviceBuffer ddy = upload(backend, dy), dx = backend.alloc(rows * 2 * ffn);
  backend.swiglu_backward(ddy, dxin, dx, rows, ffn);
  check_close(backend.download(dx),
              numeric_grad([&](const Vec& v) { return dot(dyd, swiglu_ref(v, rows, ffn)); }, xd),
              kGradRtol, kGradAtol, "dx");
}

TEST_CASE("bias: broadcast add and column-sum backward (accumulating)") {
  CpuBackend backend;
  DeviceBuffer y = upload(backend, {1, 2, 3, 4, 5, 6});
  DeviceBuffer bias = upload(backend, {10, 20, 30});
  backend.bias_add(y, bias, 2, 3);
  CHECK(backend.download(y) == std::vector<float>{11, 22, 33, 14, 25, 36});
  DeviceBuffer dbias = upload(backend, {1, 1, 1});
  backend.bias_backward(y, dbias, 2, 3);
  CHECK(backend.download(dbias) == std::vector<float>{26, 48, 70});
}

TEST_CASE("dropout + residual: seeded, deterministic, scaled; backward uses the same mask") {
  CpuBackend backend;
  const std::size_t n = 4000;
  const float p = 0.25f;
  const auto x = random_values(n, 60);
  const auto residual = random_values(n, 61);
  DeviceBuffer dxin = upload(backend, x), dres = upload(backend, residual);
  DeviceBuffer out1 = backend.alloc(n), out2 = backend.alloc(n);
  backend.dropout_residual_forward(dxin, dres, out1, p, 1234);
  backend.dropout_residual_forward(dxin, dres, out2, p, 1234);
  const auto o1 = backend.download(out1);
  CHECK(o1 == backend.download(out2));
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(1234, i, p);
    kept += keep ? 1 : 0;
    const double expected = residual[i] + (keep ? x[i] / (1.0 - p) : 0.0);
    CHECK(o1[i] == doctest::Approx(expected).epsilon(1e-6));
  }
  CHECK(static_cast<double>(kept) / n == doctest::Approx(1.0 - p).epsilon(0.05));
  backend.dropout_residual_forward(dxin, dres, out2, p, 1235);
  CHECK(o1 != backend.download(out2));

  DeviceBuffer dx = backend.alloc(n);
  backend.dropout_backward(dxin, dx, p, 1234);
  const auto g = backend.download(dx);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(g[i] == doctest::Approx(dropout_keep(1234, i, p) ? x[i] / (1.0 - p) : 0.0).epsilon(1e-6));
  }

  SUBCASE("p = 0 is a residual add; out may alias residual") {
    backend.dropout_residual_forward(dxin, dres, dres, 0.0f, 9);
    const auto sum = backend.download(dres);
    for (std::size_t i = 0; i < n; ++i) CHECK(sum[i] == x[i] + residual[i]);
  }
  CHECK_THROWS_AS(backend.dropout_backward(dxin, dx, 1.0f, 1), ExecError);
}

TEST_CASE("embedding: gather rows, zero for ids outside the shard; scatter-add backward") {
  CpuBackend backend;
  const int vocab = 4, hidden = 3;
  std::vector<float> table(vocab * hidden);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  DeviceBuffer dtable = upload(backend, table);
  DeviceBuffer ids = indices(backend, {2, 0, 2, 7});
  DeviceBuffer out = backend.alloc(4 * hidden);
  backend.embedding_forward(ids, dtable, out, 4, hidden);
  CHECK(backend.download(out) == std::vector<float>{6, 7, 8, 0, 1, 2, 6, 7, 8, 0, 0, 0});
  DeviceBuffer grad = zeros(backend, vocab * hidden);
  DeviceBuffer dout = upload(backend, std::vector<float>(4 * hidden, 1.0f));
  backend.embedding_backward(dout, ids, grad, 4, hidden);
  CHECK(backend.download(grad) == std::vector<float>{1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0});
}

TEST_CASE("cross entropy: mean loss and gradient against finite differences, in place") {
  CpuBackend backend;
  const int rows = 3, vocab = 6;
  const auto logits = random_values(rows * vocab, 70, 3.0f);
  const std::vector<std::int32_t> labels = {5, 0, 2};
  DeviceBuffer dlog = upload(backend, logits), dlab = indices(backend, labels);
  DeviceBuffer grad = backend.alloc(rows * vocab), loss = backend.alloc(1, DType::f32);
  backend.cross_entropy(dlog, dlab, grad, loss, rows, vocab);
  const Vec ld = to_double(logits);
  CHECK(backend.download(loss)[0] ==
        doctest::Approx(cross_entropy_ref(ld, labels, rows, vocab)).epsilon(1e-5));
  const Vec expected =
      numeric_grad([&](const Vec& v) { return cross_entropy_ref(v, labels, rows, vocab); }, ld);
  check_close(backend.download(grad), expected, kGradRtol, kGradAtol, "dlogits");
  backend.cross_entropy(dlog, dlab, dlog, loss, rows, vocab);
  check_close(backend.download(dlog), expected, kGradRtol, kGradAtol, "dlogits in place");

  DeviceBuffer bad = indices(backend, {0, 6, 1});
  CHECK_THROWS_AS(backend.cross_entropy(dlog, bad, grad, loss, rows, vocab), ExecError);
}

TEST_CASE("adam: two steps against hand-computed values") {
  CpuBackend backend;
  // lr 0.1, beta1 0.9, beta2 0.999, eps 1e-8; p0 = 1.
  // step 1, g = 0.5:  m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25, p = 1 - 0.1 * 0.5 / 0.5 = 0.9
  // step 2, g = -0.25: m = 0.02, v = 0.00031225, m^ = 0.02 / 0.19 = 0.1052632,
  //                   v^ = 0.00031225 / 0.001999 = 0.1562031, p = 0.9 - 0.1 * 0.1052632 / 0.3952254
  //                     = 0.8733663
  AdamConfig config;
  config.lr = 0.1f;
  config.beta1 = 0.9f;
  config.beta2 = 0.999f;
  config.eps = 1e-8f;
  DeviceBuffer p = upload(backend, {1.0f}), g = upload(backend, {0.5f});
  DeviceBuffer m = zeros(backend, 1), v = zeros(backend, 1);
  backend.adam_step(p, g, m, v, config, 1);
  CHECK(backend.download(p)[0] == doctest::Approx(0.9).epsilon(1e-6));
  CHECK(backend.download(m)[0] == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(backend.download(v)[0] == doctest::Approx(0.00025).epsilon(1e-6));
  backend.upload({-0.25f}, g);
  backend.adam_step(p, g, m, v, config, 2);
  CHECK(backend.download(p)[0] == doctest::Approx(0.8733663).epsilon(1e-6));
  CHECK(backend.download(m)[0] == doctest::Approx(0.02).epsilon(1e-5));
  CHECK(backend.download(v)[0] == doctest::Approx(0.00031225).epsilon(1e-5));

  SUBCASE("decoupled weight decay") {
    // lr 0.01, wd 0.1, beta1 0.9, beta2 0.95, p0 = 2, g = 1: m^ = v^ = 1,
    // p = 2 * (1 - 0.001) - 0.01 * 1 / 1 = 1.988.
    AdamConfig wd;
    wd.lr = 0.01f;
    wd.weight_decay = 0.1f;
    DeviceBuffer p2 = upload(backend, {2.0f}), g2 = upload(backend, {1.0f});
    DeviceBuffer m2 = zeros(backend, 1), v2 = zeros(backend, 1);
    backend.adam_step(p2, g2, m2, v2, wd, 1);
    CHECK(backend.download(p2)[0] == doctest::Approx(1.988).epsilon(1e-6));
  }
  CHECK_THROWS_AS(backend.adam_step(p, g, m, v, config, 0), ExecError);
}

TEST_CASE("timer events measure host time") {
  CpuBackend backend;
  TimerEvent start = backend.create_event(), stop = backend.create_event();
  backend.record(start);
  DeviceBuffer a = backend.alloc(1 << 16);
  backend.fill(a, 1.0f);
  backend.synchronize();
  backend.record(stop);
  CHECK(backend.elapsed_ns(start, stop) >= 0);
}

TEST_CASE("shape checks name the kernel and the operand") {
  CpuBackend backend;
  DeviceBuffer x = backend.alloc(6), y = backend.alloc(6), gamma = backend.alloc(3);
  DeviceBuffer stats = backend.alloc(2, DType::f32);
  try {
    backend.layernorm_forward(x, gamma, gamma, y, stats, stats, 2, 4, 1e-5f);
    FAIL("no exception");
  } catch (const ExecError& e) {
    CHECK(e.op() == "layernorm_forward");
    CHECK(e.detail() == "x holds 6 elements, needs 8");
  }
  DeviceBuffer ids = backend.alloc(2, DType::i32);
  try {
    backend.rmsnorm_forward(x, gamma, y, ids, 2, 3, 1e-5f);
    FAIL("no exception");
  } catch (const ExecError& e) {
    CHECK(e.detail() == "rstd must be f32, not i32");
  }
}

TEST_CASE("ExecError: one line with rank, call, detail, file and line") {
  CHECK(format_exec_error("src/exec/mpi_comm.cpp", 42, 3, "MPI_Allreduce", "MPI_ERR_COUNT") ==
        "rank 3: MPI_Allreduce: MPI_ERR_COUNT (src/exec/mpi_comm.cpp:42)");
  const ExecError e("a.cpp", 7, -1, "gemm", "bad shape");
  CHECK(std::string(e.what()) == "rank ?: gemm: bad shape (a.cpp:7)");
  CHECK(e.rank() == -1);
  CHECK(e.file() == "a.cpp");
}

TEST_CASE("call_name: the function a checked call expression calls") {
  CHECK(call_name("MPI_Send(buf, n, MPI_FLOAT, 1, 0, comm)") == "MPI_Send");
  CHECK(call_name("cudaMemcpyAsync(dst, src, n, kind, s)") == "cudaMemcpyAsync");
  CHECK(call_name("ncclInvalidArgument") == "ncclInvalidArgument");  // no call: the whole expression
}
