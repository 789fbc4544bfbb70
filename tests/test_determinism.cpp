// The same inputs give byte-identical output: plan --json, plan --out files,
// simulate --json and simulate --trace files, the HTML reports (--report),
// across two runs and across the planner's thread counts (--threads 1 vs 2). Nothing time-dependent is
// written: simulate --json has no host time (the text output keeps it).
#include <doctest/doctest.h>

#include <string>

#include "cli_run.hpp"

using cuboid::test::CliResult;
using cuboid::test::run_cuboid;
using cuboid::test::slurp;
using cuboid::test::TempDir;

namespace {

const std::string kLlama = "--model models/llama3-70b.json --cluster topologies/dgx-a100-4node.json";

// stdout and the file the command wrote to `file`.
struct Output {
  std::string out;
  std::string file;
};

Output run_to(const std::string& args, const TempDir& d, const std::string& name) {
  const auto file = d / name;
  const CliResult r = run_cuboid(args + " " + file.string(), d.path());
  REQUIRE_MESSAGE(r.code == 0, r.err);
  REQUIRE(!r.out.empty());
  return {r.out, slurp(file)};
}

}  // namespace

TEST_CASE("plan --json and plan --out are byte-identical across runs and thread counts") {
  TempDir d("determinism_plan");
  // Llama-3-70B on 4 x 8 A100 with the simulator re-rank of the best 4, and a
  // small fixed-shape search.
  const std::string searches[] = {
      "plan " + kLlama + " --json --top 50 --simulate-top 4",
      "plan --model models/gpt-small.json --cluster topologies/dgx-a100.json --global-batch 64 --json --top 100 --simulate-top 2",
  };
  for (const std::string& search : searches) {
    CAPTURE(search);
    const Output a = run_to(search + " --threads 1 --out", d, "a.json");
    const Output b = run_to(search + " --threads 1 --out", d, "b.json");
    const Output c = run_to(search + " --threads 2 --out", d, "c.json");
    CHECK(a.out == b.out);
    CHECK(a.out == c.out);
    CHECK(a.file == b.file);
    CHECK(a.file == c.file);
    CHECK(a.file.find("\"schema\": \"cuboid.plan/1\"") != std::string::npos);
  }
}

TEST_CASE("simulate --json and simulate --trace are byte-identical across runs") {
  TempDir d("determinism_sim");
  const std::string sim = "simulate " + kLlama + " --tp 4 --pp 4 --dp 2 --global-batch 64 --json --trace";
  const Output a = run_to(sim, d, "a.trace.json");
  const Output b = run_to(sim, d, "b.trace.json");
  CHECK(a.out == b.out);
  CHECK(a.file == b.file);
  CHECK(a.file.find("traceEvents") != std::string::npos);

  // A plan file read back simulates the same way each time too.
  const auto plan = d / "plan.json";
  const CliResult p = run_cuboid("plan " + kLlama + " --tp 8 --pp 2 --simulate-top 1 --out " + plan.string(), d.path());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const Output c = run_to("simulate --plan " + plan.string() + " --json --trace", d, "c.trace.json");
  const Output e = run_to("simulate --plan " + plan.string() + " --json --trace", d, "e.trace.json");
  CHECK(c.out == e.out);
  CHECK(c.file == e.file);
}

TEST_CASE("plan --report and simulate --report are byte-identical across runs and thread counts") {
  TempDir d("determinism_report");
  const std::string plan =
      "plan --model models/gpt-small.json --cluster topologies/dgx-a100.json --nodes 1 --tp 2 --pp 2 --global-batch 64";
  const Output a = run_to(plan + " --threads 1 --out " + (d / "p.json").string() + " --report", d, "a.html");
  const Output b = run_to(plan + " --threads 2 --report", d, "b.html");
  CHECK(a.file == b.file);
  CHECK(a.file.find("id=\"timeline-svg\"") != std::string::npos);
  const std::string sim = "simulate --plan " + (d / "p.json").string() + " --report";
  const Output c = run_to(sim, d, "c.html");
  const Output e = run_to(sim, d, "e.html");
  CHECK(c.file == e.file);
}
