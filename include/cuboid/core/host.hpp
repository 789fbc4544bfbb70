#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// The host a measurement was taken on: CPU model, cache sizes, online CPUs and
// the frequency governor, read from /proc/cpuinfo and /sys on Linux. Recorded
// by `cuboid run --out` (environment.host) and `cuboid calibrate`
// (calibration.host) so that `cuboid validate` can warn when a card and a
// measurements file come from different machines. A field that cannot be read
// is left out, never guessed; every field is optional when reading.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace cuboid {

struct HostInfo {
  std::optional<std::string> cpu_model;           // /proc/cpuinfo "model name"
  std::optional<std::int64_t> l1d_bytes, l2_bytes, l3_bytes;  // cpu0's caches (/sys/.../cache/index*)
  std::optional<int> cpus_online;                 // /sys/devices/system/cpu/online
  std::optional<std::string> governor;            // cpu0's cpufreq scaling_governor

  bool empty() const { return !cpu_model && !l1d_bytes && !l2_bytes && !l3_bytes && !cpus_online && !governor; }
  bool operator==(const HostInfo&) const = default;
};

// The host this process runs on. `root` replaces "/" (tests read a fake tree).
HostInfo read_host_info(const std::string& root = "/");

// {"cpu_model": ..., "l1d_bytes": ..., ...}: only the fields that were read.
nlohmann::json host_to_json(const HostInfo& h);
// Strict on what is there (InputError naming source and field), lenient on
// what is not.
HostInfo host_from_json(const nlohmann::json& j, const std::string& source, const std::string& field);

// The fields that both hosts record and that differ, as "cpu_model 'A' vs 'B'",
// joined by "; " (empty when they agree on every field both have).
std::string host_differences(const HostInfo& a, const HostInfo& b);

}  // namespace cuboid
