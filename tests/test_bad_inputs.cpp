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
#include <sys/stat.h>

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

// A JSON array nested a million deep: nlohmann parses it without recursion,
// but any recursive walk of it (dump, a copy) would run out of stack.
std::string deep_array() { return std::string(1'000'000, '[') + std::string(1'000'000, ']'); }

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
         return Spec{"plan --model models/mixtral-8x7b.json --cluster " + kClusterCard + " --for deepspeed",
                     {"--for", "deepspeed", "no experts", "--to megatron"},
                     {}};
       }},
      {"plan --for a target that runs no plan as priced (torchtitan main's per-document FlexAttention)", [](const TempDir&) {
         return Spec{"plan --model models/llama3-70b.json --cluster " + kClusterCard + " --for torchtitan-main",
                     {"--for", "torchtitan-main", "FlexAttention", "--to torchtitan"},
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
      {"HF config with an array a million deep", [](const TempDir& d) {
         const std::string p = write(d, "config.json", with_raw(load("tests/data/hf/llama3-70b-config.json"), "/hidden_act", deep_array()));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "nested more than 64 levels deep"}, {}};
       }},
      {"cluster card with an array a million deep", [](const TempDir& d) {
         const std::string p = write(d, "cluster.json", with_raw(cluster_card(), "/name", deep_array()));
         return Spec{"plan --model " + kModelCard + " --cluster " + p, {p, "nested more than 64 levels deep"}, {}};
       }},
      {"plan file with an array a million deep", [](const TempDir& d) {
         return plan_case(d, "simulate --plan", "", with_raw(plan_file(), "/model/name", deep_array()), {"nested more than 64 levels deep"});
       }},
      {"measurements file with an array a million deep", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const std::string m = write(d, "m.json", with_raw(load("tests/fuzz/corpus/measurements/tiny-pp2.json"), "/schema", deep_array()));
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m, {m, "nested more than 64 levels deep"}, {}};
       }},
      {"model card is /dev/zero", [](const TempDir&) {
         return Spec{"plan --model /dev/zero --cluster " + kClusterCard, {"/dev/zero", "is a character device, not a regular file"}, {}};
       }},
      {"plan file whose cluster card is /dev/zero", [](const TempDir& d) {
         json p = plan_file();
         p["cluster"]["source_file"] = "/dev/zero";
         Spec s = plan_case(d, "simulate --plan", "", p.dump(2), {});
         s.expect = {"/dev/zero", "is a character device, not a regular file"};
         return s;
       }},
      {"model card is a FIFO", [](const TempDir& d) {
         const auto p = d / "model.json";
         REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
         return Spec{"plan --model " + p.string() + " --cluster " + kClusterCard, {p.string(), "is a FIFO", "not a regular file"}, {}};
       }},
      {"model card above the size limit", [](const TempDir& d) {
         const std::string p = write(d, "model.json", "");
         std::filesystem::resize_file(p, (std::uintmax_t{256} << 20) + 1);  // sparse: nothing is written to disk
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "larger than cuboid's limit of 256 MiB"}, {}};
       }},
      {"a 50 MB string value is quoted short", [](const TempDir& d) {
         return model_case(d, "/activation", std::string(50'000'000, 'x'), {"activation", "...\" (50000000 characters)"});
       }},
      {"a 1 MB unknown key is quoted short", [](const TempDir& d) {
         return model_case(d, "/" + std::string(1'000'000, 'k'), 1, {"... (1000000 characters)", "unknown field"});
       }},
      {"a value with a newline stays on one line", [](const TempDir& d) {
         return model_case(d, "/activation", "swi\nglu", {"activation", "unknown value \"swi\\nglu\""});
       }},
      {"plan file with \"tp\" twice", [](const TempDir& d) {
         std::string text = plan_file().dump(2);
         text.replace(text.find("\"tp\": 4"), 7, "\"tp\": 4, \"tp\": 8");
         return plan_case(d, "export --plan", "--to megatron", text, {"parallel.tp", "appears twice in one object"});
       }},
      {"model card with a key twice", [](const TempDir& d) {
         const std::string p = write(d, "model.json", "{\"name\": \"a\", \"num_layers\": 80, \"num_layers\": 8}");
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "num_layers", "appears twice"}, {}};
       }},
      {"cluster card with a key twice", [](const TempDir& d) {
         std::string text = cluster_card().dump(2);
         text.replace(text.find("\"nodes\": 4"), 10, "\"nodes\": 4, \"nodes\": 2");
         const std::string p = write(d, "cluster.json", text);
         return Spec{"plan --model " + kModelCard + " --cluster " + p, {p, "nodes", "appears twice"}, {}};
       }},
      {"measurements file with a key twice", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         std::string text = slurp("tests/fuzz/corpus/measurements/tiny-pp2.json");
         text.replace(text.find('{'), 1, "{\"schema\": \"cuboid.measurements/1\",");
         const std::string m = write(d, "m.json", text);
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m, {m, "schema", "appears twice"}, {}};
       }},

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
      {"FP8 GEMM efficiency above 1", [](const TempDir& d) { return cluster_case(d, "/gpu/gemm_max_efficiency_fp8", 1.1, {"gpu.gemm_max_efficiency_fp8", "at most 1"}); }},
      {"FP4 GEMM efficiency zero", [](const TempDir& d) { return cluster_case(d, "/gpu/gemm_max_efficiency_fp4", 0.0, {"gpu.gemm_max_efficiency_fp4"}); }},
      {"MXFP8 cast efficiency above 1", [](const TempDir& d) { return cluster_case(d, "/gpu/mxfp8_cast_efficiency", 2.0, {"gpu.mxfp8_cast_efficiency", "at most 1"}); }},
      {"MXFP8 GEMM rate above 1", [](const TempDir& d) { return cluster_case(d, "/gpu/mxfp8_gemm_rate", json{{"fprop", 0.9}, {"dgrad", 1.5}, {"wgrad", 0.9}, {"source", "x"}}, {"gpu.mxfp8_gemm_rate.dgrad", "fraction in (0, 1]"}); }},
      {"MXFP8 GEMM rate without a pass", [](const TempDir& d) { return cluster_case(d, "/gpu/mxfp8_gemm_rate", json{{"fprop", 0.9}, {"dgrad", 0.9}, {"source", "x"}}, {"gpu.mxfp8_gemm_rate.wgrad"}); }},
      {"MXFP8 GEMM rate without a source", [](const TempDir& d) { return cluster_case(d, "/gpu/mxfp8_gemm_rate", json{{"fprop", 0.9}, {"dgrad", 0.9}, {"wgrad", 0.9}}, {"gpu.mxfp8_gemm_rate.source"}); }},
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
      {"plan file cluster.nodes 2^32 + 2", [](const TempDir& d) {
         json p = plan_file();
         p["cluster"]["nodes"] = (std::int64_t{1} << 32) + 2;  // 2 as an int
         return plan_case(d, "simulate --plan", "", p.dump(2), {"cluster.nodes", "4294967298 is above the limit of 2147483647"});
       }},
      {"plan file cluster.gpus_per_node 2^32 + 8", [](const TempDir& d) {
         json p = plan_file();
         p["cluster"]["gpus_per_node"] = (std::int64_t{1} << 32) + 8;  // 8 as an int
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"cluster.gpus_per_node", "above the limit"});
       }},
      {"plan file cluster.nodes negative", [](const TempDir& d) {
         json p = plan_file();
         p["cluster"]["nodes"] = -4;
         return plan_case(d, "simulate --plan", "", p.dump(2), {"cluster.nodes", "must be positive, got -4"});
       }},
      {"plan file num_micro_batches 2^62", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["num_micro_batches"] = std::int64_t{1} << 62;
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"parallel.num_micro_batches", "above the limit"});
       }},
      {"plan file dp_grad_bytes 2^32 + 4", [](const TempDir& d) {
         json p = plan_file();
         p["parallel"]["trainer"]["dp_grad_bytes"] = (std::int64_t{1} << 32) + 4;  // 4 as an int
         return plan_case(d, "export --plan", "--to megatron", p.dump(2), {"parallel.trainer.dp_grad_bytes", "above the limit"});
       }},
      {"HF n_shared_experts 2^53", [](const TempDir& d) {
         json c = load("tests/data/hf/deepseek-v3-config.json");
         c["n_shared_experts"] = std::int64_t{1} << 53;  // times moe_intermediate_size 2^11 wraps to 0
         const std::string p = write(d, "config.json", c.dump(2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "n_shared_experts", "above the limit of 16777216"}, {}};
       }},
      {"HF num_experts is a string", [](const TempDir& d) {
         json c = load("tests/data/hf/qwen3-30b-a3b-config.json");
         c.erase("model_type");
         c["num_experts"] = "16";
         const std::string p = write(d, "config.json", c.dump(2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "num_experts", "expected a number, got a string"}, {}};
       }},
      {"HF num_hidden_layers 2^40", [](const TempDir& d) {
         json c = load("tests/data/hf/mixtral-8x7b-config.json");
         c["num_hidden_layers"] = std::int64_t{1} << 40;  // one flag per layer would be allocated
         const std::string p = write(d, "config.json", c.dump(2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "num_hidden_layers", "above the limit"}, {}};
       }},
      {"HF rope_scaling is a string", [](const TempDir& d) {
         json c = load("tests/data/hf/llama3-70b-config.json");
         c["rope_scaling"] = "llama3";
         const std::string p = write(d, "config.json", c.dump(2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "rope_scaling", "expected an object"}, {}};
       }},
      {"model card moe.num_experts fractional", [](const TempDir& d) {
         json m = load("models/mixtral-8x7b.json");
         m["moe"]["num_experts"] = 8.5;
         const std::string p = write(d, "model.json", m.dump(2));
         return Spec{"plan --model " + p + " --cluster " + kClusterCard, {p, "moe.num_experts", "expected an integer"}, {}};
       }},
      {"cluster nics_per_node 2^32 + 1", [](const TempDir& d) {
         return cluster_case(d, "/inter_node/nics_per_node", (std::int64_t{1} << 32) + 1, {"inter_node.nics_per_node", "above the limit"});
       }},
      {"calibration ranks 2^32 + 2", [](const TempDir& d) {
         json cal = load("tests/fuzz/corpus/calibration/full.json");
         cal["ranks"] = (std::int64_t{1} << 32) + 2;
         return cluster_case(d, "/calibration", cal, {"calibration.ranks", "above the limit"});
       }},
      {"measurements steps 2^32 + 3", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         json doc = load("tests/fuzz/corpus/measurements/tiny-pp2.json");
         doc["steps"] = (std::int64_t{1} << 32) + 3;  // 3 as an int
         const std::string m = write(d, "m.json", doc.dump());
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m,
                     {m, "steps", "4294967299 is above the limit"}, {}};
       }},
      {"measurements warmup negative", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         json doc = load("tests/fuzz/corpus/measurements/tiny-pp2.json");
         doc["warmup"] = -1;
         const std::string m = write(d, "m.json", doc.dump());
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m,
                     {m, "warmup", "must not be negative"}, {}};
       }},
      {"validate --tolerance nan", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const std::string m = write(d, "m.json", slurp("tests/fuzz/corpus/measurements/tiny-pp2.json"));
         return Spec{"validate --cluster " + kClusterCard + " --plan " + p + " --measurements " + m + " --tolerance nan",
                     {"command line", "--tolerance", "not a finite number"}, {}};
       }},
      {"--gpu-spread inf", [](const TempDir&) { return flag_case("plan", "--gpu-spread inf", {"--gpu-spread", "not a finite number"}); }},
      {"--moe-imbalance on a dense model", [](const TempDir&) {
         return flag_case("plan", "--moe-imbalance 1.2", {"--moe-imbalance", "has no experts"});
       }},
      {"--moe-imbalance below 1", [](const TempDir&) {
         return Spec{"plan --model models/mixtral-8x7b.json --cluster " + kClusterCard + " --moe-imbalance 0.5",
                     {"command line", "--moe-imbalance", "must be 1 to 1000, got 0.5"}, {}};
       }},
      {"--moe-imbalance nan", [](const TempDir&) {
         return Spec{"simulate --model models/mixtral-8x7b.json --cluster " + kClusterCard +
                         " --tp 8 --pp 4 --ep 8 --moe-imbalance nan",
                     {"command line", "--moe-imbalance", "not a finite number"}, {}};
       }},
      {"--gpu-spread -nan", [](const TempDir&) { return flag_case("simulate", "--tp 8 --pp 4 --gpu-spread -nan", {"--gpu-spread", "not a finite number"}); }},
#if CUBOID_TEST_HAS_RUN
      {"run --timeout-s nan", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"run --plan " + p + " --backend cpu --timeout-s nan", {"command line", "--timeout-s", "not a finite number"}, {}};
       }},
      {"run --timeout-s 1e300", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"run --plan " + p + " --backend cpu --timeout-s 1e300", {"command line", "--timeout-s", "above the limit"}, {}};
       }},
      {"run --dropout nan", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"run --plan " + p + " --backend cpu --dropout nan", {"command line", "--dropout", "not a finite number"}, {}};
       }},
      {"run --seq-length 0", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         const auto t = d / "m.json";
         return Spec{"run --plan " + p + " --backend cpu --seq-length 0 --out " + t.string(),
                     {"command line", "--seq-length", "0 is not a positive sequence length"}, t};
       }},
      {"run --layers 0", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"run --plan " + p + " --backend cpu --layers 0", {"command line", "--layers", "0 layers do not split"}, {}};
       }},
      {"calibrate --timeout-s nan", [](const TempDir& d) {
         const auto t = d / "calibrated.json";
         return Spec{"calibrate --backend cpu --cluster topologies/localhost-cpu.json --quick --out " + t.string() + " --timeout-s nan",
                     {"command line", "--timeout-s", "not a finite number"}, t};
       }},
      {"calibrate --max-size 2^63 - 1", [](const TempDir& d) {
         const auto t = d / "calibrated.json";
         return Spec{"calibrate --backend cpu --cluster topologies/localhost-cpu.json --out " + t.string() +
                         " --max-size 9223372036854775807",
                     {"command line", "--max-size", "above the limit"}, t};
       }},
      {"calibrate --timeout-s -inf", [](const TempDir& d) {
         const auto t = d / "calibrated.json";
         return Spec{"calibrate --backend cpu --cluster topologies/localhost-cpu.json --quick --out " + t.string() + " --timeout-s -inf",
                     {"command line", "--timeout-s", "not a finite number"}, t};
       }},
#endif

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
      {"--gpus-per-node 0", [](const TempDir&) { return flag_case("plan", "--gpus-per-node 0", {"--gpus-per-node", "must be positive"}); }},
      {"--gpus-per-node above the card's", [](const TempDir&) {
         return flag_case("plan", "--gpus-per-node 9", {"--gpus-per-node", "9 GPUs per node, but a node of", "has 8"});
       }},
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
      {"mesh --moe-imbalance (the mesh prices nothing)", [](const TempDir&) {
         return flag_case("mesh", "--tp 4 --pp 4 --moe-imbalance 1.2", {"--moe-imbalance", "would be ignored"});
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
      {"plan --out replaces a read-only file", [](const TempDir& d) {
         const std::string t = write(d, "plan.json", "keep");
         std::filesystem::permissions(t, std::filesystem::perms::owner_read | std::filesystem::perms::group_read);
         return Spec{"plan " + kLlama + " --out " + t, {"--out", "is read-only; cuboid does not replace it"}, {}};
       }},
      {"plan --out is the model card it reads", [](const TempDir& d) {
         const std::string m = write(d, "model.json", slurp(kModelCard));
         return Spec{"plan --model " + m + " --cluster " + kClusterCard + " --out " + m, {"--out", "is the input " + m}, {}};
       }},
      {"plan --out and --svg on one file", [](const TempDir& d) {
         const auto t = d / "plan.json";
         return Spec{"plan " + kLlama + " --out " + t.string() + " --svg " + (d / "." / "plan.json").string(),
                     {"--svg", "--out and --svg name the same file"}, t};
       }},
      {"plan --report in a read-only folder", [](const TempDir& d) {
         std::filesystem::create_directory(d / "ro");
         std::filesystem::permissions(d / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
         const auto t = d / "ro" / "r.html";
         return Spec{"plan " + kLlama + " --report " + t.string(), {"--report", "is not writable"}, t};
       }},
      {"plan --out /dev/null", [](const TempDir&) {
         return Spec{"plan " + kLlama + " --out /dev/null", {"--out", "/dev/null is a character device, not a regular file"}, {}};
       }},
      {"export --out is the plan it reads", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"export --plan " + p + " --to megatron --out " + p, {"--out", "is the input " + p}, {}};
       }},
      {"simulate --trace is the plan it reads", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"simulate --plan " + p + " --trace " + p, {"--trace", "is the input " + p}, {}};
       }},
      {"simulate --trace and --report on one file", [](const TempDir& d) {
         const auto t = d / "sim.html";
         return Spec{"simulate " + kLlama + " --tp 8 --pp 4 --trace " + t.string() + " --report " + t.string(),
                     {"--report", "--trace and --report name the same file"}, t};
       }},
      {"mesh --svg is the cluster card it reads", [](const TempDir& d) {
         const std::string c = write(d, "cluster.json", cluster_card().dump(2));
         return Spec{"mesh --model " + kModelCard + " --cluster " + c + " --tp 8 --pp 4 --svg " + c, {"--svg", "is the input " + c}, {}};
       }},
#if CUBOID_TEST_HAS_RUN
      {"run --out is the plan it runs", [](const TempDir& d) {
         const std::string p = write(d, "plan.json", plan_file().dump(2));
         return Spec{"run --plan " + p + " --backend cpu --out " + p, {"--out", "is the input " + p}, {}};
       }},
      {"calibrate --out is a folder", [](const TempDir& d) {
         return Spec{"calibrate --cluster topologies/localhost-cpu.json --model models/tiny.json --backend cpu --out " + d.path().string(),
                     {"--out", "is a folder, not a file"}, {}};
       }},
      {"calibrate --out is the cluster card it calibrates", [](const TempDir& d) {
         const std::string c = write(d, "cluster.json", slurp("topologies/localhost-cpu.json"));
         return Spec{"calibrate --cluster " + c + " --model models/tiny.json --backend cpu --out " + c, {"--out", "is the input " + c}, {}};
       }},
      {"calibrate --out and --raw on one file", [](const TempDir& d) {
         const auto t = d / "card.json";
         return Spec{"calibrate --cluster topologies/localhost-cpu.json --model models/tiny.json --backend cpu --out " + t.string() +
                         " --raw " + t.string(),
                     {"--raw", "--out and --raw name the same file"}, t};
       }},
#endif

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
    CHECK(r.err.size() < 1200);  // values are quoted short
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

// Every output flag of every command, against each kind of unsafe path: the
// command stops before working (nothing on stdout, nothing written) with one
// line naming the flag, and the existing file stays as it was.
TEST_CASE("every command refuses an unsafe output path before it works") {
  (void)plan_file();
  struct Output {
    std::string command;  // with {in}: the input file the case writes first
    std::string input;    // what {in} holds: "model", "plan" or "cluster"
    std::string flag;
  };
  std::vector<Output> outputs = {
      {"plan --model {in} --cluster " + kClusterCard, "model", "--out"},
      {"plan --model {in} --cluster " + kClusterCard, "model", "--svg"},
      {"plan --model {in} --cluster " + kClusterCard, "model", "--report"},
      {"simulate --model {in} --cluster " + kClusterCard + " --tp 8 --pp 4", "model", "--trace"},
      {"simulate --model {in} --cluster " + kClusterCard + " --tp 8 --pp 4", "model", "--report"},
      {"mesh --model {in} --cluster " + kClusterCard + " --tp 8 --pp 4", "model", "--svg"},
      {"export --plan {in} --to megatron", "plan", "--out"},
  };
#if CUBOID_TEST_HAS_RUN
  outputs.push_back({"run --plan {in} --backend cpu", "plan", "--out"});
  outputs.push_back({"calibrate --cluster {in} --model models/tiny.json --backend cpu", "cluster", "--out"});
  outputs.push_back({"calibrate --cluster {in} --model models/tiny.json --backend cpu --out {dir}/card.json", "cluster", "--raw"});
#endif
  struct Unsafe {
    const char* name;
    const char* expect;
    std::function<std::string(const TempDir&, const std::string& input)> make;  // the path to pass
  };
  const std::vector<Unsafe> unsafe = {
      {"a read-only file", "is read-only", [](const TempDir& d, const std::string&) {
         const std::string t = write(d, "ro.out", "keep");
         std::filesystem::permissions(t, std::filesystem::perms::owner_read);
         return t;
       }},
      {"the command's input", "is the input", [](const TempDir&, const std::string& input) { return input; }},
      {"a file in a read-only folder", "is not writable", [](const TempDir& d, const std::string&) {
         std::filesystem::create_directory(d / "ro");
         std::filesystem::permissions(d / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
         return (d / "ro" / "out").string();
       }},
      {"a folder", "is a folder", [](const TempDir& d, const std::string&) { return d.path().string(); }},
      {"a device", "not a regular file", [](const TempDir&, const std::string&) { return std::string("/dev/null"); }},
  };
  TempDir capture("bad_outputs_capture");
  for (const Output& o : outputs)
    for (const Unsafe& u : unsafe) {
      const std::string name = o.command + " " + o.flag + ": " + u.name;
      CAPTURE(name);
      TempDir dir("bad_output");
      std::string input;
      if (o.input == "model") input = write(dir, "model.json", slurp(kModelCard));
      if (o.input == "plan") input = write(dir, "plan.json", plan_file().dump(2));
      if (o.input == "cluster") input = write(dir, "cluster.json", slurp("topologies/localhost-cpu.json"));
      std::string args = o.command;
      args.replace(args.find("{in}"), 4, input);
      if (auto at = args.find("{dir}"); at != std::string::npos) args.replace(at, 5, dir.path().string());
      args += " " + o.flag + " " + u.make(dir, input);
      const auto before = dir.listing();
      CAPTURE(args);
      const CliResult r = run_cuboid(args, capture.path());
      CAPTURE(r.err);
      CHECK(r.code == 2);
      CHECK(count_lines(r.err) == 1);
      CHECK(r.err.find("command line: " + o.flag + ": ") != std::string::npos);
      CHECK(r.err.find(u.expect) != std::string::npos);
      CHECK(r.out.empty());
      CHECK(dir.listing() == before);
    }
}
