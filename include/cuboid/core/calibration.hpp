#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Calibration: microbenchmark samples measured on the user's machines (GEMM
// shapes, memory-bound kernels, collectives), their fits, and the lookups the
// cost model uses instead of the datasheet when a cluster card carries a
// "calibration" section (`cuboid calibrate` writes one).
//
// Conventions (the contract between `cuboid calibrate`, the cost model and
// `cuboid validate`):
// * Times are nanoseconds (double: medians of several runs).
// * GEMM samples are per call, C[m x n] = A[m x k] * B[k x n], `batch` times
//   (workload.hpp's Op shape).
// * Kernel samples are keyed by the workload's op name (op_names.hpp); their
//   `bytes` are that op's Op::bytes, so an op is priced as
//   alpha + op.bytes * ns_per_byte whatever dtype the backend ran. The fused
//   attention core's blocks (attn_flash, attn_flash_bwd) are keyed by their
//   Op::flops instead: their time follows the products, not the bytes.
// * Collective samples use the nccl-tests "size" (Op::comm_bytes; send_recv:
//   the bytes sent), keyed by collective, tier ("intra_node" | "inter_node")
//   and group size. A fit is time = alpha + size * bus_factor(collective, n)
//   / busbw (collective_traits.hpp).
// * activation_bytes_per_element: the backend's compute dtype (cpu f32: 4,
//   cuda bf16: 2); comm_size_bytes scales the workload's bf16 activation
//   collectives to it.
//
// Lookups: inside the measured sizes the samples, interpolated (power law
// between neighbours); outside, the fit. A line cannot follow cache effects
// (docs/internals/cost.md, "Calibration lookups").
//
// `cuboid calibrate` makes each series monotone before fitting
// (make_monotone: scheduling noise, not the curve); the loader rejects a
// stored series whose times fall.
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/host.hpp"
#include "cuboid/core/workload.hpp"

namespace cuboid {

inline constexpr const char* kCalibrationSchema = "cuboid.calibration/1";

// The operands' format of a GEMM sample: the backend's own (bf16 on CUDA,
// f32 on the CPU) or FP8 (E4M3 x E4M3 with per-tensor scales, the GEMM
// alone: cuBLASLt on operands quantized beforehand). JSON "precision": "fp8";
// absent: the backend's own.
enum class GemmFormat { bf16, fp8 };

struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  double time_ns = 0;  // median per call
  // Where the figure came from: "sweep" or "measured in run <file>" (empty in
  // cards written by the sweep alone, which is then the source).
  std::string source = {};
  GemmFormat format = GemmFormat::bf16;
};

// The same GEMM problem: shape and operand format (a card keeps one sample
// of each).
inline bool same_problem(const GemmSample& a, const GemmSample& b) {
  return a.m == b.m && a.n == b.n && a.k == b.k && a.batch == b.batch && a.format == b.format;
}

struct SizeSample {
  double bytes = 0;    // kernel: workload Op::bytes; collective: nccl-tests size
  double time_ns = 0;  // median per call
};

// time_ns = alpha_ns + bytes * ns_per_byte, least squares weighted by
// relative error (small and large sizes count alike). Residuals are relative:
// (fit - measured) / measured, one per sample, in sample order.
struct LinearFit {
  double alpha_ns = 0;
  double ns_per_byte = 0;
  std::vector<double> residuals;
  double rms_residual = 0;
  double max_abs_residual = 0;

  double time_ns(double bytes) const { return alpha_ns + bytes * ns_per_byte; }
};

struct KernelCalibration {
  std::vector<SizeSample> samples;  // sorted by bytes
  LinearFit fit;
  std::string source;               // as GemmSample::source, for the table
};

struct CollectiveKey {
  Collective collective = Collective::all_reduce;
  std::string tier;  // "intra_node" | "inter_node"
  int group_size = 0;
  // The buffers' cache state when measured. false: hot, as a layer's
  // exchanges (TP, CP, EP, PP) find the activations the op before wrote;
  // true: cold, as the data-parallel collectives find the gradient and
  // parameter buffers the step last touched before its whole working set
  // passed (calibrate/step_cache.hpp). JSON "buffers": "cold" (absent: hot).
  bool cold = false;
  auto operator<=>(const CollectiveKey&) const = default;
};

struct CollectiveCalibration {
  std::vector<SizeSample> samples;  // sorted by bytes
  LinearFit fit;                    // on size * bus_factor
  double alpha_ns = 0;              // = fit.alpha_ns
  double busbw_GBps = 0;            // = 1 / fit.ns_per_byte
  std::string source;               // as GemmSample::source, for the table
};

// One operand pool's GEMM and kernel tables (Calibration::other_pools).
struct OperandPoolTables {
  double gemm_operand_pool_bytes = 0;
  std::vector<GemmSample> gemms;
  std::map<std::string, KernelCalibration> kernels;
};

struct Calibration {
  std::string backend;  // "cpu" | "cuda"
  std::string device;   // "cpu (one core per rank)", "NVIDIA H200", ...
  std::string created_by;  // the command line / tool version that measured it
  int ranks = 0;           // ranks that ran the sweep at once
  int activation_bytes_per_element = 2;  // see above: 4 for cpu (f32), 2 for cuda (bf16)
  // CPU ranks sharing one core (ranks on the node / online CPUs, >= 1; 1 on
  // GPUs). Samples are a whole core's speed and the ranks of a core take
  // turns, so a compute op costs ranks_per_core x its sample (applied by
  // calibrated_gemm_ns, calibrated_kernel_ns, best_gemm_flops_per_s).
  // Collectives are measured with the sharing in place and used as measured.
  double ranks_per_core = 1;
  // The bytes the GEMM sweep rotated its operands over (the plans' step
  // working set per rank, calibrate.hpp gemm_operand_pool_bytes); 0 in older
  // cards and in tables taken from a run, whose GEMMs ran in the step itself.
  double gemm_operand_pool_bytes = 0;
  // The machine that measured (rank 0's host); absent in older cards.
  std::optional<HostInfo> host;
  std::vector<GemmSample> gemms;                          // measured shapes
  std::map<std::string, KernelCalibration> kernels;       // by workload op name
  std::map<CollectiveKey, CollectiveCalibration> collectives;
  // A card calibrated on plans of different step working sets: the GEMM and
  // kernel tables of the plans whose operand pool is not the largest, one
  // entry per pool (the tables above are the largest pool's). A plan is
  // priced from the tables of the pool nearest its own working set
  // (operand_pool_view; cost/operand_pool.hpp picks it): on a host whose
  // caches the pools straddle, the same GEMM runs at another rate.
  std::vector<OperandPoolTables> other_pools;
};

// The card as a plan whose operand pool is other_pools[i] reads it: those
// tables (a kernel the pool lacks keeps the largest pool's), that pool, no
// other pools. Throws std::out_of_range for a bad index.
Calibration operand_pool_view(const Calibration& cal, std::size_t i);

// Least-squares alpha-beta fit (relative-error weighted). Throws InputError
// (source, field) when there are fewer than 2 samples, a time is not finite
// or not positive, or the fit gives a negative slope (time must not fall as
// size grows); a small negative intercept is clamped to 0 and refitted.
LinearFit fit_linear(const std::vector<SizeSample>& samples, const std::string& source,
                     const std::string& field);
CollectiveCalibration fit_collective(Collective c, int group_size, std::vector<SizeSample> samples,
                                     const std::string& source, const std::string& field);
KernelCalibration fit_kernel(std::vector<SizeSample> samples, const std::string& source,
                             const std::string& field);

// Pool-adjacent-violators: replaces `sorted` (by size) times with the closest
// (least squares) non-decreasing sequence; returns how many samples changed.
int make_monotone(std::vector<SizeSample>& sorted);

// Piecewise power-law interpolation of samples sorted by size (strictly
// increasing sizes after merging equal ones by their mean time); nullopt
// outside [first, last] size.
std::optional<double> interpolate_samples(const std::vector<SizeSample>& sorted, double bytes);

// activation_bytes_per_element / 2 (1 without a calibration).
double activation_bytes_scale(const Calibration* cal);
// The bytes an op's collective / p2p really moves on the calibrated backend:
// comm_bytes, scaled by activation_bytes_scale for Op::compute_dtype ops.
double comm_size_bytes(const Op& op, const Calibration* cal);

// Lookups for the cost model. Each returns nullopt when the calibration has
// nothing to say (the caller falls back to the datasheet model):
// * GEMM: an exact measured shape gives its time; otherwise interpolation of
//   achieved FLOP/s in log(m), log(n), log(k), log(batch) among measured
//   shapes that bracket the query; outside the measured range nullopt (the
//   roofline fall-back prices it).
// * Kernel: the op name's samples interpolated inside their size range,
//   else its fit (bytes in the workload convention).
// * Collective: the (collective, tier, group size) samples interpolated
//   inside their size range, else the fit.
// GEMM lookups use the samples of one format (the backend's own by default).
std::optional<double> calibrated_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n,
                                         std::int64_t k, std::int64_t batch, GemmFormat format = GemmFormat::bf16);
// A grouped expert GEMM's kernel table is keyed by its op name and the local
// experts its rows split among ("expert_fc1@4"): the router's split, and with
// it the time at a given FLOP count, differs with the number of experts, so a
// table measured with 8 local experts does not price a plan with 4 (the GEMM
// table prices it by shape then). Cards written before the key carry the bare
// op name, which the cost model still reads.
std::string grouped_kernel_name(const std::string& op_name, std::int64_t local_experts);
std::optional<double> calibrated_kernel_ns(const Calibration& cal, const std::string& op_name,
                                           double bytes);
// A GEMM with more rows (m) than any measured shape that brackets its n, k
// and batch: its time at the rate of the largest such m that the samples
// bracket (with the ranks_per_core share). With n, k and batch fixed a
// GEMM's achieved rate does not fall as m grows (more tiles, the same tile
// shapes), so this rate is a floor on the query's: the cost model takes the
// faster of this time and the roofline. nullopt where calibrated_gemm_ns
// answers, or where no smaller m is bracketed.
std::optional<double> held_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n, std::int64_t k,
                                   std::int64_t batch, GemmFormat format = GemmFormat::bf16);
// The same lookups before the ranks_per_core share (what was measured).
std::optional<double> measured_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n,
                                       std::int64_t k, std::int64_t batch, GemmFormat format = GemmFormat::bf16);
std::optional<double> measured_kernel_ns(const Calibration& cal, const std::string& op_name,
                                         double bytes);
std::optional<double> calibrated_collective_ns(const Calibration& cal, Collective c,
                                               const std::string& tier, int group_size,
                                               double size_bytes, bool cold = false);
// The (collective, tier, group size) fit, or null.
// One collective's time at size_bytes: interpolated in range, else its fit.
double collective_curve_ns(const CollectiveCalibration& cc, Collective c, int group_size, double size_bytes);
// `cold`: the data-parallel collectives' table (CollectiveKey::cold); a card
// that measured only the other state gives that one.
const CollectiveCalibration* find_collective(const Calibration& cal, Collective c,
                                             const std::string& tier, int group_size, bool cold = false);
// The best FLOP/s any measured GEMM achieved (nullopt without GEMM samples):
// the cost model's roofline fall-back, outside the measured shapes, uses it
// in place of the profile's peak x gemm_max_efficiency.
// `format`: of the samples considered (a card without FP8 samples: nullopt for fp8).
std::optional<double> best_gemm_flops_per_s(const Calibration& cal, GemmFormat format = GemmFormat::bf16);

// JSON: the "calibration" section of a cluster card (schema kCalibrationSchema).
// The reader checks everything and throws InputError naming the field:
// unknown schema, non-finite / negative / zero times, unknown collective or
// tier, a kernel or collective whose measured times fall as the size grows
// (beyond measurement noise), a fit whose stored parameters disagree with a
// refit of its samples.
nlohmann::json calibration_to_json(const Calibration& cal);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace cuboid
