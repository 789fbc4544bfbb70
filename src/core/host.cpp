// The host record: /proc/cpuinfo and /sys, every field optional.
#include "cuboid/core/host.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"

namespace cuboid {

namespace {

std::optional<std::string> first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.empty()) return std::nullopt;
  return line;
}

// sysfs cache sizes: "48K", "2048K", "32M".
std::optional<std::int64_t> size_bytes(const std::string& s) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (v <= 0) return std::nullopt;
  const std::string unit = s.substr(used);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return std::nullopt;
}

// "0-3,6,8-9" -> 7
std::optional<int> count_cpus(const std::string& list) {
  int n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      const std::size_t dash = part.find('-');
      if (dash == std::string::npos) {
        (void)std::stoi(part);
        ++n;
      } else {
        const int lo = std::stoi(part.substr(0, dash)), hi = std::stoi(part.substr(dash + 1));
        if (hi < lo) return std::nullopt;
        n += hi - lo + 1;
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (n <= 0) return std::nullopt;
  return n;
}

}  // namespace

HostInfo read_host_info(const std::string& root) {
  const std::filesystem::path r(root);
  HostInfo h;
  {
    std::ifstream in(r / "proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) != 0) continue;
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      if (!v.empty()) h.cpu_model = v;
      break;
    }
  }
  const std::filesystem::path cpu = r / "sys/devices/system/cpu";
  if (const auto online = first_line(cpu / "online")) h.cpus_online = count_cpus(*online);
  h.governor = first_line(cpu / "cpu0/cpufreq/scaling_governor");
  std::error_code ec;
  for (int i = 0; i < 16; ++i) {
    const std::filesystem::path idx = cpu / "cpu0/cache" / ("index" + std::to_string(i));
    if (!std::filesystem::exists(idx, ec)) break;
    const auto level = first_line(idx / "level"), type = first_line(idx / "type"), size = first_line(idx / "size");
    if (!level || !type || !size) continue;
    const std::optional<std::int64_t> bytes = size_bytes(*size);
    if (!bytes) continue;
    if (*level == "1" && *type == "Data") h.l1d_bytes = bytes;
    if (*level == "2" && *type != "Instruction") h.l2_bytes = bytes;
    if (*level == "3" && *type != "Instruction") h.l3_bytes = bytes;
  }
  return h;
}

nlohmann::json host_to_json(const HostInfo& h) {
  nlohmann::json j = nlohmann::json::object();
  if (h.cpu_model) j["cpu_model"] = *h.cpu_model;
  if (h.l1d_bytes) j["l1d_bytes"] = *h.l1d_bytes;
  if (h.l2_bytes) j["l2_bytes"] = *h.l2_bytes;
  if (h.l3_bytes) j["l3_bytes"] = *h.l3_bytes;
  if (h.cpus_online) j["cpus_online"] = *h.cpus_online;
  if (h.governor) j["governor"] = *h.governor;
  return j;
}

HostInfo host_from_json(const nlohmann::json& j, const std::string& source, const std::string& field) {
  const std::string fix = "give the host record `cuboid run` or `cuboid calibrate` writes, or leave it out";
  if (!j.is_object()) throw InputError(source, field, "expected an object, got " + std::string(j.type_name()), fix);
  HostInfo h;
  auto text = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key)) return std::nullopt;
    if (!j[key].is_string()) throw InputError(source, field + "." + key, "expected a string", fix);
    return j[key].get<std::string>();
  };
  auto count = [&](const char* key) -> std::optional<std::int64_t> {
    if (!j.contains(key)) return std::nullopt;
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 || v.get<std::int64_t>() > (std::int64_t{1} << 50))
      throw InputError(source, field + "." + key, "expected a positive integer", fix);
    return v.get<std::int64_t>();
  };
  for (const auto& [key, v] : j.items()) {
    static const std::vector<std::string> known{"cpu_model", "l1d_bytes", "l2_bytes", "l3_bytes", "cpus_online",
                                                "governor"};
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw InputError(source, field + "." + key, "unknown field", fix);
  }
  h.cpu_model = text("cpu_model");
  h.l1d_bytes = count("l1d_bytes");
  h.l2_bytes = count("l2_bytes");
  h.l3_bytes = count("l3_bytes");
  if (const auto n = count("cpus_online")) {
    if (*n > 1'000'000) throw InputError(source, field + ".cpus_online", "expected a positive integer", fix);
    h.cpus_online = static_cast<int>(*n);
  }
  h.governor = text("governor");
  return h;
}

std::string host_differences(const HostInfo& a, const HostInfo& b) {
  std::string out;
  auto add = [&](const char* name, const auto& x, const auto& y) {
    if (!x || !y || *x == *y) return;
    out += fmt::format("{}{} '{}' vs '{}'", out.empty() ? "" : "; ", name, *x, *y);
  };
  add("cpu_model", a.cpu_model, b.cpu_model);
  add("l1d_bytes", a.l1d_bytes, b.l1d_bytes);
  add("l2_bytes", a.l2_bytes, b.l2_bytes);
  add("l3_bytes", a.l3_bytes, b.l3_bytes);
  add("cpus_online", a.cpus_online, b.cpus_online);
  add("governor", a.governor, b.governor);
  return out;
}

}  // namespace cuboid
