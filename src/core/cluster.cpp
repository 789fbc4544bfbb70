#include "cuboid/core/cluster.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <limits>
#include <vector>
#include <string>
#include <string_view>

#include "cuboid/core/busbw_curve.hpp"
#include "cuboid/core/calibration.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/core/plan.hpp"

namespace cuboid {

namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kNsPerUs = 1e3;

std::string show_number(double v) {
  std::string s = std::to_string(v);
  // std::to_string gives 6 decimals; trim the zeros so messages read "0.5", not "0.500000".
  if (s.find('.') != std::string::npos) {
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  return s;
}

// A sourced constant whose source is kept under `field` (the struct member's name).
double sourced(JsonReader& r, std::string_view key, std::map<std::string, std::string>& sources,
               const std::string& field) {
  std::string source;
  const double v = r.sourced_positive_number(key, &source);
  if (!source.empty()) sources[field] = source;
  return v;
}

// A fraction in (0, 1] (efficiencies).
double sourced_fraction(JsonReader& r, std::string_view key, std::map<std::string, std::string>& sources,
                        const std::string& field) {
  const double v = sourced(r, key, sources, field);
  if (v > 1.0) r.fail(key, "must be at most 1, got " + show_number(v), "give a fraction in (0, 1]");
  return v;
}

// The largest count a card gives (nodes, GPUs, NICs, channels): far beyond
// any cluster, and far inside int.
constexpr std::int64_t kMaxCount = 1'000'000'000;

// A positive integer, bare or sourced ({"value": 8, "source": "..."}).
int sourced_count(JsonReader& r, std::string_view key, std::map<std::string, std::string>& sources,
                  const std::string& field) {
  if (!r.is_object(key)) return r.count<int>(key, 1, kMaxCount);
  const double v = sourced(r, key, sources, field);
  if (v != std::floor(v) || v > kMaxCount) r.fail(key, "expected a whole number, got " + show_number(v), "give an integer");
  return static_cast<int>(v);
}

// A non-negative integer, bare or sourced; absent -> fallback.
int optional_count(JsonReader& r, std::string_view key, std::map<std::string, std::string>& sources,
                   const std::string& field, int fallback) {
  if (!r.has(key)) {
    (void)r.optional_number(key);  // marks an explicit null as read
    return fallback;
  }
  if (r.is_object(key)) return sourced_count(r, key, sources, field);
  return r.count<int>(key, 0, kMaxCount);
}

// A non-negative number, bare or sourced, at most `max` (a fraction's 1, a
// rate's infinity); absent -> 0.
double optional_sourced_fraction(JsonReader& r, std::string_view key, std::map<std::string, std::string>& sources,
                                 const std::string& field, double max) {
  if (!r.has(key)) {
    (void)r.optional_number(key);  // marks an explicit null as read
    return 0;
  }
  double v = 0;
  if (r.is_object(key)) {
    JsonReader inner = r.object(key);
    v = inner.number("value");
    if (const auto src = inner.optional_string("source")) sources[field] = *src;
    inner.reject_unknown({"unit", "note", "notes"});
  } else {
    v = r.number(key);
  }
  if (v < 0) r.fail(key, "must not be negative, got " + show_number(v), "give a value >= 0 (0: off)");
  if (v > max)
    r.fail(key, "must be at most " + show_number(max) + ", got " + show_number(v),
           "give a value in [0, " + show_number(max) + "]");
  return v;
}

// Unknown keys are checked before any field is read, so that a misspelt
// required field reads "unknown field ... did you mean", not "missing".
void check_keys(const nlohmann::json& j, const JsonReader& r, std::initializer_list<std::string_view> known) {
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (key.rfind('_', 0) == 0 || key == "source" || key == "description" || key == "notes") continue;
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const auto best = closest_field(key, std::span<const std::string_view>(known.begin(), known.size()), 3);
    const std::string fix = !best ? "remove it or check its spelling (see the README's card schema)"
                                  : "remove it or check its spelling (did you mean \"" + std::string(*best) + "\"?)";
    r.fail(key, "unknown field", fix);
  }
}

std::int64_t memory_bytes(JsonReader& r, GpuProfile& gpu) {
  struct Unit {
    std::string_view key;
    double bytes;
  };
  // GB (1e9 B) is the datasheet unit ("80 GB"); MiB is what nvidia-smi reports.
  constexpr Unit units[] = {{"memory_MiB", kMiB}, {"memory_GiB", kGiB}, {"memory_GB", kGiga}};
  const Unit* found = nullptr;
  for (const Unit& u : units) {
    if (!r.has(u.key)) continue;
    if (found != nullptr) {
      r.fail(u.key, "given together with " + std::string(found->key),
             "give exactly one of memory_MiB, memory_GiB, memory_GB");
    }
    found = &u;
  }
  if (found == nullptr) {
    r.fail("memory_MiB", "missing required field (the GPU's memory capacity)",
           "give exactly one of memory_MiB, memory_GiB, memory_GB");
  }
  const double v = sourced(r, found->key, gpu.sources, "memory_bytes");
  return static_cast<std::int64_t>(std::llround(v * found->bytes));
}

// A row of fractions of peak, one per sequence length.
std::vector<double> rate_row(JsonReader& k, const nlohmann::json& row, const std::string& at, std::size_t n) {
  if (!row.is_array() || row.size() != n)
    k.fail(at, "expected " + std::to_string(n) + " fractions of peak (one per seq_length), got " + row.dump().substr(0, 40),
           "give one fraction in (0, 1] per sequence length");
  std::vector<double> out;
  for (std::size_t i = 0; i < n; ++i) {
    if (!row[i].is_number() || row[i].get<double>() <= 0 || row[i].get<double>() > 1)
      k.fail(at + "[" + std::to_string(i) + "]", "must be a fraction in (0, 1], got " + row[i].dump().substr(0, 40),
             "give the published TFLOP/s over the GPU's peak");
    out.push_back(row[i].get<double>());
  }
  return out;
}

// An ascending list of positive integers (head dimensions, sequence lengths).
std::vector<std::int64_t> ascending(JsonReader& k, std::string_view key) {
  const nlohmann::json& v = k.raw(key);
  if (!v.is_array() || v.empty()) k.fail(key, "expected a non-empty array, got " + v.dump().substr(0, 40), "give e.g. [64, 128]");
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = std::string(key) + "[" + std::to_string(i) + "]";
    if (!v[i].is_number_integer() || v[i].get<std::int64_t>() <= 0)
      k.fail(at, "expected a positive integer, got " + v[i].dump().substr(0, 40), "give positive integers");
    if (!out.empty() && v[i].get<std::int64_t>() <= out.back())
      k.fail(at, "must ascend without repeats", "list each value once, smallest first");
    out.push_back(v[i].get<std::int64_t>());
  }
  return out;
}

// One kernel's rates: {"head_dim": [...], "seq_length": [...], "fwd":
// [[...]], "bwd": [[...]], "source": "..."}, each row's fractions of the
// format's peak, and its source in `source`. The caller rejects unknown keys.
AttentionRates read_attention_rates(JsonReader& k, std::string& source) {
  source = k.string("source");
  if (source.find_first_not_of(' ') == std::string::npos)
    k.fail("source", "is empty", "name the paper or page and the figure the rates were read from");
  AttentionRates rates;
  for (std::int64_t d : ascending(k, "head_dim")) rates.head_dims.push_back(static_cast<int>(d));
  rates.seq_lengths = ascending(k, "seq_length");
  for (const char* pass : {"fwd", "bwd"}) {
    const nlohmann::json& rows = k.raw(pass);
    if (!rows.is_array() || rows.size() != rates.head_dims.size())
      k.fail(pass, "expected " + std::to_string(rates.head_dims.size()) + " rows (one per head_dim)",
             "give one row of fractions per head dimension");
    auto& out = std::string_view(pass) == "fwd" ? rates.fwd : rates.bwd;
    for (std::size_t i = 0; i < rows.size(); ++i)
      out.push_back(rate_row(k, rows[i], std::string(pass) + "[" + std::to_string(i) + "]", rates.seq_lengths.size()));
  }
  return rates;
}

// "attention_kernels": {"flash2": {"head_dim": [...], "seq_length": [...],
// "fwd": [[...]], "bwd": [[...]], "source": "..."}, ...}; cuDNN's may hold
// its FP8 rates by format: "cudnn": {..., "fp8": {...}, "mxfp8": {...}}.
void read_attention_kernels(JsonReader& r, GpuProfile& gpu) {
  JsonReader table = r.object("attention_kernels");
  for (const auto& item : r.raw("attention_kernels").items()) {
    const std::string& name = item.key();
    if (name.rfind('_', 0) == 0) continue;
    const AttentionKernel kernel = parse_attention_kernel(name, r.source(), r.field_path("attention_kernels") + "." + name);
    if (kernel == AttentionKernel::auto_ || kernel == AttentionKernel::unfused)
      table.fail(name, "is not a fused kernel", "give rates for flash1, flash2, flash3 or cudnn");
    JsonReader k = table.object(name);
    if (kernel != AttentionKernel::cudnn)
      for (const char* format : {"fp8", "mxfp8"})
        if (k.has(format))
          k.fail(format, "is given for " + name + ", but only cuDNN's fused attention runs in FP8 (Transformer "
                         "Engine's FusedAttention FP8 backend)", "move the FP8 rates under cudnn");
    std::string source;
    gpu.attention_rates[kernel] = read_attention_rates(k, source);
    gpu.sources["attention_kernels." + name] = source;
    for (const Fp8AttentionFormat format : {Fp8AttentionFormat::per_tensor, Fp8AttentionFormat::mxfp8}) {
      const std::string key(card_key(format));
      if (!k.has(key)) continue;
      JsonReader f = k.object(key);
      gpu.fp8_attention_rates[format] = read_attention_rates(f, source);
      f.reject_unknown({"unit", "note"});
      gpu.sources["attention_kernels." + name + "." + key] = source;
    }
    k.reject_unknown({"unit", "note"});
  }
}

// "mxfp8_gemm_rate": {"fprop": f, "dgrad": f, "wgrad": f, "source": "..."}:
// an MXFP8 GEMM's rate over a per-tensor FP8 GEMM's at the same shape, per pass.
void read_mxfp8_gemm_rate(JsonReader& r, GpuProfile& gpu) {
  JsonReader k = r.object("mxfp8_gemm_rate");
  const std::string source = k.string("source");
  if (source.find_first_not_of(' ') == std::string::npos)
    k.fail("source", "is empty", "name the measurement the ratios were read from");
  for (const char* pass : {"fprop", "dgrad", "wgrad"}) {
    const double v = k.number(pass);
    if (!(v > 0 && v <= 1))
      k.fail(pass, "must be a fraction in (0, 1], got " + std::to_string(v),
             "give the MXFP8 GEMM's time over the per-tensor FP8 one's inverted (FP8 ms / MXFP8 ms)");
    (std::string_view(pass) == "fprop"   ? gpu.mxfp8_gemm_fprop
     : std::string_view(pass) == "dgrad" ? gpu.mxfp8_gemm_dgrad
                                         : gpu.mxfp8_gemm_wgrad) = v;
  }
  k.reject_unknown({"unit", "note"});
  gpu.sources["mxfp8_gemm_rate"] = source;
}

}  // namespace

const AttentionRates* attention_rates_of(const GpuProfile& gpu, AttentionKernel kernel) {
  if (kernel == AttentionKernel::auto_) kernel = gpu.attention_kernel;
  const auto it = gpu.attention_rates.find(kernel);
  return it == gpu.attention_rates.end() ? nullptr : &it->second;
}

const AttentionRates* fp8_attention_rates_of(const GpuProfile& gpu, Fp8AttentionFormat format) {
  const auto it = gpu.fp8_attention_rates.find(format);
  return it == gpu.fp8_attention_rates.end() ? nullptr : &it->second;
}

std::string_view describe(Fp8AttentionFormat format) {
  return format == Fp8AttentionFormat::mxfp8 ? "MXFP8" : "per-tensor FP8";
}

std::string_view card_key(Fp8AttentionFormat format) { return format == Fp8AttentionFormat::mxfp8 ? "mxfp8" : "fp8"; }

double attention_efficiency(const AttentionRates& rates, std::int64_t head_dim, std::int64_t seq_length, bool backward) {
  // The nearest head dimension (the larger on a tie).
  std::size_t row = 0;
  for (std::size_t i = 1; i < rates.head_dims.size(); ++i)
    if (std::llabs(rates.head_dims[i] - head_dim) <= std::llabs(rates.head_dims[row] - head_dim)) row = i;
  const std::vector<double>& v = (backward ? rates.bwd : rates.fwd)[row];
  const std::vector<std::int64_t>& s = rates.seq_lengths;
  if (seq_length <= s.front()) return v.front();
  if (seq_length >= s.back()) return v.back();
  std::size_t hi = 1;
  while (s[hi] < seq_length) ++hi;
  const double x0 = std::log2(static_cast<double>(s[hi - 1])), x1 = std::log2(static_cast<double>(s[hi]));
  const double t = (std::log2(static_cast<double>(seq_length)) - x0) / (x1 - x0);
  return v[hi - 1] + t * (v[hi] - v[hi - 1]);
}

namespace {

GpuProfile gpu_from_reader(const nlohmann::json& j, JsonReader& r) {
  check_keys(j, r, {"name", "peak_bf16_tflops", "peak_fp8_tflops", "peak_fp4_tflops", "hbm_bandwidth_GBps",
                    "memory_MiB", "memory_GiB", "memory_GB", "sm_count", "gemm_max_efficiency", "gemm_max_efficiency_fp8", "gemm_max_efficiency_fp4", "memory_bound_efficiency", "kernel_launch_us",
                    "memory_reserve_GiB", "flash_attention", "unfused_attention_efficiency", "speed_spread",
                    "flash_attention_fwd_efficiency", "flash_attention_bwd_efficiency", "gemm_sustained_fraction",
                    "microscaling_formats", "mxfp8_cast_efficiency", "mxfp8_gemm_rate", "attention_kernel", "attention_kernels"});
  GpuProfile gpu;
  gpu.name = r.string("name");
  gpu.peak_bf16_flops = sourced(r, "peak_bf16_tflops", gpu.sources, "peak_bf16_flops") * kTera;
  // Optional: absent or 0, the GPU has no such tensor cores.
  constexpr double kNoBound = std::numeric_limits<double>::infinity();
  gpu.peak_fp8_flops = optional_sourced_fraction(r, "peak_fp8_tflops", gpu.sources, "peak_fp8_flops", kNoBound) * kTera;
  gpu.peak_fp4_flops = optional_sourced_fraction(r, "peak_fp4_tflops", gpu.sources, "peak_fp4_flops", kNoBound) * kTera;
  gpu.hbm_bandwidth_Bps = sourced(r, "hbm_bandwidth_GBps", gpu.sources, "hbm_bandwidth_Bps") * kGiga;
  gpu.memory_bytes = memory_bytes(r, gpu);
  gpu.sm_count = sourced_count(r, "sm_count", gpu.sources, "sm_count");
  gpu.gemm_max_efficiency = sourced_fraction(r, "gemm_max_efficiency", gpu.sources, "gemm_max_efficiency");
  if (r.has("gemm_max_efficiency_fp8"))
    gpu.gemm_max_efficiency_fp8 =
        sourced_fraction(r, "gemm_max_efficiency_fp8", gpu.sources, "gemm_max_efficiency_fp8");
  if (r.has("gemm_max_efficiency_fp4"))
    gpu.gemm_max_efficiency_fp4 =
        sourced_fraction(r, "gemm_max_efficiency_fp4", gpu.sources, "gemm_max_efficiency_fp4");
  if (r.has("gemm_sustained_fraction"))
    gpu.gemm_sustained_fraction =
        sourced_fraction(r, "gemm_sustained_fraction", gpu.sources, "gemm_sustained_fraction");
  gpu.memory_bound_efficiency =
      sourced_fraction(r, "memory_bound_efficiency", gpu.sources, "memory_bound_efficiency");
  if (r.has("unfused_attention_efficiency"))
    gpu.unfused_attention_efficiency =
        sourced_fraction(r, "unfused_attention_efficiency", gpu.sources, "unfused_attention_efficiency");
  if (r.has("mxfp8_cast_efficiency"))
    gpu.mxfp8_cast_efficiency = sourced_fraction(r, "mxfp8_cast_efficiency", gpu.sources, "mxfp8_cast_efficiency");
  if (r.has("mxfp8_gemm_rate")) read_mxfp8_gemm_rate(r, gpu);
  if (r.has("flash_attention_fwd_efficiency"))
    gpu.flash_attention_fwd_efficiency =
        sourced_fraction(r, "flash_attention_fwd_efficiency", gpu.sources, "flash_attention_fwd_efficiency");
  if (r.has("flash_attention_bwd_efficiency"))
    gpu.flash_attention_bwd_efficiency =
        sourced_fraction(r, "flash_attention_bwd_efficiency", gpu.sources, "flash_attention_bwd_efficiency");
  if (r.has("attention_kernels")) read_attention_kernels(r, gpu);
  if (r.has("attention_kernel")) {
    JsonReader k = r.object("attention_kernel");
    gpu.attention_kernel = parse_attention_kernel(k.string("value"), r.source(), r.field_path("attention_kernel") + ".value");
    gpu.sources["attention_kernel"] = k.string("source");
    k.reject_unknown({"unit", "note"});
    if (gpu.attention_kernel == AttentionKernel::auto_ || gpu.attention_kernel == AttentionKernel::unfused)
      r.fail("attention_kernel", "must name a fused kernel", "give flash1, flash2, flash3 or cudnn");
    if (!gpu.attention_rates.empty() && !gpu.attention_rates.count(gpu.attention_kernel))
      r.fail("attention_kernel", "names " + std::string(to_string(gpu.attention_kernel)) + ", which attention_kernels has no rates for",
             "add its rates to attention_kernels or name a kernel it has");
  }
  gpu.speed_spread = optional_sourced_fraction(r, "speed_spread", gpu.sources, "speed_spread", kMaxSpeedSpread);
  gpu.kernel_launch_ns = sourced(r, "kernel_launch_us", gpu.sources, "kernel_launch_ns") * kNsPerUs;
  gpu.memory_reserve_bytes = static_cast<std::int64_t>(
      std::llround(sourced(r, "memory_reserve_GiB", gpu.sources, "memory_reserve_bytes") * kGiB));
  // Optional capability, bare or sourced ({"value": false, "source": "..."}).
  if (r.is_object("flash_attention")) {
    JsonReader f = r.object("flash_attention");
    gpu.flash_attention = f.boolean("value");
    if (const auto src = f.optional_string("source")) gpu.sources["flash_attention"] = *src;
    f.reject_unknown({"unit", "note"});
  } else {
    gpu.flash_attention = r.optional_boolean("flash_attention").value_or(true);
  }
  if (r.is_object("microscaling_formats")) {
    JsonReader f = r.object("microscaling_formats");
    gpu.microscaling_formats = f.boolean("value");
    if (const auto src = f.optional_string("source")) gpu.sources["microscaling_formats"] = *src;
    f.reject_unknown({"unit", "note"});
  } else {
    gpu.microscaling_formats = r.optional_boolean("microscaling_formats").value_or(false);
  }
  if (gpu.memory_reserve_bytes >= gpu.memory_bytes) {
    r.fail("memory_reserve_GiB", "reserve is not smaller than the GPU's memory",
           "give a reserve below the memory capacity");
  }
  r.reject_unknown();
  return gpu;
}

IntraNodeFabric intra_from_reader(const nlohmann::json& j, JsonReader r) {
  check_keys(j, r, {"kind", "link_bandwidth_GBps", "allreduce_busbw_GBps", "busbw_GBps", "latency_us",
                    "allreduce_busbw_curve", "nccl_channels"});
  IntraNodeFabric f;
  f.kind = r.choice("kind", {"nvswitch", "nvlink", "pcie", "shared-memory"});
  f.link_bandwidth_GBps = sourced(r, "link_bandwidth_GBps", f.sources, "link_bandwidth_GBps");
  f.allreduce_busbw_GBps = sourced(r, "allreduce_busbw_GBps", f.sources, "allreduce_busbw_GBps");
  f.busbw_GBps = sourced(r, "busbw_GBps", f.sources, "busbw_GBps");
  f.latency_ns = sourced(r, "latency_us", f.sources, "latency_ns") * kNsPerUs;
  f.nccl_channels = optional_count(r, "nccl_channels", f.sources, "nccl_channels", 0);
  if (r.has("allreduce_busbw_curve")) {
    f.allreduce_busbw_curve = std::make_shared<const BusbwCurve>(busbw_curve_from_json(
        r.raw("allreduce_busbw_curve"), r.source(), r.field_path("allreduce_busbw_curve")));
    f.sources["allreduce_busbw_curve"] = f.allreduce_busbw_curve->source;
  } else {
    (void)r.optional_number("allreduce_busbw_curve");  // marks an explicit null as read
  }
  r.reject_unknown();
  return f;
}

HostLink host_link_from_reader(const nlohmann::json& j, JsonReader r) {
  check_keys(j, r, {"kind", "d2h_GBps", "h2d_GBps"});
  HostLink h;
  h.kind = r.choice("kind", {"nvlink-c2c", "pcie-gen4", "pcie-gen5"});
  h.d2h_GBps = sourced(r, "d2h_GBps", h.sources, "d2h_GBps");
  h.h2d_GBps = sourced(r, "h2d_GBps", h.sources, "h2d_GBps");
  r.reject_unknown();
  return h;
}

InterNodeFabric inter_from_reader(const nlohmann::json& j, JsonReader r) {
  check_keys(j, r, {"kind", "nics_per_node", "nic_bandwidth_Gbps", "nic_busbw_GBps", "latency_us",
                    "switch_latency_us", "levels", "nodes_per_leaf", "leaves_per_pod", "oversubscription",
                    "core_oversubscription", "rail_optimized"});
  InterNodeFabric f;
  f.kind = r.choice("kind", {"infiniband-hdr", "infiniband-ndr", "infiniband-xdr", "roce", "none"});
  if (f.kind == "none") {
    // A single machine: no NICs, no switches. Only nics_per_node (0) may be stated.
    f.nics_per_node = optional_count(r, "nics_per_node", f.sources, "nics_per_node", 0);
    if (f.nics_per_node != 0) {
      r.fail("nics_per_node", "must be 0 when kind is \"none\", got " + std::to_string(f.nics_per_node),
             "set nics_per_node to 0 or give the network's kind");
    }
    f.levels = 0;
    f.nodes_per_leaf = 0;
    f.rail_optimized = false;
    r.reject_unknown();
    return f;
  }
  f.nics_per_node = optional_count(r, "nics_per_node", f.sources, "nics_per_node", 0);
  if (f.nics_per_node == 0) {
    r.fail("nics_per_node", "must be at least 1 for inter_node kind \"" + f.kind + "\"",
           "give the NICs per node, or set kind to \"none\" for a single machine");
  }
  f.nic_bandwidth_Gbps = sourced(r, "nic_bandwidth_Gbps", f.sources, "nic_bandwidth_Gbps");
  f.nic_busbw_GBps = sourced(r, "nic_busbw_GBps", f.sources, "nic_busbw_GBps");
  f.latency_ns = sourced(r, "latency_us", f.sources, "latency_ns") * kNsPerUs;
  f.switch_latency_ns = sourced(r, "switch_latency_us", f.sources, "switch_latency_ns") * kNsPerUs;
  f.levels = optional_count(r, "levels", f.sources, "levels", 2);
  if (f.levels < 1 || f.levels > 3) {
    r.fail("levels", "must be 1, 2 or 3, got " + std::to_string(f.levels),
           "give 1 (one switch), 2 (leaf/spine) or 3 (leaf/spine/core)");
  }
  f.nodes_per_leaf = sourced_count(r, "nodes_per_leaf", f.sources, "nodes_per_leaf");
  f.leaves_per_pod = optional_count(r, "leaves_per_pod", f.sources, "leaves_per_pod", 0);
  if (r.has("oversubscription")) {
    f.oversubscription = sourced(r, "oversubscription", f.sources, "oversubscription");
    if (f.oversubscription < 1.0) {
      r.fail("oversubscription", "must be at least 1, got " + show_number(f.oversubscription),
             "give downlink:uplink bandwidth as a ratio >= 1 (1 = full bisection)");
    }
  } else {
    (void)r.optional_number("oversubscription");  // marks an explicit null as read
  }
  if (r.has("core_oversubscription")) {
    f.core_oversubscription = sourced(r, "core_oversubscription", f.sources, "core_oversubscription");
    if (f.core_oversubscription < 1.0) {
      r.fail("core_oversubscription", "must be at least 1, got " + show_number(f.core_oversubscription),
             "give the pods' downlink:uplink bandwidth to the core as a ratio >= 1 (1 = full bisection)");
    }
  } else {
    (void)r.optional_number("core_oversubscription");
  }
  f.rail_optimized = r.optional_boolean("rail_optimized").value_or(true);
  if (f.levels == 3 && f.rail_optimized && f.leaves_per_pod % f.nics_per_node != 0) {
    r.fail("leaves_per_pod",
           "must be a multiple of nics_per_node (" + std::to_string(f.nics_per_node) +
               ") in a rail-optimised tree, got " + std::to_string(f.leaves_per_pod),
           "count whole scalable units: (leaf groups per pod) x nics_per_node");
  }
  r.reject_unknown();
  return f;
}

// Checks that need the final node count (after --nodes).
void check_node_count(const Cluster& c, const std::string& source, bool overridden) {
  const std::string where = overridden ? "command line" : source;
  const std::string field = overridden ? "--nodes" : "nodes";
  // A bound on the GPU count keeps the topology graph and the planner within
  // memory and time (and GPU indices within int); 262,144 is 2.6x the 100,000
  // GPUs tests/test_scale.cpp plans.
  constexpr std::int64_t kMaxGpus = std::int64_t{1} << 18;
  const std::int64_t gpus = static_cast<std::int64_t>(c.nodes) * c.gpus_per_node;
  if (gpus > kMaxGpus) {
    throw InputError(where, field,
                     std::to_string(c.nodes) + " nodes x " + std::to_string(c.gpus_per_node) + " GPUs = " +
                         std::to_string(gpus) + " GPUs, above cuboid's limit of " + std::to_string(kMaxGpus),
                     "plan at most " + std::to_string(kMaxGpus / c.gpus_per_node) + " nodes (--nodes N)");
  }
  if (c.inter.kind == "none" && c.nodes > 1) {
    throw InputError(where, field,
                     std::to_string(c.nodes) + " nodes, but " + source +
                         " has no inter-node network (inter_node.kind \"none\")",
                     "use 1 node, or a card with an inter-node network");
  }
  if (c.inter.kind != "none" && c.inter.levels == 1 && c.nodes > c.inter.nodes_per_leaf) {
    throw InputError(where, field,
                     std::to_string(c.nodes) + " nodes exceed the single switch of " + source + " (" +
                         std::to_string(c.inter.nodes_per_leaf) + " nodes per leaf, levels 1)",
                     "use at most " + std::to_string(c.inter.nodes_per_leaf) +
                         " nodes, or a card with levels 2 or 3");
  }
}

void check_overrides(std::optional<int> nodes, std::optional<int> gpus_per_node) {
  if (nodes && *nodes <= 0) {
    throw InputError("command line", "--nodes", "must be positive, got " + std::to_string(*nodes),
                     "give a node count >= 1");
  }
  if (gpus_per_node && *gpus_per_node <= 0) {
    throw InputError("command line", "--gpus-per-node", "must be positive, got " + std::to_string(*gpus_per_node),
                     "give a GPU count >= 1");
  }
}

// --gpus-per-node G: G of each node's GPUs, with their share of its NICs (a
// GPU keeps its own NIC on a rail-optimised node); the NVLink domain and the
// fabric are the card's. A GB200 NVL72 job given 16 of a rack's 18 trays is
// 64 GPUs of the 72 (docs/cards.md).
void use_gpus_per_node(Cluster& c, const std::string& source, int gpus) {
  const std::string cl = "command line";
  const std::string flag = "--gpus-per-node";
  if (gpus > c.gpus_per_node) {
    throw InputError(cl, flag,
                     std::to_string(gpus) + " GPUs per node, but a node of " + source + " has " +
                         std::to_string(c.gpus_per_node),
                     "use at most " + std::to_string(c.gpus_per_node) + " GPUs per node");
  }
  if (c.gpus_per_host > 0 && gpus % c.gpus_per_host != 0) {
    throw InputError(cl, flag,
                     std::to_string(gpus) + " GPUs per node are not whole hosts: a host of " + source + " has " +
                         std::to_string(c.gpus_per_host) + " GPUs",
                     "give a multiple of " + std::to_string(c.gpus_per_host) + " GPUs per node");
  }
  const int nics = c.inter.nics_per_node;
  if (nics > 0) {
    if (static_cast<std::int64_t>(nics) * gpus % c.gpus_per_node != 0) {
      throw InputError(cl, flag,
                       std::to_string(gpus) + " of " + std::to_string(c.gpus_per_node) + " GPUs would take a fraction of " +
                           source + "'s " + std::to_string(nics) + " NICs per node",
                       "give a multiple of " + std::to_string(c.gpus_per_node / std::gcd(nics, c.gpus_per_node)) +
                           " GPUs per node");
    }
    c.inter.nics_per_node = static_cast<int>(static_cast<std::int64_t>(nics) * gpus / c.gpus_per_node);
    if (c.inter.levels == 3 && c.inter.rail_optimized && c.inter.leaves_per_pod % c.inter.nics_per_node != 0) {
      throw InputError(cl, flag,
                       std::to_string(c.inter.nics_per_node) + " NICs per node do not divide the " +
                           std::to_string(c.inter.leaves_per_pod) + " rail leaves per pod of " + source,
                       "give a GPU count whose NICs divide leaves_per_pod");
    }
  }
  c.gpus_per_node = gpus;
  if (c.gpus_per_host == gpus) c.gpus_per_host = 0;
}

}  // namespace

GpuProfile gpu_profile_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source, "", "a GPU profile must be a JSON object", "wrap the fields in { ... }");
  JsonReader r(j, source);
  return gpu_from_reader(j, r);
}

Cluster cluster_from_json(const nlohmann::json& j, const std::string& source,
                          const std::filesystem::path& base_dir, std::optional<int> nodes,
                          std::optional<int> gpus_per_node) {
  if (!j.is_object()) throw InputError(source, "", "a cluster card must be a JSON object", "wrap the fields in { ... }");
  check_overrides(nodes, gpus_per_node);
  JsonReader r(j, source);
  check_keys(j, r, {"name", "nodes", "max_nodes", "gpus_per_node", "gpus_per_host", "gpu", "intra_node", "inter_node",
                    "host_link", "calibration"});
  Cluster c;
  c.name = r.string("name");
  c.source_file = source;
  std::map<std::string, std::string> ignored_sources;
  c.nodes = sourced_count(r, "nodes", ignored_sources, "nodes");
  const int max_nodes = optional_count(r, "max_nodes", ignored_sources, "max_nodes", 0);
  c.gpus_per_node = sourced_count(r, "gpus_per_node", ignored_sources, "gpus_per_node");
  c.gpus_per_host = optional_count(r, "gpus_per_host", ignored_sources, "gpus_per_host", 0);
  if (c.gpus_per_host == c.gpus_per_node) c.gpus_per_host = 0;
  // A host of several nodes: a test fixture that counts one machine's ranks
  // as nodes (tests/data/clusters/localhost-cpu-2x2.json).
  if (c.gpus_per_host > 0 && c.gpus_per_node % c.gpus_per_host != 0 && c.gpus_per_host % c.gpus_per_node != 0)
    r.fail("gpus_per_host",
           std::to_string(c.gpus_per_host) + " GPUs per host neither divide the node's " +
               std::to_string(c.gpus_per_node) + " nor are whole nodes",
           "give the GPUs of one host (a GB200 NVL72 compute tray: 4), a divisor of gpus_per_node, or a multiple "
           "of it where one host holds several nodes");

  if (!r.has("gpu")) r.fail("gpu", "missing required field", "give an inline GPU profile object or a path such as \"gpus/a100-sxm4-80gb.json\"");
  if (r.is_object("gpu")) {
    JsonReader g = r.object("gpu");
    c.gpu = gpu_from_reader(j.at("gpu"), g);
  } else {
    const nlohmann::json& gv = r.raw("gpu");
    if (!gv.is_string()) {
      r.fail("gpu", "expected an object or a file path string",
             "give an inline GPU profile object or a path such as \"gpus/a100-sxm4-80gb.json\"");
    }
    const std::string rel = gv.get<std::string>();
    const std::filesystem::path gpu_path = base_dir / rel;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(gpu_path, ec)) {
      r.fail("gpu", "GPU profile file \"" + rel + "\" not found (looked for " + gpu_path.string() + ")",
             "give a path relative to the card's folder, e.g. \"gpus/a100-sxm4-80gb.json\"");
    }
    c.gpu = gpu_profile_from_json(read_json_file(gpu_path), gpu_path.string());
  }
  JsonReader intra = r.object("intra_node");  // checks presence and type first
  c.intra = intra_from_reader(j.at("intra_node"), intra);
  // A collective holding every SM would leave an overlapped GEMM none.
  if (c.intra.nccl_channels > 0 && c.intra.nccl_channels >= c.gpu.sm_count) {
    intra.fail("nccl_channels",
               std::to_string(c.intra.nccl_channels) + " channels (one SM each) leave none of the GPU's " +
                   std::to_string(c.gpu.sm_count) + " SMs for compute",
               "give fewer channels than sm_count (NCCL_DEBUG=INFO prints \"N coll channels\")");
  }
  JsonReader inter = r.object("inter_node");
  c.inter = inter_from_reader(j.at("inter_node"), inter);
  // Optional: what activation offloading copies over.
  if (r.has("host_link")) {
    JsonReader host = r.object("host_link");
    c.host_link = host_link_from_reader(j.at("host_link"), host);
  }
  // Optional measurements (`cuboid calibrate`); the fields above stay the
  // fall-back for whatever the calibration did not measure.
  if (r.has("calibration")) {
    c.calibration = std::make_shared<const Calibration>(calibration_from_json(r.raw("calibration"), source));
    c.gpu.calibration = c.calibration;
  } else {
    (void)r.optional_number("calibration");  // marks an explicit null as read
  }
  r.reject_unknown();

  if (max_nodes > 0 && c.nodes > max_nodes) {
    r.fail("nodes", std::to_string(c.nodes) + " exceeds max_nodes " + std::to_string(max_nodes),
           "lower nodes or raise max_nodes");
  }
  if (gpus_per_node) use_gpus_per_node(c, source, *gpus_per_node);
  if (!nodes) check_node_count(c, source, false);
  if (nodes) {
    if (max_nodes > 0 && *nodes > max_nodes) {
      throw InputError("command line", "--nodes",
                       std::to_string(*nodes) + " nodes exceed max_nodes " + std::to_string(max_nodes) + " of " +
                           source,
                       "use at most " + std::to_string(max_nodes) + " nodes, or a card for a larger cluster");
    }
    c.nodes = *nodes;
    check_node_count(c, source, true);
  }
  return c;
}

Cluster load_cluster(const std::filesystem::path& path, std::optional<int> nodes, std::optional<int> gpus_per_node) {
  check_overrides(nodes, gpus_per_node);
  const nlohmann::json j = read_json_file(path);
  return cluster_from_json(j, path.string(), path.parent_path(), nodes, gpus_per_node);
}

}  // namespace cuboid
