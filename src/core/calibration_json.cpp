// The "calibration" section of a cluster card (schema cuboid.calibration/1),
// in human units: times in microseconds, bandwidths in GB/s. The samples are
// the measurement; every fit is derived from them, so the reader refits and
// rejects stored parameters that disagree (a hand edit that the simulator
// would otherwise silently ignore or trust). Residuals are written for the
// reader of the file and recomputed on load.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuboid/core/calibration.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/json_reader.hpp"

namespace cuboid {

namespace {

constexpr double kNsPerUs = 1e3;
// Stored fit parameters are doubles printed with round-trip precision; the
// only difference a refit may show is the us <-> ns conversion's rounding.
constexpr double kRefitRelTolerance = 1e-6;
constexpr const char* kRoot = "calibration";
constexpr std::int64_t kMaxRanks = 1'000'000;  // ranks of a sweep or a group: beyond any machine, inside int
constexpr const char* kRecalibrate = "re-run `cuboid calibrate` (the samples are the measurement; the fit is derived from them)";

std::string json_type(const nlohmann::json& v) { return v.type_name(); }

std::string at_index(const std::string& field, std::size_t i) { return field + "[" + std::to_string(i) + "]"; }

nlohmann::json samples_json(const std::vector<SizeSample>& samples, const LinearFit& fit, const char* size_key) {
  nlohmann::json a = nlohmann::json::array();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    nlohmann::json s;
    s[size_key] = samples[i].bytes;
    s["time_us"] = samples[i].time_ns / kNsPerUs;
    if (i < fit.residuals.size()) s["residual"] = fit.residuals[i];
    a.push_back(std::move(s));
  }
  return a;
}

void fit_json(nlohmann::json& j, const LinearFit& fit) {
  j["alpha_us"] = fit.alpha_ns / kNsPerUs;
  j["rms_residual"] = fit.rms_residual;
  j["max_abs_residual"] = fit.max_abs_residual;
}

// An array field (absent -> empty).
const nlohmann::json* optional_array(JsonReader& r, const char* key) {
  if (!r.has(key)) {
    (void)r.optional_number(key);  // marks an explicit null as read
    return nullptr;
  }
  const nlohmann::json& a = r.raw(key);
  if (!a.is_array()) r.fail(key, "expected an array, got " + json_type(a), "give [ ... ]");
  return &a;
}

JsonReader element(const nlohmann::json& v, const std::string& source, const std::string& field) {
  if (!v.is_object()) throw InputError(source, field, "expected an object, got " + json_type(v), "give { ... }");
  return JsonReader(v, source, field);
}

// The samples of a kernel or collective, in file order, which must be by size.
std::vector<SizeSample> read_samples(JsonReader& r, const std::string& source, const std::string& field,
                                     const char* size_key) {
  const nlohmann::json* a = optional_array(r, "samples");
  if (a == nullptr) r.fail("samples", "missing required field", "add the measured samples");
  std::vector<SizeSample> out;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string f = at_index(field + ".samples", i);
    JsonReader s = element((*a)[i], source, f);
    SizeSample x;
    x.bytes = s.number(size_key);
    x.time_ns = s.number("time_us") * kNsPerUs;
    s.reject_unknown({"residual"});
    if (!out.empty() && x.bytes < out.back().bytes) {
      s.fail(size_key, "samples must be in increasing size, but " + fmt::format("{:.15g}", x.bytes) +
                           " follows " + fmt::format("{:.15g}", out.back().bytes),
             "sort the samples by size");
    }
    out.push_back(x);
  }
  return out;
}

void check_stored(JsonReader& r, const char* key, double stored, double refit, double tolerance, const char* unit) {
  if (std::fabs(stored - refit) <= tolerance) return;
  r.fail(key,
         fmt::format("{:.6g}", stored) + " " + unit + " disagrees with the fit of its samples (" +
             fmt::format("{:.6g}", refit) + " " + unit + ")",
         kRecalibrate);
}

// alpha may be 0 (clamped): its tolerance scales with the smallest time.
double alpha_tolerance_us(const std::vector<SizeSample>& samples) {
  double t = samples.empty() ? 0 : samples.front().time_ns;
  for (const SizeSample& s : samples) t = std::min(t, s.time_ns);
  return kRefitRelTolerance * t / kNsPerUs;
}

Collective parse_collective(JsonReader& r) {
  const std::string name =
      r.choice("collective", {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "all_to_all"});
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                       Collective::broadcast, Collective::send_recv, Collective::all_to_all}) {
    if (to_string(c) == name) return c;
  }
  return Collective::all_reduce;  // unreachable: choice() checked the name
}

void read_gemms(JsonReader& r, const std::string& source, const std::string& prefix, std::vector<GemmSample>& gemms) {
  const nlohmann::json* a = optional_array(r, "gemms");
  if (a == nullptr) return;
  const std::string field = prefix + ".gemms";
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string f = at_index(field, i);
    JsonReader g = element((*a)[i], source, f);
    GemmSample s;
    s.m = g.positive_integer("m");
    s.n = g.positive_integer("n");
    s.k = g.positive_integer("k");
    s.batch = g.optional_positive_integer("batch").value_or(1);
    const double t_us = g.number("time_us");
    if (!(t_us > 0)) {
      g.fail("time_us", "must be positive, got " + fmt::format("{:.6g}", t_us) + " us",
             "re-run the measurement: a timer or the benchmark failed");
    }
    s.time_ns = t_us * kNsPerUs;
    s.source = g.optional_string("source").value_or("");
    // "fp8": an FP8 GEMM's sample (GemmFormat); absent: the backend's own dtype.
    if (g.optional_choice("precision", {"fp8"})) s.format = GemmFormat::fp8;
    g.reject_unknown();
    for (std::size_t j = 0; j < gemms.size(); ++j) {
      if (same_problem(gemms[j], s)) {
        throw InputError(source, f, "the same shape as " + at_index(field, j), "keep one median per shape");
      }
    }
    gemms.push_back(s);
  }
}

void read_kernels(JsonReader& r, const std::string& source, const std::string& prefix,
                  std::map<std::string, KernelCalibration>& kernels) {
  if (!r.has("kernels")) {
    (void)r.optional_number("kernels");
    return;
  }
  const nlohmann::json& obj = r.raw("kernels");
  if (!obj.is_object()) r.fail("kernels", "expected an object keyed by op name, got " + json_type(obj), "give { \"act\": { ... }, ... }");
  for (const auto& [name, v] : obj.items()) {
    const std::string f = prefix + ".kernels." + name;
    JsonReader k = element(v, source, f);
    std::vector<SizeSample> samples = read_samples(k, source, f, "bytes");
    KernelCalibration kc = fit_kernel(std::move(samples), source, f);
    kc.source = k.optional_string("source").value_or("");
    check_stored(k, "alpha_us", k.number("alpha_us"), kc.fit.alpha_ns / kNsPerUs, alpha_tolerance_us(kc.samples), "us");
    const double bw = 1.0 / kc.fit.ns_per_byte;
    check_stored(k, "bandwidth_GBps", k.number("bandwidth_GBps"), bw, kRefitRelTolerance * bw, "GB/s");
    k.reject_unknown({"rms_residual", "max_abs_residual"});
    kernels.emplace(name, std::move(kc));
  }
}

std::optional<double> read_pool_bytes(JsonReader& r) {
  if (!r.has("gemm_operand_pool_bytes")) return std::nullopt;
  const double pool = r.number("gemm_operand_pool_bytes");
  if (!(pool > 0 && pool <= 0x1p40)) {
    r.fail("gemm_operand_pool_bytes", "must be above 0 and at most 1 TiB, got " + fmt::format("{}", pool),
           "give the bytes the GEMM sweep rotated its operands over, or leave the field out");
  }
  return pool;
}

// "other_operand_pools": [{ "gemm_operand_pool_bytes", "gemms", "kernels" }],
// each pool once and none the card's own.
void read_other_pools(JsonReader& r, const std::string& source, Calibration& cal) {
  const nlohmann::json* a = optional_array(r, "other_operand_pools");
  if (a == nullptr) return;
  const std::string field = std::string(kRoot) + ".other_operand_pools";
  if (cal.gemm_operand_pool_bytes <= 0)
    r.fail("other_operand_pools", "needs the card's own gemm_operand_pool_bytes",
           "give the largest pool's bytes in gemm_operand_pool_bytes, or leave other_operand_pools out");
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string f = at_index(field, i);
    JsonReader p = element((*a)[i], source, f);
    OperandPoolTables t;
    t.gemm_operand_pool_bytes = read_pool_bytes(p).value_or(0);
    if (t.gemm_operand_pool_bytes == 0)
      p.fail("gemm_operand_pool_bytes", "is missing", "give the bytes this pool's GEMM sweep rotated its operands over");
    if (t.gemm_operand_pool_bytes == cal.gemm_operand_pool_bytes ||
        std::any_of(cal.other_pools.begin(), cal.other_pools.end(), [&](const OperandPoolTables& o) {
          return o.gemm_operand_pool_bytes == t.gemm_operand_pool_bytes;
        }))
      p.fail("gemm_operand_pool_bytes", "repeats the pool " + fmt::format("{}", t.gemm_operand_pool_bytes),
             "keep one entry per pool (the card's own tables are its gemm_operand_pool_bytes)");
    read_gemms(p, source, f, t.gemms);
    read_kernels(p, source, f, t.kernels);
    p.reject_unknown();
    cal.other_pools.push_back(std::move(t));
  }
}

void read_collectives(JsonReader& r, const std::string& source, Calibration& cal) {
  const nlohmann::json* a = optional_array(r, "collectives");
  if (a == nullptr) return;
  const std::string field = std::string(kRoot) + ".collectives";
  std::vector<CollectiveKey> seen;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const std::string f = at_index(field, i);
    JsonReader c = element((*a)[i], source, f);
    CollectiveKey key;
    key.collective = parse_collective(c);
    key.tier = c.choice("tier", {"intra_node", "inter_node"});
    key.group_size = c.count<int>("group_size", 1, kMaxRanks);
    key.cold = c.optional_choice("buffers", {"hot", "cold"}).value_or("hot") == "cold";
    const auto dup = std::find(seen.begin(), seen.end(), key);
    if (dup != seen.end()) {
      throw InputError(source, f,
                       "the same collective, tier, group size and buffers as " +
                           at_index(field, static_cast<std::size_t>(dup - seen.begin())),
                       "keep one sweep per (collective, tier, group_size, buffers)");
    }
    seen.push_back(key);
    std::vector<SizeSample> samples = read_samples(c, source, f, "size_bytes");
    CollectiveCalibration cc = fit_collective(key.collective, key.group_size, std::move(samples), source, f);
    cc.source = c.optional_string("source").value_or("");
    check_stored(c, "alpha_us", c.number("alpha_us"), cc.alpha_ns / kNsPerUs, alpha_tolerance_us(cc.samples), "us");
    check_stored(c, "busbw_GBps", c.number("busbw_GBps"), cc.busbw_GBps, kRefitRelTolerance * cc.busbw_GBps, "GB/s");
    c.reject_unknown({"rms_residual", "max_abs_residual"});
    cal.collectives.emplace(key, std::move(cc));
  }
}

nlohmann::json gemms_json(const std::vector<GemmSample>& samples) {
  nlohmann::json gemms = nlohmann::json::array();
  for (const GemmSample& g : samples) {
    nlohmann::json e = {{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}, {"time_us", g.time_ns / kNsPerUs}};
    if (!g.source.empty()) e["source"] = g.source;
    if (g.format == GemmFormat::fp8) e["precision"] = "fp8";
    gemms.push_back(std::move(e));
  }
  return gemms;
}

nlohmann::json kernels_json(const std::map<std::string, KernelCalibration>& tables) {
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [name, kc] : tables) {
    nlohmann::json k;
    fit_json(k, kc.fit);
    k["bandwidth_GBps"] = 1.0 / kc.fit.ns_per_byte;
    k["samples"] = samples_json(kc.samples, kc.fit, "bytes");
    if (!kc.source.empty()) k["source"] = kc.source;
    kernels[name] = std::move(k);
  }
  return kernels;
}

}  // namespace

nlohmann::json calibration_to_json(const Calibration& cal) {
  nlohmann::json j;
  j["schema"] = kCalibrationSchema;
  j["backend"] = cal.backend;
  j["device"] = cal.device;
  j["created_by"] = cal.created_by;
  j["ranks"] = cal.ranks;
  j["activation_bytes_per_element"] = cal.activation_bytes_per_element;
  j["ranks_per_core"] = cal.ranks_per_core;
  if (cal.gemm_operand_pool_bytes > 0) j["gemm_operand_pool_bytes"] = cal.gemm_operand_pool_bytes;
  if (cal.host) j["host"] = host_to_json(*cal.host);
  j["gemms"] = gemms_json(cal.gemms);
  j["kernels"] = kernels_json(cal.kernels);
  if (!cal.other_pools.empty()) {
    nlohmann::json pools = nlohmann::json::array();
    for (const OperandPoolTables& t : cal.other_pools)
      pools.push_back({{"gemm_operand_pool_bytes", t.gemm_operand_pool_bytes},
                       {"gemms", gemms_json(t.gemms)},
                       {"kernels", kernels_json(t.kernels)}});
    j["other_operand_pools"] = std::move(pools);
  }
  nlohmann::json collectives = nlohmann::json::array();
  for (const auto& [key, cc] : cal.collectives) {
    nlohmann::json c;
    c["collective"] = std::string(to_string(key.collective));
    c["tier"] = key.tier;
    c["group_size"] = key.group_size;
    if (key.cold) c["buffers"] = "cold";
    fit_json(c, cc.fit);
    c["busbw_GBps"] = cc.busbw_GBps;
    c["samples"] = samples_json(cc.samples, cc.fit, "size_bytes");
    if (!cc.source.empty()) c["source"] = cc.source;
    collectives.push_back(std::move(c));
  }
  j["collectives"] = std::move(collectives);
  return j;
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    throw InputError(source, kRoot, "expected an object, got " + json_type(j),
                     "give the section `cuboid calibrate` writes: { \"schema\": \"" + std::string(kCalibrationSchema) +
                         "\", ... }");
  }
  JsonReader r(j, source, kRoot);
  const std::string schema = r.string("schema");
  if (schema != kCalibrationSchema) {
    r.fail("schema", "unknown schema " + quote_value(schema),
           "use \"" + std::string(kCalibrationSchema) + "\" (written by this version of `cuboid calibrate`)");
  }
  Calibration cal;
  cal.backend = r.choice("backend", {"cpu", "cuda"});
  cal.device = r.string("device");
  cal.created_by = r.optional_string("created_by").value_or("");
  cal.ranks = r.count<int>("ranks", 1, kMaxRanks);
  // Cards written before the field: the backend's compute dtype (cpu f32, cuda bf16).
  const int act = r.optional_count<int>("activation_bytes_per_element").value_or(cal.backend == "cpu" ? 4 : 2);
  if (act != 2 && act != 4) {
    r.fail("activation_bytes_per_element", "must be 2 (bf16) or 4 (f32), got " + std::to_string(act),
           "give the element size of the backend's compute dtype");
  }
  cal.activation_bytes_per_element = act;
  // Cards written before the field: one rank per core.
  const double share = r.optional_number("ranks_per_core").value_or(1.0);
  if (!(share >= 1.0 && share <= 256.0)) {
    r.fail("ranks_per_core", "must be between 1 and 256, got " + fmt::format("{}", share),
           "give the ranks on the node divided by its CPUs (1 for one rank per core or per GPU)");
  }
  if (share != 1.0 && cal.backend != "cpu") {
    r.fail("ranks_per_core", "is " + fmt::format("{}", share) + " for backend " + cal.backend,
           "only cpu ranks share cores; give 1");
  }
  cal.ranks_per_core = share;
  // Cards written before the field, and tables taken from a run: not recorded.
  cal.gemm_operand_pool_bytes = read_pool_bytes(r).value_or(0);
  // Cards written before the field: no host.
  if (r.has("host")) cal.host = host_from_json(r.raw("host"), source, std::string(kRoot) + ".host");
  read_gemms(r, source, kRoot, cal.gemms);
  read_kernels(r, source, kRoot, cal.kernels);
  read_other_pools(r, source, cal);
  read_collectives(r, source, cal);
  r.reject_unknown();
  return cal;
}

}  // namespace cuboid
