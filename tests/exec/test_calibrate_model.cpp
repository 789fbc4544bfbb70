// cuboid calibrate with more than one rank on the NCCL semantics model
// (nccl_model.hpp): the whole multi-rank sequence that `calibrate --backend
// cuda` runs on NCCL (the device world's GEMM-turn barriers, the layer and
// optimizer sweeps on the TP groups, every group shape's collectives), played
// under NCCL's ordering and matching rules, with every rank's results gathered
// on rank 0 over the host exchange. Before calibrate attached the device world,
// its sweeps ran on MPI's world whatever the backend (GPU pointers into MPI)
// and MPI_Gatherv collected the results, which on a world without MPI
// (torchrun) returned rank 0's alone.
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuboid/calibrate/calibrate.hpp"
#include "cuboid/calibrate/results.hpp"
#include "cuboid/exec/host_exchange.hpp"
#include "cuboid/exec/registry.hpp"
#include "nccl_model.hpp"
#include "small_gpt.hpp"

using namespace cuboid;
using namespace cuboid::exec;
using namespace cuboid::calibrate;

namespace {

// A host exchange among threads: every call is an all-gather of one string
// per rank. A rank enters call k + 1 only after leaving call k, so the last
// arrival of a call may overwrite the previous call's result.
class ThreadExchange : public HostExchange {
 public:
  struct Shared {
    explicit Shared(int n) : slots(static_cast<std::size_t>(n)) {}
    std::mutex mutex;
    std::condition_variable done;
    std::vector<std::string> slots, result;
    int arrived = 0;
    std::uint64_t generation = 0;
    std::uint64_t calls = 0;
  };
  ThreadExchange(Shared& shared, int rank) : shared_(shared), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(shared_.slots.size()); }
  void broadcast(std::string& bytes, int root) override { bytes = all_gather(bytes)[static_cast<std::size_t>(root)]; }
  std::vector<std::string> gather(const std::string& mine, int root) override {
    std::vector<std::string> all = all_gather(mine);
    return rank_ == root ? all : std::vector<std::string>{};
  }
  std::vector<std::string> all_gather(const std::string& mine) override {
    std::unique_lock lock(shared_.mutex);
    shared_.slots[static_cast<std::size_t>(rank_)] = mine;
    const std::uint64_t generation = shared_.generation;
    if (++shared_.arrived == size()) {
      shared_.result = shared_.slots;
      shared_.arrived = 0;
      ++shared_.generation;
      ++shared_.calls;
      shared_.done.notify_all();
    } else {
      shared_.done.wait(lock, [&] { return shared_.generation != generation; });
    }
    return shared_.result;
  }
  void barrier() override { (void)all_gather(""); }

 private:
  Shared& shared_;
  int rank_;
};

}  // namespace

TEST_CASE("calibrate's multi-rank sweeps follow NCCL's rules and rank 0 gathers every rank over the host exchange") {
  // TP 2 x PP 2 x DP 2 on nodes of 4 GPUs (Megatron's order): TP and DP
  // pairs inside a node, PP pairs across nodes, so two group shapes.
  ParallelPlan plan;
  plan.tp = 2;
  plan.pp = 2;
  plan.dp = 2;
  plan.micro_batch = 1;
  plan.global_batch = 4;
  plan.seq_length = 8;
  plan.flash_attention = false;
  plan.sequence_parallel = true;
  plan.recompute = Recompute::none;
  const int world = plan.world_size();
  Cluster cluster;
  cluster.gpus_per_node = 4;
  const std::vector<CalibrationJob> jobs = {CalibrationJob{model::small_gpt(2), plan, "tp2pp2dp2"}};
  CalibrateOptions options;
  options.quick = true;
  options.max_size_bytes = 64 << 10;

  auto fabric = model::Fabric::make(world);
  ThreadExchange::Shared shared(world);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::string> gathered;
  std::vector<std::size_t> returned(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        BackendOptions bo;
        bo.threads = 1;
        std::unique_ptr<Backend> backend = make_backend("cpu", bo);
        ThreadExchange exchange(shared, r);
        SweepSeconds seconds;
        const StepFootprint footprint = step_footprint(jobs, cluster.gpu, 4, 1, options.quick);
        std::vector<std::string> mine = measure_and_gather(*backend, fabric->world(r), exchange, jobs, cluster,
                                                           options, CoreShare{}, footprint, nullptr, seconds);
        returned[static_cast<std::size_t>(r)] = mine.size();
        if (r == 0) gathered = std::move(mine);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      fabric->retire(r);
    });
  for (std::thread& t : threads) t.join();

  REQUIRE(fabric->failure() == "");
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    CHECK(returned[static_cast<std::size_t>(r)] == (r == 0 ? static_cast<std::size_t>(world) : 0u));
  }
  // The results travel over the host exchange (one gather), never as device traffic.
  CHECK(shared.calls == 1);
  CHECK(fabric->launches() > 0);
  REQUIRE(gathered.size() == static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    const RankResults rr = rank_results_from_json(nlohmann::json::parse(gathered[static_cast<std::size_t>(r)]));
    CHECK(rr.rank == r);
    CHECK_FALSE(rr.gemms.empty());
    CHECK_FALSE(rr.kernels.empty());
    std::set<std::tuple<std::string, int>> shapes;
    for (const CollectiveRecord& c : rr.collectives) {
      CHECK(c.m.wrong == 0);
      shapes.insert({c.key.tier, c.key.group_size});
    }
    CHECK(shapes == std::set<std::tuple<std::string, int>>{{"intra_node", 2}, {"inter_node", 2}});
  }
}
