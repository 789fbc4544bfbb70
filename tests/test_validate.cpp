// cuboid validate: the measurements reader, the checks that measurements
// belong to the plan and the cluster card, and the report's numbers, on
// hand-made measurements with known times.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/cost/estimator.hpp"
#include "cuboid/io/measurements.hpp"
#include "cuboid/core/model.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid/report/validate.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {
namespace {

const std::string kRoot = CUBOID_SOURCE_ROOT_DIR;
constexpr double kOpS = 0.001;  // every hand-made op takes 1 ms per step

Cluster cpu_card() { return load_cluster(kRoot + "/topologies/localhost-cpu.json"); }

// A plan file of the tiny model on the 2-rank CPU card, as `cuboid plan --out` writes it.
PlanFile make_plan(int tp, int pp, int dp, int zero = 0, bool flash = false) {
  const ModelSpec model = load_model(kRoot + "/models/tiny.json");
  const Cluster cluster = cpu_card();
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = 4 * dp;
  p.seq_length = 128;
  p.zero_stage = zero;
  p.recompute = Recompute::none;
  p.sequence_parallel = tp > 1;
  p.schedule = Schedule::one_f_one_b;
  p.flash_attention = flash;
  const Topology topo(cluster);
  return plan_file_from_json(plan_to_json(model, cluster, estimate(model, topo, p)), "plan.json");
}

nlohmann::json time_stats(double s) { return {{"median_s", s}, {"min_s", s}, {"max_s", s}}; }

nlohmann::json op_json(const std::string& name, const std::string& kind, const std::string& pass) {
  nlohmann::json j = {{"name", name}, {"kind", kind}, {"pass", pass}, {"calls_per_step", 1},
                      {"time_per_step", time_stats(kOpS)}, {"step_seconds", {kOpS}}};
  if (kind == "gemm") j["shape"] = {{"m", 8}, {"n", 8}, {"k", 8}, {"batch", 1}};
  if (kind == "memory_bound") j["bytes_per_call"] = 1024.0;
  return j;
}

nlohmann::json comm_json(const std::string& name, const std::string& kind, const std::string& collective,
                         const std::string& group, int size) {
  nlohmann::json j = op_json(name, kind, "backward");
  j["collective"] = collective;
  j["group"] = group;
  j["group_size"] = size;
  j["bytes_per_call"] = 4096.0;
  return j;
}

// What the executor would time on a rank of this plan: the workload's ops of
// its stage (less the simulator-only ones), PP / DP / optimizer tasks (the
// step's kernels the executor runs: grad_scale, adam, param_copy, grad_zero),
// and one executor-only op (dqkv_zero). Every op 1 ms.
nlohmann::json rank_ops(const PlanFile& pf, int stage) {
  std::set<std::string> seen;
  nlohmann::json ops = nlohmann::json::array();
  auto add_layer_ops = [&](const LayerOps& l) {
    for (const auto* list : {&l.forward, &l.backward, &l.recompute})
      for (const Op& op : *list) {
        if (!seen.insert(op.name).second) continue;
        if (std::any_of(simulator_only_ops().begin(), simulator_only_ops().end(),
                        [&](const NamedReason& r) { return r.name == op.name; }))
          continue;
        const std::string pass = op.pass == Pass::forward ? "forward" : "backward";
        if (op.kind == OpKind::collective)
          ops.push_back(comm_json(op.name, "collective", std::string(to_string(op.collective)), "tp", pf.plan.tp));
        else
          ops.push_back(op_json(op.name, std::string(to_string(op.kind)), pass));
      }
  };
  add_layer_ops(transformer_layer_ops(pf.model, pf.plan));
  if (stage == 0) add_layer_ops(embedding_ops(pf.model, pf.plan));
  if (stage == pf.plan.pp - 1) add_layer_ops(lm_head_ops(pf.model, pf.plan));
  if (pf.plan.pp > 1) {
    const bool first = stage == 0;
    ops.push_back(comm_json(first ? "pp_send_fwd" : "pp_recv_fwd", "p2p", "send_recv", "pp", pf.plan.pp));
    ops.push_back(comm_json(first ? "pp_recv_bwd" : "pp_send_bwd", "p2p", "send_recv", "pp", pf.plan.pp));
  }
  if (pf.plan.dp > 1) {
    if (pf.plan.zero_stage == 0) {
      ops.push_back(comm_json("dp_ar_grads", "collective", "all_reduce", "dp", pf.plan.dp));
    } else {
      ops.push_back(comm_json("dp_rs_grads", "collective", "reduce_scatter", "dp", pf.plan.dp));
      ops.push_back(comm_json("dp_ag_params", "collective", "all_gather", "dp", pf.plan.dp));
    }
  }
  ops.push_back(op_json("grad_scale", "memory_bound", "backward"));
  ops.push_back(op_json("adam", "memory_bound", "backward"));
  ops.push_back(op_json("param_copy", "memory_bound", "backward"));
  ops.push_back(op_json("grad_zero", "memory_bound", "forward"));
  ops.push_back(op_json("dqkv_zero", "memory_bound", "backward"));
  return ops;
}

// A measurements document for a run of `pf` whose every rank took `iteration_s`.
nlohmann::json make_measurements(const PlanFile& pf, double iteration_s) {
  const ParallelPlan& p = pf.plan;
  nlohmann::json doc;
  doc["schema"] = "cuboid.measurements/1";
  doc["generator"] = "cuboid test";
  doc["plan_file"] = pf.source;
  doc["cluster"] = {{"name", pf.cluster_name}, {"source_file", pf.cluster_source_file}};
  doc["model"] = {{"name", pf.model.name}, {"num_layers", pf.model.num_layers}, {"hidden_size", pf.model.hidden_size},
                  {"num_attention_heads", pf.model.num_attention_heads}, {"ffn_hidden_size", pf.model.ffn_hidden_size},
                  {"vocab_size", pf.model.vocab_size}};
  doc["plan"] = {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"micro_batch", p.micro_batch},
                 {"global_batch", p.global_batch}, {"num_micro_batches", p.num_micro_batches()},
                 {"seq_length", p.seq_length}, {"virtual_stages", p.virtual_stages}, {"zero_stage", p.zero_stage},
                 {"recompute", std::string(to_string(p.recompute))}, {"sequence_parallel", p.sequence_parallel},
                 {"schedule", std::string(to_string(p.schedule))}, {"rank_order", p.order.str()},
                 {"world_size", p.world_size()}};
  doc["environment"] = {{"backend", "cpu"}, {"device", "cpu (one core per rank)"}, {"hostnames", {"vm"}}};
  doc["steps"] = 3;
  doc["warmup"] = 1;
  doc["iteration_time_s"] = iteration_s;
  const RankMapping map(p, pf.gpus_per_node);
  doc["ranks"] = nlohmann::json::array();
  for (int r = 0; r < p.world_size(); ++r) {
    const RankCoord c = map.coord(r);
    doc["ranks"].push_back({{"rank", r}, {"hostname", "vm"},
                            {"coord", {{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"node", c.node}, {"gpu", c.gpu}}},
                            {"iteration", time_stats(iteration_s)}, {"step_seconds", {iteration_s}},
                            {"compute_s", 0.0}, {"communication_s", 0.0}, {"ops", rank_ops(pf, c.pp)}});
  }
  return doc;
}

std::string message_of(const PlanFile& pf, const Cluster& cluster, const nlohmann::json& doc) {
  try {
    validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

const ComponentRow& row(const std::vector<ComponentRow>& rows, const std::string& name) {
  for (const ComponentRow& r : rows)
    if (r.component == name) return r;
  FAIL("no row " << name);
  return rows.front();
}

TEST_CASE("the report adds the measured ops up by component and compares them with the simulation") {
  const PlanFile pf = make_plan(2, 1, 1);
  const Cluster cluster = cpu_card();
  // The prediction does not depend on the measurements: take it once.
  const double predicted =
      validate_measurements(pf, cluster, measurements_from_json(make_measurements(pf, 1.0), "m.json"), 0.10)
          .predicted_iteration_s;
  REQUIRE(predicted > 0);

  // Measured 25 % slower than predicted: error -20 %, beyond 10 %.
  const double slow = predicted * 1.25;
  const nlohmann::json doc = make_measurements(pf, slow);
  const ValidationReport r = validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
  CHECK(r.predicted_iteration_s == doctest::Approx(predicted));
  CHECK(r.measured_iteration_s == doctest::Approx(slow));
  CHECK(r.error() == doctest::Approx(-0.2));
  CHECK_FALSE(r.within_tolerance());

  // Count the hand-made ops of rank 0 by component (see validate.hpp).
  int compute = 0, tp = 0, optimizer = 0, not_simulated = 0, all = 0;
  for (const auto& op : doc["ranks"][0]["ops"]) {
    const std::string name = op["name"], kind = op["kind"];
    ++all;
    if (name == "adam" || name == "grad_scale" || name == "param_copy" || name == "grad_zero") ++optimizer;
    else if (name == "dqkv_zero") ++not_simulated;
    else if (kind == "collective") ++tp;
    else ++compute;
  }
  CHECK(row(r.components, "compute").measured_s == doctest::Approx(compute * kOpS));
  CHECK(row(r.components, "tp_comm").measured_s == doctest::Approx(tp * kOpS));
  CHECK(row(r.components, "optimizer").measured_s == doctest::Approx(optimizer * kOpS));
  CHECK(row(r.components, "not simulated").measured_s == doctest::Approx(not_simulated * kOpS));
  CHECK(row(r.components, "dp_comm").measured_s == 0);
  CHECK(row(r.components, "untimed").measured_s == doctest::Approx(slow - all * kOpS));
  const ComponentRow& it = row(r.components, "iteration");
  CHECK(it.error() == doctest::Approx(-0.2));
  // The predicted components are the simulator's critical path: they sum to the iteration.
  double sum = 0;
  for (const ComponentRow& c : r.components)
    if (c.component != "iteration") sum += c.predicted_s;
  CHECK(sum == doctest::Approx(predicted).epsilon(1e-6));

  const std::string text = format_validation(r, true);
  CHECK(text.find(fmt::format("{:<22} {:>13.4f} {:>12.4f} {:>9}\n", "iteration", predicted, slow, "-20.0%")) !=
        std::string::npos);
  CHECK(text.find(fmt::format("FAIL: end-to-end error -20.0% (predicted {:.4f} s, measured {:.4f} s) exceeds the "
                              "tolerance of 10.0%\n",
                              predicted, slow)) != std::string::npos);
  CHECK(text.find("fc1_dgrad") != std::string::npos);  // the per-op table
  const nlohmann::json j = validation_to_json(r);
  CHECK(j["within_tolerance"] == false);
  CHECK(j["error"].get<double>() == doctest::Approx(-0.2));
  // The comparison names the prediction's interval: this cluster's GPU has
  // no validated runs, so it is unknown, and says why.
  CHECK_FALSE(r.interval.known);
  CHECK(text.find("interval: unknown (no validation data") != std::string::npos);
  CHECK(j["prediction_interval"]["known"] == false);

  // Measured 5 % faster than predicted: error +5 %, within 10 %, PASS.
  const double fast = predicted / 1.05;
  const ValidationReport ok =
      validate_measurements(pf, cluster, measurements_from_json(make_measurements(pf, fast), "m.json"), 0.10);
  CHECK(ok.error() == doctest::Approx(0.05));
  CHECK(ok.within_tolerance());
  CHECK(format_validation(ok, false).find("PASS: end-to-end error +5.0%") != std::string::npos);
  // The same run with a tighter tolerance fails.
  CHECK_FALSE(validate_measurements(pf, cluster, measurements_from_json(make_measurements(pf, fast), "m.json"), 0.04)
                  .within_tolerance());
}

TEST_CASE("the end-to-end figure is the slowest rank's median iteration; stages are compared one by one") {
  const PlanFile pf = make_plan(1, 2, 1);
  const Cluster cluster = cpu_card();
  nlohmann::json doc = make_measurements(pf, 0.5);
  doc["ranks"][1]["iteration"] = time_stats(0.7);
  doc["iteration_time_s"] = 0.7;
  const ValidationReport r = validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
  CHECK(r.measured_rank == 1);
  CHECK(r.measured_iteration_s == doctest::Approx(0.7));
  REQUIRE(r.stages.size() == 2);
  CHECK(r.stages[0].measured_rank == 0);
  CHECK(row(r.stages[1].rows, "stage time").measured_s == doctest::Approx(0.7));
  // Two PP ops per stage, 1 ms each.
  CHECK(row(r.stages[0].rows, "pp_comm (+wait)").measured_s == doctest::Approx(2 * kOpS));
  CHECK(row(r.components, "pp_comm+bubble").measured_s == doctest::Approx(2 * kOpS));
}

TEST_CASE("ZeRO-1 over DP 2: the DP reduce-scatter and all-gather are expected and counted as dp_comm") {
  const PlanFile pf = make_plan(1, 1, 2, 1);
  const ValidationReport r =
      validate_measurements(pf, cpu_card(), measurements_from_json(make_measurements(pf, 0.5), "m.json"), 0.10);
  CHECK(row(r.components, "dp_comm").measured_s == doctest::Approx(2 * kOpS));
  CHECK(row(r.components, "dp_comm").predicted_s > 0);
}

TEST_CASE("an ALiBi model: the bias copy is priced, and a run that has no such kernel still validates") {
  PlanFile pf = make_plan(2, 1, 1);
  pf.model.alibi = true;
  pf.model.learned_position_embeddings = false;
  const std::vector<Op> fwd = transformer_layer_ops(pf.model, pf.plan).forward;
  REQUIRE(std::any_of(fwd.begin(), fwd.end(), [](const Op& o) { return o.name == "attn_alibi_bias"; }));
  const nlohmann::json doc = make_measurements(pf, 0.5);
  for (const auto& o : doc["ranks"][0]["ops"]) CHECK(o["name"] != "attn_alibi_bias");
  CHECK(message_of(pf, cpu_card(), doc) == "(no error)");
}

TEST_CASE("bad data: each mismatch is an InputError naming the file, the field and the fix") {
  const PlanFile pf = make_plan(2, 1, 1);
  const Cluster cluster = cpu_card();
  const std::string rerun = "(fix: validate the measurements of a run of this very plan file "
                            "(cuboid run --plan PLAN --out measurements.json))";

  SUBCASE("another plan") {
    nlohmann::json doc = make_measurements(make_plan(1, 1, 2), 0.5);
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: plan.tp: the run had TP 1 but plan file plan.json has 2: these measurements are from another plan " +
              rerun);
  }
  SUBCASE("another micro-batch count") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["plan"]["global_batch"] = 8;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: plan.global_batch: the run had global batch 8 but plan file plan.json has 4: these measurements "
          "are from another plan " + rerun);
  }
  SUBCASE("a scaled-down run (--layers)") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["model"]["num_layers"] = 2;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: model.num_layers: the run had layers 2 but plan file plan.json has 4 (fix: the run was scaled down "
          "(cuboid run --layers / --seq-length) or is from another model; validate the measurements of a run of this "
          "very plan file (cuboid run --plan PLAN --out measurements.json) without --layers / --seq-length, or make "
          "a plan for the smaller model)");
  }
  SUBCASE("another rank order") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][0]["coord"]["tp"] = 1;
    doc["ranks"][1]["coord"]["tp"] = 0;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[0].coord: rank 0 ran as (tp 1, pp 0, dp 0) but plan file plan.json maps it to (tp 0, pp 0, "
          "dp 0) " + rerun);
  }
  SUBCASE("another cluster") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["cluster"]["name"] = "DGX A100 x4";
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: cluster.name: the run's plan was made for cluster \"DGX A100 x4\" but plan file plan.json is for "
          "\"localhost (2 CPU ranks)\" " + rerun);
  }
  SUBCASE("a run over more hosts than the plan's nodes") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["environment"]["hostnames"] = {"node-a", "node-b"};
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: environment.hostnames: the run spanned 2 host(s) but plan file plan.json places its 2 ranks on 1 "
          "node(s) of 2 GPUs: the run was on another cluster (fix: run with as many ranks per node as the cluster card "
          "has GPUs per node, or plan for the cluster the run used)");
  }
  SUBCASE("a different backend than the card") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["environment"]["backend"] = "cuda";
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: environment.backend: the run used the cuda backend but cluster card " + cluster.source_file +
              " describes CPU ranks (fix: validate against a card of the machines the run used (for the cuda "
              "backend: cuboid calibrate --backend cuda writes one), or rerun with --backend cpu)");
  }
  SUBCASE("a card calibrated on another backend") {
    Cluster calibrated = cluster;
    auto cal = std::make_shared<Calibration>();
    cal->backend = "cuda";
    calibrated.calibration = cal;
    calibrated.gpu.calibration = cal;
    CHECK(message_of(pf, calibrated, make_measurements(pf, 0.5)) ==
          "m.json: environment.backend: the run used the cpu backend but cluster card " + cluster.source_file +
              " was calibrated on the cuda backend (fix: validate against a card of the machines the run used (for "
              "the cpu backend: cuboid calibrate --backend cpu writes one), or rerun with --backend cuda)");
  }
  SUBCASE("an op the simulator prices was not timed") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    auto& ops = doc["ranks"][1]["ops"];
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i]["name"] == "fc1") ops.erase(i);
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[1].ops: op \"fc1\", which the simulator prices on pipeline stage 0, was not timed on rank 1: "
          "the run did other work than the plan describes " + rerun);
  }
  SUBCASE("an op the simulator does not price was timed") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][0]["ops"].push_back(op_json("mystery", "memory_bound", "forward"));
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[0].ops: op \"mystery\" timed on rank 0 is not an op the simulator prices on pipeline stage 0 " +
              rerun);
  }
  SUBCASE("a flash-attention plan against a run of the unfused attention core") {
    const PlanFile flash = make_plan(2, 1, 1, 0, true);
    CHECK(message_of(flash, cluster, make_measurements(pf, 0.5)) ==
          "m.json: ranks[0].ops: op \"attn_flash\", which the simulator prices on pipeline stage 0, was not timed on "
          "rank 0: the run did other work than the plan describes (fix: the run had the unfused attention core and "
          "the plan the fused one: run this plan file (the executor runs the core the plan names))");
  }
  SUBCASE("a NaN time (written as null)") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    std::size_t i = 0;
    while (doc["ranks"][0]["ops"][i]["name"] != "qkv") ++i;
    doc["ranks"][0]["ops"][i]["time_per_step"]["median_s"] = nullptr;
    CHECK(message_of(pf, cluster, doc) ==
          fmt::format("m.json: ranks[0].ops[{}].time_per_step.median_s: is null: the time was not finite (NaN or "
                      "infinity) when it was written (fix: find why that op's timer failed, then measure again with "
                      "`cuboid run --plan plan.json --out measurements.json`)",
                      i));
  }
  SUBCASE("a NaN time in memory") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][1]["iteration"]["max_s"] = std::numeric_limits<double>::quiet_NaN();
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[1].iteration.max_s: value is not finite (fix: give a finite number)");
  }
  SUBCASE("a negative time") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][1]["compute_s"] = -0.25;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[1].compute_s: negative time -0.25 s (fix: times cannot be negative; measure again with "
          "`cuboid run --plan plan.json --out measurements.json`)");
  }
  SUBCASE("a median outside min..max") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][0]["iteration"]["min_s"] = 0.6;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[0].iteration.median_s: median 0.5 s is not between min 0.6 s and max 0.5 s (fix: the summary "
          "is inconsistent (edited by hand?); measure again with `cuboid run --plan plan.json --out measurements.json`)");
  }
  SUBCASE("another schema") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["schema"] = "cuboid.measurements/2";
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: schema: is \"cuboid.measurements/2\", not \"cuboid.measurements/1\" (fix: give a measurements file "
          "written by `cuboid run --out` of this cuboid version)");
  }
  SUBCASE("no ranks") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"] = nlohmann::json::array();
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks: is empty: no rank reported its timings (fix: measure again with `cuboid run --plan plan.json "
          "--out measurements.json`)");
  }
  SUBCASE("a duplicate rank") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][1]["rank"] = 0;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks: rank 0 appears twice (fix: measure again with `cuboid run --plan plan.json --out "
          "measurements.json`)");
  }
  SUBCASE("a missing field") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["ranks"][0]["ops"][0].erase("calls_per_step");
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[0].ops[0].calls_per_step: missing required field (fix: add \"calls_per_step\")");
  }
  SUBCASE("a summary that disagrees with the ranks") {
    nlohmann::json doc = make_measurements(pf, 0.5);
    doc["iteration_time_s"] = 0.25;
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: iteration_time_s: 0.25 s is not the slowest rank's median iteration (0.5 s) (fix: the summary is "
          "inconsistent (edited by hand?); measure again with `cuboid run --plan plan.json --out measurements.json`)");
  }
}

TEST_CASE("load_measurements reads a file and names it in errors") {
  CHECK_THROWS_WITH_AS(load_measurements("/nonexistent/measurements.json"),
                       doctest::Contains("/nonexistent/measurements.json"), InputError);
}


TEST_CASE("a calibration with ranks sharing cores says how to read the components") {
  ValidationReport r;
  r.measured_iteration_s = 1;
  r.predicted_iteration_s = 1;
  CHECK(format_validation(r, false).find("shared cores") == std::string::npos);
  r.ranks_per_core = 2;
  const std::string text = format_validation(r, false);
  CHECK(text.find("shared cores  2 ranks per core: the prediction charges each compute op 2 x its one-rank time") !=
        std::string::npos);
  CHECK(validation_to_json(r)["ranks_per_core"] == 2.0);
}

TEST_CASE("page faults per measured step: the most of any rank is reported, a large count with a note") {
  const PlanFile pf = make_plan(2, 1, 1);
  const Cluster cluster = cpu_card();
  nlohmann::json doc = make_measurements(pf, 0.5);
  SUBCASE("files from before the count have none") {
    const ValidationReport r = validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
    CHECK(r.page_faults_per_step == -1);
    CHECK(validation_to_json(r)["page_faults_per_step"].is_null());
    CHECK(format_validation(r, false).find("page faults") == std::string::npos);
  }
  SUBCASE("each rank's median over its steps; the rank with the most") {
    // Rank 0: the warm-up's stragglers in one step, none after. Rank 1: a
    // 14.7 MB reduce-scatter's buffer faulted afresh every step (3,589 pages).
    doc["ranks"][0]["page_faults_per_step"] = {31, 0, 0};
    doc["ranks"][1]["page_faults_per_step"] = {3589, 3557, 3557};
    const ValidationReport r = validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
    CHECK(r.page_faults_per_step == 3557);
    CHECK(r.page_fault_rank == 1);
    CHECK(validation_to_json(r)["page_faults_per_step"] == 3557);
    CHECK(format_validation(r, false).find("page faults   rank 1 took 3557 minor page faults per measured step") !=
          std::string::npos);
  }
  SUBCASE("a few faults are no news") {
    doc["ranks"][0]["page_faults_per_step"] = {255, 255, 255};
    const ValidationReport r = validate_measurements(pf, cluster, measurements_from_json(doc, "m.json"), 0.10);
    CHECK(r.page_faults_per_step == 255);
    CHECK(format_validation(r, false).find("page faults") == std::string::npos);
  }
  SUBCASE("not a count") {
    doc["ranks"][1]["page_faults_per_step"] = {3, -1};
    CHECK(message_of(pf, cluster, doc) ==
          "m.json: ranks[1].page_faults_per_step[1]: expected a count of page faults (a non-negative integer) (fix: "
          "measure again with `cuboid run --plan plan.json --out measurements.json`)");
  }
}

TEST_CASE("--statistic min compares the fastest steps: the slowest rank by its fastest step, each op's fastest") {
  const PlanFile pf = make_plan(1, 2, 1);
  const Cluster cluster = cpu_card();
  nlohmann::json doc = make_measurements(pf, 0.5);
  // Rank 0: median 0.5, fastest 0.45. Rank 1: median 0.7 (slowest by median), fastest 0.40.
  doc["ranks"][0]["iteration"] = {{"median_s", 0.5}, {"min_s", 0.45}, {"max_s", 0.9}};
  doc["ranks"][1]["iteration"] = {{"median_s", 0.7}, {"min_s", 0.40}, {"max_s", 0.9}};
  doc["iteration_time_s"] = 0.7;
  // One op of rank 0 at 1 ms median, 0.5 ms fastest.
  doc["ranks"][0]["ops"][0]["time_per_step"] = {{"median_s", kOpS}, {"min_s", kOpS / 2}, {"max_s", kOpS}};
  const Measurements m = measurements_from_json(doc, "m.json");
  const ValidationReport med = validate_measurements(pf, cluster, m, 0.10);
  CHECK(med.statistic == Statistic::median);
  CHECK(med.measured_rank == 1);
  CHECK(med.measured_iteration_s == doctest::Approx(0.7));
  const ValidationReport fastest = validate_measurements(pf, cluster, m, 0.10, Statistic::min);
  CHECK(fastest.measured_rank == 0);
  CHECK(fastest.measured_iteration_s == doctest::Approx(0.45));
  CHECK(fastest.predicted_iteration_s == doctest::Approx(med.predicted_iteration_s));
  const std::string name = doc["ranks"][0]["ops"][0]["name"];
  for (const OpRow& o : fastest.ops)
    if (o.stage == 0 && o.name == name) CHECK(o.measured_s == doctest::Approx(kOpS / 2));
  CHECK(format_validation(fastest, false).find("slowest rank 0; fastest of the measured steps)") != std::string::npos);
  CHECK(validation_to_json(fastest)["statistic"] == "min");
}

TEST_CASE("runs interleaved with calibrations count as one: min of mins, median of medians, steps added") {
  const PlanFile pf = make_plan(1, 2, 1);
  const Cluster cluster = cpu_card();
  nlohmann::json a = make_measurements(pf, 0.5), b = make_measurements(pf, 0.5);
  a["steps"] = 10;
  b["steps"] = 6;
  a["ranks"][0]["iteration"] = {{"median_s", 0.50}, {"min_s", 0.45}, {"max_s", 0.60}};
  b["ranks"][0]["iteration"] = {{"median_s", 0.40}, {"min_s", 0.38}, {"max_s", 0.90}};
  a["ranks"][1]["iteration"] = {{"median_s", 0.50}, {"min_s", 0.47}, {"max_s", 0.55}};
  b["ranks"][1]["iteration"] = {{"median_s", 0.44}, {"min_s", 0.43}, {"max_s", 0.46}};
  a["iteration_time_s"] = 0.50;
  b["iteration_time_s"] = 0.44;
  a["ranks"][0]["ops"][0]["time_per_step"] = {{"median_s", 0.004}, {"min_s", 0.003}, {"max_s", 0.005}};
  b["ranks"][0]["ops"][0]["time_per_step"] = {{"median_s", 0.002}, {"min_s", 0.001}, {"max_s", 0.008}};
  const Measurements m = merge_runs({measurements_from_json(a, "a.json"), measurements_from_json(b, "b.json")});
  CHECK(m.source == "a.json + b.json");
  CHECK(m.steps == 16);
  // Rank 0: medians 0.50 and 0.40 -> 0.45; rank 1: 0.50 and 0.44 -> 0.47, the slowest.
  CHECK(m.ranks[0].iteration.median_s == doctest::Approx(0.45));
  CHECK(m.ranks[0].iteration.min_s == doctest::Approx(0.38));
  CHECK(m.ranks[0].iteration.max_s == doctest::Approx(0.90));
  CHECK(m.ranks[1].iteration.median_s == doctest::Approx(0.47));
  CHECK(m.iteration_time_s == doctest::Approx(0.47));
  CHECK(m.ranks[0].ops[0].time_per_step.median_s == doctest::Approx(0.003));
  CHECK(m.ranks[0].ops[0].time_per_step.min_s == doctest::Approx(0.001));
  CHECK(m.ranks[0].ops[0].time_per_step.max_s == doctest::Approx(0.008));
  // --statistic min: the slowest rank by its fastest step over both runs (rank 1, 0.43 s).
  const ValidationReport fastest = validate_measurements(pf, cluster, m, 0.10, Statistic::min);
  CHECK(fastest.measured_rank == 1);
  CHECK(fastest.measured_iteration_s == doctest::Approx(0.43));
  // One run is returned as it is.
  CHECK(merge_runs({measurements_from_json(a, "a.json")}).iteration_time_s == doctest::Approx(0.50));
}

TEST_CASE("runs of different plans or hosts are not merged: the later file and the field are named") {
  const PlanFile pf = make_plan(1, 2, 1);
  const nlohmann::json a = make_measurements(pf, 0.5);
  auto refused = [&](nlohmann::json b) {
    try {
      (void)merge_runs({measurements_from_json(a, "a.json"), measurements_from_json(b, "b.json")});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json other_plan = a;
  other_plan["plan"]["global_batch"] = 2 * a["plan"]["global_batch"].get<std::int64_t>();
  CHECK(refused(other_plan).find("b.json: plan: the plan differs from a.json's") != std::string::npos);
  nlohmann::json other_op = a;
  other_op["ranks"][1]["ops"][0]["calls_per_step"] = 7;
  CHECK(refused(other_op).find("b.json: ranks[1].ops[0]") != std::string::npos);
  nlohmann::json other_backend = a;
  other_backend["environment"]["backend"] = "cuda";
  CHECK(refused(other_backend).find("environment.backend") != std::string::npos);
}
}  // namespace
}  // namespace cuboid
