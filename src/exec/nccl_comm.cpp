// The NCCL communicator (see nccl_comm.hpp).
#include "cuboid/exec/nccl_comm.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line) {
  std::string detail = std::string(ncclGetErrorString(code)) + " in `" + call + "`";
  // NCCL keeps a more specific message (which peer, which transport) aside.
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    detail += " (" + std::string(last) + ")";
  throw ExecError(file, line, launcher_rank(), call_name(call), detail);
}

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclUniqueId to_nccl(const NcclUniqueId& id) {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId::bytes), "NCCL_UNIQUE_ID_BYTES changed");
  ncclUniqueId out;
  std::memcpy(&out, id.bytes.data(), sizeof(out));
  return out;
}

}  // namespace

NcclUniqueId nccl_unique_id() {
  ncclUniqueId raw;
  CUBOID_NCCL_CHECK(ncclGetUniqueId(&raw));
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &raw, sizeof(raw));
  return id;
}

namespace {
NcclComm init_comm(const NcclUniqueId& id, int rank, int size, const CudaBackend& backend) {
  CUBOID_EXEC_REQUIRE(size > 0 && rank >= 0 && rank < size, "ncclCommInitRank",
                      "rank " + std::to_string(rank) + " of " + std::to_string(size));
  CUBOID_CUDA_CHECK(cudaSetDevice(backend.device_info().ordinal));
  ncclComm_t comm = nullptr;
  CUBOID_NCCL_CHECK(ncclCommInitRank(&comm, size, to_nccl(id), rank));
  return NcclComm(comm);
}
}  // namespace

NcclCommunicator::NcclCommunicator(const NcclUniqueId& id, int rank, int size, CudaBackend& backend)
    : NcclCommunicator(init_comm(id, rank, size, backend), backend) {}

NcclCommunicator::NcclCommunicator(NcclComm comm, CudaBackend& backend)
    : backend_(&backend),
      comm_(std::move(comm)),
      comm_stream_(make_stream()),
      compute_ready_(make_sync_event()),
      comm_done_(make_sync_event()),
      barrier_word_(backend.alloc(1, DType::f32)) {
  CUBOID_NCCL_CHECK(ncclCommUserRank(comm_.get(), &rank_));
  CUBOID_NCCL_CHECK(ncclCommCount(comm_.get(), &size_));
  backend.fill(barrier_word_, 0.0f);
}

NcclCommunicator::~NcclCommunicator() {
  // Let in-flight collectives finish before ncclCommDestroy frees their resources.
  (void)cudaStreamSynchronize(comm_stream_.get());
}

template <typename Enqueue>
void NcclCommunicator::on_comm_stream(Enqueue&& enqueue) {
  const cudaStream_t compute = backend_->stream();
  const cudaStream_t comm = comm_stream_.get();
  CUBOID_CUDA_CHECK(cudaEventRecord(compute_ready_.get(), compute));
  CUBOID_CUDA_CHECK(cudaStreamWaitEvent(comm, compute_ready_.get(), 0));
  enqueue(comm);
  CUBOID_CUDA_CHECK(cudaEventRecord(comm_done_.get(), comm));
  CUBOID_CUDA_CHECK(cudaStreamWaitEvent(compute, comm_done_.get(), 0));
}

void NcclCommunicator::all_reduce_sum_impl(DeviceSpan buffer, std::size_t count) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclAllReduce(buffer.native(), buffer.native(), count, nccl_type(buffer.dtype()), ncclSum,
                                    comm_.get(), s));
  });
}

void NcclCommunicator::reduce_scatter_sum_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t recv_count) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclReduceScatter(send.native(), recv.native(), recv_count, nccl_type(recv.dtype()), ncclSum,
                                        comm_.get(), s));
  });
}

void NcclCommunicator::all_gather_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t send_count) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(
        ncclAllGather(send.native(), recv.native(), send_count, nccl_type(recv.dtype()), comm_.get(), s));
  });
}

// nccl-tests' alltoall: one group of a send and a receive per peer, self
// included.
void NcclCommunicator::all_to_all_impl(ConstDeviceSpan send, DeviceSpan recv, std::size_t count) {
  const std::size_t block = count * dtype_bytes(send.dtype());
  const ncclDataType_t type = nccl_type(send.dtype());
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    for (int peer = 0; peer < size() && rc == ncclSuccess; ++peer) {
      const auto at = static_cast<std::size_t>(peer) * block;
      rc = ncclSend(static_cast<const unsigned char*>(send.native()) + at, count, type, peer, comm_.get(), s);
      if (rc == ncclSuccess)
        rc = ncclRecv(static_cast<unsigned char*>(recv.native()) + at, count, type, peer, comm_.get(), s);
    }
    // The group is always closed, also when an op in it failed.
    const ncclResult_t ended = ncclGroupEnd();
    CUBOID_NCCL_CHECK(rc);
    CUBOID_NCCL_CHECK(ended);
  });
}

// The same grouped send / receive with each peer's own count (Megatron's
// alltoall token dispatcher calls torch.distributed.all_to_all_single with
// split sizes, which NCCL runs this way); empty blocks post nothing, on both
// sides alike.
void NcclCommunicator::all_to_all_v_impl(ConstDeviceSpan send, std::span<const std::size_t> send_counts,
                                         DeviceSpan recv, std::span<const std::size_t> recv_counts) {
  const std::size_t esz = dtype_bytes(send.dtype());
  const ncclDataType_t type = nccl_type(send.dtype());
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    std::size_t s_at = 0, r_at = 0;
    for (int peer = 0; peer < size() && rc == ncclSuccess; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (send_counts[p] > 0)
        rc = ncclSend(static_cast<const unsigned char*>(send.native()) + s_at * esz, send_counts[p], type, peer,
                      comm_.get(), s);
      if (rc == ncclSuccess && recv_counts[p] > 0)
        rc = ncclRecv(static_cast<unsigned char*>(recv.native()) + r_at * esz, recv_counts[p], type, peer, comm_.get(),
                      s);
      s_at += send_counts[p];
      r_at += recv_counts[p];
    }
    const ncclResult_t ended = ncclGroupEnd();
    CUBOID_NCCL_CHECK(rc);
    CUBOID_NCCL_CHECK(ended);
  });
}

void NcclCommunicator::broadcast_impl(DeviceSpan buffer, std::size_t count, int root) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclBroadcast(buffer.native(), buffer.native(), count, nccl_type(buffer.dtype()), root,
                                    comm_.get(), s));
  });
}

// NCCL has no tags: p2p between a pair is matched in issue order.
void NcclCommunicator::send_impl(ConstDeviceSpan buffer, std::size_t count, int peer, int /*tag*/) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclSend(buffer.native(), count, nccl_type(buffer.dtype()), peer, comm_.get(), s));
  });
}

void NcclCommunicator::recv_impl(DeviceSpan buffer, std::size_t count, int peer, int /*tag*/) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclRecv(buffer.native(), count, nccl_type(buffer.dtype()), peer, comm_.get(), s));
  });
}

void NcclCommunicator::send_recv_impl(ConstDeviceSpan send_buffer, std::size_t send_count, int send_peer,
                                      DeviceSpan recv_buffer, std::size_t recv_count, int recv_peer, int /*tag*/) {
  on_comm_stream([&](cudaStream_t s) {
    // One group: both directions progress together, so two stages exchanging
    // activations and gradients (1F1B) cannot deadlock.
    CUBOID_NCCL_CHECK(ncclGroupStart());
    const ncclResult_t sent =
        ncclSend(send_buffer.native(), send_count, nccl_type(send_buffer.dtype()), send_peer, comm_.get(), s);
    const ncclResult_t received =
        ncclRecv(recv_buffer.native(), recv_count, nccl_type(recv_buffer.dtype()), recv_peer, comm_.get(), s);
    CUBOID_NCCL_CHECK(ncclGroupEnd());
    CUBOID_NCCL_CHECK(sent);
    CUBOID_NCCL_CHECK(received);
  });
}

void NcclCommunicator::exchange_impl(std::span<const P2pOp> ops) {
  on_comm_stream([&](cudaStream_t s) {
    CUBOID_NCCL_CHECK(ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    for (const P2pOp& op : ops) {
      if (rc != ncclSuccess) break;
      rc = op.is_send ? ncclSend(op.send_buffer.native(), op.count, nccl_type(op.send_buffer.dtype()), op.peer,
                                 comm_.get(), s)
                      : ncclRecv(op.recv_buffer.native(), op.count, nccl_type(op.recv_buffer.dtype()), op.peer,
                                 comm_.get(), s);
    }
    // The group is always closed, also when an op in it failed.
    const ncclResult_t ended = ncclGroupEnd();
    CUBOID_NCCL_CHECK(rc);
    CUBOID_NCCL_CHECK(ended);
  });
}

void NcclCommunicator::barrier() {
  all_reduce_sum_impl(barrier_word_, 1);
  CUBOID_CUDA_CHECK(cudaStreamSynchronize(comm_stream_.get()));
}

std::optional<std::string> NcclCommunicator::async_error() {
  ncclComm_t c = comm_.get();
  if (c == nullptr) return std::nullopt;
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(c, &state) != ncclSuccess) return std::string("ncclCommGetAsyncError failed");
  if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
  std::string what = ncclGetErrorString(state);
  if (const char* last = ncclGetLastError(c); last != nullptr && *last != '\0') what += std::string(" (") + last + ")";
  return what;
}

void NcclCommunicator::abort_local() noexcept {
  // Abandons the kernels in flight; the handle is not destroyed again.
  if (ncclComm_t c = comm_.release(); c != nullptr) (void)ncclCommAbort(c);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  ncclComm_t child = nullptr;
  CUBOID_NCCL_CHECK(ncclCommSplit(comm_.get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
  if (child == nullptr) return nullptr;
  return std::unique_ptr<Communicator>(new NcclCommunicator(NcclComm(child), *backend_));
}

std::unique_ptr<Communicator> make_nccl_world(const NcclUniqueId& id, int rank, int size, CudaBackend& backend) {
  return std::make_unique<NcclCommunicator>(id, rank, size, backend);
}

}  // namespace cuboid::exec
