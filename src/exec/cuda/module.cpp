// The entry point of cuboid-cuda.so (see ../cuda_module.hpp).
#include <algorithm>
#include <string>

#include "../cuda_module.hpp"
#include "cuboid/exec/cuda_backend.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/nccl_comm.hpp"

namespace cuboid::exec {

namespace {

std::unique_ptr<Communicator> make_world(HostExchange& exchange, Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  CUBOID_EXEC_REQUIRE(cuda != nullptr, "attach_device_world",
                      "no NCCL communicator for backend " + std::string(backend.name()));
  // As nccl-tests does: rank 0 makes the id, every rank gets it, all init together.
  std::string id(sizeof(NcclUniqueId::bytes), '\0');
  if (exchange.rank() == 0) {
    const NcclUniqueId made = nccl_unique_id();
    id.assign(made.bytes.data(), made.bytes.size());
  }
  exchange.broadcast(id, 0);
  NcclUniqueId shared;
  CUBOID_EXEC_REQUIRE(id.size() == shared.bytes.size(), "ncclUniqueId broadcast",
                      "received " + std::to_string(id.size()) + " bytes");
  std::copy(id.begin(), id.end(), shared.bytes.begin());
  return make_nccl_world(shared, exchange.rank(), exchange.size(), *cuda);
}

const CudaModule kModule{kCudaModuleAbi, cuda_device_count, make_cuda_backend, make_world};

}  // namespace

}  // namespace cuboid::exec

extern "C" const cuboid::exec::CudaModule* cuboid_cuda_module() noexcept { return &cuboid::exec::kModule; }
