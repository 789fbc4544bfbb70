// Launching without MPI: the torchrun / Slurm variables, the TCP store the
// ranks meet in (threads on 127.0.0.1 stand in for processes), and the
// start-up check that every rank runs the same plan.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/plan.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/exec/op_timer.hpp"
#include "cuboid/exec/tcp_store.hpp"
#include "small_gpt.hpp"

using namespace cuboid;
using namespace cuboid::exec;
using namespace std::chrono_literals;

namespace {

// A port nobody listens on right now (the kernel's choice for port 0).
int free_port() {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(s);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return ntohs(a.sin_port);
}

// A port whose next port is free too, for a store that listens on
// MASTER_PORT + 1 (a port the kernel hands out for port 0 can have its
// neighbour taken by another test's connection).
int free_port_before_free_port() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int p = free_port();
    if (p >= 65535) continue;
    Socket next(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(p + 1));
    if (::bind(next.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return p;
  }
  FAIL("no port with a free next port");
  return 0;
}

TcpStoreOptions options(int port, int rank, int size, std::chrono::milliseconds timeout = 20s) {
  TcpStoreOptions o;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.rank = rank;
  o.world_size = size;
  o.timeout = timeout;
  return o;
}

// Runs body(rank) on `n` threads at once; returns each thread's error text ("" when none).
std::vector<std::string> on_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("four ranks meet in the TCP store and exchange bytes") {
  const int port = free_port();
  constexpr int n = 4;
  std::vector<std::vector<std::string>> gathered(n), all(n);
  std::vector<std::string> broadcast(n);
  const auto errors = on_ranks(n, [&](int r) {
    // Rank 0 comes last: the others retry until it listens.
    if (r == 0) std::this_thread::sleep_for(300ms);
    TcpStore store(options(port, r, n));
    if (store.rank() != r || store.size() != n) throw std::runtime_error("wrong rank or size");
    all[static_cast<std::size_t>(r)] = store.all_gather("rank " + std::to_string(r));
    std::string b = r == 2 ? std::string("from two\0with a zero", 19) : std::string("junk");
    store.broadcast(b, 2);
    broadcast[static_cast<std::size_t>(r)] = b;
    gathered[static_cast<std::size_t>(r)] = store.gather(std::string(static_cast<std::size_t>(r) * 1000, 'x'), 1);
    store.barrier();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    CHECK(all[static_cast<std::size_t>(r)] == std::vector<std::string>{"rank 0", "rank 1", "rank 2", "rank 3"});
    CHECK(broadcast[static_cast<std::size_t>(r)] == std::string("from two\0with a zero", 19));
    if (r == 1) {
      REQUIRE(gathered[1].size() == n);
      for (int k = 0; k < n; ++k) CHECK(gathered[1][static_cast<std::size_t>(k)].size() == static_cast<std::size_t>(k) * 1000);
    } else {
      CHECK(gathered[static_cast<std::size_t>(r)].empty());
    }
  }
}

TEST_CASE("a rank launched with another WORLD_SIZE is refused on both sides") {
  const int port = free_port();
  const auto errors = on_ranks(2, [&](int r) { TcpStore store(options(port, r, r == 0 ? 2 : 3)); });
  const std::string expected =
      "environment: WORLD_SIZE: rank 1 was launched with WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2 "
      "(fix: launch every rank with the same WORLD_SIZE and distinct RANK values)";
  CHECK(errors[0] == expected);
  CHECK(errors[1] == expected);
}

TEST_CASE("without rank 0 the others stop at the timeout, naming MASTER_ADDR and the store's port") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_ranks(1, [&](int) { TcpStore store(options(port, 1, 2, 400ms)); });
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(errors[0].find("rank 1: TCP store rendezvous: could not connect to rank 0's store at MASTER_ADDR:MASTER_PORT = "
                       "127.0.0.1:" + std::to_string(port) + " within 0.4 s (last error: Connection refused)") == 0);
}

TEST_CASE("rank 0 names the ranks that never came") {
  const int port = free_port();
  const auto errors = on_ranks(2, [&](int r) { TcpStore store(options(port, r, 3, 600ms)); });
  CHECK(errors[0].find("rank 0: TCP store rendezvous: 1 rank(s) (2) did not connect to 127.0.0.1:" +
                       std::to_string(port) + " within 0.6 s") == 0);
  // Rank 1 was connected and hears nothing back: it fails too instead of waiting forever.
  CHECK(errors[1].find("rank 1: TCP store rendezvous: rank 0 at 127.0.0.1:" + std::to_string(port)) == 0);
}

TEST_CASE("a rank that dies after the rendezvous ends the others' exchange with its rank") {
  const int port = free_port();
  const auto errors = on_ranks(2, [&](int r) {
    TcpStore store(options(port, r, 2));
    if (r == 1) return;  // the store closes its socket: as if the process died
    (void)store.all_gather("still here");
  });
  CHECK(errors[1] == "");
  CHECK(errors[0].find("rank 0: TCP store gather: no message from rank 1: it closed the connection") == 0);
}

TEST_CASE("bad store settings are input errors naming the variable") {
  CHECK_THROWS_WITH_AS(TcpStore(options(0, 0, 2)),
                       "environment: MASTER_PORT: 0 is not a TCP port (fix: set MASTER_PORT to a free port between "
                       "1024 and 65534 on rank 0's host (cuboid's store uses the next one), or CUBOID_STORE_PORT)",
                       InputError);
  TcpStoreOptions o = options(29500, 0, 2);
  o.master_addr.clear();
  CHECK_THROWS_WITH_AS(TcpStore{o},
                       "environment: MASTER_ADDR: is not set (fix: set MASTER_ADDR to rank 0's host name or IP "
                       "address (torchrun sets it))",
                       InputError);
  CHECK_THROWS_AS(TcpStore(options(29500, 2, 2)), InputError);
}

TEST_CASE("torchrun and Slurm variables say who we are") {
  const LaunchInfo t = detect_launch(fake_env(
      {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}}));
  CHECK(t.launcher == Launcher::torchrun);
  CHECK(t.rank == 3);
  CHECK(t.world_size == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.master_addr == "node7");
  CHECK(t.master_port == 29500);
  // torchrun's agent store holds MASTER_PORT: cuboid's listens on the next port.
  CHECK(t.store_port == 29501);
  CHECK(t.store_port_var == "MASTER_PORT + 1");
  const LaunchInfo own = detect_launch(fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"},
                                                 {"MASTER_PORT", "29500"}, {"CUBOID_STORE_PORT", "31000"}}));
  CHECK(own.store_port == 31000);
  CHECK(own.store_port_var == "CUBOID_STORE_PORT");

  const LaunchInfo s = detect_launch(fake_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                                               {"MASTER_ADDR", "gpu001"}, {"MASTER_PORT", "12345"}}));
  CHECK(s.launcher == Launcher::slurm);
  CHECK(s.rank == 5);
  CHECK(s.world_size == 16);
  CHECK(s.local_rank == 1);
  CHECK(s.master_addr == "gpu001");
  CHECK(s.store_port == 12346);

  // srun with PMIx is an MPI launch; the node-local rank comes from Slurm.
  const LaunchInfo p = detect_launch(fake_env({{"PMIX_RANK", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}}));
  CHECK(p.launcher == Launcher::mpi);
  CHECK(p.local_rank == 2);

  CHECK_THROWS_WITH_AS(detect_launch(fake_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})),
                       "environment: RANK: rank 4 is not below WORLD_SIZE=4 (fix: launch with a consistent rank and "
                       "world size)",
                       InputError);
  CHECK_THROWS_AS(detect_launch(fake_env({{"RANK", "0"}, {"WORLD_SIZE", "two"}})), InputError);
}

TEST_CASE("torchrun variables without MPI: the cpu backend asks for mpirun, the others for MASTER_ADDR") {
  LaunchInfo l;
  l.launcher = Launcher::torchrun;
  l.world_size = 2;
  CHECK_THROWS_WITH_AS(start_world(l, "cpu", 1.0),
                       "environment: WORLD_SIZE: WORLD_SIZE=2 asks for 2 ranks but the cpu backend's collectives are "
                       "MPI, and this process was not started by an MPI launcher (fix: launch with mpirun -np 2 (or "
                       "srun --mpi=pmix), or run one rank without WORLD_SIZE)",
                       InputError);
  CHECK_THROWS_WITH_AS(start_world(l, "cuda", 1.0),
                       "environment: MASTER_ADDR: is not set, and WORLD_SIZE=2 ranks started without MPI meet at "
                       "rank 0's MASTER_ADDR (port MASTER_PORT + 1) (fix: launch with torchrun (it sets both), or set "
                       "MASTER_ADDR and MASTER_PORT)",
                       InputError);
}

TEST_CASE("every rank must run the same plan: a different one is named with its ranks") {
  const int port = free_port();
  constexpr int n = 3;
  const auto errors = on_ranks(n, [&](int r) {
    TcpStore store(options(port, r, n));
    require_same_plan(store, r == 1 ? "00000000000000bb" : "00000000000000aa", r == 1 ? "b.json" : "a.json");
  });
  const std::string expected =
      "a.json: parallel: the ranks were not given the same plan and sizes: ranks 0,2 run a.json (fingerprint "
      "00000000000000aa); rank 1 runs b.json (fingerprint 00000000000000bb) (fix: give every rank the same --plan "
      "file and the same --layers, --seq-length, --steps, --warmup, --check and --backend)";
  CHECK(errors[0] == expected);
  CHECK(errors[2] == expected);
  CHECK(errors[1].find("b.json: parallel: the ranks were not given the same plan and sizes: ranks 0,2") == 0);

  const int port2 = free_port();
  const auto same = on_ranks(2, [&](int r) {
    TcpStore store(options(port2, r, 2));
    require_same_plan(store, "00000000000000aa", "a.json");
  });
  CHECK(same[0] == "");
  CHECK(same[1] == "");
}

TEST_CASE("under torchrun the store does not collide with torchrun's own store on MASTER_PORT") {
  // torchrun's agent serves its TCPStore on MASTER_PORT before the ranks
  // start: a listener there stands for it. Two ranks started with torchrun's
  // variables must meet on the next port.
  int master_port = 0;
  Socket agent;
  for (int attempt = 0; attempt < 20 && master_port == 0; ++attempt) {
    const int p = free_port();
    if (p >= 65535) continue;
    Socket a(::socket(AF_INET, SOCK_STREAM, 0)), next(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(p));
    if (::bind(a.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(a.fd(), 8) != 0) continue;
    addr.sin_port = htons(static_cast<std::uint16_t>(p + 1));
    if (::bind(next.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) continue;  // p + 1 taken
    master_port = p;
    agent = std::move(a);  // `next` closes: p + 1 is free again
  }
  REQUIRE(master_port != 0);
  const auto errors = on_ranks(2, [&](int r) {
    const LaunchInfo l = detect_launch(fake_env({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                                                 {"LOCAL_RANK", std::to_string(r)}, {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(master_port)}}));
    World w = start_world(l, "cuda", 20.0);
    (void)w.exchange->all_gather("rank " + std::to_string(r));
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  // Binding MASTER_PORT itself, as before, fails the way the issue reported.
  std::string bound;
  try {
    TcpStore store(options(master_port, 0, 2, 500ms));
  } catch (const InputError& e) {
    bound = e.what();
  }
  CHECK(bound.find("MASTER_PORT: rank 0 cannot listen on port " + std::to_string(master_port)) != std::string::npos);
}

TEST_CASE("the node-local rank comes from the launcher that started the process, in a documented order") {
  // Open MPI's own variable wins over a Slurm allocation's stale SLURM_LOCALID.
  const LaunchInfo ompi = detect_launch(fake_env({{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_RANK", "9"},
                                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}, {"SLURM_LOCALID", "0"}}));
  CHECK(ompi.launcher == Launcher::mpi);
  CHECK(ompi.local_rank == 1);
  CHECK(ompi.local_size == 8);
  CHECK(ompi.local_rank_var == "OMPI_COMM_WORLD_LOCAL_RANK");
  // MPICH's and Intel MPI's Hydra (mpiexec) set MPI_LOCALRANKID.
  const LaunchInfo hydra = detect_launch(fake_env(
      {{"PMI_SIZE", "16"}, {"PMI_RANK", "9"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "8"}}));
  CHECK(hydra.launcher == Launcher::mpi);
  CHECK(hydra.rank == 9);
  CHECK(hydra.local_rank == 1);
  CHECK(hydra.local_size == 8);
  // srun --mpi=pmix: Slurm's.
  const LaunchInfo pmix = detect_launch(fake_env({{"PMIX_RANK", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}}));
  CHECK(pmix.local_rank == 1);
  CHECK(pmix.local_rank_var == "SLURM_LOCALID");
  // torchrun started by srun (one agent per node): LOCAL_RANK is the
  // worker's, SLURM_LOCALID the agent's.
  const LaunchInfo tr = detect_launch(fake_env({{"RANK", "9"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "1"},
                                                {"LOCAL_WORLD_SIZE", "8"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"},
                                                {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}}));
  CHECK(tr.launcher == Launcher::torchrun);
  CHECK(tr.local_rank == 1);
  CHECK(tr.local_size == 8);
}

TEST_CASE("the CUDA device honours CUDA_VISIBLE_DEVICES and GPUs isolated per rank") {
  LaunchInfo l;
  l.local_rank = 3;
  l.local_size = 8;
  l.local_rank_var = "LOCAL_RANK";
  CHECK(choose_cuda_device(l, 8, std::nullopt) == 3);
  // srun --gpus-per-task=1 (or a wrapper) leaves each rank one GPU: device 0.
  CHECK(choose_cuda_device(l, 1, std::string("5")) == 0);
  CHECK_THROWS_WITH_AS(choose_cuda_device(l, 4, std::string("0,1,2,3")),
                       "environment: CUDA_VISIBLE_DEVICES: local rank 3 (LOCAL_RANK) of 8 ranks on this node, but the "
                       "rank sees 4 GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3): ranks would share GPUs (fix: start one rank "
                       "per visible GPU, or give each rank its own GPU (srun --gpus-per-task=1))",
                       InputError);
  CHECK_THROWS_WITH_AS(choose_cuda_device(l, 0, std::string("")),
                       "environment: CUDA_VISIBLE_DEVICES: this rank sees no NVIDIA GPU (CUDA_VISIBLE_DEVICES=) (fix: "
                       "run on a GPU node, and check that the launcher does not hide every GPU from the ranks)",
                       InputError);
  // Without a local size, the rank itself bounds it: rank 5 needs 6 GPUs.
  l.local_size = 0;
  l.local_rank = 5;
  CHECK(choose_cuda_device(l, 8, std::nullopt) == 5);
  CHECK_THROWS_AS(choose_cuda_device(l, 4, std::nullopt), InputError);
}

TEST_CASE("the documented Slurm batch line: SLURM_PROCID / SLURM_NTASKS with MASTER_ADDR / MASTER_PORT meet") {
  const int master_port = free_port_before_free_port();
  const auto errors = on_ranks(2, [&](int r) {
    const LaunchInfo l = detect_launch(fake_env({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "2"},
                                                 {"SLURM_LOCALID", std::to_string(r)}, {"SLURM_NTASKS_PER_NODE", "2"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(master_port)}}));
    CHECK(l.launcher == Launcher::slurm);
    World w = start_world(l, "cuda", 20.0);
    (void)w.exchange->all_gather("rank " + std::to_string(r));
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

namespace {
// A communicator whose library reports an asynchronous error, as NCCL's
// ncclCommGetAsyncError does after a peer died.
class FailedCommunicator final : public Communicator {
 public:
  std::string_view kind() const noexcept override { return "failing"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 2; }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  std::optional<std::string> async_error() override { return std::string("remote process exited"); }
  void abort_local() noexcept override { std::fprintf(stderr, "aborted locally\n"); }

 protected:
  void all_reduce_sum_impl(DeviceSpan, std::size_t) override {}
  void reduce_scatter_sum_impl(ConstDeviceSpan, DeviceSpan, std::size_t) override {}
  void all_gather_impl(ConstDeviceSpan, DeviceSpan, std::size_t) override {}
  void broadcast_impl(DeviceSpan, std::size_t, int) override {}
  void all_to_all_impl(ConstDeviceSpan, DeviceSpan, std::size_t) override {}
  void all_to_all_v_impl(ConstDeviceSpan, std::span<const std::size_t>, DeviceSpan, std::span<const std::size_t>) override {}
  void send_impl(ConstDeviceSpan, std::size_t, int, int) override {}
  void recv_impl(DeviceSpan, std::size_t, int, int) override {}
  void send_recv_impl(ConstDeviceSpan, std::size_t, int, DeviceSpan, std::size_t, int, int) override {}
  void exchange_impl(std::span<const P2pOp>) override {}
};
}  // namespace

TEST_CASE("the watchdog ends the job on a communicator's asynchronous error, aborting every communicator") {
  // In a child process: ending the job exits it.
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(pipe_fds[1], 2);
    FailedCommunicator failing;
    Watchdog watchdog(0, 600.0);
    watchdog.enter("dp_ar_grads");
    std::this_thread::sleep_for(10s);  // the watchdog must end the process long before
    std::_Exit(0);
  }
  ::close(pipe_fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) err.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CAPTURE(err);
  CHECK(err.find(": failing communicator of 2 ranks (this rank 0): remote process exited while in op 'dp_ar_grads'; "
                 "ending the job") != std::string::npos);
  CHECK(err.find("aborted locally") != std::string::npos);
}

TEST_CASE("the executor runs fp8-current and mxfp8 plans; delayed, blockwise and NVFP4 scaling it refuses before any work") {
  const ModelSpec gpt = model::small_gpt(2);
  ParallelPlan plan;
  CHECK_NOTHROW(check_executable(gpt, plan, "plan.json"));
  for (const Precision p : {Precision::fp8_current, Precision::mxfp8}) {
    plan.precision = p;
    CHECK_NOTHROW(check_executable(gpt, plan, "plan.json"));
  }
  const std::pair<Precision, const char*> refused[] = {
      {Precision::fp8_delayed, "the executor does not run delayed scaling (each tensor's scale comes from an amax "
                               "history of earlier iterations, which it keeps none of)"},
      {Precision::fp8_blockwise, "the executor does not run blockwise FP8 scaling (1 x 128 and 128 x 128 blocks)"},
      {Precision::nvfp4, "the executor does not run NVFP4 linear layers (4-bit elements in 16-element blocks)"},
  };
  for (const auto& row : refused) {
    plan.precision = row.first;
    CAPTURE(to_string(row.first));
    const std::string full = std::string("plan.json: parallel.precision: ") + row.second;
    CHECK_THROWS_WITH_AS(check_executable(gpt, plan, "plan.json"), doctest::Contains(full.c_str()), InputError);
  }
}
