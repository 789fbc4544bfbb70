// Host exchange over MPI and for a one-rank world (the TCP store is tcp_store.cpp).
#include "cuboid/exec/host_exchange.hpp"

#include <climits>
#include <cstdint>
#include <string>

#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/mpi_comm.hpp"

namespace cuboid::exec {

namespace {

class SelfExchange final : public HostExchange {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  void broadcast(std::string&, int) override {}
  std::vector<std::string> gather(const std::string& mine, int) override { return {mine}; }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
  void barrier() override {}
};

int as_int(std::size_t n, const char* op) {
  CUBOID_EXEC_REQUIRE(n <= static_cast<std::size_t>(INT_MAX), op,
                      std::to_string(n) + " bytes exceed MPI's int count");
  return static_cast<int>(n);
}

// Splits `all` into the pieces whose lengths are `lens`.
std::vector<std::string> split(const std::string& all, const std::vector<int>& lens) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (int len : lens) {
    out.push_back(all.substr(at, static_cast<std::size_t>(len)));
    at += static_cast<std::size_t>(len);
  }
  return out;
}

std::vector<int> displacements(const std::vector<int>& lens) {
  std::vector<int> d(lens.size(), 0);
  for (std::size_t i = 1; i < d.size(); ++i) d[i] = d[i - 1] + lens[i - 1];
  return d;
}

std::size_t total(const std::vector<int>& lens) {
  std::size_t n = 0;
  for (int len : lens) n += static_cast<std::size_t>(len);
  return n;
}

class MpiExchange final : public HostExchange {
 public:
  MpiExchange() : comm_(MpiCommunicator::world()) {}

  int rank() const noexcept override { return comm_.rank(); }
  int size() const noexcept override { return comm_.size(); }

  void broadcast(std::string& bytes, int root) override {
    std::int64_t n = static_cast<std::int64_t>(bytes.size());
    CUBOID_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_.native()));
    bytes.resize(static_cast<std::size_t>(n));
    CUBOID_MPI_CHECK(MPI_Bcast(bytes.data(), as_int(bytes.size(), "broadcast"), MPI_CHAR, root, comm_.native()));
  }

  std::vector<std::string> gather(const std::string& mine, int root) override {
    int len = as_int(mine.size(), "gather");
    std::vector<int> lens(static_cast<std::size_t>(size()));
    CUBOID_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm_.native()));
    const bool is_root = rank() == root;
    const std::vector<int> displs = displacements(lens);
    std::string all(is_root ? total(lens) : 0, '\0');
    CUBOID_MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root,
                                 comm_.native()));
    if (!is_root) return {};
    return split(all, lens);
  }

  std::vector<std::string> all_gather(const std::string& mine) override {
    int len = as_int(mine.size(), "all_gather");
    std::vector<int> lens(static_cast<std::size_t>(size()));
    CUBOID_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_.native()));
    const std::vector<int> displs = displacements(lens);
    std::string all(total(lens), '\0');
    CUBOID_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                                    comm_.native()));
    return split(all, lens);
  }

  void barrier() override { comm_.barrier(); }

 private:
  MpiCommunicator comm_;
};

}  // namespace

std::unique_ptr<HostExchange> make_self_exchange() { return std::make_unique<SelfExchange>(); }
std::unique_ptr<HostExchange> make_mpi_exchange() { return std::make_unique<MpiExchange>(); }

}  // namespace cuboid::exec
