// The plan file (schema cuboid.plan/1): what cuboid writes reads back to the
// same plan; other versions, hand edits and mismatched clusters are refused
// with the file, the field and the fix; writes are atomic.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/trainer.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/search/planner.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;
namespace fs = std::filesystem;

namespace {

const cuboid::test::Fixture& seed() {
  static const auto all = cuboid::test::fixtures();
  return all.front();
}

nlohmann::json seed_json() {
  static const nlohmann::json j = cuboid::test::fixture_json(seed());
  return j;
}

std::string read_error(const nlohmann::json& j) {
  try {
    plan_file_from_json(j, "plan.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("cuboid_planfile_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("a plan file holds the model, cluster, every parallel setting, the rank mapping and the prediction") {
  const nlohmann::json j = seed_json();
  CHECK(j["schema"] == "cuboid.plan/1");
  CHECK(j["model"]["name"] == "llama3-70b");
  CHECK(j["cluster"]["name"] == "DGX A100 x4");
  CHECK(j["cluster"]["nodes"] == 4);
  CHECK(j["cluster"]["gpus_per_node"] == 8);
  CHECK(j["cluster"]["gpu"] == "A100-SXM4-80GB");
  const auto& par = j["parallel"];
  CHECK(par["tp"] == 4);
  CHECK(par["pp"] == 4);
  CHECK(par["dp"] == 2);
  CHECK(par["num_micro_batches"] == 32);
  CHECK(par["zero_stage"] == 1);
  CHECK(par["recompute"] == "full");
  CHECK(par["schedule"] == "1f1b");
  CHECK(par["rank_order"] == "tp-dp-pp");
  REQUIRE(j["rank_mapping"].size() == 32);
  // tp-dp-pp: rank 13 = tp 1, dp 1, pp 1 on node 1, GPU 5.
  CHECK(j["rank_mapping"][13] == nlohmann::json{{"rank", 13}, {"node", 1}, {"gpu", 5}, {"tp", 1}, {"pp", 1}, {"dp", 1}});
  const auto& pred = j["prediction"];
  CHECK(pred["iteration_time_s"].get<double>() > 0);
  CHECK(pred["tokens_per_s"].get<double>() > 0);
  CHECK(pred["memory"]["total_bytes"].get<std::int64_t>() > 0);
  CHECK(pred["breakdown"].size() == 6);
}

TEST_CASE("cluster.gpus_per_host: written where a node has several hosts, read back, absent otherwise") {
  CHECK_FALSE(seed_json()["cluster"].contains("gpus_per_host"));
  CHECK(plan_file_from_json(seed_json(), "plan.json").gpus_per_host == 0);
  nlohmann::json j = seed_json();
  j["cluster"]["gpus_per_host"] = 4;
  const PlanFile pf = plan_file_from_json(j, "plan.json");
  CHECK(pf.gpus_per_host == 4);
  CHECK(pf.hosts() == 8);
  j["cluster"]["gpus_per_host"] = 3;
  CHECK(read_error(j) == "plan.json: cluster.gpus_per_host: 3 neither divides gpus_per_node 8 nor is a multiple of it "
                         "(fix: regenerate it with this cuboid (cuboid plan ... --out FILE))");
  j["cluster"]["gpus_per_host"] = 12;
  CHECK(read_error(j).find("plan.json: cluster.gpus_per_host: ") == 0);
  // A host of two nodes (a test fixture's CPU ranks counted as nodes).
  j["cluster"]["gpus_per_host"] = 16;
  CHECK(plan_file_from_json(j, "plan.json").hosts() == 2);
}

TEST_CASE("every fixture plan reads back to the same plan and model") {
  for (const auto& f : cuboid::test::fixtures()) {
    CAPTURE(f.name);
    const PlanFile pf = cuboid::test::fixture_plan_file(f);
    CHECK(pf.plan.tp == f.plan.tp);
    CHECK(pf.plan.pp == f.plan.pp);
    CHECK(pf.plan.dp == f.plan.dp);
    CHECK(pf.plan.virtual_stages == f.plan.virtual_stages);
    CHECK(pf.plan.zero_stage == f.plan.zero_stage);
    CHECK(pf.plan.recompute == f.plan.recompute);
    CHECK(pf.plan.sequence_parallel == f.plan.sequence_parallel);
    CHECK(pf.plan.schedule == f.plan.schedule);
    CHECK(pf.plan.global_batch == f.plan.global_batch);
    CHECK(pf.plan.order == f.plan.order);
    CHECK(model_to_json(pf.model) == model_to_json(load_model(cuboid::test::source_root() / f.model_card)));
    CHECK(pf.nodes == 4);
    CHECK(pf.gpus_per_node == 8);
    CHECK(pf.prediction.is_object());
  }
}

TEST_CASE("read_plan_file reads a written file; write_output_file leaves no temporary behind") {
  const fs::path dir = temp_dir();
  const fs::path file = dir / "plan.json";
  write_output_file(file, "old");
  write_output_file(file, seed_json().dump(2));
  const PlanFile pf = read_plan_file(file);
  CHECK(pf.source == file.string());
  CHECK(pf.plan.tp == 4);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);
  CHECK((fs::status(file).permissions() & fs::perms::others_read) != fs::perms::none);
  fs::remove_all(dir);
}

TEST_CASE("another schema version is refused with the fix") {
  nlohmann::json j = seed_json();
  j["schema"] = "cuboid.plan/2";
  CHECK(read_error(j) ==
        "plan.json: schema: plan file schema \"cuboid.plan/2\" is not supported (fix: regenerate it with this cuboid, "
        "which writes cuboid.plan/1)");
  j.erase("schema");
  CHECK(read_error(j) ==
        "plan.json: schema: missing (this is not a cuboid plan file) (fix: pass a file written by cuboid plan --out, "
        "which starts with \"schema\": \"cuboid.plan/1\")");
}

TEST_CASE("gradient-accumulation fusion round-trips; older plan files without it read as fused") {
  nlohmann::json j = seed_json();
  CHECK(j["parallel"]["grad_accum_fusion"] == true);
  j["parallel"]["grad_accum_fusion"] = false;
  CHECK_FALSE(plan_file_from_json(j, "plan.json").plan.grad_accum_fusion);
  j["parallel"].erase("grad_accum_fusion");
  CHECK(plan_file_from_json(j, "plan.json").plan.grad_accum_fusion);
  j["parallel"]["grad_accum_fusion"] = "off";
  CHECK(read_error(j).rfind("plan.json: parallel.grad_accum_fusion: ", 0) == 0);
}

TEST_CASE("unknown fields, wrong types and hand edits name the field") {
  nlohmann::json j = seed_json();
  j["parallel"]["tensor_parallel"] = 4;
  CHECK(read_error(j).rfind("plan.json: parallel.tensor_parallel: ", 0) == 0);

  j = seed_json();
  j["extra"] = 1;
  CHECK(read_error(j).rfind("plan.json: extra: ", 0) == 0);

  j = seed_json();
  j["model"]["hidden_size"] = "big";
  CHECK(read_error(j).rfind("plan.json: model.hidden_size: expected an integer", 0) == 0);

  j = seed_json();
  j["parallel"]["zero_stage"] = "1";
  CHECK(read_error(j).rfind("plan.json: parallel.zero_stage: expected an integer", 0) == 0);

  j = seed_json();
  j["parallel"]["recompute"] = "partial";
  CHECK(read_error(j) ==
        "plan.json: parallel.recompute: unknown value \"partial\" (fix: use one of none|selective|full)");

  j = seed_json();
  j["rank_mapping"][13]["node"] = 0;
  CHECK(read_error(j) ==
        "plan.json: rank_mapping[13].node: is 0 but rank order tp-dp-pp with 8 GPUs per node puts rank 13 at node 1 "
        "(fix: the file was edited by hand; regenerate it with this cuboid (cuboid plan ... --out FILE))");

  j = seed_json();
  j["parallel"]["world_size"] = 16;
  CHECK(read_error(j) ==
        "plan.json: parallel.world_size: is 16 but TP x PP x DP x CP = 32 (fix: regenerate it with this cuboid "
        "(cuboid plan ... --out FILE))");

  j = seed_json();
  j["prediction"].erase("iteration_time_s");
  CHECK(read_error(j).rfind("plan.json: prediction.iteration_time_s: missing required field", 0) == 0);
}

TEST_CASE("the plan is validated against its own inline model") {
  nlohmann::json j = seed_json();
  j["model"]["num_attention_heads"] = 48;  // TP 4 still divides; KV heads 8 still divide 48
  j["model"]["head_dim"] = 128;
  CHECK(read_error(j) == "(accepted)");
  j["parallel"]["tp"] = 3;
  j["parallel"]["dp"] = 2;
  j["parallel"]["world_size"] = 24;
  const std::string e = read_error(j);
  CHECK(e.rfind("plan.json: parallel.", 0) == 0);
  CHECK(e.find("(fix: regenerate it with this cuboid") != std::string::npos);
}

TEST_CASE("a plan file whose model has experts, latent attention and MTP reads (EP 1, ETP = TP when absent)") {
  nlohmann::json j = seed_json();
  j["model"]["moe"] = {{"num_experts", 8}, {"experts_per_token", 2}, {"expert_ffn_hidden_size", 28672}};
  CHECK(read_error(j) == "(accepted)");
  const PlanFile pf = plan_file_from_json(j, "plan.json");
  CHECK(pf.plan.ep == 1);
  CHECK(pf.plan.expert_tp() == pf.plan.tp);
  j["parallel"]["ep"] = 3;
  CHECK(read_error(j).rfind("plan.json: parallel.ep: EP 3 does not divide the 8 experts", 0) == 0);
  j["parallel"].erase("ep");
  j["model"]["moe"]["first_dense_layers"] = 1;
  CHECK(read_error(j) == "(accepted)");
  j["model"]["mla"] = {{"kv_lora_rank", 512}, {"qk_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128}};
  j["model"].erase("head_dim");
  j["model"].erase("num_kv_heads");
  CHECK(read_error(j) == "(accepted)");
  j["model"]["mtp_layers"] = 1;
  CHECK(read_error(j) == "(accepted)");
}

TEST_CASE("a plan for another cluster shape is refused") {
  const PlanFile pf = cuboid::test::fixture_plan_file(seed());
  const fs::path card = cuboid::test::source_root() / "topologies/dgx-a100-4node.json";
  CHECK_NOTHROW(check_plan_matches_cluster(pf, load_cluster(card)));
  const Cluster two = load_cluster(card, 2);
  CHECK_THROWS_WITH_AS(check_plan_matches_cluster(pf, two),
                       (card.string() +
                        ": nodes: plan file seed.plan.json was made for 4 nodes x 8 A100-SXM4-80GB (cluster \"DGX A100 "
                        "x4\") (32 GPUs) but this cluster has 2 nodes x 8 A100-SXM4-80GB (16 GPUs) (fix: pass --nodes "
                        "4, or regenerate the plan for this cluster)")
                           .c_str(),
                       InputError);
  Cluster other_gpu = load_cluster(card);
  other_gpu.gpu.name = "H100-SXM5-80GB";
  CHECK_THROWS_WITH_AS(check_plan_matches_cluster(pf, other_gpu),
                       (card.string() +
                        ": gpu: plan file seed.plan.json was made for 4 nodes x 8 A100-SXM4-80GB (cluster \"DGX A100 "
                        "x4\") but this cluster has 4 nodes x 8 H100-SXM5-80GB (fix: use the cluster card the plan was "
                        "made for (" + card.string() + "), or regenerate the plan for this cluster)")
                           .c_str(),
                       InputError);
}

TEST_CASE("trainer settings round-trip; older plan files without them read as megatron-core") {
  nlohmann::json j = seed_json();
  CHECK(j["parallel"]["trainer"]["preset"] == "megatron-core");
  CHECK(j["parallel"]["trainer"]["dp_overlap"] == true);
  CHECK(j["parallel"]["trainer"]["dp_grad_bytes"] == 4);
  j["parallel"]["trainer"] = {{"preset", "megatron-2021"}, {"dp_overlap", false}, {"dp_grad_bytes", 2},
                              {"zero1_grad_all_reduce", false}, {"tp_backward_overlap", false}};
  // What Megatron-LM of 2021 (and Megatron-DeepSpeed of 2022, below) can run.
  for (const char* off : {"sequence_parallel", "flash_attention", "grad_accum_fusion"}) j["parallel"][off] = false;
  j["parallel"]["zero_stage"] = 0;
  const TrainerSettings t = plan_file_from_json(j, "plan.json").plan.trainer;
  CHECK(t.preset == "megatron-2021");
  CHECK_FALSE(t.dp_overlap);
  CHECK(t.dp_grad_bytes == 2);
  j["parallel"]["trainer"]["dp_grad_bytes"] = 3;
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.dp_grad_bytes: must be 2", 0) == 0);
  j["parallel"]["trainer"]["dp_grad_bytes"] = 2;
  j["parallel"]["trainer"]["preset"] = "megatron-1999";
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.preset: unknown trainer", 0) == 0);
  j["parallel"]["trainer"]["preset"] = "megatron-2021";
  // grad_accum_bytes, absent here as in plan files written before it: the preset's
  // (2021: autograd's fp16 .grad, 6 B per parameter).
  CHECK(t.grad_accum_bytes == 6);
  j["parallel"]["trainer"]["preset"] = "megatron-deepspeed-2022";
  // Its DeepSpeed reduces the BF16Optimizer's fp32 gradients only.
  CHECK(read_error(j) ==
        "plan.json: parallel.trainer.dp_grad_bytes: megatron-deepspeed-2022 does not reduce gradients in 16 bits "
        "(Megatron-DeepSpeed of 2022 (BigScience's fork, BLOOM) on DeepSpeed's pipeline engine, bf16) (fix: set "
        "trainer.dp_grad_bytes to the preset's (4), or name a parallel.trainer.preset that has it, or regenerate it "
        "with cuboid plan --trainer megatron-deepspeed-2022 ... --out FILE)");
  j["parallel"]["trainer"]["dp_grad_bytes"] = 4;
  CHECK(plan_file_from_json(j, "plan.json").plan.trainer.grad_accum_bytes == 18);
  j["parallel"]["trainer"]["grad_accum_bytes"] = 10;
  CHECK(plan_file_from_json(j, "plan.json").plan.trainer.grad_accum_bytes == 10);
  j["parallel"]["trainer"]["grad_accum_bytes"] = 12;
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.grad_accum_bytes: must be 6", 0) == 0);
  j["parallel"]["trainer"]["grad_accum_bytes"] = 6;
  CHECK(plan_file_from_json(j, "plan.json").plan.trainer.grad_accum_bytes == 6);
  j["parallel"].erase("trainer");
  // megatron-core's settings as the code's defaults have them, and its
  // Megatron-FSDP's gradient dtype (the struct's 0 is a trainer without one).
  TrainerSettings mcore;
  mcore.fsdp_grad_bytes = 2;
  CHECK(plan_file_from_json(j, "plan.json").plan.trainer == mcore);
}

TEST_CASE("pp_fsdp_no_sync: written when on (torchtitan's pipeline with FSDP), absent otherwise, absent reads as off") {
  nlohmann::json j = seed_json();
  CHECK_FALSE(j["parallel"]["trainer"].contains("pp_fsdp_no_sync"));
  CHECK_FALSE(plan_file_from_json(j, "plan.json").plan.trainer.pp_fsdp_no_sync);
  j["parallel"]["trainer"]["pp_fsdp_no_sync"] = true;
  const PlanFile pf = plan_file_from_json(j, "plan.json");
  CHECK(pf.plan.trainer.pp_fsdp_no_sync);
  const Cluster cluster = cuboid::test::four_dgx_a100();
  ParallelPlan p = pf.plan;
  CHECK(plan_to_json(pf.model, cluster, estimate(pf.model, Topology(cluster), p))["parallel"]["trainer"]["pp_fsdp_no_sync"] ==
        true);
  j["parallel"]["trainer"]["pp_fsdp_no_sync"] = 1;
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.pp_fsdp_no_sync: ", 0) == 0);
}

TEST_CASE("ZeRO-3 settings round-trip; older plan files without them read as FSDP2's") {
  const cuboid::test::Fixture& f = seed();
  // What DeepSpeed of 2021 can run: no pipeline, no SP, unfused attention and accumulation.
  ParallelPlan p = cuboid::test::unfused(f.plan);
  p.dp *= p.pp;
  p.pp = 1;
  p.sequence_parallel = p.flash_attention = false;
  p.trainer = find_trainer("deepspeed-2021")->settings;
  const ModelSpec model = load_model(cuboid::test::source_root() / f.model_card);
  const Cluster cluster = cuboid::test::four_dgx_a100();
  const Topology topo(cluster);
  nlohmann::json j = plan_to_json(model, cluster, estimate(model, topo, p));
  const nlohmann::json& z = j["parallel"]["trainer"]["zero3"];
  CHECK(z["unit"] == "tensor");
  CHECK(z["persist_params"] == 100000);
  CHECK(z["prefetch_units"] == 0);
  CHECK(z["prefetch_params"] == 50000000);
  CHECK(z["reuse_params"] == 1000000000);
  CHECK(z["reduce_bucket_params"] == 500000000);
  CHECK(z["reduce_per_tensor"] == true);
  CHECK(z["sync"] == true);
  CHECK(z["list_collectives"] == true);
  CHECK(z["fetch_norm"] == true);
  CHECK(plan_file_from_json(j, "plan.json").plan.trainer == p.trainer);

  j["parallel"]["trainer"]["zero3"]["unit"] = "layer";
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.zero3.unit:", 0) == 0);
  j["parallel"]["trainer"]["zero3"]["unit"] = "block";
  j["parallel"]["trainer"]["zero3"]["prefetch_params"] = -1;
  CHECK(read_error(j).rfind("plan.json: parallel.trainer.zero3.prefetch_params: must not be negative", 0) == 0);
  j["parallel"]["trainer"]["zero3"]["prefetch_params"] = 0;
  j["parallel"]["trainer"]["zero3"]["overlap"] = true;
  CHECK(read_error(j).find("overlap") != std::string::npos);

  // Written before the settings existed: the other trainer fields stay, ZeRO-3 is FSDP2's.
  j["parallel"]["trainer"].erase("zero3");
  const TrainerSettings t = plan_file_from_json(j, "plan.json").plan.trainer;
  CHECK(t.preset == "deepspeed-2021");
  CHECK(t.dp_grad_bytes == 2);
  CHECK(t.zero3_unit == Zero3Unit::block);
  CHECK(t.zero3_prefetch_units == 1);
  CHECK_FALSE(t.zero3_sync);
  CHECK_FALSE(t.zero3_list_collectives);
  CHECK_FALSE(t.zero3_fetch_norm);
}

TEST_CASE("a plan file meets the trainer rules of the flags that would make it: one check_plan") {
  nlohmann::json j = seed_json();
  // The seed as Megatron-LM of 2021 runs it (fp16 gradients), but with ZeRO 1, which it has not.
  j["parallel"]["trainer"]["preset"] = "megatron-2021";
  j["parallel"]["trainer"]["dp_grad_bytes"] = 2;
  for (const char* off : {"sequence_parallel", "flash_attention", "grad_accum_fusion"}) j["parallel"][off] = false;
  j["parallel"]["recompute"] = "full";
  j["parallel"]["zero_stage"] = 1;
  CHECK(read_error(j) ==
        "plan.json: parallel.zero_stage: megatron-2021 cannot run ZeRO stage 1 (Megatron-LM of 2021 (Narayanan et "
        "al. SC'21 scripts), fp16) (fix: use zero_stage 0, or name a parallel.trainer.preset that runs ZeRO 1, or "
        "regenerate it with cuboid plan --trainer megatron-2021 ... --out FILE)");

  // The flags that would make it meet the same refusal, in their words.
  const cuboid::test::Fixture& f = seed();
  const ModelSpec model = load_model(cuboid::test::source_root() / f.model_card);
  const Cluster cluster = cuboid::test::four_dgx_a100();
  PlannerOptions o;
  o.trainer = "megatron-2021";
  o.tp = 4;
  o.pp = 4;
  o.dp = 2;
  o.global_batch = 64;
  o.seq_length = 8192;
  o.recompute = Recompute::full;
  o.zero_stage = 1;
  nlohmann::json valid = j;
  valid["parallel"]["zero_stage"] = 0;
  ParallelPlan file_plan = plan_file_from_json(valid, "plan.json").plan;
  file_plan.zero_stage = 1;
  try {
    (void)plan_from_options(model, cluster, o);
    FAIL("ZeRO 1 with megatron-2021 planned");
  } catch (const PlanRejected& e) {
    CHECK(e.rejection().kind == Rejection::Kind::plan);
    CHECK(e.rejection().plan == check_plan(file_plan, model, cluster));
    CHECK(e.problem() == describe(*check_plan(file_plan, model, cluster), model, cluster));
  }

  // torchtitan's ring has no a2a: a plan file with it is refused like --cp-comm-type a2a.
  nlohmann::json t = seed_json();
  t["parallel"]["trainer"]["preset"] = "torchtitan";
  t["parallel"]["grad_accum_fusion"] = false;
  t["parallel"]["zero_stage"] = 3;
  t["parallel"]["cp"] = 2;
  t["parallel"]["dp"] = 1;
  t["parallel"]["num_micro_batches"] = 64;
  t["parallel"]["cp_comm"] = "a2a";
  CHECK(read_error(t).rfind("plan.json: parallel.cp_comm: torchtitan exchanges K/V around the ring only", 0) == 0);
}
