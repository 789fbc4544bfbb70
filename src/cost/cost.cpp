// Cost models for compute kernels and collectives. Every constant comes from
// the GPU profile or the cluster card; the ones here are structural (tile size).
#include "cuboid/cost/cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "cuboid/core/element_bytes.hpp"
#include "cuboid/core/dispatch.hpp"
#include "cuboid/core/busbw_curve.hpp"
#include "cuboid/core/collective_traits.hpp"
#include "cuboid/core/op_names.hpp"
#include "cuboid/core/calibration.hpp"
#include "cuboid/core/precision.hpp"

namespace cuboid {

namespace {

// Output tile of the modelled GEMM kernel: cuBLAS / CUTLASS bf16 kernels on
// A100 / H100 use 128 x 128 (or 128 x 256) CTA tiles for large problems. One
// CTA per SM at a time (their shared-memory footprint allows no more), which
// gives NVIDIA's "wave quantisation" (Deep Learning Performance guide,
// "Matrix Multiplication Background").
constexpr double kTile = 128.0;
// A time for groups that can never finish (no bandwidth): large, but far
// from int64 overflow when summed over many ops.
constexpr TimeNs kUnreachableNs = std::numeric_limits<TimeNs>::max() / 1024;

// Useful fraction of the SM-time a batched GEMM occupies: tile quantisation
// (partial 128 x 128 tiles at the edges do full work) times wave quantisation
// (the last wave of tiles leaves SMs idle). Equals
// m*n*batch / (waves * sm_count * 128 * 128).
double quantisation_efficiency(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return 1.0;
  const double sms = static_cast<double>(std::max(1, gpu.sm_count));
  const double tiles = std::ceil(static_cast<double>(m) / kTile) * std::ceil(static_cast<double>(n) / kTile) *
                       static_cast<double>(batch);
  const double waves = std::ceil(tiles / sms);
  const double useful = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(batch);
  return useful / (waves * sms * kTile * kTile);
}

double hbm_Bps(const GpuProfile& gpu) { return gpu.hbm_bandwidth_Bps * gpu.memory_bound_efficiency; }

// The HBM rate of an op: the unfused attention core's kernels at their own
// measured fraction where the profile has one.
// An MXFP8 quantize kernel (an activation's or an output gradient's cast)
// at the profile's measured rate of Transformer Engine's MXFP8 cast.
double op_hbm_Bps(const GpuProfile& gpu, const Op& op) {
  if (op.unfused_attention && gpu.unfused_attention_efficiency > 0)
    return gpu.hbm_bandwidth_Bps * gpu.unfused_attention_efficiency;
  if (op.kind == OpKind::memory_bound && op.precision == Precision::mxfp8 && gpu.mxfp8_cast_efficiency > 0 &&
      (op.name == op::fp8_cast || op.name == op::fp8_grad_cast))
    return gpu.hbm_bandwidth_Bps * gpu.mxfp8_cast_efficiency;
  return hbm_Bps(gpu);
}

TimeNs to_ns(double seconds) {
  if (!(seconds < 1e9)) return kUnreachableNs;  // also catches NaN and infinity
  return static_cast<TimeNs>(std::llround(seconds * 1e9));
}

double gemm_flops(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
         static_cast<double>(batch);
}

// The tensor-core peak of a GEMM in format `p` (an FP8 / FP4 plan's linear
// layers; check_plan refuses a format whose peak is 0).
double peak_flops(const GpuProfile& gpu, Precision p) {
  if (p == Precision::bf16) return gpu.peak_bf16_flops;
  return fp4_gemms(p) ? gpu.peak_fp4_flops : gpu.peak_fp8_flops;
}

// The FLOP/s tensor-core work keeps in training from a burst efficiency of
// the profile (a benchmark's best shape): peak x it x gemm_sustained_fraction.
double sustained_flops(const GpuProfile& gpu, double burst_efficiency, Precision p = Precision::bf16) {
  return peak_flops(gpu, p) * burst_efficiency * gpu.gemm_sustained_fraction;
}

// The best fraction of its format's peak a large GEMM reaches in a short
// burst: the profile's FP8 / FP4 maximum achievable matmul FLOPS where it
// has one (every FP8 recipe's GEMM: per-tensor, blockwise and MXFP8 alike;
// NVFP4's: the FP4 figure), else the bf16 GEMM's fraction
// (docs/cost-model.md "FP8").
double gemm_burst_efficiency(const GpuProfile& gpu, Precision p) {
  if (p == Precision::bf16) return gpu.gemm_max_efficiency;
  const double measured = fp4_gemms(p) ? gpu.gemm_max_efficiency_fp4 : gpu.gemm_max_efficiency_fp8;
  return measured > 0 ? measured : gpu.gemm_max_efficiency;
}

// The card's sample format of a GEMM in precision `p` (none for FP4: not swept).
std::optional<GemmFormat> calibrated_format(Precision p) {
  if (p == Precision::bf16) return GemmFormat::bf16;
  if (fp4_gemms(p)) return std::nullopt;
  return GemmFormat::fp8;
}

// The best FLOP/s a large GEMM reaches: measured on a calibrated profile
// (the best of its GEMM samples: the datasheet peak and the assumed
// efficiency are what calibration replaces), else peak x the format's burst
// efficiency x the fraction of that burst rate a GEMM sustains in training.
// An FP8 GEMM takes the best of the card's FP8 samples where `cuboid
// calibrate` swept them (a GPU with FP8 GEMMs: GemmFormat::fp8), else the
// datasheet model; NVFP4 always the datasheet model (calibrated_format).
double gemm_best_flops(const GpuProfile& gpu, Precision p = Precision::bf16) {
  if (gpu.calibration) {
    if (const auto format = calibrated_format(p))
      if (const auto best = best_gemm_flops_per_s(*gpu.calibration, *format)) return *best;
  }
  return sustained_flops(gpu, gemm_burst_efficiency(gpu, p), p);
}

// Compute-only and HBM-only seconds of a GEMM; its time is the larger (roofline).
// `rate`: the kernel's rate over its format's best (block_scaled_rate).
double gemm_compute_s(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                      Precision p = Precision::bf16, double rate = 1.0) {
  return gemm_flops(m, n, k, batch) / (gemm_best_flops(gpu, p) * rate * quantisation_efficiency(gpu, m, n, batch));
}

// A and B in the GEMM's format, C in bf16.
double gemm_memory_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, double bytes_per_s,
                     Precision p = Precision::bf16) {
  const double mk = static_cast<double>(m) * static_cast<double>(k), kn = static_cast<double>(k) * static_cast<double>(n);
  const double mn = static_cast<double>(m) * static_cast<double>(n), d = static_cast<double>(batch);
  if (p == Precision::bf16) return (mk + kn + mn) * d * kBf16Bytes / bytes_per_s;
  return ((mk + kn) * quantized_element_bytes(p) + mn * kBf16Bytes) * d / bytes_per_s;
}

// Roofline time of an uncalibrated GEMM whose HBM side runs at bytes_per_s.
// `launch_ns`: the host's launch of the kernel (0 inside a CUDA graph).
TimeNs gemm_roofline_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                        std::int64_t batch, double extra_bytes, double bytes_per_s, Precision p, double launch_ns,
                        double rate) {
  const double seconds = std::max(gemm_compute_s(gpu, m, n, k, batch, p, rate),
                                  gemm_memory_s(m, n, k, batch, bytes_per_s, p) + extra_bytes / bytes_per_s);
  return to_ns(seconds) + static_cast<TimeNs>(launch_ns);
}

}  // namespace

// No separate small-k factor: the roofline term already charges a GEMM with a
// shallow k for reading A and B and writing C (arithmetic intensity ~ k for
// large m, n), which is what makes such GEMMs slow; a second factor would
// count the same effect twice.
double gemm_efficiency(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0.0;
  if (gpu.calibration) {
    if (const auto ns = calibrated_gemm_ns(*gpu.calibration, m, n, k, batch)) {
      return gemm_flops(m, n, k, batch) / (gpu.peak_bf16_flops * *ns * 1e-9);
    }
  }
  double seconds = std::max(gemm_compute_s(gpu, m, n, k, batch), gemm_memory_s(m, n, k, batch, hbm_Bps(gpu)));
  if (gpu.calibration) {
    if (const auto held = held_gemm_ns(*gpu.calibration, m, n, k, batch)) seconds = std::min(seconds, *held * 1e-9);
  }
  return gemm_flops(m, n, k, batch) / (gpu.peak_bf16_flops * seconds);
}

namespace {

// A measured (or interpolated) time is per call, launch included; else the
// roofline with the HBM side at bytes_per_s. `rate` (block_scaled_rate)
// slows a measured time of the format's samples as it does the roofline's.
TimeNs gemm_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
               double extra_bytes, double bytes_per_s, Precision p, double launch_ns, double rate = 1.0) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  if (gpu.calibration) {
    if (const auto format = calibrated_format(p)) {
      if (const auto ns = calibrated_gemm_ns(*gpu.calibration, m, n, k, batch, *format))
        return std::llround(*ns / rate);
      const TimeNs roofline = gemm_roofline_ns(gpu, m, n, k, batch, extra_bytes, bytes_per_s, p, launch_ns, rate);
      // More rows than the samples bracket: the largest bracketed m's rate
      // is a floor (held_gemm_ns), the roofline an estimate; the faster wins.
      if (const auto held = held_gemm_ns(*gpu.calibration, m, n, k, batch, *format))
        return std::min(roofline, static_cast<TimeNs>(std::llround(*held / rate)));
      return roofline;
    }
  }
  return gemm_roofline_ns(gpu, m, n, k, batch, extra_bytes, bytes_per_s, p, launch_ns, rate);
}

// An MXFP8 GEMM's rate over the per-tensor FP8 GEMM's at its shape (the
// profile's mxfp8_gemm_rate), by pass: the backward's GEMMs are named after
// the forward's + op::dgrad_suffix / op::wgrad_suffix (workload.cpp
// add_gemm_backward); a recomputed forward keeps the forward's name. 1 for
// every other format.
double block_scaled_rate(const GpuProfile& gpu, const Op& op) {
  if (op.precision != Precision::mxfp8) return 1.0;
  if (op.name.ends_with(op::dgrad_suffix)) return gpu.mxfp8_gemm_dgrad;
  if (op.name.ends_with(op::wgrad_suffix)) return gpu.mxfp8_gemm_wgrad;
  return gpu.mxfp8_gemm_fprop;
}

// A memory-bound kernel: measured by name on a calibrated card, else its bytes at bytes_per_s.
TimeNs kernel_ns(const GpuProfile& gpu, const std::string& name, double bytes, double bytes_per_s, double launch_ns) {
  if (bytes <= 0) return 0;
  if (gpu.calibration) {
    if (const auto ns = calibrated_kernel_ns(*gpu.calibration, name, bytes)) return std::llround(*ns);
  }
  return to_ns(bytes / bytes_per_s) + static_cast<TimeNs>(launch_ns);
}

}  // namespace

TimeNs gemm_time_ns(const GpuProfile& gpu, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                    double extra_bytes) {
  return gemm_ns(gpu, m, n, k, batch, extra_bytes, hbm_Bps(gpu), Precision::bf16, gpu.kernel_launch_ns);
}

TimeNs memory_bound_time_ns(const GpuProfile& gpu, double bytes) {
  if (bytes <= 0) return 0;
  return to_ns(bytes / hbm_Bps(gpu)) + static_cast<TimeNs>(gpu.kernel_launch_ns);
}

TimeNs list_collective_copies_ns(const GpuProfile& gpu, double bytes, int group_size) {
  if (group_size <= 1 || bytes <= 0) return 0;
  return group_size * memory_bound_time_ns(gpu, 2.0 * bytes / group_size);
}

// A fit's time is per call, launch included.
TimeNs kernel_time_ns(const GpuProfile& gpu, const std::string& name, double bytes) {
  return kernel_ns(gpu, name, bytes, hbm_Bps(gpu), gpu.kernel_launch_ns);
}

TimeNs collective_time_ns(Collective c, double size_bytes, int group_size, const LinkParams& link) {
  if (group_size <= 1 || size_bytes <= 0) return 0;
  if (link.calibrated != nullptr) return to_ns(collective_curve_ns(*link.calibrated, c, group_size, size_bytes) * 1e-9);
  if (link.busbw_Bps <= 0) return kUnreachableNs;
  const double n = group_size;
  const double volume = traits(c).ring_bytes(n);  // bytes through the bus, in units of size_bytes
  double steps = traits(c).ring_steps(n);         // latency terms
  if (link.fitted) steps = 1.0;
  double seconds = volume * size_bytes / link.busbw_Bps + steps * link.latency_ns * 1e-9;
  if (link.curve != nullptr) {
    if (const auto curve_ns = curve_time_ns(*link.curve, c, group_size, size_bytes)) {
      seconds = std::max(seconds, *curve_ns * 1e-9);
    }
  }
  return to_ns(seconds);
}

// Alpha-beta parameters of a group from the highest tier it crosses.
// * Same GPU (or a single rank): free.
// * Inside a node: the card's nccl-tests busbw (all-reduce has its own figure
//   because NVLS / NVLink SHARP makes it differ from the other collectives).
// * Across nodes: in DP and PP phases every GPU of a node talks at once, so a
//   GPU gets its share of the node's NICs, nics * nic_busbw / gpus_per_node.
//   A ring (or NCCL's hierarchical ring) with k of the group's GPUs on one
//   node crosses the node boundary with k rails at once, so its busbw is
//   k * share, never above what NVLink gives inside the node. This is the
//   inter-node bound NCCL's ring busbw hits for a hierarchical all-reduce
//   (e.g. DGX A100: 8 x 24 GB/s = 192 GB/s, the measured figure).
//   Leaving a leaf switch (on the group's rail) divides by the fabric's oversubscription; latency
//   is one NIC-switch-NIC hop plus switch_latency_ns per extra switch on the
//   route (leaf-spine-leaf: 2 extra, leaf-spine-core-spine-leaf: 4 extra).
//   With the phase's load the division is only by as much as the phase's
//   crossing ring edges exceed the uplinks (uplink_load).
namespace {

// All-to-all across nodes, as NCCL runs it (a send to every peer at once; PXN,
// on by default since NCCL 2.12, moves what goes to another node over NVLink
// to the GPU on the destination's rail first, so it leaves through that GPU's
// NIC and stays on the rail). With k members on a node and n in all, each
// member sends (n - k) / n of the size to other nodes, through its share of
// the node's NICs (the k members' remote traffic spreads over k rails), and
// over NVLink its (k - 1) / n to the node's members plus, for PXN, what the
// other (k - 1) rails' GPUs forward: (k - 1) / k of the size in all. The
// slower side sets the time; expressed as a busbw for the bus factor (n - 1) / n
// (nccl-tests' alltoall), the tier's oversubscription applied after.
double all_to_all_busbw_GBps(const std::vector<int>& ranks, const std::vector<int>& sorted_nodes,
                             double nic_share_GBps, double intra_busbw_GBps) {
  const double n = static_cast<double>(ranks.size());
  int k_min = static_cast<int>(ranks.size()), k_max = 0;
  for (std::size_t i = 0; i < sorted_nodes.size();) {
    std::size_t j = i;
    while (j < sorted_nodes.size() && sorted_nodes[j] == sorted_nodes[i]) ++j;
    k_min = std::min(k_min, static_cast<int>(j - i));
    k_max = std::max(k_max, static_cast<int>(j - i));
    i = j;
  }
  const double nic_seconds_per_byte = (n - k_min) / n / (nic_share_GBps * 1e9);
  const double nvlink_seconds_per_byte = (k_max - 1.0) / k_max / (intra_busbw_GBps * 1e9);
  return (n - 1.0) / n / std::max(nic_seconds_per_byte, nvlink_seconds_per_byte) / 1e9;
}

LinkParams link_params(const Topology& topo, Collective c, const std::vector<int>& ranks, const UplinkLoad* load,
                       bool cold_buffers) {
  const Cluster& cl = topo.cluster();
  const double intra_busbw_GBps = c == Collective::all_reduce ? cl.intra.allreduce_busbw_GBps : cl.intra.busbw_GBps;
  const LinkParams free_link{std::numeric_limits<double>::infinity(), 0.0};
  if (ranks.size() <= 1) return free_link;

  const int gpn = std::max(1, cl.gpus_per_node);
  // Fast path without the topology: all ranks on one node.
  int max_per_node = 0;
  bool one_node = true;
  bool one_gpu = true;
  {
    const int node0 = ranks.front() / gpn;
    for (int r : ranks) {
      one_node = one_node && r / gpn == node0;
      one_gpu = one_gpu && r == ranks.front();
    }
  }
  if (one_gpu) return free_link;
  if (cl.calibration) {
    const CollectiveCalibration* fit =
        find_collective(*cl.calibration, c, one_node ? "intra_node" : "inter_node", static_cast<int>(ranks.size()),
                        cold_buffers);
    if (fit != nullptr) return LinkParams{fit->busbw_GBps * 1e9, fit->alpha_ns, true, fit};
  }
  if (one_node) {
    return LinkParams{intra_busbw_GBps * 1e9, cl.intra.latency_ns, false, nullptr, cl.intra.allreduce_busbw_curve.get()};
  }

  // k: the most GPUs of the group on one node.
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (int r : ranks) nodes.push_back(r / gpn);
  std::sort(nodes.begin(), nodes.end());
  for (std::size_t i = 0; i < nodes.size();) {
    std::size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    max_per_node = std::max(max_per_node, static_cast<int>(j - i));
    i = j;
  }
  // The tier of the inter-node traffic. NCCL keeps it on one rail (its rings
  // pair GPU i of one node with GPU i of the next, and PXN, on by default
  // since NCCL 2.12, first moves data over NVLink to the GPU on the right
  // rail), so the tier is that between the nodes on a common rail, not the
  // pairwise worst of Topology::group_tier, which on a rail-optimised tree
  // counts two GPUs of different rails as a spine crossing. One rail of a
  // fat tree is ultrametric, so comparing every node with the first is enough.
  Tier tier = Tier::leaf;
  const int first = nodes.front() * gpn;
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    if (nodes[i] != nodes[i - 1]) tier = std::max(tier, topo.tier(first, nodes[i] * gpn));
  }
  const double share_GBps = cl.inter.nics_per_node * cl.inter.nic_busbw_GBps / gpn;
  double busbw_GBps = std::min(max_per_node * share_GBps, intra_busbw_GBps);
  if (c == Collective::all_to_all) busbw_GBps = all_to_all_busbw_GBps(ranks, nodes, share_GBps, intra_busbw_GBps);
  // A send/recv (a pipeline hop, or the CP ring's shift) is one connection
  // per GPU: its own NIC's share, however many of the group share the node.
  if (c == Collective::send_recv) busbw_GBps = std::min(share_GBps, intra_busbw_GBps);
  int extra_switches = 0;
  if (tier == Tier::spine) extra_switches = 2;
  if (tier == Tier::core) extra_switches = 4;
  const double over = std::max(1.0, cl.inter.oversubscription);
  const double core_over = std::max(1.0, cl.inter.core_oversubscription);
  if (load == nullptr) {
    if (extra_switches > 0) busbw_GBps /= over;
    if (tier == Tier::core) busbw_GBps /= core_over;
  } else {
    // The uplinks as the topology builds them: a leaf's designed downlinks
    // (its nodes' NICs; one rail's on a rail-optimised tree) over the
    // oversubscription, a pod's leaves' uplinks over the core's; at the NICs'
    // busbw, the rate the rings' edges are priced at.
    const double leaf_down_GBps = std::max(1, cl.inter.nodes_per_leaf) *
                                  (cl.inter.rail_optimized ? 1 : cl.inter.nics_per_node) * cl.inter.nic_busbw_GBps;
    const double leaf_up_GBps = leaf_down_GBps / over;
    const double pod_up_GBps = std::max(1, cl.inter.leaves_per_pod) * leaf_up_GBps / core_over;
    double slowdown = 1.0;
    if (extra_switches > 0 && over > 1.0) slowdown = std::max(slowdown, load->leaf_edges * busbw_GBps / leaf_up_GBps);
    if (tier == Tier::core && (over > 1.0 || core_over > 1.0))
      slowdown = std::max(slowdown, load->pod_edges * busbw_GBps / pod_up_GBps);
    busbw_GBps /= slowdown;
  }
  return LinkParams{busbw_GBps * 1e9, cl.inter.latency_ns + extra_switches * cl.inter.switch_latency_ns};
}

}  // namespace

LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks, bool cold_buffers) {
  return link_params(topo, c, ranks, nullptr, cold_buffers);
}

LinkParams group_link_params(const Topology& topo, Collective c, const std::vector<int>& ranks, const UplinkLoad& load,
                             bool cold_buffers) {
  return link_params(topo, c, ranks, &load, cold_buffers);
}

UplinkCounter::UplinkCounter(const Topology& topo)
    : topo_(topo),
      gpn_(std::max(1, topo.cluster().gpus_per_node)),
      leaf_out_(static_cast<std::size_t>(topo.num_leaves()), 0),
      pod_out_(static_cast<std::size_t>(topo.num_pods()), 0) {}

void UplinkCounter::begin_group() { first_ = prev_ = -1; }

// The ring over nodes: a rank on the node of the previous one adds no edge
// (NCCL's ring passes a node's GPUs in one visit).
void UplinkCounter::add(int rank) {
  if (prev_ >= 0 && rank / gpn_ == prev_ / gpn_) return;
  if (prev_ >= 0) edge(prev_, rank);
  if (first_ < 0) first_ = rank;
  prev_ = rank;
}

void UplinkCounter::end_group() {
  if (prev_ >= 0 && prev_ / gpn_ != first_ / gpn_) edge(prev_, first_);
  first_ = prev_ = -1;
}

void UplinkCounter::edge(int from, int to) {
  const int leaf = topo_.leaf_of(from);
  if (leaf < 0) return;
  if (leaf != topo_.leaf_of(to)) ++leaf_out_[static_cast<std::size_t>(leaf)];
  const int pod = topo_.pod_of(from);
  if (pod != topo_.pod_of(to)) ++pod_out_[static_cast<std::size_t>(pod)];
}

UplinkLoad UplinkCounter::load() const {
  UplinkLoad l;
  for (const int n : leaf_out_) l.leaf_edges = std::max(l.leaf_edges, n);
  for (const int n : pod_out_) l.pod_edges = std::max(l.pod_edges, n);
  return l;
}

UplinkLoad uplink_load(const Topology& topo, const std::vector<std::vector<int>>& groups) {
  UplinkCounter counter(topo);
  for (const std::vector<int>& g : groups) {
    counter.begin_group();
    for (const int r : g) counter.add(r);
    counter.end_group();
  }
  return counter.load();
}

// Compute ops only. Communication ops need a group's LinkParams, so they are
// priced with collective_time_ns by the caller; here they cost nothing.
TimeNs op_time_ns(const GpuProfile& gpu, const Op& op) {
  // A kernel replayed from a captured CUDA graph has no host launch of its
  // own (Op::graphed); a measured time is kept as measured.
  const double launch_ns = op.graphed ? 0.0 : gpu.kernel_launch_ns;
  switch (op.kind) {
    case OpKind::gemm:
      // The shape is what the kernel runs (the unfused attention GEMMs
      // compute the full s x s even though only half is useful).
      // Calibrated: a grouped GEMM as measured inside the executor's MoE
      // layer with as many local experts, by FLOPs (its time hangs on how the
      // rows split among them); a card of another expert count prices it by
      // shape below; a card from before the key by the bare name.
      if (op.grouped && gpu.calibration && op.precision == Precision::bf16) {
        if (const auto ns = calibrated_kernel_ns(*gpu.calibration, grouped_kernel_name(op.name, op.batch), op.flops))
          return std::llround(*ns);
        if (const auto ns = calibrated_kernel_ns(*gpu.calibration, op.name, op.flops)) return std::llround(*ns);
      }
      return gemm_ns(gpu, op.m, op.n, op.k, op.batch, op.bytes, op_hbm_Bps(gpu, op), op.precision, launch_ns,
                     block_scaled_rate(gpu, op));
    case OpKind::attention_core: {
      // Fused (flash) attention: tensor-core work at the efficiency of its
      // grid (query blocks x heads), causal half only, against the HBM
      // traffic of Q, K, V, O. The rate is the flash kernel's own published
      // best (the GPU profile's flash_attention_fwd/bwd_efficiency) where the
      // profile has it, else the best GEMM's; a calibrated profile puts its
      // best measured GEMM FLOP/s here (the calibration sweeps no fused
      // attention kernel).
      if (op.flops <= 0 && op.bytes <= 0) return 0;
      // The kernel's own rates at this head dimension (op.n) and sequence
      // length (op.k, the keys per sequence) where the profile has them.
      const bool backward = op.name == op::attn_flash_bwd;
      // FP8 attention (workload.cpp quantize_attention_core): cuDNN's FP8
      // kernels at the format's measured rates, fractions of the FP8 peak
      // (plan_check refuses a plan whose GPU has none); a calibration's
      // blocks were timed in bf16.
      const std::optional<Fp8AttentionFormat> format = fp8_attention_format_of(op.precision);
      const AttentionRates* fp8 = format ? fp8_attention_rates_of(gpu, *format) : nullptr;
      // Calibrated: the block as measured inside the executor's layer, by FLOPs.
      if (gpu.calibration && fp8 == nullptr)
        if (const auto ns = calibrated_kernel_ns(*gpu.calibration, op.name, op.flops)) return std::llround(*ns);
      const AttentionRates* rates = attention_rates_of(gpu, op.attention_kernel);
      const double flash = rates != nullptr ? attention_efficiency(*rates, op.n, op.k, backward)
                           : backward       ? gpu.flash_attention_bwd_efficiency
                                            : gpu.flash_attention_fwd_efficiency;
      const double best = fp8 != nullptr ? sustained_flops(gpu, attention_efficiency(*fp8, op.n, op.k, backward), op.precision)
                          : gpu.calibration || flash <= 0 ? gemm_best_flops(gpu)
                                                          : sustained_flops(gpu, flash);
      const double compute_s = op.flops / (best * quantisation_efficiency(gpu, op.m, op.n, op.batch));
      const double memory_s = op.bytes / hbm_Bps(gpu);
      return to_ns(std::max(compute_s, memory_s)) + static_cast<TimeNs>(launch_ns);
    }
    case OpKind::memory_bound:
      return kernel_ns(gpu, op.name, op.bytes, op_hbm_Bps(gpu, op), launch_ns);
    case OpKind::collective:
    case OpKind::p2p:
      return 0;
  }
  return 0;
}

GpuProfile with_sms_taken(const GpuProfile& gpu, int sms_taken) {
  GpuProfile g = gpu;
  if (sms_taken <= 0 || gpu.sm_count <= sms_taken) return g;
  const int left = gpu.sm_count - sms_taken;
  g.peak_bf16_flops = gpu.peak_bf16_flops * static_cast<double>(left) / static_cast<double>(gpu.sm_count);
  g.peak_fp8_flops = gpu.peak_fp8_flops * static_cast<double>(left) / static_cast<double>(gpu.sm_count);
  g.peak_fp4_flops = gpu.peak_fp4_flops * static_cast<double>(left) / static_cast<double>(gpu.sm_count);
  g.sm_count = left;
  return g;
}

namespace {
GpuProfile uncalibrated(const GpuProfile& gpu) {
  GpuProfile g = gpu;
  g.calibration = nullptr;
  return g;
}
}  // namespace

SmsTakenPricer::SmsTakenPricer(const GpuProfile& gpu, int sms_taken)
    : gpu_(gpu), sms_taken_(sms_taken), full_(uncalibrated(gpu)), reduced_(with_sms_taken(full_, sms_taken)) {}

TimeNs SmsTakenPricer::operator()(const Op& op) const {
  if (sms_taken_ <= 0 || op.kind != OpKind::gemm) return op_time_ns(gpu_, op);
  const TimeNs reduced = op_time_ns(reduced_, op);
  if (!gpu_.calibration) return reduced;
  const TimeNs full = op_time_ns(full_, op);
  const TimeNs measured = op_time_ns(gpu_, op);
  if (full <= 0) return measured;
  return std::llround(static_cast<double>(measured) * static_cast<double>(reduced) / static_cast<double>(full));
}

TimeNs op_time_sms_taken_ns(const GpuProfile& gpu, const Op& op, int sms_taken) {
  if (sms_taken <= 0 || op.kind != OpKind::gemm) return op_time_ns(gpu, op);
  return SmsTakenPricer(gpu, sms_taken)(op);
}

TimeNs overlapped_time_ns(TimeNs collective_ns, TimeNs reduced_ns, TimeNs full_ns) {
  if (collective_ns <= 0 || reduced_ns <= 0) return full_ns;
  if (collective_ns >= reduced_ns) return reduced_ns;
  const double left = 1.0 - static_cast<double>(collective_ns) / static_cast<double>(reduced_ns);
  return collective_ns + std::llround(left * static_cast<double>(full_ns));
}

int nccl_ring_channels(const Cluster& cl, int members_per_node, int nodes) {
  if (cl.intra.nccl_channels <= 0 || members_per_node <= 0) return 0;
  if (nodes <= 1) return cl.intra.nccl_channels;
  if (cl.inter.nics_per_node <= 0 || cl.inter.nic_bandwidth_Gbps <= 0) return 0;
  // NCCL's ring speeds across nodes (search.cc speedArrayInter), GB/s.
  static constexpr double kSpeeds[] = {48.0, 30.0, 24.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                       7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
  const double width = cl.inter.nic_bandwidth_Gbps / 8.0;
  double speed = kSpeeds[std::size(kSpeeds) - 1];
  for (const double s : kSpeeds) {
    if (s <= width) {
      speed = s;
      break;
    }
  }
  const int rings = std::min(members_per_node, cl.inter.nics_per_node);
  const int searched = std::min(16, speed >= 25.0 ? 2 * rings : rings);
  const int channels = std::min(32, 2 * searched);
  return std::min(channels, std::max(0, cl.gpu.sm_count - 1));
}

int nccl_ring_channels(const Cluster& cl, const std::vector<int>& ranks) {
  const int gpn = std::max(1, cl.gpus_per_node);
  std::map<int, int> on_node;
  for (const int r : ranks) ++on_node[r / gpn];
  int most = 0;
  for (const auto& [node, members] : on_node) most = std::max(most, members);
  return nccl_ring_channels(cl, most, static_cast<int>(on_node.size()));
}

int flex_exchange_sms(int sm_count, const FlexSetting& flex, int domains) {
  return std::min(flex_kernels(flex, domains).sms, std::max(0, sm_count - 1));
}

int ep_exchange_sms(const Cluster& cl, MoeDispatcher dispatcher, const FlexSetting& flex, const std::vector<int>& ep_ranks) {
  if (dispatcher == MoeDispatcher::flex) {
    const int gpn = std::max(1, cl.gpus_per_node);
    std::vector<int> nodes;
    for (const int r : ep_ranks)
      if (std::find(nodes.begin(), nodes.end(), r / gpn) == nodes.end()) nodes.push_back(r / gpn);
    return flex_exchange_sms(cl.gpu.sm_count, flex, static_cast<int>(nodes.size()));
  }
  return nccl_ring_channels(cl, ep_ranks);
}

double sm_contention_ns(double collective_ns, double compute_ns, double ratio) {
  if (collective_ns <= 0 || compute_ns <= 0 || ratio <= 1.0) return 0;
  return std::min(collective_ns * (1.0 - 1.0 / ratio), compute_ns * (ratio - 1.0));
}

}  // namespace cuboid
