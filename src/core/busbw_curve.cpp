// Size-dependent bus bandwidth curves (busbw_curve.hpp).
#include "cuboid/core/busbw_curve.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid {

namespace {

constexpr double kNsPerS = 1e9;
constexpr double kBytesPerGB = 1e9;

std::string bytes_text(double b) { return fmt::format("{:.15g}", b); }

}  // namespace

// Samples hold all-reduce times on `ranks` GPUs, so busbw = factor x S / t.
double curve_busbw_GBps(const BusbwCurve& curve, double size_bytes) {
  const std::vector<SizeSample>& s = curve.samples;
  if (s.empty()) return 0.0;
  const double factor = bus_factor(Collective::all_reduce, curve.ranks);
  const SizeSample& at = size_bytes <= s.front().bytes ? s.front() : s.back();
  if (size_bytes <= s.front().bytes || size_bytes >= s.back().bytes) return factor * at.bytes / at.time_ns;
  const double t_ns = interpolate_samples(s, size_bytes).value_or(at.time_ns);
  return factor * size_bytes / t_ns;
}

std::optional<double> curve_time_ns(const BusbwCurve& curve, Collective c, int group_size, double size_bytes) {
  if (c != Collective::all_reduce && c != Collective::reduce_scatter && c != Collective::all_gather) {
    return std::nullopt;
  }
  if (group_size <= 1 || !(size_bytes > 0) || curve.samples.empty()) return std::nullopt;
  const double equivalent_bytes = size_bytes * curve.ranks / group_size;
  return bus_factor(c, group_size) * size_bytes / curve_busbw_GBps(curve, equivalent_bytes);
}

BusbwCurve busbw_curve_from_json(const nlohmann::json& j, const std::string& source, const std::string& field) {
  if (!j.is_object()) {
    throw InputError(source, field, "expected an object with ranks, source and points",
                     "give {\"ranks\": 8, \"source\": \"...\", \"points\": [{\"size_bytes\": ..., "
                     "\"busbw_GBps\": ...}, ...]}");
  }
  JsonReader r(j, source, field);
  BusbwCurve curve;
  if (!r.has("source")) {
    r.fail("source", "missing: a curve is a measurement and must say where it was read",
           "give the nccl-tests run it comes from (URL, NCCL version, command)");
  }
  curve.source = r.string("source");
  const std::int64_t ranks = r.positive_integer("ranks");
  if (ranks < 2 || ranks > 1'000'000) {
    r.fail("ranks", "must be between 2 and 1000000, got " + std::to_string(ranks),
           "give the number of GPUs of the measured all_reduce_perf run");
  }
  curve.ranks = static_cast<int>(ranks);
  const nlohmann::json& points = r.raw("points");
  if (!points.is_array() || points.size() < 2) {
    r.fail("points", "needs an array of at least 2 points",
           "give the out-of-place rows of the run as {\"size_bytes\": ..., \"busbw_GBps\": ...}");
  }
  const double factor = bus_factor(Collective::all_reduce, curve.ranks);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::string f = field + ".points[" + std::to_string(i) + "]";
    if (!points[i].is_object()) {
      throw InputError(source, f, "expected an object", "give {\"size_bytes\": ..., \"busbw_GBps\": ...}");
    }
    JsonReader p(points[i], source, f);
    const double size = p.positive_number("size_bytes");
    const double busbw = p.positive_number("busbw_GBps");
    p.reject_unknown({"note"});
    if (!curve.samples.empty() && !(size > curve.samples.back().bytes)) {
      p.fail("size_bytes",
             "sizes must increase, but " + bytes_text(size) + " follows " + bytes_text(curve.samples.back().bytes),
             "list the points in increasing size, one per size");
    }
    // Stored as the all-reduce's time so that interpolate_samples applies.
    curve.samples.push_back(SizeSample{size, factor * size / (busbw * kBytesPerGB) * kNsPerS});
  }
  r.reject_unknown({"unit", "note", "notes", "command", "nccl_version"});
  return curve;
}

}  // namespace cuboid
