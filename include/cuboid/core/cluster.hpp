#pragma once
#ifndef CUBOID_LAYER_CORE
#error "cuboid/core is not below this layer in the build (docs/architecture.md)"
#endif
// Cluster cards and GPU profiles (topologies/*.json). Every default constant
// in a shipped card carries its source ({"value": X, "source": "..."}); the
// loader keeps those sources so reports can cite them.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuboid {

struct Calibration;  // calibration.hpp
struct BusbwCurve;   // busbw_curve.hpp

// The largest GpuProfile::speed_spread a card or --gpu-spread may give; the
// sourced values are near 0.01, and at 0.5 the normal model already puts the
// slowest of 4,000 GPUs at 2.8 times the median's time.
inline constexpr double kMaxSpeedSpread = 0.5;

// The attention core's kernel by library and version (--attention-kernel):
// auto = the trainer preset's, else the GPU profile's default fused kernel
// (Transformer Engine's choice on it); unfused = Megatron's QK^T, fused
// softmax, AV (flash attention off); flash1 / flash2 / flash3 = Dao's
// FlashAttention 1, 2, 3; cudnn = cuDNN's fused attention (Transformer
// Engine's FusedAttention). Each fused kernel is priced at the GPU
// profile's sourced rates for it (attention_kernels).
enum class AttentionKernel { auto_, unfused, flash1, flash2, flash3, cudnn };

// One fused attention kernel's published rates on a GPU: the achieved
// fraction of peak of its forward and of its backward (FLOPs as the
// FlashAttention papers count them: causal half, backward 2.5 x forward) by
// head dimension (rows, ascending) and sequence length (columns, ascending).
// attention_efficiency picks the nearest head dimension and interpolates in
// log2 of the sequence length, clamped to the measured range.
struct AttentionRates {
  std::vector<int> head_dims;
  std::vector<std::int64_t> seq_lengths;
  std::vector<std::vector<double>> fwd, bwd;  // [head_dims][seq_lengths]
};

// The formats cuDNN's fused attention runs in FP8 (Megatron-Core's
// --fp8-dot-product-attention, cuboid's --fp8-attention; Transformer
// Engine's FusedAttention FP8 backend): per-tensor scaled E4M3 (under the
// delayed and current scaling recipes) and MXFP8 (under the MXFP8 recipe).
enum class Fp8AttentionFormat { per_tensor, mxfp8 };

struct GpuProfile {
  std::string name;                     // "A100-SXM4-80GB"
  double peak_bf16_flops = 0;           // dense tensor-core FLOP/s (datasheet)
  double peak_fp8_flops = 0;  // dense FP8 tensor-core FLOP/s (datasheet); 0: no FP8 tensor cores
  double peak_fp4_flops = 0;  // dense FP4 (NVFP4) tensor-core FLOP/s (datasheet); 0: none
  // Block-scaled ("microscaling") tensor-core formats, MXFP8 and NVFP4: the
  // GEMM applies a scale per 1 x 32 (1 x 16) block itself. Transformer
  // Engine runs those recipes on compute capability 10.0 (Blackwell) only.
  bool microscaling_formats = false;
  double hbm_bandwidth_Bps = 0;         // bytes/s (datasheet)
  std::int64_t memory_bytes = 0;        // HBM capacity
  int sm_count = 0;                     // streaming multiprocessors (wave quantisation)
  double gemm_max_efficiency = 0;       // best achievable fraction of peak on large GEMMs (MAMF / peak)
  // The same for an FP8 GEMM (of peak_fp8_flops: a per-tensor scaled
  // torch._scaled_mm sweep's best shape) and an FP4 one (of peak_fp4_flops),
  // measured where a profile has them; 0: gemm_max_efficiency, the bf16
  // GEMM's fraction taken for the format's own peak.
  double gemm_max_efficiency_fp8 = 0;
  double gemm_max_efficiency_fp4 = 0;
  // An MXFP8 GEMM's rate as a fraction of a per-tensor FP8 GEMM's at the
  // same shape, per pass (the forward's GEMM, the backward's data-gradient
  // and weight-gradient GEMMs): the block scales the kernel applies cost it
  // this much. Measured where a profile has it; 1: the per-tensor FP8 rate.
  double mxfp8_gemm_fprop = 1;
  double mxfp8_gemm_dgrad = 1;
  double mxfp8_gemm_wgrad = 1;
  // The fraction of the burst rates above (gemm_max_efficiency and the flash
  // kernels' efficiencies, benchmarks of short runs at their best shape)
  // that tensor-core work keeps in training: long, back to back, on operands
  // distributed as trained weights and activations, the clock set by the
  // power limit. 1: no such measurement (the burst rates as they are).
  double gemm_sustained_fraction = 1;
  double memory_bound_efficiency = 0;   // achievable fraction of HBM bandwidth for element-wise kernels
  // Achieved fraction of HBM bandwidth of the unfused attention core's
  // kernels (the s x s score GEMMs with k = head_dim, softmax, dropout, and
  // their backward), measured where a profile has it; 0: memory_bound_efficiency.
  double unfused_attention_efficiency = 0;
  // Achieved fraction of HBM bandwidth of Transformer Engine's MXFP8
  // quantize kernel (a bf16 tensor in, its rowwise and columnwise MXFP8
  // copies and their scales out, in one pass), measured where a profile has
  // it; 0: memory_bound_efficiency.
  double mxfp8_cast_efficiency = 0;
  // Achieved fraction of peak of the fused (flash) attention kernel's
  // forward and backward, from that kernel's own published benchmarks; 0:
  // gemm_max_efficiency (a flash kernel reaches less than the best GEMM).
  // A card without an attention_kernels table prices every fused kernel here.
  double flash_attention_fwd_efficiency = 0;
  double flash_attention_bwd_efficiency = 0;
  // The fused kernel the GPU's trainer stack picks by default (Transformer
  // Engine's backend choice on this compute capability): what
  // --attention-kernel auto runs here; auto: none named (the rates above).
  AttentionKernel attention_kernel = AttentionKernel::auto_;
  // Each fused kernel's sourced rates on this GPU (attention_kernels); a
  // kernel the table lacks is refused on a GPU that has a table.
  std::map<AttentionKernel, AttentionRates> attention_rates;
  // cuDNN's FP8 attention rates per format (attention_kernels.cudnn.fp8 and
  // .mxfp8), fractions of the FP8 peak; a format without a table is refused.
  std::map<Fp8AttentionFormat, AttentionRates> fp8_attention_rates;
  double kernel_launch_ns = 0;          // fixed cost per kernel
  std::int64_t memory_reserve_bytes = 0;  // CUDA context, NCCL buffers, cuBLAS workspace, fragmentation
  // Whether the device's default attention core is fused (flash): the
  // planner's default for --flash-attention. The CPU executor's default is
  // the unfused core (QK^T, softmax, AV), so its cards say false; a plan
  // that turns flash on there (context parallelism needs it) runs the fused
  // core's arithmetic by blocks (Backend::attention_*).
  bool flash_attention = true;
  // Relative standard deviation of a GPU's sustained compute speed across
  // GPUs of this SKU (manufacturing and power management); 0: every GPU
  // alike. The constants above describe a median GPU, and a synchronous
  // step waits for the slowest of its GPUs (cost/speed_spread.hpp).
  double speed_spread = 0;
  std::map<std::string, std::string> sources;  // field -> source text
  // Measured GEMM / kernel timings of a calibrated card (its "calibration"
  // section), consulted by gemm_time_ns / op_time_ns before the datasheet
  // model above; null for an uncalibrated card. Shared, so copies stay cheap.
  std::shared_ptr<const Calibration> calibration;
};

struct IntraNodeFabric {
  std::string kind;                     // "nvswitch" | "nvlink" | "pcie" | "shared-memory"
  double link_bandwidth_GBps = 0;       // per GPU, per direction, line rate
  double allreduce_busbw_GBps = 0;      // nccl-tests all_reduce busbw across the whole node
  double busbw_GBps = 0;                // nccl-tests busbw of the other collectives and of p2p
  double latency_ns = 0;                // per message (alpha)
  // SMs a ring collective's kernel holds on each GPU of this tier while it
  // runs (NCCL launches one CTA per channel, each resident on its own SM for
  // the whole collective), so a GEMM overlapping it runs on sm_count minus
  // these. A property of NCCL's topology search on this fabric, not of the
  // GPU alone. 0 (absent): not modelled, overlapped GEMMs keep every SM.
  int nccl_channels = 0;
  // Optional nccl-tests all_reduce busbw by message size (busbw_curve.hpp):
  // all-reduce, reduce-scatter and all-gather inside a node are priced at
  // max(alpha-beta at the constants above, the curve's time); null: the
  // constants alone, as before.
  std::shared_ptr<const BusbwCurve> allreduce_busbw_curve;
  std::map<std::string, std::string> sources;
};

struct InterNodeFabric {
  std::string kind;                     // "infiniband-hdr" | "infiniband-ndr" | "infiniband-xdr" | "roce" | "none"
  int nics_per_node = 0;
  double nic_bandwidth_Gbps = 0;        // line rate per NIC
  double nic_busbw_GBps = 0;            // achieved nccl-tests bandwidth per NIC
  double latency_ns = 0;                // per message (alpha), NIC-to-NIC through one switch
  double switch_latency_ns = 0;         // added per extra switch hop
  int levels = 2;                       // fat-tree levels: 1 = one switch, 2 = leaf/spine, 3 = leaf/spine/core
  int nodes_per_leaf = 1;               // nodes under one leaf switch (per rail when rail-optimised)
  int leaves_per_pod = 0;               // leaves under one spine group (3-level trees); 0 = all
  double oversubscription = 1.0;        // leaf downlink : uplink bandwidth (1 = full bisection)
  double core_oversubscription = 1.0;   // spine (pod) downlink : uplink to the core, 3-level trees
  bool rail_optimized = true;           // NIC i of every node goes to the leaf of rail i
  std::map<std::string, std::string> sources;
};

// The link between a GPU and its host's memory, which activation offloading
// copies over (cluster card "host_link"): NVLink-C2C on a Grace superchip,
// PCIe on an x86 host. Achieved rates per GPU and direction; 0: the card
// states no host link (offloading is refused on it).
struct HostLink {
  std::string kind;     // "nvlink-c2c" | "pcie-gen4" | "pcie-gen5"
  double d2h_GBps = 0;  // device to host (offload)
  double h2d_GBps = 0;  // host to device (reload)
  std::map<std::string, std::string> sources;
  bool present() const { return d2h_GBps > 0 && h2d_GBps > 0; }
};

struct Cluster {
  std::string name;
  std::string source_file;
  int nodes = 0;
  int gpus_per_node = 0;
  // The GPUs one host (one operating system, one launcher: torchrun's
  // --nproc_per_node, a hostfile's slots) drives, where a node is more than
  // one host: a GB200 NVL72 rack is one NVLink node of 18 hosts (compute
  // trays) of 4 GPUs. 0: the node is one host. A multiple of gpus_per_node
  // where one host holds several nodes (a test fixture's CPU ranks).
  int gpus_per_host = 0;
  GpuProfile gpu;
  IntraNodeFabric intra;
  InterNodeFabric inter;
  HostLink host_link;
  // The card's "calibration" section (the same object as gpu.calibration):
  // measured collectives per (collective, tier, group size) for the estimator
  // and the simulator; null for an uncalibrated card.
  std::shared_ptr<const Calibration> calibration;

  int total_gpus() const { return nodes * gpus_per_node; }
  // GPUs per host and hosts in all (the node's when gpus_per_host is 0).
  int host_gpus() const { return gpus_per_host > 0 ? gpus_per_host : gpus_per_node; }
  int hosts() const { return (total_gpus() + host_gpus() - 1) / host_gpus(); }
};

// The rates of `kernel` on `gpu` (auto: its default kernel); nullptr when
// its table has none (then flash_attention_fwd/bwd_efficiency price it).
const AttentionRates* attention_rates_of(const GpuProfile& gpu, AttentionKernel kernel);
// cuDNN's FP8 attention rates on `gpu` in `format`; nullptr when it has none.
const AttentionRates* fp8_attention_rates_of(const GpuProfile& gpu, Fp8AttentionFormat format);
// The format as messages name it ("per-tensor FP8", "MXFP8") and its key
// under a card's attention_kernels.cudnn ("fp8", "mxfp8").
std::string_view describe(Fp8AttentionFormat format);
std::string_view card_key(Fp8AttentionFormat format);
// The fraction of peak of one pass of the kernel at a head dimension and a
// sequence length (AttentionRates says how it is read).
double attention_efficiency(const AttentionRates& rates, std::int64_t head_dim, std::int64_t seq_length, bool backward);

// Parses a GPU profile object (inline in a card or a file under topologies/gpus/).
GpuProfile gpu_profile_from_json(const nlohmann::json& j, const std::string& source);

// Loads a cluster card. "gpu" may be an inline object or a path relative to the
// card's folder (e.g. "gpus/a100-sxm4-80gb.json"). `nodes`, when given,
// overrides the card's node count (--nodes N): one card serves every size.
// `gpus_per_node`, when given, uses that many of each node's GPUs, at most the
// card's, with their share of its NICs (--gpus-per-node G: 16 of an NVL72
// rack's 18 trays are 64 GPUs).
Cluster load_cluster(const std::filesystem::path& path, std::optional<int> nodes = std::nullopt,
                     std::optional<int> gpus_per_node = std::nullopt);
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source,
                          const std::filesystem::path& base_dir, std::optional<int> nodes = std::nullopt,
                          std::optional<int> gpus_per_node = std::nullopt);

}  // namespace cuboid
