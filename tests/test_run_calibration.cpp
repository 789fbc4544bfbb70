// cuboid calibrate --from-measurements (report/run_calibration.hpp) on a
// recorded measurements file, checked against the file's own op times by
// hand; the host record (core/host.hpp) and validate's host warning.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/host.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/io/measurements.hpp"
#include "cuboid/report/run_calibration.hpp"
#include "cuboid/report/validate.hpp"
#include "cli_run.hpp"
#include "fixtures.hpp"

namespace cuboid {
namespace {

const std::string kRoot = CUBOID_SOURCE_ROOT_DIR;
const std::string kRun = kRoot + "/tests/data/measurements/tiny-tp2.json";

nlohmann::json raw_run() { return read_json_file(kRun); }

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

// By hand from the file: per call = the step's figure / calls_per_step, in
// ns; the same shape on several ranks or ops: the median.
std::map<Shape, double> expected_gemms(const nlohmann::json& j, const char* stat) {
  std::map<Shape, std::vector<double>> by_shape;
  for (const auto& r : j["ranks"])
    for (const auto& o : r["ops"]) {
      if (o["kind"] != "gemm") continue;
      const auto& s = o["shape"];
      by_shape[{s["m"], s["n"], s["k"], s["batch"]}].push_back(o["time_per_step"][stat].get<double>() * 1e9 /
                                                               o["calls_per_step"].get<double>());
    }
  std::map<Shape, double> out;
  for (const auto& [k, v] : by_shape) out[k] = median_of(v);
  return out;
}

const GemmSample* find_gemm(const Calibration& cal, const Shape& s) {
  for (const GemmSample& g : cal.gemms)
    if (Shape{g.m, g.n, g.k, g.batch} == s && g.format == GemmFormat::bf16) return &g;
  return nullptr;
}

TEST_CASE("GEMM entries are the run's per-call times, by the statistic") {
  const nlohmann::json j = raw_run();
  const Measurements m = measurements_from_json(j, kRun);
  for (const auto& [stat, key] : {std::pair{Statistic::median, "median_s"}, std::pair{Statistic::min, "min_s"}}) {
    CAPTURE(key);
    const RunCalibration rc = calibration_from_runs({m}, nullptr, stat, "test");
    const std::map<Shape, double> want = expected_gemms(j, key);
    REQUIRE(want.size() >= 4);
    CHECK(rc.gemms_measured == static_cast<int>(want.size()));
    CHECK(rc.calibration.gemms.size() == want.size());
    CHECK(rc.calibration.ranks_per_core == 1);
    CHECK(rc.calibration.backend == "cpu");
    for (const auto& [shape, ns] : want) {
      const GemmSample* g = find_gemm(rc.calibration, shape);
      REQUIRE(g != nullptr);
      CHECK(g->time_ns == doctest::Approx(ns).epsilon(1e-12));
      CHECK(g->source == "measured in run " + kRun);
      const auto [mm, n, k, b] = shape;
      CHECK(*calibrated_gemm_ns(rc.calibration, mm, n, k, b) == doctest::Approx(ns).epsilon(1e-12));
    }
  }
}

TEST_CASE("collective samples are the run's per-call times at its buffer bytes; pipeline waits are not taken") {
  const nlohmann::json j = raw_run();
  const RunCalibration rc = calibration_from_runs({measurements_from_json(j, kRun)}, nullptr, Statistic::median, "t");
  std::map<std::pair<std::string, double>, std::vector<double>> want;
  for (const auto& r : j["ranks"])
    for (const auto& o : r["ops"])
      if (o["kind"] == "collective" && o["group_size"].get<int>() >= 2 &&
          std::none_of(executor_only_ops().begin(), executor_only_ops().end(),
                       [&](const NamedReason& r) { return o["name"] == r.name; }))
        want[{o["collective"], o["bytes_per_call"]}].push_back(o["time_per_step"]["median_s"].get<double>() * 1e9 /
                                                               o["calls_per_step"].get<double>());
  REQUIRE(!want.empty());
  int found = 0;
  for (const auto& [key, cc] : rc.calibration.collectives) {
    CHECK(key.tier == "intra_node");
    CHECK(key.group_size == 2);
    CHECK(!key.cold);  // TP 2's exchanges: the hot table (only DP collectives are cold)
    CHECK(key.collective != Collective::send_recv);
    CHECK(cc.source == "measured in run " + kRun);
    for (const SizeSample& s : cc.samples) {
      const auto it = want.find({std::string(to_string(key.collective)), s.bytes});
      REQUIRE(it != want.end());
      CHECK(s.time_ns == doctest::Approx(median_of(it->second)).epsilon(1e-12));
      ++found;
    }
  }
  CHECK(found == rc.collective_samples);
}

TEST_CASE("over a sweep's card: measured entries replace the same keys, the rest stays marked 'sweep'") {
  // (An FP8 sample of a measured shape is another key: the run's GEMMs are the backend's own.)
  const Cluster base = load_cluster(kRoot + "/tests/data/clusters/localhost-cpu-calibrated.json");
  REQUIRE(base.calibration);
  Calibration sweep = *base.calibration;
  sweep.ranks_per_core = 2;  // compute entries are stored / 2 so that lookups give the step's time
  const nlohmann::json j = raw_run();
  const std::map<Shape, double> want = expected_gemms(j, "median_s");
  // A sweep entry of a measured shape, and one of a shape the run did not measure.
  const auto [m0, n0, k0, b0] = want.begin()->first;
  sweep.gemms.push_back(GemmSample{m0, n0, k0, b0, 1.0});
  sweep.gemms.push_back(GemmSample{7, 7, 7, 1, 3.0});
  sweep.gemms.push_back(GemmSample{m0, n0, k0, b0, 5.0, "", GemmFormat::fp8});
  const RunCalibration rc =
      calibration_from_runs({measurements_from_json(j, kRun)}, &sweep, Statistic::median, "t");
  const Calibration& cal = rc.calibration;
  CHECK(cal.device == sweep.device);
  CHECK(cal.created_by == sweep.created_by + "; measured entries from runs: t");
  CHECK(cal.ranks_per_core == 2);
  const GemmSample* measured = find_gemm(cal, want.begin()->first);
  REQUIRE(measured != nullptr);
  CHECK(measured->time_ns == doctest::Approx(want.begin()->second / 2).epsilon(1e-12));
  CHECK(*calibrated_gemm_ns(cal, m0, n0, k0, b0) == doctest::Approx(want.begin()->second).epsilon(1e-12));
  const GemmSample* kept = find_gemm(cal, {7, 7, 7, 1});
  REQUIRE(kept != nullptr);
  CHECK(kept->time_ns == 3.0);
  CHECK(kept->source == "sweep");
  const auto fp8 =
      std::find_if(cal.gemms.begin(), cal.gemms.end(), [](const GemmSample& g) { return g.format == GemmFormat::fp8; });
  REQUIRE(fp8 != cal.gemms.end());
  CHECK(fp8->time_ns == 5.0);
  CHECK(fp8->source == "sweep");
  const auto unmeasured = std::count_if(sweep.gemms.begin(), sweep.gemms.end(), [&](const GemmSample& g) {
    return !want.contains({g.m, g.n, g.k, g.batch}) || g.format == GemmFormat::fp8;
  });
  CHECK(unmeasured >= 1);
  CHECK(cal.gemms.size() == want.size() + static_cast<std::size_t>(unmeasured));
  for (const auto& [name, kc] : cal.kernels) {
    CHECK(kc.source == "sweep");
    CHECK(kc.samples.size() == sweep.kernels.at(name).samples.size());
  }
  // The merged card's section reads back with its sources.
  const Calibration back = calibration_from_json(calibration_to_json(cal), "card");
  CHECK(find_gemm(back, {7, 7, 7, 1})->source == "sweep");
  CHECK(find_gemm(back, want.begin()->first)->source == "measured in run " + kRun);
  for (const auto& [key, cc] : back.collectives) CHECK(cc.source == cal.collectives.at(key).source);
}

TEST_CASE("--from-measurements refuses runs it cannot calibrate from") {
  const nlohmann::json j = raw_run();
  const Measurements m = measurements_from_json(j, kRun);
  CHECK(test::input_error_message([] { calibration_from_runs({}, nullptr, Statistic::median, "t"); }) ==
        "command line: --from-measurements: no measurements file given "
        "(fix: give one or more files written by cuboid run --out)");
  Measurements cuda = m;
  cuda.backend = "cuda";
  cuda.source = "b.json";
  CHECK(test::input_error_message([&] { calibration_from_runs({m, cuda}, nullptr, Statistic::median, "t"); }) ==
        "b.json: environment.backend: is cuda, but " + kRun + " ran on cpu (fix: calibrate from runs of one backend)");
  Calibration base;
  base.backend = "cuda";
  CHECK(test::input_error_message([&] { calibration_from_runs({m}, &base, Statistic::median, "t"); }) ==
        kRun + ": environment.backend: is cpu, but the card passed with --cluster was calibrated on cuda (fix: give "
               "a card calibrated on the run's backend, or one without a calibration section)");
  Measurements bare = m;
  for (MeasuredRank& r : bare.ranks)
    std::erase_if(r.ops, [](const MeasuredOp& o) { return o.kind == OpKind::gemm || o.kind == OpKind::collective; });
  CHECK(test::input_error_message([&] { calibration_from_runs({bare}, nullptr, Statistic::median, "t"); }) ==
        kRun + ": ranks[].ops: has no GEMM or collective time to calibrate from (fix: give a measurements file of a "
               "run that timed its ops (cuboid run --out))");
  // An FP8 run's linear GEMMs ran quantized: the file says so, and its GEMMs are no card samples.
  nlohmann::json fp8 = j;
  fp8["plan"]["precision"] = "fp8-current";
  const Measurements q = measurements_from_json(fp8, kRun);
  CHECK(q.plan.precision == Precision::fp8_current);
  CHECK(m.plan.precision == Precision::bf16);
  CHECK(test::input_error_message([&] { calibration_from_runs({q}, nullptr, Statistic::median, "t"); }) ==
        kRun + ": plan.precision: is fp8-current: the run's linear GEMMs ran quantized, and a card's GEMM samples are "
               "the backend's own (fix: calibrate from a bf16 run of the same layout (cuboid calibrate sweeps FP8 "
               "GEMMs itself on a GPU that has them))");
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST_CASE("the host record: /proc/cpuinfo and /sys, fields that cannot be read left out") {
  test::TempDir root("host");
  const std::filesystem::path cpu = root / "sys/devices/system/cpu";
  write_file(root / "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Test CPU @ 2.00GHz\n"
                                    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Test CPU @ 2.00GHz\n");
  write_file(cpu / "online", "0-1\n");
  auto cache = [&](int i, const char* level, const char* type, const char* size) {
    const std::filesystem::path d = cpu / "cpu0/cache" / ("index" + std::to_string(i));
    write_file(d / "level", std::string(level) + "\n");
    write_file(d / "type", std::string(type) + "\n");
    write_file(d / "size", std::string(size) + "\n");
  };
  cache(0, "1", "Data", "48K");
  cache(1, "1", "Instruction", "32K");
  cache(2, "2", "Unified", "2048K");
  cache(3, "3", "Unified", "480M");
  HostInfo h = read_host_info(root.path().string());
  CHECK(h.cpu_model == "Intel(R) Xeon(R) Test CPU @ 2.00GHz");
  CHECK(h.l1d_bytes == 48 * 1024);
  CHECK(h.l2_bytes == 2048 * 1024);
  CHECK(h.l3_bytes == std::int64_t{480} << 20);
  CHECK(h.cpus_online == 2);
  CHECK_FALSE(h.governor);  // no cpufreq in a VM: left out
  CHECK(host_to_json(h) == nlohmann::json{{"cpu_model", "Intel(R) Xeon(R) Test CPU @ 2.00GHz"},
                                          {"l1d_bytes", 49152},
                                          {"l2_bytes", 2097152},
                                          {"l3_bytes", 503316480},
                                          {"cpus_online", 2}});
  write_file(cpu / "cpu0/cpufreq/scaling_governor", "performance\n");
  h = read_host_info(root.path().string());
  CHECK(h.governor == "performance");
  CHECK(host_from_json(host_to_json(h), "f", "host") == h);
  // Nothing readable: an empty record, never invented values.
  test::TempDir empty("host-empty");
  CHECK(read_host_info(empty.path().string()).empty());
  CHECK(host_to_json(HostInfo{}) == nlohmann::json::object());
}

TEST_CASE("host records: bad fields are refused, differences are named") {
  CHECK(test::input_error_message([] { host_from_json({{"l2_bytes", "2M"}}, "m.json", "environment.host"); }) ==
        "m.json: environment.host.l2_bytes: expected a positive integer (fix: give the host record `cuboid run` or "
        "`cuboid calibrate` writes, or leave it out)");
  CHECK(test::input_error_message([] { host_from_json({{"cpu_modle", "x"}}, "m.json", "environment.host"); }) ==
        "m.json: environment.host.cpu_modle: unknown field (fix: give the host record `cuboid run` or "
        "`cuboid calibrate` writes, or leave it out)");
  CHECK(test::input_error_message([] { host_from_json(nlohmann::json::array(), "m.json", "environment.host"); }) ==
        "m.json: environment.host: expected an object, got array (fix: give the host record `cuboid run` or "
        "`cuboid calibrate` writes, or leave it out)");
  HostInfo a, b;
  a.cpu_model = "A";
  a.l2_bytes = 1 << 20;
  b.cpu_model = "B";
  b.l3_bytes = 1 << 30;  // only one side has it: not a difference
  CHECK(host_differences(a, b) == "cpu_model 'A' vs 'B'");
  b.cpu_model = "A";
  CHECK(host_differences(a, b).empty());
}

TEST_CASE("measurements and calibrations carry the host; older files without it still load") {
  nlohmann::json j = raw_run();
  j["environment"].erase("host");
  CHECK_FALSE(measurements_from_json(j, "old.json").host);
  j["environment"]["host"] = {{"cpu_model", "A"}, {"cpus_online", 2}};
  const Measurements m = measurements_from_json(j, "new.json");
  REQUIRE(m.host);
  CHECK(m.host->cpu_model == "A");
  j["environment"]["host"] = {{"cpus_online", -1}};
  CHECK(test::input_error_message([&] { measurements_from_json(j, "bad.json"); }) ==
        "bad.json: environment.host.cpus_online: expected a positive integer (fix: give the host record `cuboid run` "
        "or `cuboid calibrate` writes, or leave it out)");
  // The calibration from the run records the run's host.
  const RunCalibration rc = calibration_from_runs({m}, nullptr, Statistic::median, "t");
  REQUIRE(rc.calibration.host);
  CHECK(rc.calibration.host->cpu_model == "A");
  const Calibration back = calibration_from_json(calibration_to_json(rc.calibration), "card");
  CHECK(back.host == rc.calibration.host);
}

TEST_CASE("validate warns in one line when the card's and the run's hosts differ") {
  nlohmann::json card = read_json_file(kRoot + "/tests/data/clusters/localhost-cpu-calibrated.json");
  nlohmann::json j = raw_run();
  j["environment"]["host"] = {{"cpu_model", "Run CPU"}, {"l2_bytes", 4194304}};
  const Measurements m = measurements_from_json(j, "m.json");
  // No host in the card (older cards): no warning.
  CHECK(host_mismatch_warning(cluster_from_json(card, "card.json", kRoot + "/tests/data/clusters"), m).empty());
  card["calibration"]["host"] = {{"cpu_model", "Card CPU"}, {"l2_bytes", 4194304}};
  const std::string w = host_mismatch_warning(cluster_from_json(card, "card.json", kRoot + "/tests/data/clusters"), m);
  CHECK(w == "cuboid: warning: the card was calibrated on another host than m.json ran on (card vs run: cpu_model "
             "'Card CPU' vs 'Run CPU'); host drift counts in the errors below");
  CHECK(w.find('\n') == std::string::npos);
  card["calibration"]["host"]["cpu_model"] = "Run CPU";
  CHECK(host_mismatch_warning(cluster_from_json(card, "card.json", kRoot + "/tests/data/clusters"), m).empty());
}

}  // namespace
}  // namespace cuboid
