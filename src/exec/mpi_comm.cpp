#include "cuboid/exec/mpi_comm.hpp"

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#include <utility>

#include "cuboid/core/error.hpp"

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

namespace {

bool mpi_alive() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

int world_rank_or_launcher() {
  if (mpi_alive()) {
    int rank = -1;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS) return rank;
  }
  return launcher_rank();
}

// MPI datatype for a span. Sums need a numeric type; moving bf16 bits is fine.
MPI_Datatype mpi_type(DType d, bool reduction, const char* op) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT;
    case DType::bf16:
      CUBOID_EXEC_REQUIRE(!reduction, op, "MPI cannot sum bf16; reduce in f32");
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

int mpi_count(std::size_t count, const char* op) {
  CUBOID_EXEC_REQUIRE(count <= static_cast<std::size_t>(INT_MAX), op,
                      "count " + std::to_string(count) + " exceeds MPI's int");
  return static_cast<int>(count);
}

std::atomic<MpiWait> g_wait{MpiWait::spin};

// Completes `request` under the process's policy. Sleeping starts at 2 us so a
// partner that is nearly there costs little, and backs off to 200 us so a long
// wait (a pipeline bubble) wakes this rank at most 5,000 times a second.
void complete(MPI_Request& request) {
  const MpiWait wait = g_wait.load(std::memory_order_relaxed);
  if (wait == MpiWait::spin) {
    CUBOID_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
    return;
  }
  constexpr auto kFirstSleep = std::chrono::microseconds(2);
  constexpr auto kLongestSleep = std::chrono::microseconds(200);
  auto sleep = kFirstSleep;
  int done = 0;
  CUBOID_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  while (done == 0) {
    if (wait == MpiWait::yield) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
    CUBOID_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
}

// Yield and sleep need the non-blocking form of each call (then complete()).
bool nonblocking() { return g_wait.load(std::memory_order_relaxed) != MpiWait::spin; }

}  // namespace

MpiWait parse_mpi_wait(std::string_view word, int ranks_on_node, int cpus_online) {
  if (word == "spin") return MpiWait::spin;
  if (word == "sleep") return MpiWait::sleep;
  if (word == "yield") return MpiWait::yield;
  if (word == "auto") return ranks_on_node > cpus_online ? MpiWait::yield : MpiWait::spin;
  throw InputError("command line", "--mpi-wait", "is '" + std::string(word) + "'",
                   "use auto, spin, yield or sleep");
}

std::string_view mpi_wait_name(MpiWait wait) noexcept {
  switch (wait) {
    case MpiWait::spin: return "spin";
    case MpiWait::yield: return "yield";
    case MpiWait::sleep: return "sleep";
  }
  return "spin";
}

void set_mpi_wait(MpiWait wait) {
  g_wait.store(wait, std::memory_order_relaxed);
  // Linux's default timer slack (50 us, prctl(2) PR_SET_TIMERSLACK) lets every
  // 2 us sleep last up to 50 us longer.
  if (wait == MpiWait::sleep) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
}

MpiWait mpi_wait() noexcept { return g_wait.load(std::memory_order_relaxed); }

int mpi_ranks_on_node() {
  CUBOID_EXEC_REQUIRE(mpi_alive(), "mpi_ranks_on_node", "MPI is not initialised");
  MPI_Comm node = MPI_COMM_NULL;
  CUBOID_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int size = 0;
  const int rc = MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  CUBOID_MPI_CHECK(rc);
  return size;
}

int cpus_online() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(std::min<long>(n, INT_MAX)) : 1;
}

[[noreturn]] void throw_mpi_error(int code, const char* op, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::string detail = "MPI error " + std::to_string(code);
  if (MPI_Error_string(code, text, &length) == MPI_SUCCESS && length > 0) {
    detail += ": " + std::string(text, static_cast<std::size_t>(length));
  }
  throw ExecError(file, line, world_rank_or_launcher(), call_name(op), detail);
}

// --- environment ----------------------------------------------------------------
MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  CUBOID_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized != 0) {
    CUBOID_MPI_CHECK(MPI_Query_thread(&provided_));
    return;
  }
  CUBOID_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided_));
  owns_ = true;
  // Errors on the world communicator come back as codes (then ExecError)
  // instead of killing the job without saying where.
  CUBOID_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiEnvironment::~MpiEnvironment() {
  if (owns_ && mpi_alive()) MPI_Finalize();
}

bool MpiEnvironment::initialized() { return mpi_alive(); }

// --- communicator -----------------------------------------------------------------
MpiCommunicator MpiCommunicator::world() {
  CUBOID_EXEC_REQUIRE(mpi_alive(), "MpiCommunicator::world",
                      "MPI is not initialised (create an MpiEnvironment first)");
  MPI_Comm dup = MPI_COMM_NULL;
  CUBOID_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return MpiCommunicator(dup);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  CUBOID_EXEC_REQUIRE(comm != MPI_COMM_NULL, "MpiCommunicator", "MPI_COMM_NULL given");
  CUBOID_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  CUBOID_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  CUBOID_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() { release(); }

MpiCommunicator::MpiCommunicator(MpiCommunicator&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(std::exchange(other.rank_, 0)),
      size_(std::exchange(other.size_, 0)) {}

MpiCommunicator& MpiCommunicator::operator=(MpiCommunicator&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(other.rank_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MpiCommunicator::release() noexcept {
  // After MPI_Finalize a handle cannot be freed (and need not be).
  if (comm_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

void MpiCommunicator::barrier() {
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Barrier(comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Ibarrier(comm_, &request));
  complete(request);
}

void end_job(std::string_view message) noexcept {
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the first caller ends the process
  }
  // ExecError's text already starts with "rank R: ".
  if (message.rfind("rank ", 0) == 0)
    std::fprintf(stderr, "cuboid: %.*s; ending the job\n", static_cast<int>(message.size()), message.data());
  else
    std::fprintf(stderr, "cuboid: rank %d: %.*s; ending the job\n", world_rank_or_launcher(),
                 static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  // ncclCommAbort may wait for the kernel it abandons: from a helper thread,
  // given at most 2 s.
  static std::atomic<bool> aborted{false};
  std::thread([] {
    abort_live_communicators();
    aborted.store(true);
  }).detach();
  for (int i = 0; i < 200 && !aborted.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (mpi_alive()) MPI_Abort(MPI_COMM_WORLD, 1);  // ends every rank of the job
  std::_Exit(1);
}

MpiCommunicator MpiCommunicator::split_mpi(int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  CUBOID_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
  CUBOID_EXEC_REQUIRE(out != MPI_COMM_NULL, "split_mpi",
                      "negative color: this rank joins no group (use split())");
  return MpiCommunicator(out);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  CUBOID_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
  if (out == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(out);
}

void MpiCommunicator::broadcast_bytes(std::span<std::byte> bytes, int root) {
  CUBOID_MPI_CHECK(
      MPI_Bcast(bytes.data(), mpi_count(bytes.size(), "broadcast_bytes"), MPI_BYTE, root, comm_));
}

std::vector<double> MpiCommunicator::all_gather_doubles(double value) {
  std::vector<double> all(static_cast<std::size_t>(size_));
  CUBOID_MPI_CHECK(MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_));
  return all;
}

double MpiCommunicator::all_reduce_max(double value) {
  double out = 0.0;
  CUBOID_MPI_CHECK(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm_));
  return out;
}

// --- collectives and p2p ---------------------------------------------------------------
void MpiCommunicator::all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) {
  const int n = mpi_count(count, "all_reduce_sum");
  const MPI_Datatype type = mpi_type(buffer.dtype(), true, "all_reduce_sum");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buffer.native(), n, type, MPI_SUM, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.native(), n, type, MPI_SUM, comm_, &request));
  complete(request);
}

void MpiCommunicator::reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv,
                                              std::size_t recv_count) {
  const int n = mpi_count(recv_count, "reduce_scatter_sum");
  const MPI_Datatype type = mpi_type(recv.dtype(), true, "reduce_scatter_sum");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Reduce_scatter_block(send.native(), recv.native(), n, type, MPI_SUM, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(
      MPI_Ireduce_scatter_block(send.native(), recv.native(), n, type, MPI_SUM, comm_, &request));
  complete(request);
}

void MpiCommunicator::all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) {
  const MPI_Datatype type = mpi_type(send.dtype(), false, "all_to_all");
  const int n = mpi_count(count, "all_to_all");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Alltoall(send.native(), n, type, recv.native(), n, type, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Ialltoall(send.native(), n, type, recv.native(), n, type, comm_, &request));
  complete(request);
}

void MpiCommunicator::all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts,
                                        DeviceSpan recv, std::span<const std::size_t> recv_counts) {
  const MPI_Datatype type = mpi_type(send.dtype(), false, "all_to_all_v");
  const std::size_t n = send_counts.size();
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  std::size_t s_at = 0, r_at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    sc[r] = mpi_count(send_counts[r], "all_to_all_v");
    rc[r] = mpi_count(recv_counts[r], "all_to_all_v");
    sd[r] = mpi_count(s_at, "all_to_all_v");
    rd[r] = mpi_count(r_at, "all_to_all_v");
    s_at += send_counts[r];
    r_at += recv_counts[r];
  }
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(
        MPI_Alltoallv(send.native(), sc.data(), sd.data(), type, recv.native(), rc.data(), rd.data(), type, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Ialltoallv(send.native(), sc.data(), sd.data(), type, recv.native(), rc.data(), rd.data(),
                                  type, comm_, &request));
  complete(request);
}

void MpiCommunicator::all_gather_impl(ConstDeviceSpan send, DeviceSpan recv,
                                      std::size_t send_count) {
  const MPI_Datatype type = mpi_type(send.dtype(), false, "all_gather");
  const int n = mpi_count(send_count, "all_gather");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Allgather(send.native(), n, type, recv.native(), n, type, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Iallgather(send.native(), n, type, recv.native(), n, type, comm_, &request));
  complete(request);
}

void MpiCommunicator::broadcast_impl(DeviceSpan buffer, std::size_t count, int root) {
  const int n = mpi_count(count, "broadcast");
  const MPI_Datatype type = mpi_type(buffer.dtype(), false, "broadcast");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Bcast(buffer.native(), n, type, root, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Ibcast(buffer.native(), n, type, root, comm_, &request));
  complete(request);
}

void MpiCommunicator::send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int tag) {
  const int n = mpi_count(count, "send");
  const MPI_Datatype type = mpi_type(buffer.dtype(), false, "send");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Send(buffer.native(), n, type, peer, tag, comm_));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Isend(buffer.native(), n, type, peer, tag, comm_, &request));
  complete(request);
}

void MpiCommunicator::recv_impl(DeviceSpan buffer, std::size_t count, int peer, int tag) {
  const int n = mpi_count(count, "recv");
  const MPI_Datatype type = mpi_type(buffer.dtype(), false, "recv");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Recv(buffer.native(), n, type, peer, tag, comm_, MPI_STATUS_IGNORE));
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  CUBOID_MPI_CHECK(MPI_Irecv(buffer.native(), n, type, peer, tag, comm_, &request));
  complete(request);
}

void MpiCommunicator::send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count,
                                     int send_peer, DeviceSpan recv_buffer,
                                     std::size_t recv_count, int recv_peer, int tag) {
  const int n_send = mpi_count(send_count, "send_recv");
  const int n_recv = mpi_count(recv_count, "send_recv");
  const MPI_Datatype send_type = mpi_type(send_buffer.dtype(), false, "send_recv");
  const MPI_Datatype recv_type = mpi_type(recv_buffer.dtype(), false, "send_recv");
  if (!nonblocking()) {
    CUBOID_MPI_CHECK(MPI_Sendrecv(send_buffer.native(), n_send, send_type, send_peer, tag, recv_buffer.native(),
                                  n_recv, recv_type, recv_peer, tag, comm_, MPI_STATUS_IGNORE));
    return;
  }
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  CUBOID_MPI_CHECK(MPI_Irecv(recv_buffer.native(), n_recv, recv_type, recv_peer, tag, comm_, &requests[0]));
  CUBOID_MPI_CHECK(MPI_Isend(send_buffer.native(), n_send, send_type, send_peer, tag, comm_, &requests[1]));
  complete(requests[0]);
  complete(requests[1]);
}

namespace {

// The requests of one exchange. Given up on (an exception unwinds past
// them), a receive is cancelled so its buffer can go and a send finishes on
// its own.
struct PostedRequests {
  std::vector<MPI_Request> requests;
  std::vector<bool> is_recv;
  ~PostedRequests() {
    if (!mpi_alive()) return;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      if (is_recv[i]) {
        MPI_Cancel(&requests[i]);
        MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&requests[i]);
      }
    }
  }
};

}  // namespace

void MpiCommunicator::exchange_impl(std::span<const P2pOp> ops) {
  PostedRequests posted;
  posted.requests.reserve(ops.size());
  // Receives first, so a matching send never waits for its buffer.
  for (const bool recvs : {true, false})
    for (const P2pOp& op : ops) {
      if (op.is_send == recvs) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (op.is_send)
        CUBOID_MPI_CHECK(MPI_Isend(op.send_buffer.native(), mpi_count(op.count, "exchange"),
                                   mpi_type(op.send_buffer.dtype(), false, "exchange"), op.peer, op.tag, comm_,
                                   &request));
      else
        CUBOID_MPI_CHECK(MPI_Irecv(op.recv_buffer.native(), mpi_count(op.count, "exchange"),
                                   mpi_type(op.recv_buffer.dtype(), false, "exchange"), op.peer, op.tag, comm_,
                                   &request));
      posted.requests.push_back(request);
      posted.is_recv.push_back(!op.is_send);
    }
  for (MPI_Request& r : posted.requests) complete(r);
}

}  // namespace cuboid::exec
