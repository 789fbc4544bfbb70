#include "cuboid/exec/exec_error.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace cuboid::exec {

std::string format_exec_error(const std::string& file, int line, int rank, const std::string& op,
                              const std::string& detail) {
  const std::string who = rank >= 0 ? "rank " + std::to_string(rank) : std::string("rank ?");
  return who + ": " + op + ": " + detail + " (" + file + ":" + std::to_string(line) + ")";
}

ExecError::ExecError(std::string file, int line, int rank, std::string op, std::string detail)
    : std::runtime_error(format_exec_error(file, line, rank, op, detail)),
      file_(std::move(file)),
      line_(line),
      rank_(rank),
      op_(std::move(op)),
      detail_(std::move(detail)) {}

int launcher_rank() noexcept {
  // Open MPI, MPICH/Hydra (PMI), Slurm, torchrun: the first one set wins.
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    if (end != nullptr && *end == '\0' && rank >= 0 && rank <= 1 << 30) {
      return static_cast<int>(rank);
    }
  }
  return -1;
}

std::string call_name(std::string_view call) {
  return std::string(call.substr(0, std::min(call.find('('), call.size())));
}

void throw_exec_error(const char* op, const std::string& detail, const char* file, int line) {
  throw ExecError(file, line, launcher_rank(), op, detail);
}

}  // namespace cuboid::exec
