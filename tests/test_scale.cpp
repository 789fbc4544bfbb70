// Hostile scale: a 10T-parameter model on 100,000 GPUs plans within the
// planner's normal budget (analytical ranking: above 16,384 GPUs the simulator
// re-rank is off unless asked for), and what is beyond cuboid's limits stops
// at load with exit 2 and the limit named, never a run of minutes.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

using cuboid::test::CliResult;
using cuboid::test::count_lines;
using cuboid::test::run_cuboid;
using cuboid::test::TempDir;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a 10T-parameter model on 100,000 GPUs plans in seconds") {
  TempDir d("scale");
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = run_cuboid(
      "plan --model tests/data/models/gpt-10t.json --cluster tests/data/clusters/h100-roce-100k.json --json --top 5", d.path());
  const double took_s = seconds_since(t0);
  MESSAGE("plan, 10T model on 100,000 GPUs: " << took_s << " s");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto doc = nlohmann::json::parse(r.out);
  REQUIRE(!doc["candidates"].empty());
  for (const auto& c : doc["candidates"]) {
    CHECK(c["tp"].get<std::int64_t>() * c.value("cp", std::int64_t{1}) * c["pp"].get<std::int64_t>() *
              c["dp"].get<std::int64_t>() ==
          100000);
    CHECK(c["score"] == "analytical");
    CHECK(c["iteration_time_s"].get<double>() > 0);
  }

  // The text output says why no plan was simulated.
  const CliResult text = run_cuboid(
      "plan --model tests/data/models/gpt-10t.json --cluster tests/data/clusters/h100-roce-100k.json --top 3", d.path());
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("no simulation above 16384 GPUs by default") != std::string::npos);
}

TEST_CASE("beyond the limits: exit 2 at load, naming the limit and the fix") {
  TempDir d("scale_limits");
  struct Case {
    std::string args;
    std::string expect;
  };
  // The 100k card without its max_nodes, grown to 40,000 nodes (320,000 GPUs).
  auto card = nlohmann::json::parse(cuboid::test::slurp("tests/data/clusters/h100-roce-100k.json"));
  card.erase("max_nodes");
  card["nodes"] = 40000;
  card["gpu"] = std::filesystem::absolute("topologies/gpus/h100-sxm5-80gb.json").string();
  const auto big = d / "big.json";
  cuboid::test::write_text(big, card.dump());
  const Case cases[] = {
      {"plan --model models/llama3-70b.json --cluster " + big.string(),
       big.string() + ": nodes: 40000 nodes x 8 GPUs = 320000 GPUs, above cuboid's limit of 262144 (fix: plan at most 32768 nodes (--nodes N))"},
      {"plan --model models/llama3-70b.json --cluster " + big.string() + " --nodes 50000",
       "command line: --nodes: 50000 nodes x 8 GPUs = 400000 GPUs"},
      {"plan --model models/llama3-70b.json --cluster topologies/dgx-a100-4node.json --global-batch 2000000000",
       "--global-batch: global batch 2000000000 is above cuboid's limit of 1073741824 sequences"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const CliResult r = run_cuboid(c.args, d.path());
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK_MESSAGE(r.err.find(c.expect) != std::string::npos, r.err);
  }
}
