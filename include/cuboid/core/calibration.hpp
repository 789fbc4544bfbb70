#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Calibration: microbenchmark samples measured on the user's machines (GEMM
// shapes, memory-bound kernels, collectives), the fits made from them, and the
// lookups the cost model uses in place of the datasheet defaults when a
// cluster card carries a "calibration" section (`cuboid calibrate` writes such
// a card; `cuboid plan|simulate|validate --cluster calibrated.json` use it).
//
// Conventions (the contract between `cuboid calibrate`, the cost model and
// `cuboid validate`):
// * Times are nanoseconds (double: medians of several runs).
// * GEMM samples are per call: C[m x n] = A[m x k] * B[k x n], `batch` times,
//   the same shape convention as workload.hpp's Op.
// * Kernel samples are keyed by the workload's op name ("act", "norm_in",
//   "attn_softmax_bwd", "adam", ...) and their `bytes` are that op's
//   Op::bytes at the measured size (the workload's byte convention, whatever
//   precision the backend ran in), so the cost model can price an op as
//   alpha + op.bytes * ns_per_byte without knowing the backend's dtype.
// * Collective samples use the nccl-tests "size" (Op::comm_bytes: the buffer
//   bytes per rank; for send_recv the bytes sent) and are keyed by collective,
//   tier ("intra_node" | "inter_node") and group size. A fit is
//   time = alpha + size * bus_factor(collective, n) / busbw, with NCCL's bus
//   factors (collective_traits.hpp).
// * activation_bytes_per_element: the element size of the backend's compute
//   dtype (cpu: f32, 4; cuda: bf16, 2). The collective samples are the real
//   bytes moved, but the workload's comm_bytes of activation collectives and
//   p2p assume bf16 (Op::compute_dtype); comm_size_bytes scales them so that a
//   card measured on an f32 backend prices the bytes that backend moves.
//
// Lookups: inside the measured size range a kernel or collective is priced by
// interpolating its samples (piecewise linear in log(size)-log(time): a power
// law between neighbouring sizes), not by the alpha-beta fit. One straight
// line across 1 KiB-256 MiB cannot follow cache effects (on a CPU an
// all-reduce jumps 10x between 2 and 8 MiB when the buffers leave the L2/L3),
// so the fit's error reached 95 % there while the samples are the
// measurement. The fit, with its residuals, stays: it summarises the sweep
// (alpha, busbw) and extrapolates outside the measured sizes.
//
// Monotonicity: `cuboid calibrate` makes each series monotone before fitting
// (isotonic regression of the medians, make_monotone): on an oversubscribed
// machine a small collective can take longer than a larger one because a
// partner rank was not scheduled, which is noise, not the curve. The loader
// keeps rejecting a stored series whose times fall (a hand edit or a broken
// profile).
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/core/workload.hpp"

namespace cuboid {

inline constexpr const char* kCalibrationSchema = "cuboid.calibration/1";

struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  double time_ns = 0;  // median per call
};

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
};

struct CollectiveKey {
  Collective collective = Collective::all_reduce;
  std::string tier;  // "intra_node" | "inter_node"
  int group_size = 0;
  auto operator<=>(const CollectiveKey&) const = default;
};

struct CollectiveCalibration {
  std::vector<SizeSample> samples;  // sorted by bytes
  LinearFit fit;                    // on size * bus_factor
  double alpha_ns = 0;              // = fit.alpha_ns
  double busbw_GBps = 0;            // = 1 / fit.ns_per_byte
};

struct Calibration {
  std::string backend;  // "cpu" | "cuda"
  std::string device;   // "cpu (one core per rank)", "NVIDIA H200", ...
  std::string created_by;  // the command line / tool version that measured it
  int ranks = 0;           // ranks that ran the sweep at once
  int activation_bytes_per_element = 2;  // see above: 4 for cpu (f32), 2 for cuda (bf16)
  // CPU ranks sharing one core (ranks on the node / online CPUs, at least 1).
  // The sweep times GEMMs and the optimizer one rank per core at a time, so
  // its samples are a whole core's speed; the runs it predicts share cores
  // the same way, and with the executor's waits (`--mpi-wait yield`: a rank
  // waiting on MPI hands its core to the one computing) the ranks of a core
  // take turns: each compute op then costs ranks_per_core times its sample
  // (calibrated_gemm_ns, calibrated_kernel_ns and best_gemm_flops_per_s
  // apply it). Exact when a core's ranks are busy together (a TP group on
  // one core, as tools/calibrate-local binds them); collectives are measured
  // with the sharing in place and used as measured. 1 on GPUs.
  double ranks_per_core = 1;
  std::vector<GemmSample> gemms;                          // measured shapes
  std::map<std::string, KernelCalibration> kernels;       // by workload op name
  std::map<CollectiveKey, CollectiveCalibration> collectives;
};

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
std::optional<double> calibrated_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n,
                                         std::int64_t k, std::int64_t batch);
std::optional<double> calibrated_kernel_ns(const Calibration& cal, const std::string& op_name,
                                           double bytes);
// The same lookups before the ranks_per_core share (what was measured).
std::optional<double> measured_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n,
                                       std::int64_t k, std::int64_t batch);
std::optional<double> measured_kernel_ns(const Calibration& cal, const std::string& op_name,
                                         double bytes);
std::optional<double> calibrated_collective_ns(const Calibration& cal, Collective c,
                                               const std::string& tier, int group_size,
                                               double size_bytes);
// The (collective, tier, group size) fit, or null.
// One collective's time at size_bytes: interpolated in range, else its fit.
double collective_curve_ns(const CollectiveCalibration& cc, Collective c, int group_size, double size_bytes);
const CollectiveCalibration* find_collective(const Calibration& cal, Collective c,
                                             const std::string& tier, int group_size);
// The best FLOP/s any measured GEMM achieved (nullopt without GEMM samples):
// the cost model's roofline fall-back, outside the measured shapes, uses it
// in place of the profile's peak x gemm_max_efficiency.
std::optional<double> best_gemm_flops_per_s(const Calibration& cal);

// JSON: the "calibration" section of a cluster card (schema kCalibrationSchema).
// The reader checks everything and throws InputError naming the field:
// unknown schema, non-finite / negative / zero times, unknown collective or
// tier, a kernel or collective whose measured times fall as the size grows
// (beyond measurement noise), a fit whose stored parameters disagree with a
// refit of its samples.
nlohmann::json calibration_to_json(const Calibration& cal);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace cuboid
