// The cuboid binary as a user runs it: exit codes, one-line errors naming the
// file/flag and the fix, JSON on stdout and logs on stderr.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

using cuboid::test::CliResult;
using cuboid::test::count_lines;
using cuboid::test::slurp;
using cuboid::test::TempDir;
using cuboid::test::write_text;

namespace {

// `cuboid <args>` (cli_run.hpp), its stdout and stderr captured in a folder of its own.
CliResult run(const std::string& args) {
  static const TempDir capture("cli_capture");
  return cuboid::test::run_cuboid(args, capture.path());
}

const std::string kLlama = "--model models/llama3-70b.json --cluster topologies/dgx-a100-4node.json";

}  // namespace

TEST_CASE("plan ranks layouts for Llama-3-70B on 4 x 8 A100 and lists the seed's TP4 x PP4 x DP2") {
  CliResult r = run("plan " + kLlama + " --simulate-top 2");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("Top 10 plans") != std::string::npos);
  CHECK(r.out.find(" sim ") != std::string::npos);
  CHECK(r.out.find(" est ") != std::string::npos);
  CHECK(r.out.find("Best plan of each TP x CP x PP x DP layout") != std::string::npos);

  CliResult j = run("plan " + kLlama + " --json --top 1000 --simulate-top 3");
  REQUIRE_MESSAGE(j.code == 0, j.err);
  auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["candidates"].is_array());
  REQUIRE(!doc["candidates"].empty());
  bool seed = false;
  double previous = 0;
  std::string previous_score = "simulated";
  int simulated = 0;
  for (const auto& c : doc["candidates"]) {
    // The simulated rows come first, each group fastest first.
    const std::string score = c["score"].get<std::string>();
    if (score != previous_score) {
      CHECK(previous_score == "simulated");
      CHECK(score == "analytical");
      previous = 0;
      previous_score = score;
    }
    // A row of tied rank orders stands for each of them.
    simulated += score == "simulated" ? 1 + static_cast<int>(c.value("tied_rank_orders", nlohmann::json::array()).size()) : 0;
    for (const char* key : {"tp", "pp", "dp", "micro_batch", "virtual_stages", "zero_stage", "recompute",
                            "sequence_parallel", "schedule", "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu",
                            "hardware_tflops_per_gpu", "mfu", "hfu", "memory_per_gpu_bytes", "breakdown"})
      CHECK_MESSAGE(c.contains(key), key);
    CHECK(c["tp"].get<int>() * c.value("cp", 1) * c["pp"].get<int>() * c["dp"].get<int>() == 32);
    CHECK(c["iteration_time_s"].get<double>() * 1.001 >= previous);  // best first (near-ties: default order first)
    previous = c["iteration_time_s"].get<double>();
    CHECK(c["memory_per_gpu_bytes"].get<double>() <= c["memory"]["capacity_bytes"].get<double>());
    if (c["tp"] == 4 && c["pp"] == 4 && c["dp"].get<int>() * c.value("cp", 1) == 2) seed = true;
  }
  CHECK_MESSAGE(seed, "the seed layout TP 4 x PP 4 x DP 2 must be among the candidates that fit");
  CHECK(simulated == 3);  // plans simulated, tied orders folded into their rows
  CHECK(doc["candidates_fitting"].get<std::size_t>() >= doc["candidates"].size());
}

TEST_CASE("plan with fixed dimensions and simulate agree") {
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 4 --cp 1 --micro-batch 1 --zero 1 --recompute full "
                    "--sequence-parallel on --schedule 1f1b --global-batch 64 --json --simulate-top 1");
  REQUIRE_MESSAGE(p.code == 0, p.err);
  auto best = nlohmann::json::parse(p.out)["candidates"].at(0);
  CliResult s = run("simulate " + kLlama + " --tp 4 --pp 4 --dp 2 --micro-batch 1 --zero 1 --recompute full "
                    "--sequence-parallel on --global-batch 64 --json");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  auto sim = nlohmann::json::parse(s.out);
  CHECK(sim["iteration_time_s"].get<double>() == doctest::Approx(best["iteration_time_s"].get<double>()));
  const auto& b = sim["breakdown"];
  double sum = 0;
  for (const char* k : {"compute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer"}) sum += b[k].get<double>();
  CHECK(sum == doctest::Approx(sim["iteration_time_s"].get<double>()).epsilon(1e-9));
  CliResult text = run("simulate " + kLlama + " --tp 4 --pp 4 --global-batch 64");
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("breakdown of the iteration") != std::string::npos);
  CHECK(text.out.find("memory per GPU") != std::string::npos);
  // Without gradient-accumulation fusion every micro-batch adds the main_grad
  // hooks: slower, and the plan says so.
  CliResult unfused = run("simulate " + kLlama + " --tp 4 --pp 4 --dp 2 --micro-batch 1 --zero 1 --recompute full "
                          "--sequence-parallel on --global-batch 64 --grad-accum-fusion off --json");
  REQUIRE_MESSAGE(unfused.code == 0, unfused.err);
  const auto slow = nlohmann::json::parse(unfused.out);
  CHECK(slow["iteration_time_s"].get<double>() > sim["iteration_time_s"].get<double>());
  CHECK(slow["grad_accum_fusion"] == false);
  CHECK(sim["grad_accum_fusion"] == true);
}

TEST_CASE("mesh prints the seed's picture") {
  CliResult r = run("mesh " + kLlama + " --tp 4 --pp 4 --dp 2");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("p0 d0 t0") != std::string::npos);
  CHECK(r.out.find("p3 d1 t3") != std::string::npos);
  CHECK(r.out.find("every TP group stays inside one node") != std::string::npos);
  CliResult cross = run("mesh " + kLlama + " --tp 8 --pp 2 --dp 2 --rank-order dp-tp-pp");
  REQUIRE_MESSAGE(cross.code == 0, cross.err);
  CHECK(cross.out.find("WARNING: 4 of 4 TP groups cross nodes") != std::string::npos);
  // Megatron-Core's tp-cp-ep-pp-dp: rank = t + 4 c + 8 p + 16 d, so node 1
  // holds stage 1 of replica 0, both CP ranks (cuboid's map had CP inside DP:
  // node 1 was stage 0's CP rank 1).
  CliResult cp = run("mesh " + kLlama + " --tp 4 --cp 2 --pp 2 --dp 2 --rank-order tp-cp-ep-pp-dp");
  REQUIRE_MESSAGE(cp.code == 0, cp.err);
  CHECK(cp.out.find("rank order tp-pp-dp (first named = innermost; CP next to TP, Megatron-Core's tp-cp-ep-pp-dp)") !=
        std::string::npos);
  CHECK(cp.out.find("  node 1    p1d0c0t0    p1d0c0t1") != std::string::npos);
  CHECK(cp.out.find("split one sequence) (16 groups of 2):\n  ranks 0,4 ") != std::string::npos);
}

TEST_CASE("the 512B model on 16-way PP x 8-way TP: the answer says whether it fits and what it needs") {
  CliResult r = run("plan --model models/gpt-512b.json --cluster topologies/dgx-a100-superpod.json --tp 8 "
                    "--pp 16 --simulate-top 1");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const bool fits = r.out.find("Top ") != std::string::npos;
  const bool explains = r.out.find("What would make a plan fit") != std::string::npos;
  CHECK((fits || explains));
  CHECK(r.out.find("  8   1  16   35") != std::string::npos);
}

TEST_CASE("plan --ep without --dp searches DP; when nothing fits the hints run with the fixed EP (issue #46)") {
  // Mixtral 8x7B on one DGX H100 with EP 8: the fixed EP was checked against
  // DP 1 and refused before the search, and, with DP left to the search, the
  // text mode's hints failed with the same error after the table.
  CliResult r = run("plan --model models/mixtral-8x7b.json --cluster topologies/dgx-h100.json --nodes 1 --ep 8 "
                    "--simulate-top 0");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("Nothing fits") != std::string::npos);
  CHECK(r.out.find("What would make a plan fit") != std::string::npos);
  CHECK(r.out.find("--nodes 2 (2x the GPUs)                      fits") != std::string::npos);
  // A change the options refuse is said in its line, and the command exits 0 as --json does.
  CHECK(r.out.find("--zero 3 (shard weights, grads, optimizer)   ") != std::string::npos);
  CliResult j = run("plan --model models/mixtral-8x7b.json --cluster topologies/dgx-h100.json --nodes 1 --ep 8 "
                    "--simulate-top 0 --json");
  CHECK_MESSAGE(j.code == 0, j.err);
  // DeepSeek-V3's HF config on 32 DGX H100 (its 163,840-token sequence fits
  // nowhere): the --zero 3 hint, when MoE models refused ZeRO-3, exited 2
  // blaming --zero, which was never given. Megatron-FSDP is priced now: the
  // hint searches it (the search already had ZeRO-3 plans).
  CliResult d = run("plan --model tests/data/hf/deepseek-v3-config.json --cluster topologies/dgx-h100.json --nodes 32");
  REQUIRE_MESSAGE(d.code == 0, d.err);
  CHECK(d.out.find("--zero 3 (shard weights, grads, optimizer)   still does not fit") != std::string::npos);
}

TEST_CASE("plan --explain, the table and simulate's report name an EP plan's token dispatcher (issue #46)") {
  const std::string moe = "--model models/tiny-moe.json --cluster topologies/dgx-a100-4node.json --ep 2";
  CliResult r = run("plan " + moe + " --simulate-top 1 --explain");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find(" dispatch ") != std::string::npos);             // the table's column
  CHECK(r.out.find("  dispatcher         alltoall ") != std::string::npos);  // --explain's rows, one per dispatcher
  CHECK(r.out.find("  dispatcher         allgather ") != std::string::npos);
  CHECK(r.out.find("  dispatcher         flex ") != std::string::npos);
  CHECK(r.out.find(" dispatcher) ") != std::string::npos);  // the winner's line: "EP dispatch + combine (X dispatcher)"
  CliResult s = run("simulate " + moe + " --dp 32 --moe-dispatcher flex");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("token dispatcher: flex (DeepEP") != std::string::npos);
  CliResult d = run("simulate --model models/tiny.json --cluster topologies/dgx-a100-4node.json --moe-dispatcher flex");
  CHECK(d.code == 2);
  CHECK(d.err.find("--moe-dispatcher") != std::string::npos);
}

TEST_CASE("--moe-ep-overlap: the table, --explain, simulate and the exports show it; refusals name the flag") {
  const std::string moe = "--model models/tiny-moe.json --cluster topologies/dgx-a100-4node.json --ep 2 --pp 1";
  CliResult r = run("plan " + moe + " --simulate-top 1 --explain");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find(" ovl ") == std::string::npos);  // off: no column
  CHECK(r.out.find("  EP overlap         off ") != std::string::npos);  // --explain: the winner's setting
  CHECK(r.out.find("  EP overlap         on ") != std::string::npos);   // and the best plan with the other
  CliResult on = run("plan " + moe + " --moe-ep-overlap on --simulate-top 1");
  REQUIRE_MESSAGE(on.code == 0, on.err);
  CHECK(on.out.find(" ovl ") != std::string::npos);
  CHECK(on.out.find("EP overlap on") != std::string::npos);  // the winner's line
  CHECK(on.out.find("  EP overlap: on (Megatron-Core's combined 1F1B") != std::string::npos);
  // A search with EP unset: EP 1 candidates are refused one by one, not the whole
  // search (it exited 2 naming EP 1 before any candidate).
  CliResult searched = run("plan --model models/tiny-moe.json --cluster topologies/dgx-a100-4node.json "
                           "--moe-ep-overlap on --simulate-top 0");
  REQUIRE_MESSAGE(searched.code == 0, searched.err);
  CHECK(searched.out.find(" ovl ") != std::string::npos);
  CliResult s = run("simulate " + moe + " --dp 32 --moe-ep-overlap on");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("      EP overlap: on (") != std::string::npos);
  CliResult ab = run("simulate " + moe + " --dp 32 --moe-ep-overlap on --ablate ep-overlap --json");
  CliResult off = run("simulate " + moe + " --dp 32 --json");
  REQUIRE_MESSAGE(ab.code == 0, ab.err);
  CHECK(nlohmann::json::parse(ab.out)["iteration_time_s"] == nlohmann::json::parse(off.out)["iteration_time_s"]);
  CliResult pp = run("simulate --model models/tiny-moe.json --cluster topologies/dgx-a100-4node.json --ep 2 --pp 2 "
                     "--dp 16 --moe-ep-overlap on");
  CHECK(pp.code == 2);
  CHECK(pp.err.find("--moe-ep-overlap") != std::string::npos);
  CHECK(pp.err.find("transformer_config.py:3007@d98e8a64") != std::string::npos);
  CliResult d = run("simulate --model models/tiny.json --cluster topologies/dgx-a100-4node.json --moe-ep-overlap on");
  CHECK(d.code == 2);
  CHECK(d.err.find("needs a mixture-of-experts model") != std::string::npos);
}

TEST_CASE("bad input: exit code 2 and one line naming the file or flag and the fix") {
  const TempDir files("cli_bad");
  const auto bad_json = files / "bad.json";
  write_text(bad_json, "{\"name\": \"x\", \"num_layers\": 4,");
  const auto typo = files / "typo.json";
  write_text(typo, R"({"name":"t","num_layer":4,"hidden_size":64,"num_attention_heads":4,"vocab_size":100,"seq_length":32})");
  struct Case {
    std::string args;
    std::string expect;
  };
  const Case cases[] = {
      {"plan --model /nonexistent.json --cluster topologies/dgx-a100-4node.json", "/nonexistent.json: file not found"},
      {"plan --model " + bad_json.string() + " --cluster topologies/dgx-a100-4node.json", "malformed JSON"},
      {"plan --model " + typo.string() + " --cluster topologies/dgx-a100-4node.json", "num_layer: unknown field"},
      {"plan " + kLlama + " --tp 3", "--tp: TP 3 does not divide the 64 attention heads"},
      {"plan " + kLlama + " --pp 3", "does not divide the 80 layers"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --dp 1", "does not use all 32 GPUs"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --global-batch 63", "--global-batch: global batch 63 is not divisible"},
      {"plan " + kLlama + " --zero 5", "--zero: ZeRO stage must be 0, 1, 2 or 3"},
      {"plan " + kLlama + " --recompute sometimes", "--recompute: unknown recompute mode \"sometimes\""},
      {"plan " + kLlama + " --schedule zigzag", "--schedule: unknown pipeline schedule"},
      {"plan " + kLlama + " --sequence-parallel maybe", "--sequence-parallel: expected on or off"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --grad-accum-fusion fused", "--grad-accum-fusion: expected on or off"},
      {"plan " + kLlama + " --nodes 0", "--nodes: must be positive"},
      {"plan " + kLlama + " --tp abc", "command line"},
      {"plan " + kLlama + " --global-batch -4", "--global-batch: must be positive"},
      {"plan --model models/llama3-70b.json", "--cluster is required"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --vpp 3 --schedule interleaved", "does not divide the 80 layers"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --gpu-spread -0.01", "--gpu-spread: must be in [0, 0.5], got -0.01"},
      {"plan " + kLlama + " --gpu-spread 0.6", "--gpu-spread: must be in [0, 0.5], got 0.6"},
      {"simulate " + kLlama + " --tp 4 --pp 4 --precision fp8-current", "--precision: A100-SXM4-80GB has no FP8 tensor cores"},
      {"plan " + kLlama + " --precision fp8", "--precision: unknown precision \"fp8\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    CliResult r = run(c.args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find(c.expect) != std::string::npos, r.err);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE("--gpu-spread 0 is a cluster of identical GPUs, byte for byte; the A100 card's spread is reported") {
  // The DGX A100 card with its GPU profile inline and without speed_spread.
  const TempDir dir("cli_spread");
  nlohmann::json card = nlohmann::json::parse(slurp("topologies/dgx-a100-4node.json"));
  nlohmann::json gpu = nlohmann::json::parse(slurp("topologies/" + card["gpu"].get<std::string>()));
  REQUIRE(gpu.contains("speed_spread"));
  gpu.erase("speed_spread");
  card["gpu"] = gpu;
  const auto even = dir / "even.json";
  write_text(even, card.dump(2));
  const std::string dims = " --tp 4 --pp 4 --dp 2 --global-batch 64 --json";
  const std::string plan = " --tp 4 --pp 4 --cp 1 --global-batch 64 --simulate-top 2 --top 20 --json";
  for (const std::string& args : {"simulate" + dims, "simulate" + dims + " --analytical", "plan" + plan}) {
    CAPTURE(args);
    const std::string cmd = args.substr(0, args.find(' '));
    const std::string rest = args.substr(args.find(' '));
    CliResult off = run(cmd + " " + kLlama + rest + " --gpu-spread 0");
    CliResult plain = run(cmd + " --model models/llama3-70b.json --cluster " + even.string() + rest);
    REQUIRE_MESSAGE(off.code == 0, off.err);
    REQUIRE_MESSAGE(plain.code == 0, plain.err);
    CHECK(off.out == plain.out);
    CHECK(off.out.find("gpu_spread") == std::string::npos);
  }
  // As shipped: sigma 0.0115, the slowest of 32 GPUs at 1 + 0.0115 x 2.0667291.
  CliResult on = run("simulate " + kLlama + dims);
  CliResult off = run("simulate " + kLlama + dims + " --gpu-spread 0");
  CliResult wide = run("simulate " + kLlama + dims + " --gpu-spread 0.05");
  REQUIRE_MESSAGE(on.code == 0, on.err);
  const auto a = nlohmann::json::parse(on.out), b = nlohmann::json::parse(off.out), c = nlohmann::json::parse(wide.out);
  CHECK(a["gpu_spread"]["sigma"] == 0.0115);
  CHECK(a["gpu_spread"]["gpus"] == 32);
  CHECK(a["gpu_spread"]["expected_slowdown"].get<double>() == doctest::Approx(1 + 0.0115 * 2.0667291).epsilon(1e-8));
  CHECK(c["gpu_spread"]["sigma"] == 0.05);
  CHECK(b["iteration_time_s"].get<double>() < a["iteration_time_s"].get<double>());
  CHECK(a["iteration_time_s"].get<double>() < c["iteration_time_s"].get<double>());
  CliResult text = run("simulate " + kLlama + " --tp 4 --pp 4 --dp 2 --global-batch 64");
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("GPU speed spread sigma 1.15%") != std::string::npos);
  CHECK(text.out.find("GPU speed spread per stage") != std::string::npos);
}

TEST_CASE("plan --out writes a plan file that simulate, mesh and export read back") {
  const TempDir dir("cli_plan");
  const auto plan = dir / "plan.json";
  const auto pareto = dir / "pareto.svg";
  const auto mesh = dir / "mesh.svg";
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 4 --cp 1 --global-batch 64 --simulate-top 1 --json --out " + plan.string() + " --svg " +
                    pareto.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  REQUIRE(std::filesystem::exists(plan));
  CHECK(slurp(pareto).find("<svg") != std::string::npos);
  auto best = nlohmann::json::parse(p.out)["candidates"].at(0);
  auto file = nlohmann::json::parse(slurp(plan));
  CHECK(file["schema"] == "cuboid.plan/1");
  CHECK(file["parallel"]["tp"] == 4);
  CHECK(file["rank_mapping"].size() == 32);

  CliResult s = run("simulate --plan " + plan.string() + " --json");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  auto sim = nlohmann::json::parse(s.out);
  CHECK(sim["tp"] == best["tp"]);
  CHECK(sim["micro_batch"] == best["micro_batch"]);
  CHECK(sim["zero_stage"] == best["zero_stage"]);

  CliResult m = run("mesh --plan " + plan.string() + " --svg " + mesh.string());
  REQUIRE_MESSAGE(m.code == 0, m.err);
  CHECK(slurp(mesh).find("class=\"gpu\"") != std::string::npos);

  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("--tensor-model-parallel-size 4") != std::string::npos);

  struct Case {
    std::string args;
    std::string expect;
  };
  const Case bad[] = {
      {"simulate --plan " + plan.string() + " --cluster topologies/dgx-h100.json", plan.string()},
      {"simulate --plan " + plan.string() + " --tp 2", "--plan: a plan file fixes the model and every dimension"},
      {"export --plan " + plan.string() + " --to jax", "--to: unknown export target \"jax\""},
      {"plan " + kLlama + " --tp 4 --pp 4 --simulate-top 0 --out /nonexistent-dir/plan.json", "/nonexistent-dir"},
      {"plan --model models/llama3.1-405b.json --cluster topologies/dgx-a100.json --out " + (dir / "none.json").string(),
       "--out: no plan fits in memory, so nothing was written"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.args);
    CliResult r = run(c.args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find(c.expect) != std::string::npos, r.err);
    CHECK(count_lines(r.err) == 1);
  }
  CHECK_FALSE(std::filesystem::exists("/nonexistent-dir/plan.json"));
  CHECK_FALSE(std::filesystem::exists(dir / "none.json"));
}

TEST_CASE("plan --for TARGET chooses a plan that the target can express, and export accepts it") {
  const TempDir dir("cli_for");
  for (const char* target : {"megatron", "deepspeed", "torchtitan", "nemo"}) {
    CAPTURE(target);
    const auto plan = dir / (std::string(target) + ".plan.json");
    CliResult p = run("plan " + kLlama + " --simulate-top 1 --for " + target + " --out " + plan.string());
    REQUIRE_MESSAGE(p.code == 0, p.err);
    CliResult e = run("export --plan " + plan.string() + " --to " + target);
    CHECK_MESSAGE(e.code == 0, e.err);
    CHECK(!e.out.empty());
    // DeepSpeed and torchtitan accumulate gradients in a separate pass, so
    // --for prices their plans without Megatron's fusion.
    const nlohmann::json par = nlohmann::json::parse(std::ifstream(plan))["parallel"];
    CHECK(par["grad_accum_fusion"].get<bool>() == (std::string(target) == "megatron" || std::string(target) == "nemo"));
    // --for implies the trainer that runs the export.
    const std::string want = std::string(target) == "deepspeed"    ? "megatron-deepspeed"
                             : std::string(target) == "torchtitan" ? "torchtitan"
                                                                   : "megatron-core";
    CHECK(par["trainer"]["preset"] == want);
  }
  CliResult bad = run("plan " + kLlama + " --for jax");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--for: unknown export target \"jax\"") != std::string::npos);
  // --for and --trainer must agree.
  CliResult clash = run("plan " + kLlama + " --for nemo --trainer torchtitan");
  CHECK(clash.code == 2);
  CHECK(clash.err.find("--trainer: --for nemo exports to a trainer that runs as megatron-core, not as torchtitan") !=
        std::string::npos);
  CliResult ok = run("plan " + kLlama + " --simulate-top 0 --top 1 --for megatron --trainer megatron-2022 --json");
  CHECK_MESSAGE(ok.code == 0, ok.err);
}

TEST_CASE("plan --for torchtitan, then export --to torchtitan: the README's Llama-3-70B, Mixtral 8x7B and 128K tokens with CP") {
  const TempDir dir("cli_titan");
  // The README's example (4 x 8 A100): the best plan torchtitan runs, priced
  // with its pipeline's unsharded gradients, exports as planned.
  const auto plan = dir / "llama.plan.json";
  CliResult p = run("plan " + kLlama + " --simulate-top 0 --for torchtitan --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(plan));
  CHECK(j["parallel"]["trainer"]["pp_fsdp_no_sync"] == true);
  CHECK(j["prediction"]["memory"]["fits"] == true);
  CliResult e = run("export --plan " + plan.string() + " --to torchtitan --as-planned");
  CHECK_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("--compile.no_enable\n") != std::string::npos);
  // Mixtral 8x7B: torchtitan v0.2.2 has no flavour of it, said before any search.
  CliResult mx = run("plan --model models/mixtral-8x7b.json --cluster topologies/dgx-a100-4node.json --for torchtitan");
  CHECK(mx.code == 2);
  CHECK_MESSAGE(mx.err.find("--for: --for torchtitan: torchtitan v0.2.2's qwen3 MoE flavours are 30B-A3B and "
                           "235B-A22B; none has the shape of mixtral-8x7b") != std::string::npos,
                mx.err);
  // 128K tokens over CP 2 (the 70B card with Llama 3.1's 131072 positions):
  // the export launches the ring attention that was priced.
  nlohmann::json card = nlohmann::json::parse(std::ifstream("models/llama3-70b.json"));
  card["max_position_embeddings"] = 131072;
  const auto card_128k = dir / "llama3-70b-128k.json";
  write_text(card_128k, card.dump());
  const auto cp = dir / "cp.plan.json";
  CliResult c = run("plan --model " + card_128k.string() +
                    " --cluster topologies/dgx-a100-4node.json --seq-length 131072 --global-batch 16 --cp 2 "
                    "--simulate-top 0 --for torchtitan --out " +
                    cp.string());
  REQUIRE_MESSAGE(c.code == 0, c.err);
  CHECK(nlohmann::json::parse(std::ifstream(cp))["prediction"]["memory"]["fits"] == true);
  CliResult ce = run("export --plan " + cp.string() + " --to torchtitan --as-planned");
  CHECK_MESSAGE(ce.code == 0, ce.err);
  CHECK(ce.out.find("set_rotate_method('alltoall')") != std::string::npos);
  CHECK(ce.out.find("--parallelism.context_parallel_degree=2 \\\n") != std::string::npos);
  // torchtitan main runs no plan as priced: refused before the search, with the reason.
  CliResult m = run("plan " + kLlama + " --for torchtitan-main");
  CHECK(m.code == 2);
  CHECK_MESSAGE(m.err.find("--for: --for torchtitan-main: torchtitan main (b5bcd76c) runs a language model's attention "
                           "as FlexAttention") != std::string::npos,
                m.err);
}

TEST_CASE("export of a plan the target cannot run as planned: the best plan of the same layout it runs, said so") {
  const TempDir dir("cli_replan");
  const auto plan = dir / "v2.plan.json";
  // Interleaved (v 2) on purpose: NeMo 1.x's mcore path runs no virtual stages.
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 4 --dp 2 --vpp 2 --zero 1 --global-batch 64 --simulate-top 0 --out " +
                    plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  CliResult e = run("export --plan " + plan.string() + " --to nemo");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.err.find("cannot run on nemo as planned (parallel.virtual_stages:") != std::string::npos);
  CHECK(e.err.find("exported instead the best plan nemo runs with TP 4 x PP 4 x DP 2 (cuboid plan --tp 4 --pp 4 --dp 2 "
                   "--global-batch 64 --seq-length 8192 --for nemo)") != std::string::npos);
  CHECK(e.err.find("virtual stages 2 -> 1") != std::string::npos);
  CHECK(e.out.find(", re-planned for nemo (schema cuboid.plan/1)") != std::string::npos);
  for (const char* key : {"  tensor_model_parallel_size: 4\n", "  pipeline_model_parallel_size: 4\n",
                          "  virtual_pipeline_model_parallel_size: null\n", "  global_batch_size: 64\n"})
    CHECK_MESSAGE(e.out.find(key) != std::string::npos, key);
  // --as-planned refuses, naming --for.
  CliResult strict = run("export --plan " + plan.string() + " --to nemo --as-planned");
  CHECK(strict.code == 2);
  CHECK(strict.err.find("parallel.virtual_stages") != std::string::npos);
  CHECK(strict.err.find("or plan again with --for nemo") != std::string::npos);
  // A target that runs no plan of this layout keeps its refusal and says so.
  CliResult ds = run("export --plan " + plan.string() + " --to deepspeed");
  CHECK(ds.code == 2);
  CHECK(ds.err.find("deepspeed runs no plan with TP 4 x PP 4 x DP 2") != std::string::npos);
  // The re-plan keeps an uneven split of the layers (80 layers on PP 3): NeMo
  // has no keys for it, so the refusal stands, about the plan file, not about
  // a command line the user never typed.
  const auto uneven = dir / "uneven.plan.json";
  CliResult u = run("plan " + kLlama + " --tp 8 --pp 3 --dp 1 --nodes 3 --uneven-stages --global-batch 64 --simulate-top 0 --out " +
                    uneven.string());
  REQUIRE_MESSAGE(u.code == 0, u.err);
  CliResult un = run("export --plan " + uneven.string() + " --to nemo");
  CHECK(un.code == 2);
  CHECK(un.err.find(uneven.string() + ": parallel.first_stage_layers") != std::string::npos);
  CHECK(un.err.find("command line") == std::string::npos);
}

TEST_CASE("--trainer and --dp-overlap reach plan, simulate and the plan file; a plan file fixes them") {
  const TempDir dir("cli_trainer");
  const auto plan = dir / "p.json";
  CliResult p = run("plan --model models/llama3-8b.json --cluster topologies/dgx-a100-4node.json --tp 4 --pp 4 --trainer megatron-2022 --dp-overlap on --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  const nlohmann::json t = pj["parallel"]["trainer"];
  CHECK(t["preset"] == "megatron-2022");
  // The plan file carries the prediction's interval (A100, 32 GPUs: validated).
  CHECK(pj["prediction"]["interval"]["known"] == true);
  CHECK(pj["prediction"]["interval"]["low_s"].get<double>() < pj["prediction"]["interval"]["high_s"].get<double>());
  CHECK(t["dp_overlap"] == true);
  CliResult s = run("simulate --plan " + plan.string());
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("trainer megatron-2022: DP reduction overlapped with the backward at 4 bytes per gradient") !=
        std::string::npos);
  CliResult fixed = run("simulate --plan " + plan.string() + " --trainer megatron-core");
  CHECK(fixed.code == 2);
  CliResult a = run("simulate " + kLlama + " --tp 4 --pp 4 --trainer megatron-2021 --dp-overlap off --analytical --json");
  REQUIRE_MESSAGE(a.code == 0, a.err);
  CHECK(nlohmann::json::parse(a.out)["dp_grad_bytes"] == 2);
}

TEST_CASE("--grad-reduce-dtype reaches simulate, plan, the plan file and the exports; a trainer without it refuses") {
  const TempDir dir("cli_grad_dtype");
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 4 --zero 1 --grad-reduce-dtype bf16 --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  CHECK(pj["parallel"]["trainer"]["dp_grad_bytes"] == 2);
  CliResult s = run("simulate --plan " + plan.string());
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("trainer megatron-core: DP reduction overlapped with the backward at 2 bytes per gradient") !=
        std::string::npos);
  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("--grad-reduce-in-bf16") != std::string::npos);
  // The same plan with fp32 gradients: 2 bytes more per parameter in the
  // gradient buffer, so more weight + optimizer memory.
  const std::string fixed = "simulate " + kLlama + " --tp 4 --pp 4 --zero 1 --analytical --json";
  CliResult fp32 = run(fixed + " --grad-reduce-dtype fp32");
  CliResult bf16 = run(fixed + " --grad-reduce-dtype bf16");
  REQUIRE_MESSAGE(fp32.code == 0, fp32.err);
  REQUIRE_MESSAGE(bf16.code == 0, bf16.err);
  const nlohmann::json jf = nlohmann::json::parse(fp32.out), jb = nlohmann::json::parse(bf16.out);
  CHECK(jf["dp_grad_bytes"] == 4);
  CHECK(jb["dp_grad_bytes"] == 2);
  CHECK(jb["memory"]["weights_and_optimizer_bytes"].get<double>() < jf["memory"]["weights_and_optimizer_bytes"].get<double>());
  CliResult bad = run(fixed + " --grad-reduce-dtype fp16");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--grad-reduce-dtype: expected fp32 or bf16, got \"fp16\"") != std::string::npos);
  CliResult old = run("simulate " + kLlama + " --tp 4 --pp 4 --trainer megatron-2022 --grad-reduce-dtype bf16");
  CHECK(old.code == 2);
  CHECK(old.err.find("--grad-reduce-dtype: megatron-2022 does not reduce gradients in 16 bits") != std::string::npos);
  CliResult with_plan = run("simulate --plan " + plan.string() + " --grad-reduce-dtype fp32");
  CHECK(with_plan.code == 2);
}

TEST_CASE("--fsdp-grad-dtype: Megatron-FSDP's bf16 gradients by default, fp32 on request, in memory, plan files and exports") {
  const TempDir dir("cli_fsdp_grad_dtype");
  // ZeRO-3 over DP 8 (TP 4, PP 1): the gradients at 2 bytes whatever --grad-reduce-dtype says.
  const std::string fixed = "simulate " + kLlama + " --tp 4 --pp 1 --zero 3 --analytical --json";
  CliResult d = run(fixed);
  CliResult f = run(fixed + " --fsdp-grad-dtype fp32");
  CliResult g = run(fixed + " --grad-reduce-dtype fp32");
  REQUIRE_MESSAGE(d.code == 0, d.err);
  REQUIRE_MESSAGE(f.code == 0, f.err);
  REQUIRE_MESSAGE(g.code == 0, g.err);
  const nlohmann::json jd = nlohmann::json::parse(d.out), jf = nlohmann::json::parse(f.out), jg = nlohmann::json::parse(g.out);
  CHECK(jd["fsdp_grad_bytes"] == 2);
  CHECK(jf["fsdp_grad_bytes"] == 4);
  CHECK(jg["fsdp_grad_bytes"] == 2);
  CHECK(jg["memory"]["weights_and_optimizer_bytes"] == jd["memory"]["weights_and_optimizer_bytes"]);
  // fp32 gradient shards: 2 bytes more per parameter over DP 8.
  CHECK(jf["memory"]["weights_and_optimizer_bytes"].get<double>() > jd["memory"]["weights_and_optimizer_bytes"].get<double>());
  CliResult text = run("simulate " + kLlama + " --tp 4 --pp 1 --zero 3");
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("DP reduction overlapped with the backward at 2 bytes per gradient (Megatron-FSDP's)") !=
        std::string::npos);
  // ZeRO-1: the distributed optimizer's DDP buffer, fp32; no Megatron-FSDP field in the JSON.
  CliResult z1 = run("simulate " + kLlama + " --tp 4 --pp 1 --zero 1 --analytical --json");
  REQUIRE_MESSAGE(z1.code == 0, z1.err);
  CHECK_FALSE(nlohmann::json::parse(z1.out).contains("fsdp_grad_bytes"));
  // The plan file keeps fp32 (it differs from the preset's) and the exports state it.
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 1 --zero 3 --fsdp-grad-dtype fp32 --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  CHECK(nlohmann::json::parse(std::ifstream(plan))["parallel"]["trainer"]["fsdp_grad_bytes"] == 4);
  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("--megatron-fsdp-main-grads-dtype fp32") != std::string::npos);
  CliResult b = run("export --plan " + plan.string() + " --to megatron-bridge");
  REQUIRE_MESSAGE(b.code == 0, b.err);
  CHECK(b.out.find("cfg.ddp.megatron_fsdp_main_grads_dtype = torch.float32") != std::string::npos);
  CHECK(b.out.find("\nimport torch\n") != std::string::npos);
  // Refused: another dtype word, a trainer without Megatron-FSDP.
  CliResult bad = run(fixed + " --fsdp-grad-dtype fp16");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--fsdp-grad-dtype: expected fp32 or bf16, got \"fp16\"") != std::string::npos);
  CliResult titan = run("simulate " + kLlama + " --tp 4 --pp 1 --zero 3 --trainer torchtitan --fsdp-grad-dtype bf16");
  CHECK(titan.code == 2);
  CHECK(titan.err.find("--fsdp-grad-dtype: torchtitan has no Megatron-FSDP to keep gradients in bf16") != std::string::npos);
}

TEST_CASE("--precision-aware-optimizer and --adam-moments: smaller optimizer states, in the plan file and the exports") {
  const TempDir dir("cli_precision_aware");
  const std::string fixed = "simulate " + kLlama + " --tp 4 --pp 4 --zero 1 --analytical --json";
  CliResult d = run(fixed);
  CliResult a = run(fixed + " --precision-aware-optimizer --adam-moments bf16");
  REQUIRE_MESSAGE(d.code == 0, d.err);
  REQUIRE_MESSAGE(a.code == 0, a.err);
  const nlohmann::json jd = nlohmann::json::parse(d.out), ja = nlohmann::json::parse(a.out);
  CHECK_FALSE(jd.contains("precision_aware_optimizer"));
  CHECK(ja["precision_aware_optimizer"] == true);
  CHECK(ja["adam_moment_bytes"] == 2);
  // 12 bytes of states a parameter become 6 (remainders 2 + moments 2 + 2), sharded over DP 2.
  CHECK(ja["memory"]["weights_and_optimizer_bytes"].get<double>() < jd["memory"]["weights_and_optimizer_bytes"].get<double>());
  CliResult text = run("simulate " + kLlama + " --tp 4 --pp 4 --zero 1 --precision-aware-optimizer --adam-moments bf16");
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("precision-aware optimizer (Transformer Engine's FusedAdam): 6 bytes of optimizer states per "
                      "parameter (master weights as 16-bit remainders of the bf16 weights), Adam's moments in bf16") !=
        std::string::npos);
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + kLlama + " --tp 4 --pp 4 --precision-aware-optimizer --adam-moments bf16 --out " +
                    plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  CHECK(pj["parallel"]["precision_aware_optimizer"] == true);
  CHECK(pj["parallel"]["adam_moment_bytes"] == 2);
  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("--use-precision-aware-optimizer") != std::string::npos);
  CHECK(e.out.find("--exp-avg-dtype bf16") != std::string::npos);
  // Refused: bf16 moments without it, a trainer without it, another dtype word.
  CliResult alone = run(fixed + " --adam-moments bf16");
  CHECK(alone.code == 2);
  CHECK(alone.err.find("--adam-moments: Adam's moments in bf16 need the precision-aware optimizer") != std::string::npos);
  CHECK(alone.err.find("add --precision-aware-optimizer") != std::string::npos);
  CliResult titan = run("simulate " + kLlama + " --tp 4 --pp 1 --zero 3 --trainer torchtitan --precision-aware-optimizer");
  CHECK(titan.code == 2);
  CHECK(titan.err.find("--precision-aware-optimizer: torchtitan has no precision-aware optimizer") != std::string::npos);
  CliResult bad = run(fixed + " --precision-aware-optimizer --adam-moments fp8");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--adam-moments: expected fp32 or bf16, got \"fp8\"") != std::string::npos);
}

TEST_CASE("--fp8-attention: cuDNN's FP8 attention in the report, the plan file and Megatron-Bridge's export") {
  const TempDir dir("cli_fp8_attention");
  const std::string gb = "--model models/llama3-8b.json --cluster topologies/gb200-nvl72.json --nodes 1 --gpus-per-node 8 "
                         "--tp 1 --pp 1 --dp 8 --global-batch 128 --micro-batch 2 --seq-length 8192 --zero 1 "
                         "--precision mxfp8";
  CliResult d = run("simulate " + gb + " --analytical --json");
  CliResult a = run("simulate " + gb + " --fp8-attention --analytical --json");
  REQUIRE_MESSAGE(d.code == 0, d.err);
  REQUIRE_MESSAGE(a.code == 0, a.err);
  const nlohmann::json jd = nlohmann::json::parse(d.out), ja = nlohmann::json::parse(a.out);
  CHECK_FALSE(jd.contains("fp8_attention"));
  CHECK(ja["fp8_attention"] == true);
  CHECK(ja["iteration_time_s"].get<double>() != jd["iteration_time_s"].get<double>());
  CliResult text = run("simulate " + gb + " --fp8-attention");
  REQUIRE_MESSAGE(text.code == 0, text.err);
  CHECK(text.out.find("precision mxfp8: the linear layers' GEMMs in FP8; attention core in MXFP8 (cuDNN), embedding "
                      "and LM head bf16") != std::string::npos);
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + gb + " --fp8-attention --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  CHECK(pj["parallel"]["fp8_attention"] == true);
  CliResult b = run("export --plan " + plan.string() + " --to megatron-bridge");
  REQUIRE_MESSAGE(b.code == 0, b.err);
  CHECK(b.out.find("cfg.mixed_precision.fp8_dot_product_attention = True") != std::string::npos);
  // Megatron-LM's command line has no argument for it (without --as-planned the export re-plans for it).
  CliResult e = run("export --plan " + plan.string() + " --to megatron --as-planned");
  CHECK(e.code != 0);
  CHECK(e.err.find("parallel.fp8_attention: Megatron-LM d98e8a64's command line has no setting for FP8 attention") !=
        std::string::npos);
  // Refused with the reason and the fix: a recipe without it, a GPU without rates.
  CliResult blockwise = run("simulate --model models/llama3-8b.json --cluster topologies/dgx-h100.json --tp 1 "
                            "--precision fp8-blockwise --fp8-attention");
  CHECK(blockwise.code == 2);
  CHECK(blockwise.err.find("--fp8-attention: FP8 attention under the blockwise recipe") != std::string::npos);
  CHECK(blockwise.err.find("use --precision fp8-current, fp8-delayed or mxfp8, or drop --fp8-attention") !=
        std::string::npos);
  CliResult h100 = run("simulate --model models/llama3-8b.json --cluster topologies/dgx-h100.json --tp 1 "
                       "--precision fp8-current --fp8-attention");
  CHECK(h100.code == 2);
  CHECK(h100.err.find("H100-SXM5-80GB's profile has no measured rates for cuDNN's per-tensor FP8 attention") !=
        std::string::npos);
}

TEST_CASE("--precision reaches simulate, plan, the plan file, its readers and the exports; a target without the format refuses") {
  const TempDir dir("cli_precision");
  const std::string h100 = "--model models/llama3-8b.json --cluster topologies/dgx-h100.json";
  CliResult s = run("simulate " + h100 + " --tp 2 --precision fp8-current");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("precision fp8-current: the linear layers' GEMMs in FP8") != std::string::npos);
  CliResult b = run("simulate " + h100 + " --tp 2");
  REQUIRE_MESSAGE(b.code == 0, b.err);
  CHECK(b.out.find("precision") == std::string::npos);
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + h100 + " --tp 2 --precision fp8-delayed --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  CHECK(pj["parallel"]["precision"] == "fp8-delayed");
  CliResult again = run("simulate --plan " + plan.string());
  REQUIRE_MESSAGE(again.code == 0, again.err);
  CHECK(again.out.find("precision fp8-delayed") != std::string::npos);
  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("    --fp8-format hybrid\n    --fp8-recipe delayed\n    --fp8-amax-history-len 1024\n") !=
        std::string::npos);
  CliResult ds = run("export --plan " + plan.string() + " --to deepspeed");
  CHECK(ds.code == 2);
  CHECK(ds.err.find("parallel.precision: the plan is priced with fp8-delayed GEMMs, and DeepSpeed v0.16.4's") !=
        std::string::npos);
  CliResult old = run("simulate " + h100 + " --tp 2 --trainer megatron-2022 --precision fp8-current");
  CHECK(old.code == 2);
  CHECK(old.err.find("--precision: megatron-2022 runs no FP8 / FP4 linear layers here") != std::string::npos);
}

TEST_CASE("--offload-activations reaches simulate, plan, the plan file and the exports; a card without host_link refuses") {
  const TempDir dir("cli_offload");
  const std::string h100 = "--model models/llama3-8b.json --cluster topologies/dgx-h100.json --tp 1 --pp 1 --dp 8 "
                           "--global-batch 16 --micro-batch 1 --zero 1";
  CliResult s = run("simulate " + h100 + " --offload-activations 20");
  REQUIRE_MESSAGE(s.code == 0, s.err);
  CHECK(s.out.find("  host copies ") != std::string::npos);
  // 20 x 34 sbh (no dropout masks: Llama trains without dropout) = 20 x 1.0625 GiB
  CHECK(s.out.find("  offloaded to host     21.2 GiB") != std::string::npos);
  CliResult b = run("simulate " + h100);
  REQUIRE_MESSAGE(b.code == 0, b.err);
  CHECK(b.out.find("host copies") == std::string::npos);
  const auto plan = dir / "p.json";
  CliResult p = run("plan " + h100 + " --offload-activations 20 --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(plan));
  CHECK(pj["parallel"]["offload_activations"] == 20);
  CHECK(pj["parallel"]["recompute"] == "none");
  CliResult e = run("export --plan " + plan.string() + " --to megatron");
  REQUIRE_MESSAGE(e.code == 0, e.err);
  CHECK(e.out.find("    --cpu-offloading-num-layers 20\n") != std::string::npos);
  CliResult sel = run("simulate " + h100 + " --recompute selective --offload-activations 8");
  CHECK(sel.code == 2);
  CHECK(sel.err.find("--offload-activations: Megatron-Core offloads activations only without recomputation") !=
        std::string::npos);
  CliResult cpu = run("simulate --model models/llama3-8b.json --cluster topologies/localhost-cpu.json --tp 1 --pp 1 "
                      "--dp 2 --global-batch 2 --seq-length 256 --offload-activations 4");
  CHECK(cpu.code == 2);
  CHECK(cpu.err.find("states no link between a GPU and host memory") != std::string::npos);
}

TEST_CASE("validate: measurements of another plan exit 2 with one line naming the field") {
  const TempDir dir("cli_validate");
  const auto plan = dir / "tp2.json";
  CliResult p = run("plan --model models/tiny.json --cluster topologies/localhost-cpu.json --tp 2 --global-batch 4 "
                    "--micro-batch 1 --flash-attention off --simulate-top 1 --out " + plan.string());
  REQUIRE_MESSAGE(p.code == 0, p.err);
  // A well-formed run of a DP 2 plan of the same model.
  nlohmann::json m = {{"schema", "cuboid.measurements/1"},
                      {"model", {{"name", "tiny"}, {"num_layers", 4}, {"hidden_size", 256}, {"num_attention_heads", 8},
                                 {"ffn_hidden_size", 1024}, {"vocab_size", 1024}}},
                      {"plan", {{"tp", 1}, {"pp", 1}, {"dp", 2}, {"micro_batch", 1}, {"global_batch", 4},
                                {"num_micro_batches", 2}, {"seq_length", 128}, {"virtual_stages", 1}, {"zero_stage", 0},
                                {"recompute", "none"}, {"sequence_parallel", false}, {"schedule", "1f1b"},
                                {"rank_order", "tp-dp-pp"}, {"world_size", 2}}},
                      {"environment", {{"backend", "cpu"}, {"hostnames", {"vm"}}}},
                      {"steps", 3}, {"warmup", 1}, {"iteration_time_s", 0.5}, {"ranks", nlohmann::json::array()}};
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json t = {{"median_s", 0.5}, {"min_s", 0.5}, {"max_s", 0.5}};
    m["ranks"].push_back({{"rank", r}, {"hostname", "vm"},
                          {"coord", {{"tp", 0}, {"pp", 0}, {"dp", r}, {"node", 0}, {"gpu", r}}},
                          {"iteration", t}, {"compute_s", 0.5}, {"communication_s", 0.0},
                          {"ops", {{{"name", "qkv"}, {"kind", "gemm"}, {"pass", "forward"}, {"calls_per_step", 2},
                                    {"time_per_step", t}, {"shape", {{"m", 128}, {"n", 768}, {"k", 256}, {"batch", 1}}}}}}});
  }
  const auto measurements = dir / "dp2.measurements.json";
  std::ofstream(measurements) << m.dump(2);
  CliResult v = run("validate --plan " + plan.string() + " --measurements " + measurements.string() +
                    " --cluster topologies/localhost-cpu.json");
  CHECK(v.code == 2);
  CHECK(v.out.empty());
  CHECK_MESSAGE(v.err.find(measurements.string() + ": plan.tp: the run had TP 1 but plan file " + plan.string() +
                           " has 2: these measurements are from another plan") != std::string::npos,
                v.err);
  CHECK(count_lines(v.err) == 1);
}

TEST_CASE("simulate --ablate turns one mechanism off, and names the choices for an unknown one") {
  const std::string plan = " --tp 4 --pp 4 --dp 2 --recompute full --global-batch 64 --json";
  const CliResult on = run("simulate " + kLlama + plan);
  const CliResult spread_off = run("simulate " + kLlama + plan + " --gpu-spread 0");
  const CliResult ablated = run("simulate " + kLlama + plan + " --ablate gpu-spread");
  REQUIRE_MESSAGE(on.code == 0, on.err);
  REQUIRE_MESSAGE(ablated.code == 0, ablated.err);
  const double t_on = nlohmann::json::parse(on.out)["iteration_time_s"].get<double>();
  const double t_ablated = nlohmann::json::parse(ablated.out)["iteration_time_s"].get<double>();
  CHECK(t_ablated < t_on);
  CHECK(t_ablated == nlohmann::json::parse(spread_off.out)["iteration_time_s"].get<double>());
  // The 2021 trainer's 16-bit gradients: with them off the DP reduction moves twice the bytes.
  const std::string m21 = " --tp 8 --pp 2 --dp 2 --recompute full --global-batch 64 --trainer megatron-2021 --json";
  const CliResult fp16 = run("simulate " + kLlama + m21);
  const CliResult fp32 = run("simulate " + kLlama + m21 + " --ablate dp-16bit-grads");
  REQUIRE_MESSAGE(fp16.code == 0, fp16.err);
  REQUIRE_MESSAGE(fp32.code == 0, fp32.err);
  CHECK(nlohmann::json::parse(fp32.out)["breakdown"]["dp_comm"].get<double>() >
        nlohmann::json::parse(fp16.out)["breakdown"]["dp_comm"].get<double>());
  // Each accumulation ablation touches only its own trainer's accumulation: the 2021
  // fp16 .grad (6 B -> the fp32 hook's 10: slower), not the BF16Optimizer's copy.
  const CliResult acc10 = run("simulate " + kLlama + m21 + " --ablate fp16-grad-accum");
  const CliResult acc6 = run("simulate " + kLlama + m21 + " --ablate bf16-optimizer-copy");
  REQUIRE_MESSAGE(acc10.code == 0, acc10.err);
  REQUIRE_MESSAGE(acc6.code == 0, acc6.err);
  const double t21 = nlohmann::json::parse(fp16.out)["iteration_time_s"].get<double>();
  CHECK(nlohmann::json::parse(acc10.out)["iteration_time_s"].get<double>() > t21);
  CHECK(nlohmann::json::parse(acc6.out)["iteration_time_s"].get<double>() == t21);
  const CliResult bad = run("simulate " + kLlama + plan + " --ablate everything");
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--ablate: unknown mechanism \"everything\" (fix: use one of dp-16bit-grads") != std::string::npos);
}
