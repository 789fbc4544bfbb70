// Calibration: the fits (known synthetic timings in, known parameters and
// residuals out), their errors, the JSON section of a cluster card, GEMM
// interpolation, and a calibrated card driving the cost model, the
// estimator and the discrete-event simulator.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/cost/cost.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/cost/memory.hpp"
#include "cuboid/cost/operand_pool.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/cost/optimizer_step.hpp"
#include "cuboid/sim/engine.hpp"
#include "cuboid/sim/network.hpp"
#include "cuboid/sim/simulator.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/core/workload.hpp"
#include "fixtures.hpp"

using namespace cuboid;

namespace {

std::filesystem::path root() { return test::source_root(); }

const std::filesystem::path kCalibratedCard = root() / "tests" / "data" / "clusters" / "localhost-cpu-calibrated.json";

// time = alpha + bytes * ns_per_byte at each size, exactly.
std::vector<SizeSample> line(double alpha_ns, double ns_per_byte, const std::vector<double>& sizes) {
  std::vector<SizeSample> out;
  for (double s : sizes) out.push_back({s, alpha_ns + s * ns_per_byte});
  return out;
}

const std::vector<double> kSizes{1024, 16384, 262144, 4194304, 67108864, 268435456};

// The same weighted least squares solved independently (Cramer's rule on the
// raw normal equations): minimise sum ((a + b x - t) / t)^2.
std::pair<double, double> reference_fit(const std::vector<SizeSample>& s) {
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (const SizeSample& x : s) {
    const double w = 1.0 / (x.time_ns * x.time_ns);
    s0 += w;
    s1 += w * x.bytes;
    s2 += w * x.bytes * x.bytes;
    t0 += w * x.time_ns;
    t1 += w * x.bytes * x.time_ns;
  }
  const double det = s0 * s2 - s1 * s1;
  return {(t0 * s2 - s1 * t1) / det, (s0 * t1 - s1 * t0) / det};
}

ParallelPlan tiny_tp2(const ModelSpec& m) {
  ParallelPlan p;
  p.tp = 2;
  p.pp = 1;
  p.dp = 1;
  p.micro_batch = 1;
  p.global_batch = 4;
  p.seq_length = m.seq_length;
  p.recompute = Recompute::none;
  p.sequence_parallel = false;
  p.flash_attention = false;
  p.schedule = Schedule::one_f_one_b;
  return p;
}

}  // namespace

TEST_CASE("bus factors are NCCL's") {
  CHECK(bus_factor(Collective::all_reduce, 8) == doctest::Approx(2.0 * 7 / 8));
  CHECK(bus_factor(Collective::reduce_scatter, 4) == doctest::Approx(0.75));
  CHECK(bus_factor(Collective::all_gather, 2) == doctest::Approx(0.5));
  CHECK(bus_factor(Collective::broadcast, 8) == 1.0);
  CHECK(bus_factor(Collective::send_recv, 2) == 1.0);
  CHECK(bus_factor(Collective::all_reduce, 1) == 0.0);
}

TEST_CASE("noiseless timings give back their alpha and slope with zero residuals") {
  const LinearFit fit = fit_linear(line(3000.0, 0.125, kSizes), "bench", "calibration.kernels.act");
  CHECK(fit.alpha_ns == doctest::Approx(3000.0).epsilon(1e-9));
  CHECK(fit.ns_per_byte == doctest::Approx(0.125).epsilon(1e-12));
  REQUIRE(fit.residuals.size() == kSizes.size());
  for (double r : fit.residuals) CHECK(std::fabs(r) < 1e-12);
  CHECK(fit.rms_residual < 1e-12);
  CHECK(fit.max_abs_residual < 1e-12);
  CHECK(fit.time_ns(1e6) == doctest::Approx(3000.0 + 0.125e6));
}

TEST_CASE("one perturbed sample: the weighted least-squares fit and its residuals") {
  std::vector<SizeSample> s = line(3000.0, 0.125, kSizes);
  s[3].time_ns *= 1.2;  // 20 % slow at 4 MiB
  const LinearFit fit = fit_linear(s, "bench", "k");
  const auto [a, b] = reference_fit(s);
  CHECK(fit.alpha_ns == doctest::Approx(a).epsilon(1e-9));
  CHECK(fit.ns_per_byte == doctest::Approx(b).epsilon(1e-9));
  // Residuals are (fit - measured) / measured, in sample order, and the
  // perturbed sample is the worst (the fit passes below it).
  double sum_sq = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    CHECK(fit.residuals[i] == doctest::Approx((a + b * s[i].bytes - s[i].time_ns) / s[i].time_ns).epsilon(1e-9));
    sum_sq += fit.residuals[i] * fit.residuals[i];
  }
  CHECK(fit.residuals[3] < -0.1);
  CHECK(fit.max_abs_residual == doctest::Approx(std::fabs(fit.residuals[3])));
  CHECK(fit.rms_residual == doctest::Approx(std::sqrt(sum_sq / 6.0)));
  // The other points stay close to the true line.
  CHECK(fit.ns_per_byte == doctest::Approx(0.125).epsilon(0.2));
}

TEST_CASE("a negative intercept is clamped to 0 and the slope refitted through the origin") {
  // t = 0.1 x - 50: a line below the origin.
  const std::vector<SizeSample> s = line(-50.0, 0.1, {1000, 10000, 100000});
  const LinearFit fit = fit_linear(s, "bench", "k");
  CHECK(fit.alpha_ns == 0.0);
  double num = 0, den = 0;
  for (const SizeSample& x : s) {
    num += x.bytes / x.time_ns;
    den += x.bytes * x.bytes / (x.time_ns * x.time_ns);
  }
  CHECK(fit.ns_per_byte == doctest::Approx(num / den).epsilon(1e-12));
  CHECK(fit.max_abs_residual > 0.01);  // the clamp shows in the residuals
}

TEST_CASE("collective fits recover alpha and busbw with the bus factors") {
  struct Case {
    Collective c;
    int n;
  };
  for (const Case k : {Case{Collective::all_reduce, 4}, Case{Collective::all_reduce, 2}, Case{Collective::reduce_scatter, 8},
                       Case{Collective::all_gather, 4}, Case{Collective::broadcast, 4}, Case{Collective::send_recv, 2}}) {
    CAPTURE(to_string(k.c));
    CAPTURE(k.n);
    const double alpha_ns = 20000.0;
    const double busbw_GBps = 5.0;  // = bytes per ns
    std::vector<SizeSample> s;
    for (double size : kSizes) s.push_back({size, alpha_ns + size * bus_factor(k.c, k.n) / busbw_GBps});
    const CollectiveCalibration cc = fit_collective(k.c, k.n, s, "bench", "calibration.collectives[0]");
    CHECK(cc.alpha_ns == doctest::Approx(alpha_ns).epsilon(1e-9));
    CHECK(cc.busbw_GBps == doctest::Approx(busbw_GBps).epsilon(1e-9));
    CHECK(cc.fit.alpha_ns == cc.alpha_ns);
    CHECK(cc.fit.max_abs_residual < 1e-12);
    CHECK(cc.samples.size() == kSizes.size());
    CHECK(cc.samples[2].bytes == kSizes[2]);  // nccl-tests sizes, not bus bytes
    Calibration cal;
    cal.collectives[{k.c, "intra_node", k.n}] = cc;
    // Beyond the samples (1 KiB - 256 MiB) the fit prices it; at a sample, the sample.
    CHECK(*calibrated_collective_ns(cal, k.c, "intra_node", k.n, 1e9) ==
          doctest::Approx(alpha_ns + 1e9 * bus_factor(k.c, k.n) / busbw_GBps));
    CHECK(*calibrated_collective_ns(cal, k.c, "intra_node", k.n, kSizes[3]) == s[3].time_ns);
    CHECK(!calibrated_collective_ns(cal, k.c, "inter_node", k.n, 1e6));
    CHECK(!calibrated_collective_ns(cal, k.c, "intra_node", k.n + 2, 1e6));
  }
}

TEST_CASE("fits sort their samples by size") {
  std::vector<SizeSample> s = line(1000.0, 0.5, {65536, 1024, 4096});
  const KernelCalibration kc = fit_kernel(s, "bench", "calibration.kernels.act");
  CHECK(kc.samples[0].bytes == 1024);
  CHECK(kc.samples[2].bytes == 65536);
  CHECK(kc.fit.alpha_ns == doctest::Approx(1000.0));
  Calibration cal;
  cal.kernels["act"] = kc;
  CHECK(*calibrated_kernel_ns(cal, "act", 4096) == doctest::Approx(1000.0 + 2048.0));  // the sample
  CHECK(*calibrated_kernel_ns(cal, "act", 131072) == doctest::Approx(1000.0 + 65536.0));  // the fit beyond
  CHECK(!calibrated_kernel_ns(cal, "act_bwd", 2048));
}

TEST_CASE("bad samples are InputErrors naming the sample") {
  const std::string f = "calibration.kernels.act";
  CHECK(test::input_error_message([&] { fit_linear({{1000, 2000}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples: needs at least 2 samples to fit latency and bandwidth, got 1 "
        "(fix: measure at least 2 different sizes)");
  CHECK(test::input_error_message([&] { fit_kernel({{1000, 2000}, {2000, std::numeric_limits<double>::quiet_NaN()}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples[1].time_us: is not finite "
        "(fix: re-run the measurement: a timer or the benchmark failed)");
  CHECK(test::input_error_message([&] { fit_kernel({{1000, std::numeric_limits<double>::infinity()}, {2000, 3000}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples[0].time_us: is not finite "
        "(fix: re-run the measurement: a timer or the benchmark failed)");
  CHECK(test::input_error_message([&] { fit_kernel({{1000, -3000}, {2000, 3000}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples[0].time_us: must be positive, got -3 us "
        "(fix: re-run the measurement: a timer or the benchmark failed)");
  CHECK(test::input_error_message([&] { fit_kernel({{1000, 2000}, {-5, 3000}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples[1].bytes: must be a positive finite byte count, got -5 "
        "(fix: record the size the benchmark ran with)");
  CHECK(test::input_error_message([&] { fit_linear({{1000, 2000}, {1000, 2100}}, "bench", f); }) ==
        "bench: calibration.kernels.act.samples: all 2 samples have the same size (1000 bytes) "
        "(fix: measure at least 2 different sizes)");
  // Within the noise allowance (not a monotonicity error) but falling overall.
  CHECK(test::input_error_message([&] { fit_linear({{1000, 2000}, {2000, 1900}}, "bench", f); }) ==
        "bench: calibration.kernels.act: the fitted time does not grow with the size (slope -0.1 ns per byte) "
        "(fix: check the samples: times must grow with the size; re-run the measurement over a wider size range)");
  CHECK(test::input_error_message([&] {
          fit_collective(Collective::all_reduce, 2, {{4096, 12000}, {65536, 40000}, {1048576, 20000}}, "bench",
                         "calibration.collectives[0]");
        }) ==
        "bench: calibration.collectives[0].samples[2].time_us: 20 us at 1048576 bytes is more than 25 % below 40 us "
        "at a smaller size (65536 bytes): times must not fall as the size grows "
        "(fix: re-run the measurement with more repetitions (medians), or check the sizes recorded)");
  CHECK(test::input_error_message([&] {
          fit_collective(Collective::all_reduce, 1, line(1000, 1, {1, 2}), "bench", "calibration.collectives[0]");
        }) ==
        "bench: calibration.collectives[0].group_size: must be at least 2, got 1 (fix: a collective needs 2 or more ranks)");
  // Noise below the allowance is accepted (a median 10 % under its neighbour).
  CHECK_NOTHROW(fit_collective(Collective::all_reduce, 2, {{1024, 10000}, {4096, 9000}, {1048576, 600000}}, "bench", "c"));
}

TEST_CASE("GEMM lookup: exact shapes, bracketed interpolation, nothing outside the measured range") {
  Calibration cal;
  // 256^3 at 20 GFLOP/s, 1024 x 256 x 256 at 80 GFLOP/s.
  const double f_small = 2.0 * 256 * 256 * 256, f_large = 2.0 * 1024 * 256 * 256;
  cal.gemms.push_back({256, 256, 256, 1, f_small / 20.0});
  cal.gemms.push_back({1024, 256, 256, 1, f_large / 80.0});
  CHECK(*calibrated_gemm_ns(cal, 256, 256, 256, 1) == doctest::Approx(f_small / 20.0));
  CHECK(*calibrated_gemm_ns(cal, 1024, 256, 256, 1) == doctest::Approx(f_large / 80.0));
  // m = 512 is halfway in log(m): FLOP/s interpolate to sqrt(20 x 80) = 40.
  const double f_mid = 2.0 * 512 * 256 * 256;
  CHECK(*calibrated_gemm_ns(cal, 512, 256, 256, 1) == doctest::Approx(f_mid / 40.0).epsilon(1e-12));
  // A quarter of the way (m = 362, log-space): 20^(3/4) x 80^(1/4) approximately.
  const double t = std::log(362.0 / 256.0) / std::log(4.0);
  const double rate = std::exp((1 - t) * std::log(20.0) + t * std::log(80.0));
  CHECK(*calibrated_gemm_ns(cal, 362, 256, 256, 1) == doctest::Approx(2.0 * 362 * 256 * 256 / rate).epsilon(1e-12));
  // Outside: beyond the largest m, below the smallest, or another n, k, batch.
  CHECK(!calibrated_gemm_ns(cal, 2048, 256, 256, 1));
  CHECK(!calibrated_gemm_ns(cal, 128, 256, 256, 1));
  CHECK(!calibrated_gemm_ns(cal, 512, 512, 256, 1));
  CHECK(!calibrated_gemm_ns(cal, 512, 256, 128, 1));
  CHECK(!calibrated_gemm_ns(cal, 512, 256, 256, 2));
  CHECK(!calibrated_gemm_ns(Calibration{}, 256, 256, 256, 1));
  CHECK(*best_gemm_flops_per_s(cal) == doctest::Approx(80e9));
  // A corner grid in (m, n) brackets every interior point.
  cal.gemms.push_back({256, 1024, 256, 1, 2.0 * 256 * 1024 * 256 / 40.0});
  cal.gemms.push_back({1024, 1024, 256, 1, 2.0 * 1024 * 1024 * 256 / 100.0});
  const auto mid = calibrated_gemm_ns(cal, 512, 512, 256, 1);
  REQUIRE(mid);
  const double r = 2.0 * 512 * 512 * 256 / *mid;  // equidistant corners: the geometric mean
  CHECK(r == doctest::Approx(std::pow(20.0 * 80.0 * 40.0 * 100.0, 0.25)));
}

TEST_CASE("a grouped GEMM: the kernel table of its local experts, else its shape") {
  Cluster c = load_cluster(kCalibratedCard);
  REQUIRE(c.calibration);
  Calibration cal = *c.calibration;
  Op op;
  op.name = "expert_fc1";
  op.kind = OpKind::gemm;
  op.grouped = true;
  op.m = 64;
  op.n = 256;
  op.k = 256;
  op.batch = 4;
  op.flops = 2.0 * 64 * 256 * 256 * 4;
  // The table measured with 4 local experts: 100 us at these FLOPs.
  const std::vector<SizeSample> at4{{op.flops / 2, 60e3}, {op.flops, 100e3}, {op.flops * 2, 180e3}};
  // One measured with 8 (another split of the rows): 130 us at these FLOPs.
  const std::vector<SizeSample> at8{{op.flops / 2, 80e3}, {op.flops, 130e3}, {op.flops * 2, 240e3}};
  auto priced = [&](const Calibration& k) {
    GpuProfile g = c.gpu;
    g.calibration = std::make_shared<const Calibration>(k);
    return op_time_ns(g, op);
  };
  Calibration four = cal;
  four.kernels[grouped_kernel_name("expert_fc1", 4)] = fit_kernel(at4, "bench", "k4");
  four.kernels[grouped_kernel_name("expert_fc1", 8)] = fit_kernel(at8, "bench", "k8");
  CHECK(grouped_kernel_name("expert_fc1", 4) == "expert_fc1@4");
  CHECK(priced(four) == 100000);
  // Only the 8-expert table: priced by shape as an ungrouped card would.
  Calibration eight = cal;
  eight.kernels[grouped_kernel_name("expert_fc1", 8)] = fit_kernel(at8, "bench", "k8");
  CHECK(priced(eight) == priced(cal));
  CHECK(priced(eight) != 130000);
  // A card from before the key: the bare op name's table.
  Calibration bare = cal;
  bare.kernels["expert_fc1"] = fit_kernel(at8, "bench", "k");
  CHECK(priced(bare) == 130000);
}

TEST_CASE("GEMM lookup beyond the largest m: the largest bracketed m's rate, held") {
  Calibration cal;
  const double f_small = 2.0 * 256 * 256 * 256, f_large = 2.0 * 1024 * 256 * 256;
  cal.gemms.push_back({256, 256, 256, 1, f_small / 20.0});
  cal.gemms.push_back({1024, 256, 256, 1, f_large / 80.0});
  // Inside the samples' range held_gemm_ns does not answer (calibrated_gemm_ns does).
  CHECK(!held_gemm_ns(cal, 512, 256, 256, 1));
  CHECK(!held_gemm_ns(cal, 1024, 256, 256, 1));
  // m = 4096: 4x the largest measured m at its 80 GFLOP/s, 4x its time.
  REQUIRE(held_gemm_ns(cal, 4096, 256, 256, 1));
  CHECK(*held_gemm_ns(cal, 4096, 256, 256, 1) == doctest::Approx(4.0 * f_large / 80.0));
  // Below the smallest m, or an n, k or batch no sample brackets: nothing.
  CHECK(!held_gemm_ns(cal, 128, 256, 256, 1));
  CHECK(!held_gemm_ns(cal, 4096, 512, 256, 1));
  CHECK(!held_gemm_ns(cal, 4096, 256, 256, 2));
  // A shape family bracketed only at small m (a batch of 4 measured up to
  // m = 32 beside batch-1 shapes up to m = 1024): held at m = 32, the
  // largest m that brackets batch 4, not at 1024.
  Calibration grouped;
  for (const std::int64_t b : {2, 8})
    for (const std::int64_t m : {16, 32}) grouped.gemms.push_back({m, 256, 256, b, 2.0 * m * 256 * 256 * b / 50.0});
  grouped.gemms.push_back({1024, 256, 256, 1, f_large / 80.0});
  const auto held = held_gemm_ns(grouped, 64, 256, 256, 4);
  REQUIRE(held);
  CHECK(*held == doctest::Approx(2.0 * 64 * 256 * 256 * 4 / 50.0));
  // The ranks-per-core share applies as in calibrated_gemm_ns.
  grouped.ranks_per_core = 2;
  CHECK(*held_gemm_ns(grouped, 64, 256, 256, 4) == doctest::Approx(2 * *held));
}

TEST_CASE("JSON round trip in human units") {
  Calibration cal;
  cal.backend = "cpu";
  cal.device = "cpu (one core per rank)";
  cal.created_by = "cuboid calibrate --backend cpu";
  cal.ranks = 2;
  cal.gemms.push_back({128, 384, 256, 1, 500123.5});
  cal.gemms.push_back({128, 128, 32, 4, 80000.25});
  std::vector<SizeSample> k = line(1500, 0.0833, {4096, 65536, 1048576});
  k[1].time_ns *= 1.07;  // residuals are not zero
  cal.kernels["norm_in"] = fit_kernel(k, "bench", "calibration.kernels.norm_in");
  cal.collectives[{Collective::all_reduce, "intra_node", 2}] =
      fit_collective(Collective::all_reduce, 2, line(9000, 0.31, {1024, 1048576, 268435456}), "bench", "c");
  cal.collectives[{Collective::send_recv, "inter_node", 2}] =
      fit_collective(Collective::send_recv, 2, line(4000, 0.05, {1024, 65536, 1048576, 16777216}), "bench", "c");

  const nlohmann::json j = calibration_to_json(cal);
  CHECK(j.at("schema") == "cuboid.calibration/1");
  CHECK(j.at("gemms").at(0).at("time_us") == doctest::Approx(500.1235));
  CHECK(j.at("kernels").at("norm_in").at("samples").at(1).contains("residual"));
  CHECK(j.at("kernels").at("norm_in").at("max_abs_residual") == doctest::Approx(cal.kernels["norm_in"].fit.max_abs_residual));
  const nlohmann::json& ar = j.at("collectives").at(0);
  CHECK(ar.at("collective") == "all_reduce");
  CHECK(ar.at("alpha_us") == doctest::Approx(9.0));
  CHECK(ar.at("busbw_GBps") == doctest::Approx(1 / 0.31));

  // Through text, as in a card file.
  const Calibration back = calibration_from_json(nlohmann::json::parse(j.dump(2)), "card.json");
  CHECK(back.backend == "cpu");
  CHECK(back.device == cal.device);
  CHECK(back.created_by == cal.created_by);
  CHECK(back.ranks == 2);
  REQUIRE(back.gemms.size() == 2);
  CHECK(back.gemms[1].batch == 4);
  CHECK(back.gemms[1].time_ns == doctest::Approx(80000.25));
  REQUIRE(back.kernels.count("norm_in") == 1);
  CHECK(back.kernels.at("norm_in").fit.alpha_ns == doctest::Approx(cal.kernels["norm_in"].fit.alpha_ns));
  CHECK(back.kernels.at("norm_in").fit.residuals[1] == doctest::Approx(cal.kernels["norm_in"].fit.residuals[1]));
  REQUIRE(back.collectives.size() == 2);
  for (const auto& [key, cc] : cal.collectives) {
    const CollectiveCalibration& b = back.collectives.at(key);
    CHECK(b.alpha_ns == doctest::Approx(cc.alpha_ns));
    CHECK(b.busbw_GBps == doctest::Approx(cc.busbw_GBps));
    CHECK(b.samples.size() == cc.samples.size());
  }
  CHECK(calibration_to_json(back) == j);
}

TEST_CASE("the JSON reader rejects bad calibrations, naming the field") {
  const nlohmann::json good = read_json_file(kCalibratedCard).at("calibration");
  auto bad = [&](auto&& edit) {
    nlohmann::json j = good;
    edit(j);
    return test::input_error_message([&] { calibration_from_json(j, "card.json"); });
  };
  CHECK_NOTHROW(calibration_from_json(good, "card.json"));
  CHECK(bad([](nlohmann::json& j) { j["schema"] = "cuboid.calibration/0"; }) ==
        "card.json: calibration.schema: unknown schema \"cuboid.calibration/0\" "
        "(fix: use \"cuboid.calibration/1\" (written by this version of `cuboid calibrate`))");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][0]["samples"][1]["time_us"] = -4; }) ==
        "card.json: calibration.collectives[0].samples[1].time_us: must be positive, got -4 us "
        "(fix: re-run the measurement: a timer or the benchmark failed)");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][0]["samples"][2]["time_us"] = 20; }) ==
        "card.json: calibration.collectives[0].samples[2].time_us: 20 us at 1048576 bytes is more than 25 % below "
        "42.768 us at a smaller size (65536 bytes): times must not fall as the size grows "
        "(fix: re-run the measurement with more repetitions (medians), or check the sizes recorded)");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][1]["busbw_GBps"] = 3; }) ==
        "card.json: calibration.collectives[1].busbw_GBps: 3 GB/s disagrees with the fit of its samples (2 GB/s) "
        "(fix: re-run `cuboid calibrate` (the samples are the measurement; the fit is derived from them))");
  CHECK(bad([](nlohmann::json& j) { j["kernels"]["act"]["alpha_us"] = 2.5; }) ==
        "card.json: calibration.kernels.act.alpha_us: 2.5 us disagrees with the fit of its samples (2 us) "
        "(fix: re-run `cuboid calibrate` (the samples are the measurement; the fit is derived from them))");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][0]["collective"] = "allreduce"; }) ==
        "card.json: calibration.collectives[0].collective: unknown value \"allreduce\" "
        "(fix: use one of all_reduce|reduce_scatter|all_gather|broadcast|send_recv|all_to_all)");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][2]["tier"] = "nvlink"; }) ==
        "card.json: calibration.collectives[2].tier: unknown value \"nvlink\" "
        "(fix: use one of intra_node|inter_node)");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][2] = j["collectives"][0]; }) ==
        "card.json: calibration.collectives[2]: the same collective, tier, group size and buffers as "
        "calibration.collectives[0] (fix: keep one sweep per (collective, tier, group_size, buffers))");
  CHECK(bad([](nlohmann::json& j) { j["gemms"][3] = j["gemms"][1]; }) ==
        "card.json: calibration.gemms[3]: the same shape as calibration.gemms[1] (fix: keep one median per shape)");
  CHECK(bad([](nlohmann::json& j) { j["gemms"][0]["time_us"] = 0; }) ==
        "card.json: calibration.gemms[0].time_us: must be positive, got 0 us "
        "(fix: re-run the measurement: a timer or the benchmark failed)");
  CHECK(bad([](nlohmann::json& j) { j["gemms"][0]["m"] = 0; }) ==
        "card.json: calibration.gemms[0].m: must be positive, got 0 (fix: give a value >= 1)");
  CHECK(bad([](nlohmann::json& j) { std::swap(j["kernels"]["act"]["samples"][0], j["kernels"]["act"]["samples"][1]); }) ==
        "card.json: calibration.kernels.act.samples[1].bytes: samples must be in increasing size, but 65536 follows "
        "262144 (fix: sort the samples by size)");
  CHECK(bad([](nlohmann::json& j) {
          j["kernels"]["act"]["samples"].erase(2);
          j["kernels"]["act"]["samples"].erase(1);
        }) ==
        "card.json: calibration.kernels.act.samples: needs at least 2 samples to fit latency and bandwidth, got 1 "
        "(fix: measure at least 2 different sizes)");
  CHECK(bad([](nlohmann::json& j) { j["collectives"][0]["busbw"] = 2; }) ==
        "card.json: calibration.collectives[0].busbw: unknown field "
        "(fix: remove it or check its spelling (see the README's card schema))");
  CHECK(bad([](nlohmann::json& j) { j.erase("schema"); }) ==
        "card.json: calibration.schema: missing required field (fix: add \"schema\")");
  CHECK(bad([](nlohmann::json& j) { j["backend"] = "rocm"; }) ==
        "card.json: calibration.backend: unknown value \"rocm\" (fix: use one of cpu|cuda)");
}

TEST_CASE("a calibrated card: loaded, and its fits price GEMMs, kernels and collectives") {
  const Cluster c = load_cluster(kCalibratedCard);
  REQUIRE(c.calibration);
  CHECK(c.gpu.calibration == c.calibration);
  CHECK(c.calibration->gemms.size() == 4);
  // The card without its section loads uncalibrated (the defaults stay).
  nlohmann::json plain = read_json_file(kCalibratedCard);
  plain.erase("calibration");
  const Cluster u = cluster_from_json(plain, "plain.json", kCalibratedCard.parent_path());
  CHECK(!u.calibration);
  CHECK(!u.gpu.calibration);

  // GEMM: the exact shape's measured time; an unmeasured shape falls back to
  // the roofline at the best measured rate (120 us for 2 x 128 x 256 x 128).
  CHECK(gemm_time_ns(c.gpu, 128, 384, 256) == 500000);
  CHECK(gemm_time_ns(u.gpu, 128, 384, 256) != 500000);
  const double best = 2.0 * 128 * 256 * 128 / 120e-6;
  CHECK(*best_gemm_flops_per_s(*c.calibration) == doctest::Approx(best));
  GpuProfile roofline = u.gpu;
  roofline.gemm_max_efficiency = best / roofline.peak_bf16_flops;  // what calibration puts in
  CHECK(gemm_time_ns(c.gpu, 4096, 4096, 4096) == gemm_time_ns(roofline, 4096, 4096, 4096));
  // The measured rate is the machine's own: a card's sustained fraction of
  // its datasheet burst rate does not scale it again.
  Cluster sustained = c;
  sustained.gpu.gemm_sustained_fraction = 0.5;
  CHECK(gemm_time_ns(sustained.gpu, 4096, 4096, 4096) == gemm_time_ns(c.gpu, 4096, 4096, 4096));
  CHECK(gemm_time_ns(sustained.gpu, 128, 384, 256) == 500000);

  // Memory-bound ops by name; the optimizer's "adam"; others keep the default.
  Op act;
  act.name = "act";
  act.kind = OpKind::memory_bound;
  act.bytes = 4e6;  // beyond the samples (64 KiB - 1 MiB): the fit
  CHECK(op_time_ns(c.gpu, act) == 2000 + 400000);  // 2 us + 4e6 B at 10 GB/s
  act.bytes = 524288;  // inside: the power law between the 256 KiB and 1 MiB samples
  CHECK(op_time_ns(c.gpu, act) == std::llround(std::sqrt(28214.4 * 106857.6)));
  act.bytes = 1e6;
  act.name = "act_bwd";
  CHECK(op_time_ns(c.gpu, act) == memory_bound_time_ns(c.gpu, 1e6));
  CHECK(kernel_time_ns(c.gpu, "adam", 1e7) == 5000 + 2000000);

  // Collectives: the fit of (collective, intra_node, 2) replaces the card's busbw and latency.
  const Topology topo(c);
  const LinkParams ar = group_link_params(topo, Collective::all_reduce, {0, 1});
  CHECK(ar.fitted);
  CHECK(ar.busbw_Bps == doctest::Approx(2e9));
  CHECK(ar.latency_ns == doctest::Approx(10000));
  CHECK(collective_time_ns(Collective::all_reduce, 1048576, 2, ar) == 534288);  // the sample itself
  CHECK(collective_time_ns(Collective::send_recv, 4e6, 2, group_link_params(topo, Collective::send_recv, {0, 1})) ==
        5000 + 1000000);  // beyond the samples: the fit
  CHECK(collective_time_ns(Collective::all_reduce, 262144, 2, ar) ==
        std::llround(std::sqrt(42768.0 * 534288.0)));  // inside: interpolated between 64 KiB and 1 MiB
  const LinkParams rs = group_link_params(topo, Collective::reduce_scatter, {0, 1});  // not measured
  CHECK(!rs.fitted);
  CHECK(rs.busbw_Bps == doctest::Approx(c.intra.busbw_GBps * 1e9));
}

TEST_CASE("the simulator plays a calibrated collective for its fitted time, and contention still applies") {
  const Topology topo(load_cluster(kCalibratedCard));
  auto run = [&](bool with_send) {
    sim::Network net(topo);
    sim::Engine eng(net);
    sim::CommGroup g;
    g.ranks = {0, 1};
    const sim::GroupId gid = eng.add_group(g);
    const sim::StreamId s0 = eng.add_stream(0, sim::StreamKind::tp);
    const sim::StreamId s1 = eng.add_stream(1, sim::StreamKind::tp);
    const sim::StreamId streams[2] = {s0, s1};
    const sim::TaskId t = eng.add_collective(Collective::all_reduce, gid, 1048576, streams);
    if (with_send) {
      const sim::StreamId p0 = eng.add_stream(0, sim::StreamKind::pp);
      const sim::StreamId p1 = eng.add_stream(1, sim::StreamKind::pp);
      const sim::StreamId ps[2] = {p0, p1};
      eng.add_send_recv(0, 1, 1048576, ps);
    }
    eng.run();
    return eng.end_ns(t) - eng.start_ns(t);
  };
  CHECK(std::llabs(run(false) - 534288) <= 1);  // alpha 10 us + 1 MiB at 2 GB/s
  CHECK(run(true) > 534288 + 100000);           // a p2p on the same links slows it down
}

TEST_CASE("a calibrated card drives the estimator and the simulator") {
  const ModelSpec m = load_model(root() / "models" / "tiny.json");
  const Topology cal(load_cluster(kCalibratedCard));
  nlohmann::json plain_j = read_json_file(kCalibratedCard);
  plain_j.erase("calibration");
  const Topology plain(cluster_from_json(plain_j, "plain.json", kCalibratedCard.parent_path()));
  const ParallelPlan p = tiny_tp2(m);
  const GpuProfile& gpu = cal.cluster().gpu;

  // Expected per micro-batch: compute ops and TP collectives priced by the fits.
  const LayerOps layer = transformer_layer_ops(m, p), embed = embedding_ops(m, p), head = lm_head_ops(m, p);
  double compute_ns = 0, tp_ns = 0;
  int calibrated_ops = 0;
  auto add = [&](const std::vector<Op>& ops, double times) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::collective && op.group == Group::tp) {
        // The card is a cpu (f32) card: activation collectives move twice the workload's bf16 bytes.
        tp_ns += times * static_cast<double>(collective_time_ns(op.collective,
                                                                comm_size_bytes(op, gpu.calibration.get()), 2,
                                                                group_link_params(cal, op.collective, {0, 1})));
      } else {
        compute_ns += times * static_cast<double>(op_time_ns(gpu, op));
      }
      if (op.kind == OpKind::gemm && calibrated_gemm_ns(*gpu.calibration, op.m, op.n, op.k, op.batch)) ++calibrated_ops;
      if (op.kind == OpKind::memory_bound && op.name == "act") ++calibrated_ops;
    }
  };
  for (const LayerOps* ops : {&layer, &embed, &head}) {
    const double times = ops == &layer ? static_cast<double>(m.num_layers) : 1.0;
    add(ops->forward, times);
    add(ops->backward, times);
  }
  CHECK(calibrated_ops >= 5);  // qkv, proj, fc1, fc2 forward, act
  const double mbs = static_cast<double>(p.num_micro_batches());
  // The optimizer step: its kernels (grad_scale, grad_norm, adam, param_copy,
  // grad_zero) priced by the card's fits where it has them ("adam").
  const double adam_ns =
      static_cast<double>(optimizer_step_time_ns(gpu, parameters_on_stage(m, p, 0), p.dp, 0, optimizer_precision(p)));

  const Estimate est = estimate(m, cal, p);
  CHECK(est.breakdown.compute_s == doctest::Approx(mbs * compute_ns * 1e-9).epsilon(1e-9));
  CHECK(est.breakdown.tp_comm_s == doctest::Approx(mbs * tp_ns * 1e-9).epsilon(1e-9));
  CHECK(est.breakdown.optimizer_s == doctest::Approx(adam_ns * 1e-9).epsilon(1e-9));
  CHECK(est.iteration_time_s != doctest::Approx(estimate(m, plain, p).iteration_time_s));

  const sim::SimResult r = sim::run_simulation(m, cal, p);
  REQUIRE(r.stages.size() == 1);
  CHECK(r.stages[0].compute_busy_s == doctest::Approx((mbs * compute_ns + adam_ns) * 1e-9).epsilon(1e-6));
  CHECK(r.stages[0].tp_busy_s == doctest::Approx(mbs * tp_ns * 1e-9).epsilon(1e-6));
  CHECK(r.estimate.iteration_time_s != doctest::Approx(simulate(m, plain, p).iteration_time_s));
}

TEST_CASE("isotonic regression pools the medians that fall as the size grows") {
  std::vector<SizeSample> s{{1024, 30000}, {2048, 11000}, {4096, 13000}, {8192, 12000}, {16384, 20000}};
  CHECK(make_monotone(s) == 4);
  // 11 < 30 pools them; 13 and then 12 stay below the pool's mean: all four pool into 66 / 4 = 16.5.
  const std::vector<double> want{16500, 16500, 16500, 16500, 20000};
  for (std::size_t i = 0; i < s.size(); ++i) CHECK(s[i].time_ns == doctest::Approx(want[i]));
  std::vector<SizeSample> ok = line(1000, 1, kSizes);
  CHECK(make_monotone(ok) == 0);
  CHECK(ok[2].time_ns == 1000 + kSizes[2]);
  // Pooled samples fit and load: the reader's monotonicity check passes.
  CHECK(fit_collective(Collective::all_reduce, 4, s, "cal", "c").samples.size() == 5);
}

TEST_CASE("kernel and collective lookups interpolate the samples in range, the fit outside") {
  // Samples off the line (a cache step between 2 and 8 MiB): the fit is poor there.
  std::vector<SizeSample> s{{1 << 20, 100000}, {2 << 20, 200000}, {8 << 20, 3200000}, {32 << 20, 12800000}};
  Calibration cal;
  cal.kernels["act"] = fit_kernel(s, "cal", "act");
  cal.collectives[CollectiveKey{Collective::all_reduce, "intra_node", 2}] =
      fit_collective(Collective::all_reduce, 2, s, "cal", "ar");
  CHECK(*interpolate_samples(s, 2 << 20) == 200000);          // a sample
  CHECK(*interpolate_samples(s, 4 << 20) == doctest::Approx(800000));  // power law: t ~ size^2 there
  CHECK(!interpolate_samples(s, 1000));
  CHECK(!interpolate_samples(s, 64 << 20));
  CHECK(*calibrated_kernel_ns(cal, "act", 4 << 20) == doctest::Approx(800000));
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 4 << 20) ==
        doctest::Approx(800000));
  const LinearFit& f = cal.kernels["act"].fit;
  CHECK(*calibrated_kernel_ns(cal, "act", 64 << 20) == doctest::Approx(f.time_ns(64 << 20)));
  const CollectiveCalibration& cc = cal.collectives.begin()->second;
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 512) ==
        doctest::Approx(cc.fit.time_ns(512 * bus_factor(Collective::all_reduce, 2))));
  // Equal sizes (allowed in a stored series) count as their mean.
  const std::vector<SizeSample> dup{{100, 10}, {100, 30}, {400, 80}};
  CHECK(*interpolate_samples(dup, 100) == doctest::Approx(20));
  CHECK(*interpolate_samples(dup, 200) == doctest::Approx(40));
}

TEST_CASE("collective tables in two cache states: the DP lookup takes the cold one, else the hot one") {
  const std::vector<SizeSample> hot{{1 << 20, 100000}, {4 << 20, 400000}};
  const std::vector<SizeSample> cold{{1 << 20, 150000}, {4 << 20, 800000}};
  Calibration cal;
  cal.backend = "cpu";
  cal.device = "cpu";
  cal.ranks = 2;
  cal.collectives[CollectiveKey{Collective::all_reduce, "intra_node", 2}] =
      fit_collective(Collective::all_reduce, 2, hot, "cal", "hot");
  // A card with the hot table alone (older cards): both lookups take it.
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 4 << 20, true) == 400000);
  cal.collectives[CollectiveKey{Collective::all_reduce, "intra_node", 2, true}] =
      fit_collective(Collective::all_reduce, 2, cold, "cal", "cold");
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 4 << 20) == 400000);
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 4 << 20, true) == 800000);
  // The cold table alone: the hot lookup takes it too.
  Calibration only_cold = cal;
  only_cold.collectives.erase(CollectiveKey{Collective::all_reduce, "intra_node", 2});
  CHECK(*calibrated_collective_ns(only_cold, Collective::all_reduce, "intra_node", 2, 1 << 20) == 150000);
  // JSON: "buffers": "cold" on the cold table, absent on the hot one; the
  // GEMM sweep's operand pool recorded; both read back.
  cal.gemm_operand_pool_bytes = 22413312;
  const nlohmann::json j = calibration_to_json(cal);
  CHECK(j["gemm_operand_pool_bytes"] == 22413312.0);
  CHECK(!j["collectives"][0].contains("buffers"));
  CHECK(j["collectives"][1]["buffers"] == "cold");
  const Calibration back = calibration_from_json(j, "card.json");
  CHECK(back.gemm_operand_pool_bytes == 22413312.0);
  CHECK(back.collectives.size() == 2);
  CHECK(back.collectives.count(CollectiveKey{Collective::all_reduce, "intra_node", 2, true}) == 1);
  // The same table twice in one state is refused; an unknown state too.
  nlohmann::json twice = j;
  twice["collectives"][0]["buffers"] = "cold";
  CHECK_THROWS_WITH_AS(calibration_from_json(twice, "card.json"),
                       doctest::Contains("the same collective, tier, group size and buffers"), InputError);
  nlohmann::json warm = j;
  warm["collectives"][1]["buffers"] = "warm";
  CHECK_THROWS_WITH_AS(calibration_from_json(warm, "card.json"), doctest::Contains("buffers"), InputError);
  nlohmann::json pool = j;
  pool["gemm_operand_pool_bytes"] = 0;
  CHECK_THROWS_WITH_AS(calibration_from_json(pool, "card.json"), doctest::Contains("gemm_operand_pool_bytes"),
                       InputError);
}

TEST_CASE("activation element size: JSON, defaults by backend, and the bytes collectives move") {
  Calibration cal;
  cal.backend = "cuda";
  cal.device = "d";
  cal.ranks = 2;
  cal.activation_bytes_per_element = 4;
  nlohmann::json j = calibration_to_json(cal);
  CHECK(j["activation_bytes_per_element"] == 4);
  CHECK(calibration_from_json(j, "c.json").activation_bytes_per_element == 4);
  j.erase("activation_bytes_per_element");
  CHECK(calibration_from_json(j, "c.json").activation_bytes_per_element == 2);  // cuda: bf16
  j["backend"] = "cpu";
  CHECK(calibration_from_json(j, "c.json").activation_bytes_per_element == 4);  // cpu: f32
  j["activation_bytes_per_element"] = 3;
  CHECK(test::input_error_message([&] { (void)calibration_from_json(j, "c.json"); }) ==
        "c.json: calibration.activation_bytes_per_element: must be 2 (bf16) or 4 (f32), got 3 (fix: give the "
        "element size of the backend's compute dtype)");

  // TP activation collectives scale with the element size; fp32 cross-entropy statistics do not.
  const ModelSpec m = load_model(root() / "models" / "tiny.json");
  const ParallelPlan p = tiny_tp2(m);
  const LayerOps layer = transformer_layer_ops(m, p), head = lm_head_ops(m, p);
  int scaled = 0, kept = 0;
  for (const LayerOps* ops : {&layer, &head}) {
    for (const Op& op : ops->forward) {
      if (op.kind != OpKind::collective) continue;
      if (op.compute_dtype) {
        CHECK(comm_size_bytes(op, &cal) == 2 * op.comm_bytes);
        ++scaled;
      } else {
        CHECK(comm_size_bytes(op, &cal) == op.comm_bytes);
        ++kept;
      }
      CHECK(comm_size_bytes(op, nullptr) == op.comm_bytes);
    }
  }
  CHECK(scaled == 2);  // the layer's tp_ar_attn and tp_ar_mlp (no SP: the head's forward gathers nothing)
  CHECK(kept == 3);    // tp_ar_xent_max, _sum, _tgt
}

TEST_CASE("the simulator plays a calibrated collective inside the samples for the interpolated time") {
  const Topology topo(load_cluster(kCalibratedCard));
  auto run = [&](double size) {
    sim::Network net(topo);
    sim::Engine eng(net);
    sim::CommGroup g;
    g.ranks = {0, 1};
    const sim::GroupId gid = eng.add_group(g);
    const sim::StreamId streams[2] = {eng.add_stream(0, sim::StreamKind::tp), eng.add_stream(1, sim::StreamKind::tp)};
    const sim::TaskId t = eng.add_collective(Collective::all_reduce, gid, size, streams);
    eng.run();
    return eng.end_ns(t) - eng.start_ns(t);
  };
  // Between the 64 KiB (42.768 us) and 1 MiB (534.288 us) samples: the power law, not the line (141.072 us).
  CHECK(std::llabs(run(262144) - std::llround(std::sqrt(42768.0 * 534288.0))) <= 1);
  // Below the smallest sample (4 KiB) the fit: 10 us + 1 KiB at 2 GB/s.
  CHECK(std::llabs(run(1024) - (10000 + 512)) <= 1);
  // The estimator's price is the same.
  const LinkParams ar = group_link_params(topo, Collective::all_reduce, {0, 1});
  CHECK(collective_time_ns(Collective::all_reduce, 262144, 2, ar) == std::llround(std::sqrt(42768.0 * 534288.0)));
}

TEST_CASE("ranks per core: compute ops cost the share x their sample, collectives as measured; JSON checks") {
  Calibration cal;
  cal.backend = "cpu";
  cal.device = "cpu";
  cal.ranks = 4;
  const double f = 2.0 * 256 * 256 * 256;
  cal.gemms.push_back({256, 256, 256, 1, f / 20.0});  // 20 GFLOP/s on a core of its own
  cal.gemms.push_back({1024, 256, 256, 1, 4 * f / 80.0});
  cal.kernels["act"] = fit_kernel(line(1000, 0.5, {1e4, 1e5, 1e6}), "cal", "act");
  cal.collectives[CollectiveKey{Collective::all_reduce, "intra_node", 2}] =
      fit_collective(Collective::all_reduce, 2, line(5000, 0.25, kSizes), "cal", "ar");
  const double ar = *calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 1 << 20);
  cal.ranks_per_core = 2;  // two ranks take turns on each core
  CHECK(*calibrated_gemm_ns(cal, 256, 256, 256, 1) == doctest::Approx(2 * f / 20.0));
  CHECK(*measured_gemm_ns(cal, 256, 256, 256, 1) == doctest::Approx(f / 20.0));
  CHECK(*calibrated_gemm_ns(cal, 512, 256, 256, 1) == doctest::Approx(2 * *measured_gemm_ns(cal, 512, 256, 256, 1)));
  CHECK(*best_gemm_flops_per_s(cal) == doctest::Approx(40e9));  // 80 GFLOP/s shared by two
  CHECK(*calibrated_kernel_ns(cal, "act", 1e5) == doctest::Approx(2 * (1000 + 0.5 * 1e5)));
  CHECK(*measured_kernel_ns(cal, "act", 1e5) == doctest::Approx(1000 + 0.5 * 1e5));
  CHECK(*calibrated_collective_ns(cal, Collective::all_reduce, "intra_node", 2, 1 << 20) == doctest::Approx(ar));

  nlohmann::json j = calibration_to_json(cal);
  CHECK(j["ranks_per_core"] == 2.0);
  CHECK(calibration_from_json(j, "c.json").ranks_per_core == 2.0);
  j.erase("ranks_per_core");
  CHECK(calibration_from_json(j, "c.json").ranks_per_core == 1.0);  // cards written before the field
  j["ranks_per_core"] = 0.5;
  CHECK(test::input_error_message([&] { (void)calibration_from_json(j, "c.json"); }) ==
        "c.json: calibration.ranks_per_core: must be between 1 and 256, got 0.5 (fix: give the ranks on the node "
        "divided by its CPUs (1 for one rank per core or per GPU))");
  j["ranks_per_core"] = 2;
  j["backend"] = "cuda";
  CHECK(test::input_error_message([&] { (void)calibration_from_json(j, "c.json"); }) ==
        "c.json: calibration.ranks_per_core: is 2 for backend cuda (fix: only cpu ranks share cores; give 1)");
}

TEST_CASE("a card of two operand pools prices each plan from the pool nearest its own working set") {
  const ModelSpec m = load_model(root() / "models" / "tiny.json");
  const nlohmann::json card = read_json_file(kCalibratedCard);
  const ParallelPlan tp2 = tiny_tp2(m);
  ParallelPlan dp2 = tp2;
  dp2.tp = 1;
  dp2.dp = 2;
  const Cluster base = load_cluster(kCalibratedCard);
  const double act_bytes = base.calibration->activation_bytes_per_element;
  const auto pool_of = [&](const ParallelPlan& p) {
    return static_cast<double>(operand_pool_bytes(step_working_set_bytes(m, p, base.gpu, static_cast<int>(act_bytes)), 1));
  };
  const double small = pool_of(tp2), large = pool_of(dp2);
  REQUIRE(small < large);

  // The card's own tables are the large pool's; the small pool measured the
  // same GEMMs twice as fast and "act" at 40 GB/s instead of 10.
  nlohmann::json two = card;
  nlohmann::json& cal = two.at("calibration");
  cal["gemm_operand_pool_bytes"] = large;
  nlohmann::json fast_gemms = cal.at("gemms");
  for (nlohmann::json& g : fast_gemms) g["time_us"] = g.at("time_us").get<double>() / 2;
  const KernelCalibration fast_act = fit_kernel(line(2000, 0.025, {65536, 262144, 1048576}), "t", "act");
  const nlohmann::json fast_kernels = calibration_to_json([&] {
    Calibration c = *base.calibration;
    c.kernels = {{"act", fast_act}};
    return c;
  }()).at("kernels");
  cal["other_operand_pools"] = {{{"gemm_operand_pool_bytes", small}, {"gemms", fast_gemms}, {"kernels", fast_kernels}}};
  const Cluster both = cluster_from_json(two, "two.json", kCalibratedCard.parent_path());
  REQUIRE(both.calibration->other_pools.size() == 1);
  CHECK(calibration_to_json(calibration_from_json(calibration_to_json(*both.calibration), "x")) ==
        calibration_to_json(*both.calibration));

  // The small pool's view: its GEMMs and "act", the card's "adam" (which the pool lacks).
  const Calibration view = operand_pool_view(*both.calibration, 0);
  CHECK(view.gemm_operand_pool_bytes == small);
  CHECK(view.other_pools.empty());
  CHECK(view.gemms.at(0).time_ns == doctest::Approx(250000));
  CHECK(*calibrated_kernel_ns(view, "act", 4e6) == doctest::Approx(2000 + 4e6 * 0.025));
  CHECK(view.kernels.count("adam") == 1);

  // Each plan is priced as by a card holding only its pool's tables.
  nlohmann::json only_small = card;
  only_small.at("calibration") = calibration_to_json(view);
  nlohmann::json only_large = two;
  only_large.at("calibration").erase("other_operand_pools");
  const Topology t_both(both), t_small(cluster_from_json(only_small, "s.json", kCalibratedCard.parent_path())),
      t_large(cluster_from_json(only_large, "l.json", kCalibratedCard.parent_path()));
  CHECK(t_both.has_operand_pool_views());
  CHECK(&topology_for_plan(t_both, m, dp2) == &t_both);
  CHECK(&topology_for_plan(t_both, m, tp2) != &t_both);
  CHECK(&topology_for_plan(t_small, m, tp2) == &t_small);  // one pool: itself
  CHECK(estimate(m, t_both, tp2).iteration_time_s == estimate(m, t_small, tp2).iteration_time_s);
  CHECK(estimate(m, t_both, dp2).iteration_time_s == estimate(m, t_large, dp2).iteration_time_s);
  CHECK(estimate(m, t_both, tp2).iteration_time_s < estimate(m, t_large, tp2).iteration_time_s);
  Estimator score(m, t_both);
  CHECK(score(tp2).iteration_time_s == estimate(m, t_small, tp2).iteration_time_s);
  CHECK(simulate(m, t_both, tp2).iteration_time_s == simulate(m, t_small, tp2).iteration_time_s);
  CHECK(simulate(m, t_both, dp2).iteration_time_s == simulate(m, t_large, dp2).iteration_time_s);

  // Nearest in ratio: a tie keeps the card's own tables.
  CHECK(&t_both.for_operand_pool(small * 1.01) != &t_both);
  CHECK(&t_both.for_operand_pool(std::sqrt(small * large) * 1.01) == &t_both);
  CHECK(&t_both.for_operand_pool(std::sqrt(small * large)) == &t_both);

  // Bad pools are refused naming the field.
  auto refused = [&](auto&& edit, const std::string& field) {
    nlohmann::json j = two;
    edit(j.at("calibration"));
    try {
      (void)cluster_from_json(j, "bad.json", kCalibratedCard.parent_path());
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(field) != std::string::npos, e.what());
    }
  };
  refused([&](nlohmann::json& c) { c["other_operand_pools"][0]["gemm_operand_pool_bytes"] = large; },
          "other_operand_pools[0].gemm_operand_pool_bytes");
  refused([&](nlohmann::json& c) { c["other_operand_pools"][0].erase("gemm_operand_pool_bytes"); },
          "other_operand_pools[0].gemm_operand_pool_bytes");
  refused([&](nlohmann::json& c) { c.erase("gemm_operand_pool_bytes"); }, "other_operand_pools");
  refused([&](nlohmann::json& c) { c["other_operand_pools"][0]["gemms"][0]["time_us"] = -1; },
          "other_operand_pools[0].gemms[0]");
}
