#pragma once
#ifndef CUBOID_LAYER_EXEC
#error "cuboid/exec is not below this layer in the build (docs/architecture.md)"
#endif
// ExecError: the one exception type for failures inside the executor (a C API
// call that returned an error, a shape the backend cannot run). It carries the
// rank of the process, the failing operation, and the file and line of the
// check, so a message from rank 5 of 64 says where it came from.
//
// Bad *input* (a flag, a plan file) is cuboid::InputError; ExecError is for
// what goes wrong while running.
#include <stdexcept>
#include <string>
#include <string_view>

namespace cuboid::exec {

class ExecError : public std::runtime_error {
 public:
  // op: the failing call or kernel ("MPI_Allreduce", "gemm"); detail: what went
  // wrong (the library's error string, or the violated shape rule).
  ExecError(std::string file, int line, int rank, std::string op, std::string detail);

  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  int rank() const noexcept { return rank_; }  // -1 when not known
  const std::string& op() const noexcept { return op_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string file_;
  int line_;
  int rank_;
  std::string op_;
  std::string detail_;
};

// "rank <r>: <op>: <detail> (<file>:<line>)"; "rank ?" when the rank is unknown.
std::string format_exec_error(const std::string& file, int line, int rank, const std::string& op,
                              const std::string& detail);

// The global rank of this process as the launcher announced it (OMPI_COMM_WORLD_RANK,
// PMI_RANK, SLURM_PROCID, RANK), or -1. Read from the environment so that errors
// raised before or without MPI still name their rank.
int launcher_rank() noexcept;

// The function a checked call expression calls, the op of its ExecError:
// "MPI_Send(buf, n, ...)" -> "MPI_Send" (the full expression goes in the detail
// or is told apart by file and line).
std::string call_name(std::string_view call);

// Throws ExecError for a failed MPI call; defined in mpi_comm.cpp (it needs
// MPI_Error_string). Use through CUBOID_MPI_CHECK.
[[noreturn]] void throw_mpi_error(int code, const char* op, const char* file, int line);

// Throws ExecError for a violated precondition of a backend call.
[[noreturn]] void throw_exec_error(const char* op, const std::string& detail, const char* file,
                                   int line);

}  // namespace cuboid::exec

// Wraps every MPI call: `CUBOID_MPI_CHECK(MPI_Barrier(comm_));`. Needs <mpi.h>
// at the use site. Communicators must use MPI_ERRORS_RETURN for this to see errors.
#define CUBOID_MPI_CHECK(call)                                                  \
  do {                                                                          \
    const int cuboid_mpi_rc_ = (call);                                          \
    if (cuboid_mpi_rc_ != MPI_SUCCESS) {                                        \
      ::cuboid::exec::throw_mpi_error(cuboid_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

// Precondition check inside backends and communicators:
// `CUBOID_EXEC_REQUIRE(a.size() >= n, "gemm", "A holds fewer than m*k elements");`
#define CUBOID_EXEC_REQUIRE(cond, op, detail)                                   \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ::cuboid::exec::throw_exec_error((op), (detail), __FILE__, __LINE__);     \
    }                                                                           \
  } while (0)
