// An export whose target cannot express the plan's rank order takes the
// fastest other order the planner scored that it can, and says so; without
// one, the target's refusal stands.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/io/export.hpp"
#include "cuboid/io/export_order.hpp"
#include "plan_fixtures.hpp"

using namespace cuboid;

namespace {

// The seed plan with ZeRO-3 (TP 4 x PP 4 x DP 2, which torchtitan runs as
// FSDP) as the planner might write it in Megatron's --use-tp-pp-dp-mapping
// order, with the other orders it scored; priced as torchtitan runs it (its
// pipeline's unsharded FSDP gradients), which Megatron's export ignores.
PlanFile seed_in_tp_pp_dp(const nlohmann::json& others) {
  const std::vector<test::Fixture> all = test::fixtures();
  const auto seed = std::find_if(all.begin(), all.end(), [](const test::Fixture& f) { return f.name == "seed-zero3"; });
  REQUIRE(seed != all.end());
  test::Fixture f = *seed;
  f.plan.order = RankOrder::parse("tp-pp-dp", "test", "order");
  f.plan.trainer = find_trainer("torchtitan")->settings;
  nlohmann::json j = test::fixture_json(f);
  if (!others.is_null()) j["prediction"]["other_rank_orders"] = others;
  return plan_file_from_json(j, "seed-zero3.plan.json");
}

std::string as_planned_in(const PlanFile& pf, const char* order, const char* target) {
  PlanFile other = pf;
  other.plan.order = RankOrder::parse(order, "test", "order");
  return export_plan(other, target).text;
}

}  // namespace

TEST_CASE("an order the target cannot express: the tied order the planner scored, said so") {
  const double t = seed_in_tp_pp_dp(nullptr).prediction.at("iteration_time_s").get<double>();
  const PlanFile pf = seed_in_tp_pp_dp(nlohmann::json::array(
      {{{"rank_order", "dp-tp-pp"}, {"iteration_time_s", t * 1.01}, {"score", "simulated"}},
       {{"rank_order", "tp-dp-pp"}, {"iteration_time_s", t * 1.0005}, {"score", "simulated"}}}));
  // Megatron expresses tp-pp-dp itself: the plan as written, no note.
  const ExportResult megatron = export_in_expressible_order(pf, "megatron");
  CHECK(megatron.notes.empty());
  CHECK(megatron.text == export_plan(pf, "megatron").text);
  CHECK(megatron.text.find("--use-tp-pp-dp-mapping") != std::string::npos);
  // torchtitan's device mesh has no such order: the first order it can express, in the file's order of listing.
  CHECK_THROWS_AS(export_plan(pf, "torchtitan"), InputError);
  const ExportResult tt = export_in_expressible_order(pf, "torchtitan");
  CHECK(tt.text == as_planned_in(pf, "tp-dp-pp", "torchtitan"));
  CHECK(tt.notes.find("rank order tp-dp-pp instead of the planned tp-pp-dp: torchtitan") == 0);
  CHECK(tt.notes.find("the two tied (within 0.1 %)") != std::string::npos);
}

TEST_CASE("an order that did not tie: the export says what the planner predicted for it") {
  const double t = seed_in_tp_pp_dp(nullptr).prediction.at("iteration_time_s").get<double>();
  const PlanFile pf = seed_in_tp_pp_dp(nlohmann::json::array(
      {{{"rank_order", "tp-dp-pp"}, {"iteration_time_s", t * 1.007}, {"score", "analytical"}}}));
  const ExportResult tt = export_in_expressible_order(pf, "torchtitan");
  CHECK(tt.text == as_planned_in(pf, "tp-dp-pp", "torchtitan"));
  CHECK(tt.notes.find("(+0.7 %, analytical estimate)") != std::string::npos);
}

TEST_CASE("no other order the target can express: its refusal of the plan's order stands") {
  const PlanFile alone = seed_in_tp_pp_dp(nullptr);
  try {
    (void)export_in_expressible_order(alone, "torchtitan");
    FAIL("exported");
  } catch (const InputError& e) {
    CHECK(e.field() == "parallel.rank_order");
  }
  const PlanFile only_pp_first = seed_in_tp_pp_dp(nlohmann::json::array(
      {{{"rank_order", "pp-tp-dp"}, {"iteration_time_s", 400.0}, {"score", "analytical"}}}));
  CHECK_THROWS_AS(export_in_expressible_order(only_pp_first, "torchtitan"), InputError);
}

TEST_CASE("a malformed list of other orders is refused when the plan file is read") {
  auto message = [](const nlohmann::json& others) {
    try {
      (void)seed_in_tp_pp_dp(others);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  CHECK(message(nlohmann::json::object()).find("prediction.other_rank_orders") != std::string::npos);
  CHECK(message(nlohmann::json::array({{{"rank_order", "tp-xx-pp"}, {"iteration_time_s", 1.0}, {"score", "simulated"}}}))
            .find("prediction.other_rank_orders.rank_order") != std::string::npos);
  CHECK(message(nlohmann::json::array({{{"rank_order", "tp-dp-pp"}, {"iteration_time_s", 1.0}, {"score", "fast"}}}))
            .find("score") != std::string::npos);
}
