// Calibration fits and lookups (calibration.hpp). The JSON form is in
// calibration_json.cpp.
#include "cuboid/core/calibration.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "cuboid/core/error.hpp"

namespace cuboid {

namespace {

constexpr double kNsPerUs = 1e3;
// How far a median may fall below the slowest median at a smaller size before
// the series counts as non-monotonic. Small sizes are latency-bound, so their
// medians scatter by ~10 % on a shared machine; a larger drop means the data
// is wrong (sizes and times mismatched, a cached or skipped run), not noisy.
constexpr double kMonotonicNoiseFraction = 0.25;
constexpr int kGemmDims = 4;  // m, n, k, batch

std::string us(double ns) { return fmt::format("{:.6g} us", ns / kNsPerUs); }

std::string sample_field(const std::string& field, std::size_t i, const char* key) {
  return field + ".samples[" + std::to_string(i) + "]." + key;
}

// Finite, positive sizes and times: checked before sorting (NaN has no order)
// so that errors name the caller's sample index.
void check_samples(const std::vector<SizeSample>& samples, const std::string& source, const std::string& field,
                   const char* size_key) {
  if (samples.size() < 2) {
    throw InputError(source, field + ".samples",
                     "needs at least 2 samples to fit latency and bandwidth, got " + std::to_string(samples.size()),
                     "measure at least 2 different sizes");
  }
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const SizeSample& s = samples[i];
    if (!std::isfinite(s.bytes) || s.bytes <= 0) {
      throw InputError(source, sample_field(field, i, size_key),
                       "must be a positive finite byte count, got " + fmt::format("{:.15g}", s.bytes),
                       "record the size the benchmark ran with");
    }
    if (!std::isfinite(s.time_ns)) {
      throw InputError(source, sample_field(field, i, "time_us"), "is not finite",
                       "re-run the measurement: a timer or the benchmark failed");
    }
    if (s.time_ns <= 0) {
      throw InputError(source, sample_field(field, i, "time_us"), "must be positive, got " + us(s.time_ns),
                       "re-run the measurement: a timer or the benchmark failed");
    }
  }
}

void sort_by_size(std::vector<SizeSample>& samples) {
  std::stable_sort(samples.begin(), samples.end(),
                   [](const SizeSample& a, const SizeSample& b) { return a.bytes < b.bytes; });
}

// Times sorted by size must not fall (beyond noise) as the size grows.
void check_monotonic(const std::vector<SizeSample>& sorted, const std::string& source, const std::string& field,
                     const char* size_key) {
  std::size_t slowest = 0;
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    const SizeSample& s = sorted[i];
    const SizeSample& ref = sorted[slowest];
    if (s.bytes > ref.bytes && s.time_ns < (1.0 - kMonotonicNoiseFraction) * ref.time_ns) {
      throw InputError(source, sample_field(field, i, "time_us"),
                       us(s.time_ns) + " at " + fmt::format("{:.15g}", s.bytes) + " bytes is more than " +
                           fmt::format("{:g}", kMonotonicNoiseFraction * 100) + " % below " + us(ref.time_ns) +
                           " at a smaller " + size_key + " (" + fmt::format("{:.15g}", ref.bytes) +
                           " bytes): times must not fall as the size grows",
                       "re-run the measurement with more repetitions (medians), or check the sizes recorded");
    }
    if (s.time_ns > ref.time_ns) slowest = i;
  }
}

}  // namespace

// Weighted least squares with weights 1 / t_i^2 minimises the sum of squared
// relative errors, so a 1 KiB sample (latency) counts as much as a 256 MiB
// one (bandwidth). Computed around the weighted means for numerical safety
// (sizes span 1e3..1e9 bytes).
LinearFit fit_linear(const std::vector<SizeSample>& samples, const std::string& source, const std::string& field) {
  check_samples(samples, source, field, "bytes");
  bool distinct = false;
  for (const SizeSample& s : samples) distinct = distinct || s.bytes != samples.front().bytes;
  if (!distinct) {
    throw InputError(source, field + ".samples",
                     "all " + std::to_string(samples.size()) + " samples have the same size (" +
                         fmt::format("{:.15g}", samples.front().bytes) + " bytes)",
                     "measure at least 2 different sizes");
  }
  double sw = 0, swx = 0, swt = 0;
  for (const SizeSample& s : samples) {
    const double w = 1.0 / (s.time_ns * s.time_ns);
    sw += w;
    swx += w * s.bytes;
    swt += w * s.time_ns;
  }
  const double xm = swx / sw;
  const double tm = swt / sw;
  double sxx = 0, sxt = 0;
  for (const SizeSample& s : samples) {
    const double w = 1.0 / (s.time_ns * s.time_ns);
    sxx += w * (s.bytes - xm) * (s.bytes - xm);
    sxt += w * (s.bytes - xm) * (s.time_ns - tm);
  }
  LinearFit fit;
  fit.ns_per_byte = sxt / sxx;
  fit.alpha_ns = tm - fit.ns_per_byte * xm;
  if (fit.alpha_ns < 0) {
    // A latency below zero is noise at the small sizes: refit through the
    // origin (minimising the same relative error).
    double num = 0, den = 0;
    for (const SizeSample& s : samples) {
      num += s.bytes / s.time_ns;
      den += (s.bytes / s.time_ns) * (s.bytes / s.time_ns);
    }
    fit.alpha_ns = 0;
    fit.ns_per_byte = num / den;
  }
  if (!(fit.ns_per_byte > 0) || !std::isfinite(fit.ns_per_byte)) {
    throw InputError(source, field,
                     "the fitted time does not grow with the size (slope " + fmt::format("{:.6g}", fit.ns_per_byte) +
                         " ns per byte)",
                     "check the samples: times must grow with the size; re-run the measurement over a wider "
                     "size range");
  }
  double sum_sq = 0;
  fit.residuals.reserve(samples.size());
  for (const SizeSample& s : samples) {
    const double r = (fit.time_ns(s.bytes) - s.time_ns) / s.time_ns;
    fit.residuals.push_back(r);
    sum_sq += r * r;
    fit.max_abs_residual = std::max(fit.max_abs_residual, std::fabs(r));
  }
  fit.rms_residual = std::sqrt(sum_sq / static_cast<double>(samples.size()));
  return fit;
}

CollectiveCalibration fit_collective(Collective c, int group_size, std::vector<SizeSample> samples,
                                     const std::string& source, const std::string& field) {
  if (group_size < 2) {
    throw InputError(source, field + ".group_size", "must be at least 2, got " + std::to_string(group_size),
                     "a collective needs 2 or more ranks");
  }
  if (c == Collective::send_recv && group_size != 2) {
    throw InputError(source, field + ".group_size", "send_recv is between 2 ranks, got " + std::to_string(group_size),
                     "set group_size to 2");
  }
  check_samples(samples, source, field, "size_bytes");
  sort_by_size(samples);
  check_monotonic(samples, source, field, "size");
  // Fit on the bus bytes (size x bus factor) so that the slope is 1 / busbw.
  const double factor = bus_factor(c, group_size);
  std::vector<SizeSample> bus = samples;
  for (SizeSample& s : bus) s.bytes *= factor;
  CollectiveCalibration cc;
  cc.fit = fit_linear(bus, source, field);
  cc.samples = std::move(samples);
  cc.alpha_ns = cc.fit.alpha_ns;
  cc.busbw_GBps = 1.0 / cc.fit.ns_per_byte;  // bytes per ns = GB/s
  return cc;
}

KernelCalibration fit_kernel(std::vector<SizeSample> samples, const std::string& source, const std::string& field) {
  check_samples(samples, source, field, "bytes");
  sort_by_size(samples);
  check_monotonic(samples, source, field, "size");
  KernelCalibration kc;
  kc.fit = fit_linear(samples, source, field);
  kc.samples = std::move(samples);
  return kc;
}

namespace {

double gemm_flops(const GemmSample& g) {
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
         static_cast<double>(g.batch);
}

std::array<double, kGemmDims> log_shape(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  return {std::log(static_cast<double>(m)), std::log(static_cast<double>(n)), std::log(static_cast<double>(k)),
          std::log(static_cast<double>(batch))};
}

}  // namespace

// Interpolation among scattered measured shapes (a sweep is the plans' own
// shapes plus a grid around them, not a full tensor grid, so multilinear
// interpolation on a grid would not apply). Around the query, in log space,
// each of the 2^4 orthants (below / above in m, n, k, batch; a sample equal
// in a dimension counts on both sides) must hold a measured shape, else the
// query is outside the measured range and the roofline prices it: nothing
// is ever extrapolated. The nearest shape of each orthant then contributes
// log(achieved FLOP/s) with weight 1 / distance; between two shapes that
// differ in one dimension this is exactly linear interpolation in log space.
std::optional<double> measured_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n, std::int64_t k,
                                       std::int64_t batch, GemmFormat format) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0 || cal.gemms.empty()) return std::nullopt;
  for (const GemmSample& g : cal.gemms) {
    if (g.format == format && g.m == m && g.n == n && g.k == k && g.batch == batch) return g.time_ns;
  }
  constexpr std::size_t kOrthants = std::size_t{1} << kGemmDims;
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::array<std::size_t, kOrthants> nearest;
  nearest.fill(kNone);
  std::array<double, kOrthants> best_d2;
  best_d2.fill(std::numeric_limits<double>::infinity());
  const auto q = log_shape(m, n, k, batch);
  const std::array<std::int64_t, kGemmDims> qi{m, n, k, batch};
  for (std::size_t s = 0; s < cal.gemms.size(); ++s) {
    const GemmSample& g = cal.gemms[s];
    if (g.format != format) continue;
    const std::array<std::int64_t, kGemmDims> gi{g.m, g.n, g.k, g.batch};
    const auto p = log_shape(g.m, g.n, g.k, g.batch);
    double d2 = 0;
    for (int d = 0; d < kGemmDims; ++d) d2 += (p[d] - q[d]) * (p[d] - q[d]);
    for (std::size_t o = 0; o < kOrthants; ++o) {
      bool inside = true;
      for (int d = 0; d < kGemmDims && inside; ++d) {
        const bool above = (o >> d & 1U) != 0;
        inside = gi[d] == qi[d] || (above ? gi[d] > qi[d] : gi[d] < qi[d]);
      }
      if (inside && d2 < best_d2[o]) {
        best_d2[o] = d2;
        nearest[o] = s;
      }
    }
  }
  std::array<std::size_t, kOrthants> used{};
  std::size_t n_used = 0;
  for (std::size_t o = 0; o < kOrthants; ++o) {
    if (nearest[o] == kNone) return std::nullopt;
    if (std::find(used.begin(), used.begin() + static_cast<std::ptrdiff_t>(n_used), nearest[o]) ==
        used.begin() + static_cast<std::ptrdiff_t>(n_used)) {
      used[n_used++] = nearest[o];
    }
  }
  double sum_w = 0, sum_wv = 0;
  for (std::size_t i = 0; i < n_used; ++i) {
    const GemmSample& g = cal.gemms[used[i]];
    const auto p = log_shape(g.m, g.n, g.k, g.batch);
    double d2 = 0;
    for (int d = 0; d < kGemmDims; ++d) d2 += (p[d] - q[d]) * (p[d] - q[d]);
    const double w = 1.0 / std::sqrt(d2);  // d2 > 0: the exact hit returned above
    sum_w += w;
    sum_wv += w * std::log(gemm_flops(g) / g.time_ns);
  }
  const GemmSample query{m, n, k, batch, 0.0};
  return gemm_flops(query) / std::exp(sum_wv / sum_w);
}

std::optional<double> calibrated_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n, std::int64_t k,
                                         std::int64_t batch, GemmFormat format) {
  const auto ns = measured_gemm_ns(cal, m, n, k, batch, format);
  if (!ns) return std::nullopt;
  return *ns * cal.ranks_per_core;
}

std::string grouped_kernel_name(const std::string& op_name, std::int64_t local_experts) {
  return fmt::format("{}@{}", op_name, local_experts);
}

std::optional<double> held_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n, std::int64_t k,
                                   std::int64_t batch, GemmFormat format) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0 || measured_gemm_ns(cal, m, n, k, batch, format)) return std::nullopt;
  std::set<std::int64_t, std::greater<>> smaller;
  for (const GemmSample& g : cal.gemms)
    if (g.format == format && g.m < m) smaller.insert(g.m);
  for (const std::int64_t held : smaller) {
    if (const auto ns = measured_gemm_ns(cal, held, n, k, batch, format))
      return *ns * (static_cast<double>(m) / static_cast<double>(held)) * cal.ranks_per_core;
  }
  return std::nullopt;
}

std::optional<double> best_gemm_flops_per_s(const Calibration& cal, GemmFormat format) {
  double best = 0;
  for (const GemmSample& g : cal.gemms)
    if (g.format == format) best = std::max(best, gemm_flops(g) / g.time_ns * 1e9);
  if (!(best > 0)) return std::nullopt;
  return best / cal.ranks_per_core;
}

// Pool adjacent violators with equal weights: each block holds the mean of
// its samples; a block lower than its left neighbour merges into it.
int make_monotone(std::vector<SizeSample>& sorted) {
  struct Block {
    double sum = 0;
    std::size_t count = 0;
    double mean() const { return sum / static_cast<double>(count); }
  };
  std::vector<Block> blocks;
  for (const SizeSample& s : sorted) {
    blocks.push_back(Block{s.time_ns, 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() > blocks.back().mean()) {
      const Block last = blocks.back();
      blocks.pop_back();
      blocks.back().sum += last.sum;
      blocks.back().count += last.count;
    }
  }
  int changed = 0;
  std::size_t i = 0;
  for (const Block& b : blocks) {
    for (std::size_t j = 0; j < b.count; ++j, ++i) {
      if (b.count > 1 && sorted[i].time_ns != b.mean()) {
        sorted[i].time_ns = b.mean();
        ++changed;
      }
    }
  }
  return changed;
}

std::optional<double> interpolate_samples(const std::vector<SizeSample>& sorted, double bytes) {
  if (sorted.empty() || !(bytes >= sorted.front().bytes) || !(bytes <= sorted.back().bytes)) return std::nullopt;
  // Equal sizes (allowed in a stored series) count as their mean time.
  auto mean_at = [&](std::size_t i, std::size_t& next) {
    double sum = 0;
    std::size_t j = i;
    for (; j < sorted.size() && sorted[j].bytes == sorted[i].bytes; ++j) sum += sorted[j].time_ns;
    next = j;
    return sum / static_cast<double>(j - i);
  };
  std::size_t i = 0, next = 0;
  double t0 = mean_at(0, next);
  while (next < sorted.size() && sorted[next].bytes <= bytes) {
    i = next;
    t0 = mean_at(i, next);
  }
  const double x0 = sorted[i].bytes;
  if (bytes == x0 || next >= sorted.size()) return t0;
  std::size_t after = 0;
  const double x1 = sorted[next].bytes;
  const double t1 = mean_at(next, after);
  const double f = std::log(bytes / x0) / std::log(x1 / x0);
  return std::exp(std::log(t0) + f * (std::log(t1) - std::log(t0)));
}

double activation_bytes_scale(const Calibration* cal) {
  return cal == nullptr ? 1.0 : static_cast<double>(cal->activation_bytes_per_element) / 2.0;
}

double comm_size_bytes(const Op& op, const Calibration* cal) {
  return op.compute_dtype ? op.comm_bytes * activation_bytes_scale(cal) : op.comm_bytes;
}

std::optional<double> measured_kernel_ns(const Calibration& cal, const std::string& op_name, double bytes) {
  const auto it = cal.kernels.find(op_name);
  if (it == cal.kernels.end()) return std::nullopt;
  if (const auto t = interpolate_samples(it->second.samples, bytes)) return t;
  return it->second.fit.time_ns(bytes);
}

std::optional<double> calibrated_kernel_ns(const Calibration& cal, const std::string& op_name, double bytes) {
  const auto ns = measured_kernel_ns(cal, op_name, bytes);
  if (!ns) return std::nullopt;
  return *ns * cal.ranks_per_core;
}

double collective_curve_ns(const CollectiveCalibration& cc, Collective c, int group_size, double size_bytes) {
  if (const auto t = interpolate_samples(cc.samples, size_bytes)) return *t;
  return cc.fit.time_ns(size_bytes * bus_factor(c, group_size));
}

std::optional<double> calibrated_collective_ns(const Calibration& cal, Collective c, const std::string& tier,
                                               int group_size, double size_bytes, bool cold) {
  const CollectiveCalibration* cc = find_collective(cal, c, tier, group_size, cold);
  if (cc == nullptr) return std::nullopt;
  return collective_curve_ns(*cc, c, group_size, size_bytes);
}

const CollectiveCalibration* find_collective(const Calibration& cal, Collective c, const std::string& tier,
                                             int group_size, bool cold) {
  for (const bool state : {cold, !cold}) {
    const auto it = cal.collectives.find(CollectiveKey{c, tier, group_size, state});
    if (it != cal.collectives.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace cuboid

namespace cuboid {

Calibration operand_pool_view(const Calibration& cal, std::size_t i) {
  const OperandPoolTables& pool = cal.other_pools.at(i);
  Calibration view = cal;
  view.other_pools.clear();
  view.gemm_operand_pool_bytes = pool.gemm_operand_pool_bytes;
  view.gemms = pool.gemms;
  std::map<std::string, KernelCalibration> kernels = pool.kernels;
  kernels.insert(cal.kernels.begin(), cal.kernels.end());  // keeps the pool's own where both have one
  view.kernels = std::move(kernels);
  return view;
}

}  // namespace cuboid
