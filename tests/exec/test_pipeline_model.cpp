// The executor's step runner on the NCCL semantics model (nccl_model.hpp):
// every schedule (GPipe, 1F1B, interleaved) over PP 2-8, virtual stages 1-4,
// PP to 4 x PP micro-batches, DP 1-2 and TP 1-2 must run without deadlock
// and with every p2p matched to the tensor it was meant for.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/plan.hpp"
#include "cuboid/exec/backend.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/exec/op_timer.hpp"
#include "cuboid/exec/registry.hpp"
#include "cuboid/exec/step.hpp"
#include "nccl_model.hpp"
#include "small_gpt.hpp"

using namespace cuboid;
using namespace cuboid::exec;

namespace {

using model::small_gpt;

ParallelPlan plan_of(Schedule schedule, int pp, int v, int micro_batches, int dp, int tp) {
  ParallelPlan p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.micro_batch = 1;
  p.global_batch = static_cast<std::int64_t>(micro_batches) * dp;
  p.seq_length = 8;
  p.schedule = schedule;
  p.virtual_stages = v;
  p.flash_attention = false;
  p.sequence_parallel = tp > 1;
  p.recompute = Recompute::selective;
  return p;
}

// Runs body(the rank's world communicator, rank) on one thread per rank of a new model;
// returns the model's report, else the first rank's error ("" when every
// rank finished).
std::string on_model(int world, const std::function<void(std::unique_ptr<Communicator>, int)>& body) {
  auto fabric = model::Fabric::make(world);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(fabric->world(r), r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      fabric->retire(r);
    });
  for (std::thread& t : threads) t.join();
  if (std::string f = fabric->failure(); !f.empty()) return f;
  for (int r = 0; r < world; ++r)
    if (!errors[static_cast<std::size_t>(r)].empty()) return fmt::format("rank {}: {}", r, errors[static_cast<std::size_t>(r)]);
  return "";
}

// Runs `steps` iterations of the plan, one thread per rank. With `losses`,
// the last stage's losses, rank by rank in rank order.
std::string run_on_model(const ModelSpec& model, const ParallelPlan& plan, int steps,
                         std::vector<double>* losses = nullptr, const StepOptions& options = {}) {
  const RankMapping mapping(plan, 8);
  std::vector<std::vector<double>> by_rank(static_cast<std::size_t>(plan.world_size()));
  std::string error = on_model(plan.world_size(), [&](std::unique_ptr<Communicator> world, int rank) {
    BackendOptions bo;
    bo.threads = 1;
    std::unique_ptr<Backend> backend = make_backend("cpu", bo);
    ProcessGroups groups = make_process_groups(std::move(world), mapping, model.moe.enabled());
    OpTimer timer(*backend, nullptr);
    StepRunner runner(*backend, groups, model, plan, timer, options);
    for (int s = 0; s < steps; ++s) {
      const double l = runner.step(s, false);
      if (!std::isnan(l)) by_rank[static_cast<std::size_t>(rank)].push_back(l);
    }
  });
  if (losses != nullptr)
    for (const auto& v : by_rank) losses->insert(losses->end(), v.begin(), v.end());
  return error;
}

std::string name_of(Schedule s) { return std::string(to_string(s)); }

}  // namespace

TEST_CASE("every pipeline schedule runs on the NCCL model without deadlock, PP 2-8, v 1-4, DP 1-2, TP 1-2") {
  int runs = 0, failed = 0;
  std::string first_failure;
  std::map<std::string, int> failed_by_schedule;
  for (int tp : {1, 2})
    for (int dp : {1, 2})
      for (int pp = 2; pp <= 8; ++pp)
        for (int k = 1; k <= 4; ++k) {
          const int m = k * pp;
          struct Case {
            Schedule s;
            int v;
          };
          std::vector<Case> cases = {{Schedule::gpipe, 1}, {Schedule::one_f_one_b, 1}};
          for (int v = 2; v <= 4; ++v) cases.push_back({Schedule::interleaved, v});
          for (const Case& c : cases) {
            const ParallelPlan plan = plan_of(c.s, pp, c.v, m, dp, tp);
            const std::string what = run_on_model(small_gpt(pp * c.v), plan, 1);
            ++runs;
            if (!what.empty()) {
              ++failed;
              ++failed_by_schedule[name_of(c.s) + (c.v > 1 ? " v " + std::to_string(c.v) : "")];
              if (first_failure.empty())
                first_failure = fmt::format("{} PP {} v {} micro-batches {} DP {} TP {}: {}", name_of(c.s), pp, c.v, m,
                                            dp, tp, what);
            }
          }
        }
  for (const auto& [schedule, n] : failed_by_schedule) MESSAGE(schedule << ": " << n << " configurations fail");
  INFO(first_failure);
  CHECK(runs == 560);
  CHECK(failed == 0);
}

namespace {

// Replays one stage's pipeline transfers of pipeline_order on the model, with
// the executor's tags, grouped as the executor did before Megatron's batches:
// each send held back until the next receive, then issued with it in one
// group (NcclCommunicator's isend / irecv).
void replay_held_sends(Communicator& pp, const StageOrder& order, int stage, int pp_size, int v) {
  const int nv = pp_size * v, prev = (stage + pp_size - 1) % pp_size, next = (stage + 1) % pp_size;
  std::vector<float> out(4, 0.0f), in(4, 0.0f);
  auto tag = [&](int mb, int vs, bool bwd) { return ((mb * nv + vs) * 2 + (bwd ? 1 : 0)) % 32768; };
  auto recv_of = [&](const ScheduleStep& st) -> std::vector<P2pOp> {
    const int vs = st.chunk * pp_size + stage;
    if (st.dir == Direction::forward && vs > 0) return {P2pOp::recv(DeviceSpan(in.data(), 4, DType::f32), 4, prev, tag(st.micro_batch, vs, false))};
    if (st.dir == Direction::backward && vs < nv - 1) return {P2pOp::recv(DeviceSpan(in.data(), 4, DType::f32), 4, next, tag(st.micro_batch, vs, true))};
    return {};
  };
  auto send_of = [&](const ScheduleStep& st) -> std::vector<P2pOp> {
    const int vs = st.chunk * pp_size + stage;
    const ConstDeviceSpan o(out.data(), 4, DType::f32);
    if (st.dir == Direction::forward && vs < nv - 1) return {P2pOp::send(o, 4, next, tag(st.micro_batch, vs + 1, false))};
    if (st.dir == Direction::backward && vs > 0) return {P2pOp::send(o, 4, prev, tag(st.micro_batch, vs - 1, true))};
    return {};
  };
  std::vector<P2pOp> pending;
  auto flush = [&](std::vector<P2pOp> extra) {
    pending.insert(pending.end(), extra.begin(), extra.end());
    pp.exchange(pending);
    pending.clear();
  };
  for (const ScheduleStep& st : order) {
    if (std::vector<P2pOp> r = recv_of(st); !r.empty()) flush(r);  // the irecv issues the held sends
    for (const P2pOp& s : send_of(st)) pending.push_back(s);       // isend holds the send
  }
  if (!pending.empty()) flush({});  // the step's final wait on the held sends
}

std::string replay_held_sends(Schedule s, int pp, int m, int v) {
  const std::vector<StageOrder> orders = pipeline_order(s, pp, m, v);
  return on_model(pp, [&](std::unique_ptr<Communicator> world, int r) {
    replay_held_sends(*world, orders[static_cast<std::size_t>(r)], r, pp, v);
  });
}

}  // namespace

TEST_CASE("the model finds the interleaved deadlock of held sends") {
  // Before Megatron's batches the executor held each send until its next
  // receive and issued both as one group: interleaved 1F1B deadlocks (stage
  // 0 sends two tensors in one group that stage 1 receives in two groups, the
  // first of which waits for stage 0's next group). 1F1B and GPipe did not.
  // The step runner's own grouping is the first test's.
  const std::string held = replay_held_sends(Schedule::interleaved, 2, 4, 2);
  CAPTURE(held);
  CHECK(held.rfind("deadlock: every rank waits and none can proceed", 0) == 0);
  CHECK(held.find("rank 0: in exchange") != std::string::npos);
  CHECK(held.find("rank 1: in exchange") != std::string::npos);
  CHECK(held.find("waiting on send to rank 1") != std::string::npos);
  CHECK(replay_held_sends(Schedule::one_f_one_b, 4, 8, 1) == "");
  CHECK(replay_held_sends(Schedule::gpipe, 4, 8, 1) == "");
}

TEST_CASE("the model reports collectives out of order and p2p pairs that do not match") {
  CHECK(on_model(2, [](std::unique_ptr<Communicator> world, int r) {
          std::vector<float> x(4, 1.0f), y(8, 0.0f);
          if (r == 0)
            world->all_reduce_sum(DeviceSpan(x.data(), 4, DType::f32), 4);
          else
            world->all_gather(ConstDeviceSpan(x.data(), 4, DType::f32), DeviceSpan(y.data(), 8, DType::f32), 4);
        }).rfind("collectives out of order on one communicator: all_reduce", 0) == 0);
  CHECK(on_model(2, [](std::unique_ptr<Communicator> world, int r) {
          std::vector<float> x(4, 1.0f);
          const std::vector<P2pOp> ops = {r == 0 ? P2pOp::send(ConstDeviceSpan(x.data(), 4, DType::f32), 4, 1, 7)
                                                 : P2pOp::recv(DeviceSpan(x.data(), 4, DType::f32), 4, 0, 8)};
          world->exchange(ops);
        }).find("the two ranks' orders differ (NCCL would silently deliver the wrong tensor)") != std::string::npos);
}

TEST_CASE("all-to-all on the model: block r of each rank's send arrives as block s of rank r's recv") {
  std::vector<std::vector<float>> got(3);
  CHECK(on_model(3, [&](std::unique_ptr<Communicator> world, int r) {
          // Rank r sends 10 r + d to rank d, two elements each.
          std::vector<float> send(6), recv(6, -1.0f);
          for (int d = 0; d < 3; ++d) send[2 * d] = send[2 * d + 1] = static_cast<float>(10 * r + d);
          world->all_to_all(ConstDeviceSpan(send.data(), 6, DType::f32), DeviceSpan(recv.data(), 6, DType::f32), 2);
          got[static_cast<std::size_t>(r)] = recv;
        }) == "");
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    for (int s = 0; s < 3; ++s) {
      CHECK(got[static_cast<std::size_t>(r)][2 * s] == static_cast<float>(10 * s + r));
      CHECK(got[static_cast<std::size_t>(r)][2 * s + 1] == static_cast<float>(10 * s + r));
    }
  }
  // The public call checks the buffers: 3 ranks x 2 elements need 6.
  CHECK(on_model(3, [](std::unique_ptr<Communicator> world, int) {
          std::vector<float> send(5), recv(6);
          world->all_to_all(ConstDeviceSpan(send.data(), 5, DType::f32), DeviceSpan(recv.data(), 6, DType::f32), 2);
        }).find("all_to_all") != std::string::npos);
}

namespace {

// small_gpt with an MoE MLP in every layer but the first: 4 experts, top-2.
ModelSpec small_moe(std::int64_t layers) {
  ModelSpec m = small_gpt(layers);
  m.moe.num_experts = 4;
  m.moe.experts_per_token = 2;
  m.moe.expert_ffn_hidden_size = 8;
  m.moe.moe_layers.assign(static_cast<std::size_t>(layers), true);
  m.moe.moe_layers[0] = false;
  return m;
}

}  // namespace

TEST_CASE("MoE plans on the NCCL model: the EP all-to-alls match, and EP 1, 2 and 4 train alike") {
  // EP only regroups where the experts live: with the same TP, PP and DP
  // (hence the same dense shards and data), every EP gives the same losses.
  struct Layout {
    int tp, pp, dp;
    std::vector<int> eps;
  };
  for (const Layout& l : {Layout{1, 1, 4, {1, 2, 4}}, Layout{2, 1, 2, {1, 2, 4}}, Layout{1, 2, 2, {1, 2}}}) {
    std::vector<double> reference;
    for (int ep : l.eps) {
      ParallelPlan p = plan_of(Schedule::one_f_one_b, l.pp, 1, 2 * l.pp, l.dp, l.tp);
      p.ep = ep;
      p.etp = 1;
      p.recompute = Recompute::none;
      CAPTURE(l.tp);
      CAPTURE(l.pp);
      CAPTURE(l.dp);
      CAPTURE(ep);
      std::vector<double> losses;
      REQUIRE(run_on_model(small_moe(4), p, 3, &losses).empty());
      REQUIRE(losses.size() == static_cast<std::size_t>(3 * l.tp * l.dp));
      if (reference.empty()) {
        reference = losses;
        continue;
      }
      for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(reference[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("MoE with ZeRO 1 on the NCCL model: the experts' optimizer sharded over expert-DP trains as ZeRO 0") {
  // EP 2 over DP 4: expert-DP 2; the reduce-scatter and all-gather of the
  // experts' buckets must give the same Adam steps as the all-reduce.
  std::vector<double> zero0, zero1;
  for (int zero : {0, 1}) {
    ParallelPlan p = plan_of(Schedule::one_f_one_b, 1, 1, 2, 4, 1);
    p.ep = 2;
    p.etp = 1;
    p.zero_stage = zero;
    p.recompute = Recompute::none;
    REQUIRE(run_on_model(small_moe(4), p, 3, zero == 0 ? &zero0 : &zero1).empty());
  }
  REQUIRE(zero0.size() == zero1.size());
  REQUIRE(!zero0.empty());
  for (std::size_t i = 0; i < zero0.size(); ++i) CHECK(zero1[i] == doctest::Approx(zero0[i]).epsilon(1e-5));
}

TEST_CASE("CP plans on the NCCL model: the ring's sends match, and CP 1, 2 and 4 train as the unfused core does") {
  // Context parallelism only splits each sequence over more ranks: with the
  // same TP, PP and DP, no dropout (its masks follow a rank's own positions)
  // and every loss a mean over equally many tokens, the mean loss over the
  // last stage's ranks is the same at every step for CP 1, 2, 4 with the
  // fused core and for the unfused core without CP.
  struct Layout {
    int tp, pp, dp;
    std::vector<int> cps;
  };
  StepOptions no_dropout;
  no_dropout.dropout = 0.0f;
  constexpr int kSteps = 3;
  auto step_means = [&](const std::vector<double>& losses) {
    const std::size_t ranks = losses.size() / kSteps;
    std::vector<double> mean(kSteps, 0.0);
    for (std::size_t r = 0; r < ranks; ++r)
      for (std::size_t k = 0; k < kSteps; ++k) mean[k] += losses[r * kSteps + k] / static_cast<double>(ranks);
    return mean;
  };
  for (const Layout& l : {Layout{1, 1, 1, {1, 2, 4}}, Layout{2, 1, 1, {1, 2}}, Layout{1, 2, 2, {1, 2}}}) {
    ParallelPlan unfused = plan_of(Schedule::one_f_one_b, l.pp, 1, 2 * l.pp, l.dp, l.tp);
    unfused.recompute = Recompute::none;
    std::vector<double> losses;
    REQUIRE(run_on_model(small_gpt(2 * l.pp), unfused, kSteps, &losses, no_dropout).empty());
    const std::vector<double> reference = step_means(losses);
    for (int cp : l.cps) {
      ParallelPlan p = unfused;
      p.flash_attention = true;
      p.cp = cp;
      CAPTURE(l.tp);
      CAPTURE(l.pp);
      CAPTURE(l.dp);
      CAPTURE(cp);
      losses.clear();
      REQUIRE(run_on_model(small_gpt(2 * l.pp), p, kSteps, &losses, no_dropout).empty());
      REQUIRE(losses.size() == static_cast<std::size_t>(kSteps * l.tp * l.dp * cp));
      const std::vector<double> got = step_means(losses);
      for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == doctest::Approx(reference[k]).epsilon(1e-5));
    }
  }
}
