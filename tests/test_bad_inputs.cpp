// The bad-input catalogue: cuboid run on broken cards, flags, plan files and
// output paths. For every case: exit code 2, exactly one line on stderr that
// names the file or flag and the field and says how to fix it, nothing on
// stdout, nothing written anywhere (each case runs in its own empty folder,
// which must hold only its inputs afterwards), and no sanitizer report (the
// ASan/UBSan build runs this binary too).
//
// The broken cards are made here from the shipped ones (load, change one field,
// write to the case's folder), so each case says in one line what is wrong.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.hpp"

using cuboid::test::CliResult;
using cuboid::test::count_lines;
using cuboid::test::run_cuboid;
using cuboid::test::slurp;
using cuboid::test::TempDir;
using cuboid::test::write_text;
using nlohmann::json;

namespace {

const std::string kModelCard = "models/llama3-70b.json";
const std::string kClusterCard = "topologies/dgx-a100-4node.json";
const std::string kLlama = "--model " + kModelCard + " --cluster " + kClusterCard;

// What one case runs and what its one error line must contain.
struct Spec {
  std::string args;
  std::vector<std::string> expect;  // the file or flag, the field, and what is wrong
  std::filesystem::path target;     // an output path that must not exist afterwards (empty: none)
  bool report_on_stdout = false;    // the error comes after a report the user asked for
};

struct Case {
  const char* name;
  std::function<Spec(const TempDir&)> make;
};

json load(const std::string& path) { return json::parse(slurp(path)); }

// The shipped cluster card with its GPU profile inlined, so that the copy in
// a temp folder needs no relative path and gpu.* fields can be broken too.
json cluster_card() {
  json c = load(kClusterCard);
  c["gpu"] = load("topologies/" + c["gpu"].get<std::string>());
  return c;
}

// `raw` replaces the value at `pointer` by JSON text nlohmann cannot hold
// (1e400, NaN, a 20-digit integer).
std::string with_raw(json j, const std::string& pointer, const std::string& raw) {
  j[json::json_pointer(pointer)] = "@@RAW@@";
  std::string text = j.dump(2);
  const std::string mark = "\"@@RAW@@\"";
  text.replace(text.find(mark), mark.size(), raw);
  return text;
}

std::string write(const TempDir& d, const std::string& name, const std::string& text) {
  write_text(d / name, text);
  return (d / name).string();
}

// A model card with one field set (or erased when value is null).
Spec model_case(const TempDir& d, const std::string& pointer, const json& value, std::vector<std::string> expect) {
  json m = load(kModelCard);
  if (value.is_null())
    m.erase(pointer.substr(1));
  else
    m[json::json_pointer(pointer)] = value;
  const std::string path = write(d, "model.json", m.dump(2));
  expect.insert(expect.begin(), path);
  return {"plan --model " + path + " --cluster " + kClusterCard, expect, {}};
}

Spec model_raw_case(const TempDir& d, const std::string& pointer, const std::string& raw, std::vector<std::string> expect) {
  const std::string path = write(d, "model.json", with_raw(load(kModelCard), pointer, raw));
  expect.insert(expect.begin(), path);
  return {"plan --model " + path + " --cluster " + kClusterCard, expect, {}};
}

Spec cluster_case(const TempDir& d, const std::string& pointer, const json& value, std::vector<std::string> expect) {
  json c = cluster_card();
  c[json::json_pointer(pointer)] = value;
  const std::string path = write(d, "cluster.json", c.dump(2));
  expect.insert(expect.begin(), path);
  return {"plan --model " + kModelCard + " --cluster " + path, expect, {}};
}

Spec flag_case(const std::string& command, const std::string& args, std::vector<std::string> expect) {
  expect.insert(expect.begin(), "command line");
  return {command + " " + kLlama + " " + args, expect, {}};
}

// A valid plan file (TP 4 x PP 4 x DP 2 of Llama-3-70B on the 4-node card),
// made once by cuboid plan --out.
const json& plan_file() {
  static const json plan = [] {
    TempDir d("bad_inputs_plan");
    const auto path = d / "plan.json";
    CliResult r = run_cuboid("plan " + kLlama + " --tp 4 --pp 4 --cp 1 --global-batch 64 --simulate-top 0 --out " + path.string(),
                             d.path());
    REQUIRE_MESSAGE(r.code == 0, r.err);
    return json::parse(slurp(path));
  }();
  return plan;
}

Spec plan_case(const TempDir& d, const std::string& command_before, const std::string& command_after, const std::string& text,
               std::vector<std::string> expect) {
  const std::string path = write(d, "plan.json", text);
  expect.insert(expect.begin(), path);
  return {command_before + " " + path + " " + command_after, expect, {}};
}

// The plan file as `preset` runs it: every setting the base plan has that
// the preset cannot run turned off (SP, fused attention and accumulation,
// selective recomputation, ZeRO 1, the interleaved schedule), so that a case
// breaks only its own rule.
json as_trainer(json p, const std::string& preset) {
  p["parallel"]["trainer"]["preset"] = preset;
  p["parallel"]["schedule"] = "1f1b";
  p["parallel"]["virtual_stages"] = 1;
  for (const char* off : {"sequence_parallel", "flash_attention", "grad_accum_fusion"}) p["parallel"][off] = false;
  p["parallel"]["recompute"] = "full";
  p["parallel"]["zero_stage"] = 0;
  return p;
}

// The plan file with CP `cp` in place of as much DP (its rank mapping left
// as is: the plan checks come first).
json with_cp(json p, int cp, const std::string& comm) {
  json& par = p["parallel"];
  par["cp"] = cp;
  par["dp"] = par["dp"].get<int>() / cp;
  par["cp_comm"] = comm;
  par["num_micro_batches"] = par["global_batch"].get<int>() / (par["micro_batch"].get<int>() * par["dp"].get<int>());
  return p;
}

std::vector<Case> catalogue() {
  const std::string llama_text = slurp(kModelCard);
  return {
      // --- model cards: files, JSON syntax, types
      {"model file not found", [](const TempDir& d) {
         return Spec{"plan --model " + (d / "missing.json").string() + " --cluster " + kClusterCard,
                     {(d / "missing.json").string(), "file not found"}, {}};
       }},
      {"model path is a folder", [](const TempDir& d) {
         return Spec{"plan --model " + d.path().string() + " --cluster " + kClusterCard, {d.path().string(), "is a directory"}, {}};
       }},
      {"model card truncated", [llama_text](const TempDir& d) {
         const std::string p = write(d, "model.json", llama_text.substr(0, llama_text.size() / 2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "malformed JSON"}, {}};
       }},
      {"model card empty", [](const TempDir& d) {
         const std::string p = write(d, "model.json", "");
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "file is empty"}, {}};
       }},
      {"model card is an array", [](const TempDir& d) {
         const std::string p = write(d, "model.json", "[80, 8192]");
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "expected a JSON object"}, {}};
       }},
      {"hidden_size is a string", [](const TempDir& d) { return model_case(d, "/hidden_size", "8192", {"hidden_size", "expected an integer"}); }},
      {"num_layers is fractional", [](const TempDir& d) { return model_case(d, "/num_layers", 80.5, {"num_layers", "expected an integer"}); }},
      {"tied_embeddings is a string", [](const TempDir& d) { return model_case(d, "/tied_embeddings", "yes", {"tied_embeddings", "expected true or false"}); }},
      {"num_layers zero", [](const TempDir& d) { return model_case(d, "/num_layers", 0, {"num_layers", "must be positive"}); }},
      {"hidden_size negative", [](const TempDir& d) { return model_case(d, "/hidden_size", -8192, {"hidden_size", "must be positive"}); }},
      // nlohmann cannot say which field held it: the file and the number are named.
      {"vocab_size 1e400", [](const TempDir& d) { return model_raw_case(d, "/vocab_size", "1e400", {"number overflow parsing '1e400'"}); }},
      {"hidden_size NaN", [](const TempDir& d) { return model_raw_case(d, "/hidden_size", "NaN", {"malformed JSON"}); }},
      {"num_layers 20 digits", [](const TempDir& d) { return model_raw_case(d, "/num_layers", "99999999999999999999", {"num_layers"}); }},
      {"hidden_size 2^40", [](const TempDir& d) { return model_case(d, "/hidden_size", std::int64_t{1} << 40, {"hidden_size", "limit"}); }},
      {"a 10^16-parameter model", [](const TempDir& d) { return model_case(d, "/num_layers", 16000000, {"num_layers", "T parameters"}); }},
      {"heads do not split hidden", [](const TempDir& d) { return model_case(d, "/num_attention_heads", 48, {"hidden_size", "not divisible by the 48"}); }},
      {"kv heads do not divide heads", [](const TempDir& d) { return model_case(d, "/num_kv_heads", 3, {"num_kv_heads", "do not divide"}); }},
      {"activation bogus", [](const TempDir& d) { return model_case(d, "/activation", "bogus", {"activation", "unknown value \"bogus\""}); }},
      {"normalization bogus", [](const TempDir& d) { return model_case(d, "/normalization", "bogus", {"normalization", "unknown value"}); }},
      {"unknown field", [](const TempDir& d) { return model_case(d, "/dropout", 0.1, {"dropout", "unknown field"}); }},
      {"seq_length above max positions", [](const TempDir& d) {
         json m = load(kModelCard);
         m["max_position_embeddings"] = 8192;
         m["seq_length"] = 16384;
         const std::string p = write(d, "model.json", m.dump());
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "seq_length", "exceeds max_position_embeddings"}, {}};
       }},
      {"vocab_size missing", [](const TempDir& d) { return model_case(d, "/vocab_size", nullptr, {"vocab_size", "missing required field"}); }},
      {"name empty", [](const TempDir& d) { return model_case(d, "/name", "", {"name", "is empty"}); }},
      {"plan --for a target whose export has no experts", [](const TempDir&) {
         return Spec{"plan --model models/mixtral-8x7b.json --cluster " + kClusterCard + " --for torchtitan-main",
                     {"--for", "torchtitan", "no experts", "--to megatron"},
                     {}};
       }},
      {"plan --for a target without a flavour of the MoE model's shape", [](const TempDir&) {
         return Spec{"plan --model models/mixtral-8x7b.json --cluster " + kClusterCard + " --for torchtitan",
                     {"--for", "qwen3 MoE flavours", "mixtral-8x7b", "--to megatron"},
                     {}};
       }},
      {"--ep on a dense model", [](const TempDir&) {
         return Spec{"simulate --model models/llama3-70b.json --cluster " + kClusterCard + " --tp 4 --pp 4 --ep 2",
                     {"--ep", "has no experts"},
                     {}};
       }},
      {"--ep that does not divide the experts", [](const TempDir&) {
         return Spec{"simulate --model models/mixtral-8x7b.json --cluster " + kClusterCard +
                         " --tp 2 --pp 2 --sequence-parallel on --ep 3",
                     {"--ep", "EP 3 does not divide the 8 experts"},
                     {}};
       }},

      // --- round 2: bounded inputs (nesting depth, size, regular files only, long values quoted short, duplicate keys)

      // --- cluster cards
      {"cluster file not found", [](const TempDir& d) {
         return Spec{"plan --model " + kModelCard + " --cluster " + (d / "none.json").string(), {(d / "none.json").string(), "file not found"}, {}};
       }},
      {"cluster card truncated", [](const TempDir& d) {
         const std::string text = cluster_card().dump(2);
         const std::string p = write(d, "cluster.json", text.substr(0, text.size() - 40));
         return Spec{"plan --model " + kModelCard + " --cluster " + p, {p, "malformed JSON"}, {}};
       }},
      {"gpus_per_node zero", [](const TempDir& d) { return cluster_case(d, "/gpus_per_node", 0, {"gpus_per_node", "must be positive"}); }},
      {"nodes negative", [](const TempDir& d) { return cluster_case(d, "/nodes", -1, {"nodes", "must be positive"}); }},
      {"zero NIC bandwidth", [](const TempDir& d) { return cluster_case(d, "/inter_node/nic_bandwidth_Gbps", 0, {"inter_node.nic_bandwidth_Gbps", "must be positive"}); }},
      {"zero NVLink bandwidth", [](const TempDir& d) { return cluster_case(d, "/intra_node/link_bandwidth_GBps", json{{"value", 0}, {"source", "x"}}, {"intra_node.link_bandwidth_GBps.value", "must be positive"}); }},
      {"zero busbw", [](const TempDir& d) { return cluster_case(d, "/intra_node/busbw_GBps", 0, {"intra_node.busbw_GBps", "must be positive"}); }},
      {"negative all-reduce busbw", [](const TempDir& d) { return cluster_case(d, "/intra_node/allreduce_busbw_GBps", -5, {"intra_node.allreduce_busbw_GBps", "must be positive"}); }},
      {"zero NIC busbw", [](const TempDir& d) { return cluster_case(d, "/inter_node/nic_busbw_GBps", 0.0, {"inter_node.nic_busbw_GBps", "must be positive"}); }},
      {"NIC busbw is a string", [](const TempDir& d) { return cluster_case(d, "/inter_node/nic_busbw_GBps", "fast", {"inter_node.nic_busbw_GBps", "expected a number"}); }},
      {"GEMM efficiency above 1", [](const TempDir& d) { return cluster_case(d, "/gpu/gemm_max_efficiency", 1.5, {"gpu.gemm_max_efficiency", "at most 1"}); }},
      {"sustained GEMM fraction above 1", [](const TempDir& d) { return cluster_case(d, "/gpu/gemm_sustained_fraction", 1.2, {"gpu.gemm_sustained_fraction", "at most 1"}); }},
      {"sustained GEMM fraction zero", [](const TempDir& d) { return cluster_case(d, "/gpu/gemm_sustained_fraction", 0.0, {"gpu.gemm_sustained_fraction"}); }},
      {"memory reserve above capacity", [](const TempDir& d) { return cluster_case(d, "/gpu/memory_reserve_GiB", 100, {"gpu.memory_reserve_GiB", "not smaller"}); }},
      {"inter_node kind bogus", [](const TempDir& d) { return cluster_case(d, "/inter_node/kind", "bogus", {"inter_node.kind", "unknown value \"bogus\""}); }},
      {"intra_node kind bogus", [](const TempDir& d) { return cluster_case(d, "/intra_node/kind", "bogus", {"intra_node.kind", "unknown value"}); }},
      {"fat tree of 4 levels", [](const TempDir& d) { return cluster_case(d, "/inter_node/levels", 4, {"inter_node.levels", "must be 1, 2 or 3"}); }},
      {"disconnected: 4 nodes, no network", [](const TempDir& d) { return cluster_case(d, "/inter_node", json{{"kind", "none"}}, {"nodes", "no inter-node network"}); }},
      {"no NICs on a network", [](const TempDir& d) { return cluster_case(d, "/inter_node/nics_per_node", 0, {"inter_node.nics_per_node", "at least 1"}); }},
      {"GPU profile file missing", [](const TempDir& d) { return cluster_case(d, "/gpu", "gpus/none.json", {"gpu", "not found"}); }},
      {"nodes above max_nodes", [](const TempDir& d) { return cluster_case(d, "/nodes", 200, {"nodes", "exceeds max_nodes 140"}); }},
      {"oversubscription below 1", [](const TempDir& d) { return cluster_case(d, "/inter_node/oversubscription", 0.5, {"inter_node.oversubscription", "at least 1"}); }},
      {"a million GPUs per node", [](const TempDir& d) { return cluster_case(d, "/gpus_per_node", 1000000, {"nodes", "limit of 262144"}); }},

      // --- round 2: numbers that fit (counts range-checked into their type, strings for numbers, NaN and infinities)

      // --- flags
      {"--tp does not divide heads", [](const TempDir&) { return flag_case("plan", "--tp 3", {"--tp", "does not divide the 64 attention heads"}); }},
      {"--pp does not divide layers", [](const TempDir&) { return flag_case("plan", "--pp 3", {"--pp", "does not divide the 80 layers"}); }},
      {"--pp x --vpp does not divide layers", [](const TempDir&) {
         return flag_case("simulate", "--tp 4 --pp 4 --vpp 3 --schedule interleaved", {"--vpp", "does not divide the 80 layers"});
       }},
      {"--pp does not divide the GPUs", [](const TempDir&) { return flag_case("plan", "--pp 5", {"--pp", "does not divide the 32 GPUs"}); }},
      {"--dp does not divide the GPUs", [](const TempDir&) { return flag_case("plan", "--dp 3", {"--dp", "does not divide the 32 GPUs"}); }},
      {"more GPUs than the cluster has", [](const TempDir&) { return flag_case("simulate", "--tp 8 --pp 4 --dp 2", {"--tp/--pp/--dp", "64 GPUs"}); }},
      {"global batch does not divide", [](const TempDir&) { return flag_case("simulate", "--tp 4 --pp 4 --global-batch 63", {"--global-batch", "not divisible"}); }},
      {"--global-batch 20 digits", [](const TempDir&) { return flag_case("plan", "--global-batch 99999999999999999999", {"--global-batch", "limit"}); }},
      {"--global-batch negative", [](const TempDir&) { return flag_case("plan", "--global-batch -4", {"--global-batch", "must be positive"}); }},
      {"--seq-length above the model's", [](const TempDir&) { return flag_case("plan", "--seq-length 100000", {"--seq-length", "max_position_embeddings"}); }},
      {"--recompute bogus", [](const TempDir&) { return flag_case("plan", "--recompute bogus", {"--recompute", "unknown recompute mode \"bogus\""}); }},
      {"--schedule bogus", [](const TempDir&) { return flag_case("plan", "--schedule bogus", {"--schedule", "unknown pipeline schedule"}); }},
      {"--flash-attention bogus", [](const TempDir&) { return flag_case("plan", "--flash-attention bogus", {"--flash-attention", "expected on or off"}); }},
      {"--rank-order repeats a dimension", [](const TempDir&) { return flag_case("plan", "--rank-order tp-tp-pp", {"--rank-order", "once each"}); }},
      {"--zero 4", [](const TempDir&) { return flag_case("plan", "--zero 4", {"--zero", "must be 0, 1, 2 or 3"}); }},
      {"--tp 0", [](const TempDir&) { return flag_case("plan", "--tp 0", {"--tp", "must be positive"}); }},
      {"--tp abc", [](const TempDir&) { return flag_case("plan", "--tp abc", {"--tp"}); }},
      {"--micro-batch NaN", [](const TempDir&) { return flag_case("plan", "--micro-batch nan", {"--micro-batch"}); }},
      {"--top 0", [](const TempDir&) { return flag_case("plan", "--top 0", {"--top", "must be positive"}); }},
      {"--threads -1", [](const TempDir&) { return flag_case("plan", "--threads -1", {"--threads", "must not be negative"}); }},
      {"--simulate-top -1", [](const TempDir&) { return flag_case("plan", "--simulate-top -1", {"--simulate-top", "must not be negative"}); }},
      {"--nodes 0", [](const TempDir&) { return flag_case("plan", "--nodes 0", {"--nodes", "must be positive"}); }},
      {"--nodes above max_nodes", [](const TempDir&) { return flag_case("plan", "--nodes 1000", {"--nodes", "exceed max_nodes 140"}); }},
      {"--trace-ranks not numbers", [](const TempDir& d) {
         return flag_case("simulate", "--trace " + (d / "t.json").string() + " --trace-ranks 0,x", {"--trace-ranks"});
       }},
      {"export --to bogus", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"export --plan " + p + " --to bogus", {"--to", "unknown export target \"bogus\""}, {}};
       }},
      {"plan --for bogus", [](const TempDir&) { return flag_case("plan", "--for bogus", {"--for", "unknown export target"}); }},
      {"export of a plan the target cannot run", [](const TempDir& d) {
         return plan_case(d, "export --plan", "--to deepspeed", plan_file().dump(2),
                          {"parallel.tp", "deepspeed runs no plan with TP 4 x PP 4 x DP 2"});
       }},

      // --- round 2: one validation path (a plan file passes the checks of the flags that would make it; flags without effect)
      {"plan file: megatron-2021 with ZeRO 1", [](const TempDir& d) {
         json p = as_trainer(plan_file(), "megatron-2021");
         p["parallel"]["zero_stage"] = 1;
         return plan_case(d, "simulate --plan", "", p.dump(2),
                          {"parallel.zero_stage", "megatron-2021 cannot run ZeRO stage 1", "use zero_stage 0"});
       }},
      {"plan file: torchtitan with the a2a CP exchange", [](const TempDir& d) {
         json p = with_cp(as_trainer(plan_file(), "torchtitan"), 2, "a2a");
         p["parallel"]["zero_stage"] = 3;
         return plan_case(d, "mesh --plan", "", p.dump(2),
                          {"parallel.cp_comm", "torchtitan exchanges K/V around the ring only", "parallel.trainer.preset"});
       }},
      {"plan file: ZeRO 3 with megatron-deepspeed (ZeRO 0 and 1)", [](const TempDir& d) {
         json p = as_trainer(plan_file(), "megatron-deepspeed");
         p["parallel"]["zero_stage"] = 3;
         return plan_case(d, "export --plan", "--to deepspeed", p.dump(2),
                          {"parallel.zero_stage", "megatron-deepspeed cannot run ZeRO stage 3", "use zero_stage 0 or 1"});
       }},
      {"plan file: the interleaved schedule with megatron-deepspeed", [](const TempDir& d) {
         json p = as_trainer(plan_file(), "megatron-deepspeed");
         p["parallel"]["schedule"] = "interleaved";
         p["parallel"]["virtual_stages"] = 2;
         const std::string m = write(d, "m.json", slurp("tests/fuzz/corpus/measurements/tiny-pp2.json"));
         return plan_case(d, "validate --cluster " + kClusterCard + " --measurements " + m + " --plan", "", p.dump(2),
                          {"parallel.schedule", "megatron-deepspeed has no interleaved schedule"});
       }},
      {"plan file: uneven stages with megatron-2022", [](const TempDir& d) {
         json p = as_trainer(plan_file(), "megatron-2022");
         p["parallel"]["first_stage_layers"] = 18;
         p["parallel"]["last_stage_layers"] = 18;
         return plan_case(d, "run --backend cpu --plan", "", p.dump(2),
                          {"parallel", "megatron-2022 gives every pipeline stage the same number of layers"});
       }},
      {"plan file: fused attention with megatron-2021", [](const TempDir& d) {
         json p = as_trainer(plan_file(), "megatron-2021");
         p["parallel"]["flash_attention"] = true;
         return plan_case(d, "calibrate --backend cpu --cluster " + kClusterCard + " --out " + (d / "c.json").string() +
                                 " --plan", "", p.dump(2),
                          {"parallel.flash_attention", "megatron-2021 runs the unfused attention core"});
       }},
      {"plan file: EP on a dense model", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["ep"] = 2;
         p["parallel"]["etp"] = 4;
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"parallel.ep", "llama3-70b has no experts"});
       }},
      {"plan file: an ETP on a dense model", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["etp"] = 4;
         return plan_case(d, "simulate --plan", "", p.dump(2), {"parallel.etp", "llama3-70b has no experts"});
       }},
      {"plan file: the a2a exchange without CP", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["cp_comm"] = "a2a";
         return plan_case(d, "simulate --plan", "", p.dump(2), {"parallel.cp_comm", "has no effect", "drop cp_comm"});
       }},
      {"plan file: an unknown preset is refused before its limits", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["trainer"]["preset"] = "megatron-1999";
         return plan_case(d, "simulate --plan", "", p.dump(2), {"parallel.trainer.preset", "unknown trainer"});
       }},
      {"simulate --cp-comm-type a2a without CP", [](const TempDir&) {
         return flag_case("simulate", "--tp 4 --pp 4 --cp-comm-type a2a", {"--cp-comm-type", "has no effect", "use --cp 2"});
       }},
      {"mesh --etp on a dense model", [](const TempDir&) {
         return flag_case("mesh", "--tp 4 --pp 4 --etp 4", {"--etp", "llama3-70b has no experts"});
       }},
      {"plan --cp 1 --cp-comm-type a2a", [](const TempDir&) {
         return flag_case("plan", "--cp 1 --cp-comm-type a2a", {"--cp-comm-type", "has no effect"});
       }},
      {"plan --cp-comm-type with a trainer without CP", [](const TempDir&) {
         return flag_case("plan", "--trainer megatron-2021 --cp-comm-type p2p",
                          {"--cp-comm-type", "megatron-2021 has no context parallelism"});
       }},
      {"plan --for torchtitan-main --cp 2", [](const TempDir&) {
         return flag_case("plan", "--for torchtitan-main --cp 2",
                          {"--cp", "--for torchtitan-main cannot express --cp 2", "drop --cp 2"});
       }},
      {"plan --for torchtitan --rank-order tp-pp-dp", [](const TempDir&) {
         return flag_case("plan", "--for torchtitan --rank-order tp-pp-dp",
                          {"--rank-order", "--for torchtitan cannot express --rank-order tp-pp-dp"});
       }},
      {"plan --for torchtitan --cp 2 --cp-comm-type a2a", [](const TempDir&) {
         return flag_case("plan", "--for torchtitan --cp 2 --cp-comm-type a2a",
                          {"--cp-comm-type", "torchtitan exchanges K/V around the ring only"});
       }},
      {"mesh --json (the mesh is a table)", [](const TempDir&) {
         return flag_case("mesh", "--tp 4 --pp 4 --json", {"--json", "would be ignored", "simulate --json"});
       }},
      {"mesh --gpu-spread (the mesh prices nothing)", [](const TempDir&) {
         return flag_case("mesh", "--tp 4 --pp 4 --gpu-spread 0", {"--gpu-spread", "would be ignored"});
       }},
      {"plan --explain --json (the JSON has no explain rows)", [](const TempDir&) {
         return flag_case("plan", "--explain --json", {"--explain", "would be ignored", "--report"});
       }},
      {"export --as-planned --cluster (no re-plan to put on it)", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"export --plan " + p + " --to megatron --as-planned --cluster " + kClusterCard,
                     {"command line", "--cluster", "would be ignored", "drop --cluster"}, {}};
       }},
      {"plan --for megatron --trainer megatron-2021 --zero 1", [](const TempDir&) {
         return flag_case("plan", "--for megatron --trainer megatron-2021 --zero 1",
                          {"--zero", "megatron-2021 cannot run ZeRO stage 1", "use --zero 0"});
       }},

      // --- plan files
      {"plan file not found", [](const TempDir& d) {
         return Spec{"simulate --plan " + (d / "none.json").string(), {(d / "none.json").string(), "file not found"}, {}};
       }},
      {"plan file truncated", [](const TempDir& d) {
         const std::string text = plan_file().dump(2);
         return plan_case(d, "export --plan", "--to megatron", text.substr(0, text.size() / 3), {"malformed JSON"});
       }},
      {"plan file of another schema version", [](const TempDir& d) {
         json p = plan_file();
         p["schema"] = "cuboid.plan/2";
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"schema", "cuboid.plan/2"});
       }},
      {"plan file for another cluster", [](const TempDir& d) {
         Spec s = plan_case(d, "simulate --plan", "--cluster topologies/dgx-h100.json", plan_file().dump(2), {});
         s.expect = {"topologies/dgx-h100.json", "gpu", "was made for"};
         return s;
       }},
      {"plan file names a missing cluster card", [](const TempDir& d) {
         json p = plan_file();
         p["cluster"]["source_file"] = (d / "gone.json").string();
         return plan_case(d, "simulate --plan", "", p.dump(2), {"cluster.source_file", "not found"});
       }},
      {"plan file with an edited TP", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["tp"] = 3;
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"world_size"});
       }},
      {"plan file with an overflowing world size", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["tp"] = 1000000;
         p["parallel"]["pp"] = 1000000;
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"world_size", "limit"});
       }},
      {"plan file without its parallel section", [](const TempDir& d) {
         json p = plan_file();
         p.erase("parallel");
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"parallel", "missing"});
       }},

      // --- measurements files (cuboid validate)
      {"measurements file not found", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + (d / "none.json").string(),
                     {(d / "none.json").string(), "file not found"}, {}};
       }},
      {"measurements file truncated", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const std::string text = slurp("tests/fuzz/corpus/measurements/tiny-pp2.json");
         const std::string m = write(d, "m.json", text.substr(0, text.size() / 2));
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m, {m, "malformed JSON"}, {}};
       }},
      {"measurements of another schema version", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         json doc = load("tests/fuzz/corpus/measurements/tiny-pp2.json");
         doc["schema"] = "cuboid.measurements/9";
         const std::string m = write(d, "m.json", doc.dump());
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m, {m, "schema"}, {}};
       }},
      {"measurements from another plan", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const std::string m = write(d, "m.json", slurp("tests/fuzz/corpus/measurements/tiny-pp2.json"));
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m, {m}, {}};
       }},

      // --- round 2: safe outputs (read-only files, an input as output, two outputs on one file, unwritable folders)

      // --- output paths: nothing may be written, not even a temporary file
      {"plan --out in a missing folder", [](const TempDir& d) {
         const auto t = d / "missing" / "plan.json";
         return Spec{"plan " + kLlama + " --out " + t.string(), {"--out", "does not exist"}, t};
       }},
      {"plan --out is a folder", [](const TempDir& d) {
         return Spec{"plan " + kLlama + " --simulate-top 0 --out " + d.path().string(), {"--out", "is a folder"}, {}};
       }},
      {"plan --out under a file", [](const TempDir& d) {
         write_text(d / "file.txt", "x");
         const auto t = d / "file.txt" / "plan.json";
         return Spec{"plan " + kLlama + " --out " + t.string(), {"--out", "does not exist"}, t};
       }},
      {"plan --svg in a missing folder", [](const TempDir& d) {
         const auto t = d / "missing" / "pareto.svg";
         return Spec{"plan " + kLlama + " --svg " + t.string(), {"--svg", "does not exist"}, t};
       }},
      {"plan --report in a missing folder", [](const TempDir& d) {
         const auto t = d / "missing" / "plan.html";
         return Spec{"plan " + kLlama + " --report " + t.string(), {"--report", "does not exist"}, t};
       }},
      {"plan --report when nothing fits", [](const TempDir& d) {
         const auto t = d / "none.html";
         return Spec{"plan --model models/llama3.1-405b.json --cluster topologies/dgx-a100.json --simulate-top 0 --report " +
                         t.string(),
                     {"--report", "no plan fits"}, t, true};
       }},
      {"simulate --report is a folder", [](const TempDir& d) {
         return Spec{"simulate " + kLlama + " --tp 8 --pp 4 --report " + d.path().string(), {"--report", "is a folder"}, {}};
       }},
      {"simulate --analytical --report", [](const TempDir& d) {
         const auto t = d / "sim.html";
         return Spec{"simulate " + kLlama + " --tp 8 --pp 4 --analytical --report " + t.string(),
                     {"--analytical", "--report needs the simulator"}, t};
       }},
      {"plan --out when nothing fits", [](const TempDir& d) {
         const auto t = d / "none.json";
         return Spec{"plan --model models/llama3.1-405b.json --cluster topologies/dgx-a100.json --simulate-top 0 --out " + t.string(),
                     {"--out", "no plan fits"}, t, true};
       }},
      {"export --out in a missing folder", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const auto t = d / "missing" / "megatron.sh";
         return Spec{"export --plan " + p + " --to megatron --out " + t.string(), {"--out", "does not exist"}, t};
       }},
      {"simulate --trace in a missing folder", [](const TempDir& d) {
         const auto t = d / "missing" / "trace.json";
         return Spec{"simulate " + kLlama + " --tp 8 --pp 4 --trace " + t.string(), {"--trace", "does not exist"}, t};
       }},
      {"simulate --trace is a folder", [](const TempDir& d) {
         return Spec{"simulate " + kLlama + " --tp 8 --pp 4 --trace " + d.path().string(), {"--trace", "is a folder"}, {}};
       }},
      {"mesh --svg in a missing folder", [](const TempDir& d) {
         const auto t = d / "missing" / "mesh.svg";
         return Spec{"mesh " + kLlama + " --tp 8 --pp 4 --svg " + t.string(), {"--svg", "does not exist"}, t};
       }},
  };
}

}  // namespace

TEST_CASE("bad-input catalogue: exit 2, one line naming the file or flag, the field and a fix; nothing written") {
  (void)plan_file();  // made before the per-case folders are watched
  const std::vector<Case> cases = catalogue();
  CHECK(cases.size() >= 40);
  TempDir capture("bad_inputs_capture");
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    TempDir dir("bad_input");
    const Spec spec = c.make(dir);
    const auto before = dir.listing();
    CAPTURE(spec.args);
    const CliResult r = run_cuboid(spec.args, capture.path());
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(!r.err.empty());
    CHECK(r.err.back() == '\n');
    CHECK(r.err.rfind("cuboid: ", 0) == 0);
    CHECK(r.err.find("(fix: ") != std::string::npos);
    for (const std::string& e : spec.expect) CHECK_MESSAGE(r.err.find(e) != std::string::npos, "expected \"" << e << "\"");
    CHECK(r.err.find("runtime error") == std::string::npos);
    CHECK(r.err.find("Sanitizer") == std::string::npos);
    if (!spec.report_on_stdout) CHECK_MESSAGE(r.out.empty(), r.out.substr(0, 300));
    CHECK(dir.listing() == before);  // no output file, no temporary left behind
    if (!spec.target.empty()) CHECK_FALSE(std::filesystem::exists(spec.target));
  }
}
