// Fuzzes the cluster card loader (inline GPU profile or a path under
// topologies/, --nodes) and the topology built from a loaded card.
#include <cstddef>
#include <cstdint>

#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/topology.hpp"
#include "cuboid_config.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = cuboid::fuzz::parse(data, size);
  if (!j) return 0;
  // Relative GPU profile paths resolve like a card shipped in topologies/.
  const std::filesystem::path base = std::filesystem::path(CUBOID_SOURCE_ROOT) / "topologies";
  try {
    const cuboid::Cluster c = cuboid::cluster_from_json(*j, cuboid::fuzz::kSource, base);
    const cuboid::Topology topology(c);
    (void)topology;
  } catch (const cuboid::InputError&) {
  }
  return 0;
}
