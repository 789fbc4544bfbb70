#pragma once
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
//   factors (all_reduce 2(n-1)/n; reduce_scatter, all_gather (n-1)/n;
//   broadcast, send_recv 1).
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuboid/workload.hpp"

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
  std::vector<GemmSample> gemms;                          // measured shapes
  std::map<std::string, KernelCalibration> kernels;       // by workload op name
  std::map<CollectiveKey, CollectiveCalibration> collectives;
};

// NCCL's bus-bandwidth factor for a collective over n ranks.
double bus_factor(Collective c, int n);

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

// Lookups for the cost model. Each returns nullopt when the calibration has
// nothing to say (the caller falls back to the datasheet model):
// * GEMM: an exact measured shape gives its time; otherwise interpolation of
//   achieved FLOP/s in log(m), log(n), log(k), log(batch) among measured
//   shapes that bracket the query; outside the measured range nullopt (the
//   roofline fall-back prices it).
// * Kernel: the op name's fit (bytes in the workload convention).
// * Collective: the (collective, tier, group size) fit.
std::optional<double> calibrated_gemm_ns(const Calibration& cal, std::int64_t m, std::int64_t n,
                                         std::int64_t k, std::int64_t batch);
std::optional<double> calibrated_kernel_ns(const Calibration& cal, const std::string& op_name,
                                           double bytes);
std::optional<double> calibrated_collective_ns(const Calibration& cal, Collective c,
                                               const std::string& tier, int group_size,
                                               double size_bytes);

// JSON: the "calibration" section of a cluster card (schema kCalibrationSchema).
// The reader checks everything and throws InputError naming the field:
// unknown schema, non-finite / negative / zero times, unknown collective or
// tier, a kernel or collective whose measured times fall as the size grows
// (beyond measurement noise), a fit whose stored parameters disagree with a
// refit of its samples.
nlohmann::json calibration_to_json(const Calibration& cal);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace cuboid
