// Turns for ranks that share cores, and the share the calibration records.
#include "cuboid/calibrate/core_share.hpp"

#include <sched.h>

#include <algorithm>

#include <fmt/format.h>

namespace cuboid::calibrate {

CoreShare core_share(const std::vector<std::string>& places, int rank, int ranks_on_node, int cpus_online,
                     bool cpu_backend) {
  CoreShare share;
  if (!cpu_backend || places.empty() || rank < 0 || static_cast<std::size_t>(rank) >= places.size()) return share;
  for (const std::string& place : places)
    share.turns = std::max(share.turns, static_cast<int>(std::count(places.begin(), places.end(), place)));
  share.turn = static_cast<int>(std::count(places.begin(), places.begin() + rank, places[static_cast<std::size_t>(rank)]));
  if (cpus_online > 0 && ranks_on_node > cpus_online)
    share.ranks_per_core = static_cast<double>(ranks_on_node) / static_cast<double>(cpus_online);
  return share;
}

std::string cpu_place(const std::string& hostname) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return hostname + " cpus ?";
  // Runs of consecutive CPUs as "a-b", joined by commas.
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!cpus.empty()) cpus += ',';
    cpus += last == c ? fmt::format("{}", c) : fmt::format("{}-{}", c, last);
    c = last;
  }
  return hostname + " cpus " + cpus;
}

}  // namespace cuboid::calibrate
