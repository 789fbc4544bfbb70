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
#else
TEST_CASE("calibrate is built with the executor only") { CHECK(true); }
#endif

}  // namespace
}  // namespace cuboid::test
