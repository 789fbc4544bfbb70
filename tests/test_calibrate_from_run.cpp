// cuboid calibrate --from-measurements and cuboid validate's host warning,
// through the real binary (CUBOID_BIN): no mpirun, no backend.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

namespace cuboid::test {
namespace {

const std::string kRun = "tests/data/measurements/tiny-tp2.json";
const std::string kPlan = "tests/data/measurements/tiny-tp2.plan.json";

#ifdef CUBOID_TEST_HAS_RUN
TEST_CASE("calibrate --from-measurements writes a card whose GEMMs are the run's per-call times") {
  TempDir t("from_run");
  const std::string card = (t / "card.json").string();
  const CliResult r = run_cuboid("calibrate --from-measurements " + kRun +
                                     " --cluster topologies/localhost-cpu.json --out " + card,
                                 t.path());
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  const nlohmann::json c = nlohmann::json::parse(slurp(card))["calibration"];
  const nlohmann::json m = nlohmann::json::parse(slurp(kRun));
  // fc1's shape, by hand: the step's median / calls per step of every GEMM of that shape on
  // every rank (another op may share it), their median.
  nlohmann::json shape;
  for (const auto& op : m["ranks"][0]["ops"])
    if (op["name"] == "fc1") shape = op["shape"];
  REQUIRE(shape.is_object());
  std::vector<double> per_call_us;
  for (const auto& rank : m["ranks"])
    for (const auto& op : rank["ops"])
      if (op["kind"] == "gemm" && op["shape"] == shape)
        per_call_us.push_back(op["time_per_step"]["median_s"].get<double>() / op["calls_per_step"].get<double>() * 1e6);
  std::sort(per_call_us.begin(), per_call_us.end());
  const std::size_t n = per_call_us.size();
  const double want_us = n % 2 == 1 ? per_call_us[n / 2] : (per_call_us[n / 2 - 1] + per_call_us[n / 2]) / 2;
  int checked = 0;
  for (const auto& g : c["gemms"])
    if (g["m"] == shape["m"] && g["n"] == shape["n"] && g["k"] == shape["k"] && g["batch"] == shape["batch"]) {
      CHECK(g["time_us"].get<double>() == doctest::Approx(want_us).epsilon(1e-9));
      CHECK(g["source"] == "measured in run " + kRun);
      ++checked;
    }
  CHECK(checked == 1);
  REQUIRE(c.contains("host"));
  CHECK(c["host"] == m["environment"]["host"]);
  // The card validates the run it came from, and no host warning: same host.
  const CliResult v = run_cuboid("validate --plan " + kPlan + " --measurements " + kRun + " --cluster " + card, t.path());
  CHECK((v.code == 0 || v.code == 1));
  CHECK(v.err.find("warning") == std::string::npos);
}

TEST_CASE("validate warns once on stderr when the card's host differs, exit code unchanged") {
  TempDir t("from_run_host");
  const std::string card = (t / "card.json").string();
  REQUIRE(run_cuboid("calibrate --from-measurements " + kRun + " --cluster topologies/localhost-cpu.json --out " + card,
                     t.path())
              .code == 0);
  const std::string args = "validate --plan " + kPlan + " --measurements " + kRun + " --cluster ";
  const CliResult same = run_cuboid(args + card, t.path());
  nlohmann::json j = nlohmann::json::parse(slurp(card));
  j["calibration"]["host"]["cpu_model"] = "Another CPU";
  TempDir t2("from_run_host2");
  write_text(t2 / "card.json", j.dump(2));
  const CliResult other = run_cuboid(args + (t2 / "card.json").string(), t.path());
  CHECK(other.code == same.code);
  std::string out = other.out;
  const std::string p2 = (t2 / "card.json").string();
  for (std::size_t at = out.find(p2); at != std::string::npos; at = out.find(p2)) out.replace(at, p2.size(), card);
  CHECK(out == same.out);
  CHECK(other.err.rfind("cuboid: warning: the card was calibrated on another host than " + kRun +
                            " ran on (card vs run: cpu_model 'Another CPU' vs ",
                        0) == 0);
  CHECK(other.err.find('\n') == other.err.size() - 1);
}

TEST_CASE("calibrate --from-measurements: bad input exits 2 with one line") {
  TempDir t("from_run_bad");
  const std::string out = " --out " + (t / "card.json").string();
  const CliResult missing =
      run_cuboid("calibrate --from-measurements " + (t / "nope.json").string() + " --cluster topologies/localhost-cpu.json" + out, t.path());
  CHECK(missing.code == 2);
  CHECK(missing.err.find('\n') == missing.err.size() - 1);
  const CliResult sweep_flag = run_cuboid(
      "calibrate --from-measurements " + kRun + " --plan " + kPlan + " --cluster topologies/localhost-cpu.json" + out, t.path());
  CHECK(sweep_flag.code == 2);
  CHECK(sweep_flag.err == "cuboid: command line: --from-measurements: measures nothing: --plan, --model, --raw and "
                          "--quick belong to the sweep (fix: leave them out, or run the sweep under mpirun without "
                          "--from-measurements)\n");
  const CliResult stat = run_cuboid(
      "calibrate --from-measurements " + kRun + " --statistic mean --cluster topologies/localhost-cpu.json" + out, t.path());
  CHECK(stat.code == 2);
  CHECK(stat.err == "cuboid: command line: --statistic: is 'mean' (fix: use median or min)\n");
  // The output is the input: refused before any work.
  const CliResult self =
      run_cuboid("calibrate --from-measurements " + kRun + " --cluster topologies/localhost-cpu.json --out " + kRun, t.path());
  CHECK(self.code == 2);
  CHECK(!std::filesystem::exists(t / "card.json"));
  // Without --from-measurements the sweep still needs --backend.
  const CliResult no_backend = run_cuboid("calibrate --cluster topologies/localhost-cpu.json" + out, t.path());
  CHECK(no_backend.code == 2);
  CHECK(no_backend.err.find("--backend is required") != std::string::npos);
}
TEST_CASE("calibrate --merge: each sample by the statistic over the cards, refitted; cards calibrated unlike refused") {
  TempDir t("merge");
  const std::string a = "tests/data/clusters/localhost-cpu-calibrated.json";
  nlohmann::json j = nlohmann::json::parse(slurp(a));
  nlohmann::json& cal = j["calibration"];
  // The second card: the first GEMM twice as fast, the second twice as slow,
  // the act kernel 0.8x throughout and the first collective 1.25x (a whole
  // series scaled by c scales its fit's alpha by c and its bandwidth by 1 / c).
  const double gemm0 = cal["gemms"][0]["time_us"].get<double>(), gemm1 = cal["gemms"][1]["time_us"].get<double>();
  cal["gemms"][0]["time_us"] = gemm0 / 2;
  cal["gemms"][1]["time_us"] = gemm1 * 2;
  nlohmann::json& act = cal["kernels"]["act"];
  const double act0 = act["samples"][0]["time_us"].get<double>();
  for (auto& x : act["samples"]) x["time_us"] = x["time_us"].get<double>() * 0.8;
  act["alpha_us"] = act["alpha_us"].get<double>() * 0.8;
  act["bandwidth_GBps"] = act["bandwidth_GBps"].get<double>() / 0.8;
  nlohmann::json& coll = cal["collectives"][0];
  const double coll0 = coll["samples"][0]["time_us"].get<double>();
  for (auto& x : coll["samples"]) x["time_us"] = x["time_us"].get<double>() * 1.25;
  coll["alpha_us"] = coll["alpha_us"].get<double>() * 1.25;
  coll["busbw_GBps"] = coll["busbw_GBps"].get<double>() / 1.25;
  const std::string b = (t / "b.json").string(), out = (t / "merged.json").string();
  write_text(t / "b.json", j.dump(2));
  const CliResult r = run_cuboid("calibrate --merge " + a + " " + b + " --statistic min --out " + out, t.path());
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("cuboid calibrate: merged 2 cards, statistic min: ") == 0);
  const nlohmann::json m = nlohmann::json::parse(slurp(out))["calibration"];
  CHECK(m["gemms"].size() == cal["gemms"].size());
  auto gemm_us = [&](const nlohmann::json& like) {
    for (const auto& g : m["gemms"])
      if (g["m"] == like["m"] && g["n"] == like["n"] && g["k"] == like["k"] && g["batch"] == like["batch"])
        return g["time_us"].get<double>();
    return -1.0;
  };
  CHECK(gemm_us(cal["gemms"][0]) == doctest::Approx(gemm0 / 2));
  CHECK(gemm_us(cal["gemms"][1]) == doctest::Approx(gemm1));
  CHECK(m["kernels"]["act"]["samples"][0]["time_us"].get<double>() == doctest::Approx(act0 * 0.8));
  CHECK(m["kernels"]["act"]["bandwidth_GBps"].get<double>() == doctest::Approx(act["bandwidth_GBps"].get<double>()));
  CHECK(m["collectives"][0]["samples"][0]["time_us"].get<double>() == doctest::Approx(coll0));
  CHECK(m["created_by"].get<std::string>().find("--merge") != std::string::npos);
  // median of two: their mean; the merged card plans.
  const CliResult med = run_cuboid("calibrate --merge " + a + " " + b + " --out " + out, t.path());
  REQUIRE(med.code == 0);
  const nlohmann::json mm = nlohmann::json::parse(slurp(out))["calibration"];
  CHECK(mm["kernels"]["act"]["samples"][0]["time_us"].get<double>() == doctest::Approx(act0 * 0.9));
  CHECK(run_cuboid("simulate --model models/tiny.json --cluster " + out + " --tp 2 --global-batch 4", t.path()).code == 0);
  // Refused, exit 2 and one line: one card, a --cluster beside it, cards calibrated unlike.
  const CliResult one = run_cuboid("calibrate --merge " + a + " --out " + out, t.path());
  CHECK(one.code == 2);
  CHECK(one.err == "cuboid: command line: --merge: gives 1 card(s) (fix: give two or more calibrated cards of the "
                   "same machine and plans)\n");
  const CliResult cluster =
      run_cuboid("calibrate --merge " + a + " " + b + " --cluster topologies/localhost-cpu.json --out " + out, t.path());
  CHECK(cluster.code == 2);
  CHECK(cluster.err.find("--merge: measures nothing") != std::string::npos);
  cal["ranks_per_core"] = 2;
  write_text(t / "c.json", j.dump(2));
  const CliResult unlike = run_cuboid("calibrate --merge " + a + " " + (t / "c.json").string() + " --out " + out, t.path());
  CHECK(unlike.code == 2);
  CHECK(unlike.err == "cuboid: " + (t / "c.json").string() + ": calibration.ranks_per_core: is 2, but " + a +
                          " has 1 (fix: merge cards calibrated alike (the same backend, ranks per core and operand "
                          "pool))\n");
  const CliResult plain = run_cuboid("calibrate --merge " + a + " topologies/localhost-cpu.json --out " + out, t.path());
  CHECK(plain.code == 2);
  CHECK(plain.err.find("calibration: is missing") != std::string::npos);
}
#else
TEST_CASE("calibrate is built with the executor only") { CHECK(true); }
#endif

}  // namespace
}  // namespace cuboid::test
