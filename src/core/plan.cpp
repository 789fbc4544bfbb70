#include "cuboid/core/plan.hpp"

#include <algorithm>
#include <iterator>
#include <set>
#include <stdexcept>
#include <utility>

#include "cuboid/core/error.hpp"

namespace cuboid {

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string_view to_string(Dim d) {
  switch (d) {
    case Dim::tp: return "tp";
    case Dim::dp: return "dp";
    case Dim::pp: return "pp";
  }
  return "?";
}

std::string_view to_string(Zero3Unit u) { return u == Zero3Unit::tensor ? "tensor" : "block"; }

std::string_view to_string(CpComm c) { return c == CpComm::a2a ? "a2a" : "p2p"; }

CpComm parse_cp_comm(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "p2p") return CpComm::p2p;
  if (s == "a2a") return CpComm::a2a;
  if (s == "allgather" || s == "a2a+p2p")
    throw InputError(source, field, "CP communication \"" + std::string(s) + "\" is not modelled",
                     "use p2p (the ring, Megatron's default) or a2a");
  throw InputError(source, field, "unknown CP communication " + quote_value(s), "use p2p or a2a");
}

std::string_view to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::alltoall: return "alltoall";
    case MoeDispatcher::allgather: return "allgather";
    case MoeDispatcher::flex: return "flex";
  }
  return "?";
}

MoeDispatcher parse_moe_dispatcher(std::string_view s, const std::string& source, const std::string& field) {
  for (MoeDispatcher d : {MoeDispatcher::alltoall, MoeDispatcher::allgather, MoeDispatcher::flex})
    if (s == to_string(d)) return d;
  throw InputError(source, field, "unknown MoE token dispatcher " + quote_value(s),
                   "use alltoall, allgather or flex (DeepEP / HybridEP)");
}

std::string_view to_string(FlexBackend b) { return b == FlexBackend::hybridep ? "hybridep" : "deepep"; }

FlexBackend parse_flex_backend(std::string_view s, const std::string& source, const std::string& field) {
  for (FlexBackend b : {FlexBackend::deepep, FlexBackend::hybridep})
    if (s == to_string(b)) return b;
  throw InputError(source, field, "unknown flex dispatcher backend " + quote_value(s),
                   "use deepep or hybridep (Megatron-Core's --moe-flex-dispatcher-backend; ncclep is not modelled)");
}

namespace {
constexpr std::pair<Precision, std::string_view> kPrecisions[] = {
    {Precision::bf16, "bf16"},          {Precision::fp8_delayed, "fp8-delayed"}, {Precision::fp8_current, "fp8-current"},
    {Precision::fp8_blockwise, "fp8-blockwise"}, {Precision::mxfp8, "mxfp8"},    {Precision::nvfp4, "nvfp4"},
};
}  // namespace

std::string_view to_string(Precision p) {
  for (const auto& [value, name] : kPrecisions)
    if (value == p) return name;
  return "?";
}

std::string_view to_string(OptimizerKind o) { return o == OptimizerKind::muon ? "muon" : "adam"; }

std::string precision_names() {
  std::string out;
  for (std::size_t i = 0; i < std::size(kPrecisions); ++i)
    out += std::string(i == 0 ? "" : i + 1 == std::size(kPrecisions) ? " or " : ", ") + std::string(kPrecisions[i].second);
  return out;
}

Precision parse_precision(std::string_view s, const std::string& source, const std::string& field) {
  for (const auto& [value, name] : kPrecisions)
    if (name == s) return value;
  throw InputError(source, field, "unknown precision " + quote_value(s), "use " + precision_names());
}

namespace {
constexpr std::pair<AttentionKernel, std::string_view> kAttentionKernels[] = {
    {AttentionKernel::auto_, "auto"},   {AttentionKernel::unfused, "unfused"}, {AttentionKernel::flash1, "flash1"},
    {AttentionKernel::flash2, "flash2"}, {AttentionKernel::flash3, "flash3"},   {AttentionKernel::cudnn, "cudnn"},
};
}  // namespace

std::string_view to_string(AttentionKernel k) {
  for (const auto& [value, name] : kAttentionKernels)
    if (value == k) return name;
  return "?";
}

std::string attention_kernel_names() {
  std::string out;
  for (std::size_t i = 0; i < std::size(kAttentionKernels); ++i)
    out += std::string(i == 0 ? "" : i + 1 == std::size(kAttentionKernels) ? " or " : ", ") +
           std::string(kAttentionKernels[i].second);
  return out;
}

AttentionKernel parse_attention_kernel(std::string_view s, const std::string& source, const std::string& field) {
  for (const auto& [value, name] : kAttentionKernels)
    if (name == s) return value;
  throw InputError(source, field, "unknown attention kernel " + quote_value(s), "use " + attention_kernel_names());
}

Zero3Unit parse_zero3_unit(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "block") return Zero3Unit::block;
  if (s == "tensor") return Zero3Unit::tensor;
  throw InputError(source, field, "unknown ZeRO-3 unit " + quote_value(s), "use block or tensor");
}

Recompute parse_recompute(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  throw InputError(source, field, "unknown recompute mode " + quote_value(s),
                   "use none, selective or full");
}

std::string_view to_string(RecomputeMethod m) {
  switch (m) {
    case RecomputeMethod::uniform: return "uniform";
    case RecomputeMethod::block: return "block";
  }
  return "?";
}

RecomputeMethod parse_recompute_method(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "uniform") return RecomputeMethod::uniform;
  if (s == "block") return RecomputeMethod::block;
  throw InputError(source, field, "unknown recompute method " + quote_value(s), "use uniform or block");
}

bool recomputes_layer(const ParallelPlan& plan, int index) {
  if (plan.recompute != Recompute::full) return false;
  return plan.recompute_method == RecomputeMethod::uniform || index < plan.recompute_num_layers;
}

std::vector<std::array<int, 2>> recompute_groups(const ParallelPlan& plan, int layers) {
  std::vector<std::array<int, 2>> groups;
  if (plan.recompute != Recompute::full) return groups;
  const int n = std::max(1, plan.recompute_num_layers);
  if (plan.recompute_method == RecomputeMethod::block) {
    for (int i = 0; i < std::min(n, layers); ++i) groups.push_back({i, i + 1});
  } else {
    for (int i = 0; i < layers; i += n) groups.push_back({i, std::min(i + n, layers)});
  }
  return groups;
}

namespace {

// A comma-separated list of module names (each Megatron-Core's) as bits of
// `all`, an unknown name handed to `unknown` (which throws); and back.
template <typename Module, std::size_t N, typename Unknown>
std::uint8_t parse_module_bits(std::string_view list, const Module (&all)[N], Unknown&& unknown) {
  std::uint8_t bits = 0;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view name = list.substr(start, comma - start);
    bool known = false;
    for (const Module m : all) {
      if (name == to_string(m)) {
        bits = static_cast<std::uint8_t>(bits | static_cast<std::uint8_t>(m));
        known = true;
      }
    }
    if (!known) unknown(name);
    start = comma + 1;
  }
  return bits;
}

template <typename Module, std::size_t N>
std::string module_bits_string(std::uint8_t bits, const Module (&all)[N]) {
  std::string out;
  for (const Module m : all) {
    if ((bits & static_cast<std::uint8_t>(m)) == 0) continue;
    if (!out.empty()) out += ',';
    out += to_string(m);
  }
  return out;
}

}  // namespace

namespace {
constexpr RecomputeModule kRecomputeModules[] = {
    RecomputeModule::core_attn, RecomputeModule::mlp, RecomputeModule::layernorm, RecomputeModule::moe_act,
    RecomputeModule::moe, RecomputeModule::shared_experts, RecomputeModule::mla_up_proj,
};
}  // namespace

std::string_view to_string(RecomputeModule m) {
  switch (m) {
    case RecomputeModule::core_attn: return "core_attn";
    case RecomputeModule::mlp: return "mlp";
    case RecomputeModule::layernorm: return "layernorm";
    case RecomputeModule::moe_act: return "moe_act";
    case RecomputeModule::moe: return "moe";
    case RecomputeModule::shared_experts: return "shared_experts";
    case RecomputeModule::mla_up_proj: return "mla_up_proj";
  }
  return "?";
}

std::uint8_t parse_recompute_modules(std::string_view list, const std::string& source, const std::string& field) {
  return parse_module_bits(list, kRecomputeModules, [&](std::string_view name) {
    throw InputError(source, field, "unknown recompute module " + quote_value(name),
                     "use a comma-separated list of core_attn, mlp, layernorm, moe_act, moe, shared_experts, "
                     "mla_up_proj");
  });
}

std::string recompute_modules_string(std::uint8_t modules) { return module_bits_string(modules, kRecomputeModules); }

namespace {
constexpr OffloadModule kOffloadModules[] = {
    OffloadModule::attn_norm, OffloadModule::qkv_linear, OffloadModule::core_attn, OffloadModule::attn_proj,
    OffloadModule::mlp_norm,  OffloadModule::expert_fc1, OffloadModule::moe_act,
};
}  // namespace

std::string_view to_string(OffloadModule m) {
  switch (m) {
    case OffloadModule::attn_norm: return "attn_norm";
    case OffloadModule::qkv_linear: return "qkv_linear";
    case OffloadModule::core_attn: return "core_attn";
    case OffloadModule::attn_proj: return "attn_proj";
    case OffloadModule::mlp_norm: return "mlp_norm";
    case OffloadModule::expert_fc1: return "expert_fc1";
    case OffloadModule::moe_act: return "moe_act";
  }
  return "?";
}

std::uint8_t parse_offload_modules(std::string_view list, const std::string& source, const std::string& field) {
  return parse_module_bits(list, kOffloadModules, [&](std::string_view name) {
    // Megatron-Core's other two (transformer_config.py:2132-2142 at
    // d98e8a64) offload what no model of cuboid's has.
    if (name == "fused_group_mlp")
      throw InputError(source, field,
                       "fused_group_mlp offloads Transformer Engine's fused grouped MLP "
                       "(--use-transformer-engine-op-fuser), which cuboid does not model",
                       "offload expert_fc1 and moe_act instead");
    if (name == "gdp_qkv")
      throw InputError(source, field, "gdp_qkv offloads the GatedDeltaProduct mixer's input, which no model of cuboid's has",
                       "drop gdp_qkv");
    throw InputError(source, field, "unknown offload module " + quote_value(name),
                     "use a comma-separated list of attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, "
                     "expert_fc1, moe_act");
  });
}

std::string offload_modules_string(std::uint8_t modules) { return module_bits_string(modules, kOffloadModules); }

Schedule parse_schedule(std::string_view s, const std::string& source, const std::string& field) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  if (s == "interleaved") return Schedule::interleaved;
  throw InputError(source, field, "unknown pipeline schedule " + quote_value(s),
                   "use gpipe, 1f1b or interleaved");
}

std::string RankOrder::str() const {
  std::string out;
  for (Dim d : inner_to_outer) {
    if (!out.empty()) out += "-";
    out += to_string(d);
  }
  return out;
}

std::string RankOrder::megatron_name() const {
  if (!cp_next_to_tp()) return "";
  return inner_to_outer[1] == Dim::dp ? "tp-cp-ep-dp-pp" : "tp-cp-ep-pp-dp";
}

std::array<RankAxis, 4> RankOrder::axes() const {
  auto axis = [](Dim d) { return d == Dim::tp ? RankAxis::tp : d == Dim::dp ? RankAxis::dp : RankAxis::pp; };
  std::array<RankAxis, 4> out{};
  std::size_t k = 0;
  for (Dim d : inner_to_outer) {
    if (d == Dim::dp && !cp_next_to_tp()) out[k++] = RankAxis::cp;
    out[k++] = axis(d);
    if (d == Dim::tp && cp_next_to_tp()) out[k++] = RankAxis::cp;
  }
  return out;
}

RankOrder RankOrder::parse(std::string_view s, const std::string& source, const std::string& field) {
  const std::string fix =
      "give the three dimensions innermost first, e.g. tp-dp-pp (Megatron's default) or tp-pp-dp, or Megatron-Core's "
      "tp-cp-ep-dp-pp or tp-cp-ep-pp-dp";
  // Megatron-Core's names of its two orders (parallel_state.py), the same
  // maps as tp-dp-pp and tp-pp-dp.
  if (s == "tp-cp-ep-dp-pp") return RankOrder{};
  if (s == "tp-cp-ep-pp-dp") return RankOrder{{Dim::tp, Dim::pp, Dim::dp}};
  RankOrder order;
  std::set<Dim> seen;
  std::size_t start = 0;
  int i = 0;
  while (start <= s.size()) {
    std::size_t dash = s.find('-', start);
    std::string_view part = s.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    Dim d;
    if (part == "tp") d = Dim::tp;
    else if (part == "dp") d = Dim::dp;
    else if (part == "pp") d = Dim::pp;
    else if (part == "cp" || part == "ep")
      throw InputError(source, field,
                       "rank order " + quote_value(s) + " names " + std::string(part) +
                           ": cuboid places CP and EP as Megatron-Core does, in its orders tp-cp-ep-dp-pp and "
                           "tp-cp-ep-pp-dp only",
                       fix);
    else throw InputError(source, field, "unknown dimension " + quote_value(part) + " in rank order " + quote_value(s), fix);
    if (i >= 3 || !seen.insert(d).second)
      throw InputError(source, field, "rank order \"" + std::string(s) + "\" must name tp, dp and pp once each", fix);
    order.inner_to_outer[static_cast<std::size_t>(i++)] = d;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  if (i != 3) throw InputError(source, field, "rank order \"" + std::string(s) + "\" must name tp, dp and pp once each", fix);
  return order;
}

std::string_view to_string(CudaGraphImpl i) {
  switch (i) {
    case CudaGraphImpl::none: return "none";
    case CudaGraphImpl::local: return "local";
    case CudaGraphImpl::transformer_engine: return "transformer_engine";
    case CudaGraphImpl::full_iteration: return "full_iteration";
  }
  return "none";
}

namespace {
constexpr CudaGraphModule kCudaGraphModules[] = {CudaGraphModule::attn,       CudaGraphModule::mlp,
                                                 CudaGraphModule::moe,        CudaGraphModule::moe_router,
                                                 CudaGraphModule::moe_preprocess, CudaGraphModule::mamba};
constexpr std::uint8_t bit(CudaGraphModule m) { return static_cast<std::uint8_t>(m); }
}  // namespace

std::string_view to_string(CudaGraphModule m) {
  switch (m) {
    case CudaGraphModule::attn: return "attn";
    case CudaGraphModule::mlp: return "mlp";
    case CudaGraphModule::moe: return "moe";
    case CudaGraphModule::moe_router: return "moe_router";
    case CudaGraphModule::moe_preprocess: return "moe_preprocess";
    case CudaGraphModule::mamba: return "mamba";
  }
  return "?";
}

std::string CudaGraphs::str() const {
  std::string out(to_string(impl));
  if (modules == 0) return out;
  out += ":";
  for (CudaGraphModule m : kCudaGraphModules)
    if ((modules & bit(m)) != 0) {
      if (out.back() != ':') out += ",";
      out += to_string(m);
    }
  return out;
}

// The list's own rules (transformer_config.py __post_init__ at d98e8a64,
// lines 2804-2823); those that depend on the model and the plan are
// check_plan's (plan_check.cpp check_cuda_graph_modules).
CudaGraphs CudaGraphs::parse(std::string_view s, const std::string& source, const std::string& field) {
  const std::string fix =
      "use none, full_iteration, local or transformer_engine, the last two optionally with :MODULES, a comma-separated "
      "list of attn, mlp, moe, moe_router, moe_preprocess and mamba (Megatron-Core's --cuda-graph-impl and "
      "--cuda-graph-modules)";
  CudaGraphs g;
  const std::size_t colon = s.find(':');
  const std::string_view impl = s.substr(0, colon);
  bool known = false;
  for (CudaGraphImpl i : {CudaGraphImpl::none, CudaGraphImpl::local, CudaGraphImpl::transformer_engine,
                          CudaGraphImpl::full_iteration})
    if (impl == to_string(i)) {
      g.impl = i;
      known = true;
    }
  if (!known) throw InputError(source, field, "unknown CUDA graph implementation " + quote_value(impl), fix);
  if (colon == std::string_view::npos) return g;
  if (g.impl == CudaGraphImpl::none || g.impl == CudaGraphImpl::full_iteration)
    throw InputError(source, field, quote_value(s) + ": " + std::string(impl) + " takes no modules",
                     "give " + std::string(impl) + " alone");
  std::string_view rest = s.substr(colon + 1);
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    std::uint8_t b = 0;
    for (CudaGraphModule m : kCudaGraphModules)
      if (part == to_string(m)) b = bit(m);
    if (b == 0)
      throw InputError(source, field, "unknown CUDA graph module " + quote_value(part) + " in " + quote_value(s),
                       "name attn, mlp, moe, moe_router, moe_preprocess or mamba (Megatron-Core's CudaGraphModule)");
    if ((g.modules & b) != 0)
      throw InputError(source, field, quote_value(s) + " names " + std::string(part) + " twice", "name each module once");
    g.modules |= b;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  const auto has = [&](CudaGraphModule m) { return (g.modules & bit(m)) != 0; };
  // local does not tell the router from the preprocess: either names both (:2806-2815).
  if (g.impl == CudaGraphImpl::local && (has(CudaGraphModule::moe_router) || has(CudaGraphModule::moe_preprocess)))
    g.modules |= bit(CudaGraphModule::moe_router) | bit(CudaGraphModule::moe_preprocess);
  if (has(CudaGraphModule::moe) && has(CudaGraphModule::moe_router))
    throw InputError(source, field,
                     quote_value(s) + ": cuda_graph_modules must not contain both moe and moe_router (Megatron-Core "
                                      "asserts it: transformer_config.py:2820@d98e8a64)",
                     "name moe, or moe_router (with moe_preprocess)");
  if (has(CudaGraphModule::moe_preprocess) && !has(CudaGraphModule::moe_router))
    throw InputError(source, field,
                     quote_value(s) + ": moe_preprocess cuda graph is only supported with moe_router cuda graph "
                                      "(Megatron-Core asserts it: transformer_config.py:2824@d98e8a64)",
                     "add moe_router");
  return g;
}

bool has_uneven_stages(const ParallelPlan& plan) { return plan.first_stage_layers > 0 || plan.last_stage_layers > 0; }

bool has_pipeline_layout(const ParallelPlan& plan) {
  return plan.embedding_in_split || plan.loss_in_split || !plan.pipeline_layout.empty();
}

std::int64_t split_layers(const ParallelPlan& plan, std::int64_t num_layers) {
  return num_layers + (plan.embedding_in_split ? 1 : 0) + (plan.loss_in_split ? 1 : 0);
}

int layers_on_stage(const ParallelPlan& plan, std::int64_t num_layers, int stage) {
  if (has_pipeline_layout(plan)) {
    int layers = 0;
    for (int c = 0; c < chunks_per_stage(plan); ++c) layers += layers_in_chunk(plan, num_layers, stage, c);
    return layers;
  }
  if (!has_uneven_stages(plan)) return static_cast<int>(num_layers / plan.pp);
  if (stage == 0 && plan.first_stage_layers > 0) return plan.first_stage_layers;
  if (stage == plan.pp - 1 && plan.last_stage_layers > 0) return plan.last_stage_layers;
  const int fixed_stages = (plan.first_stage_layers > 0 ? 1 : 0) + (plan.last_stage_layers > 0 ? 1 : 0);
  const int middle = plan.pp - fixed_stages;
  return middle > 0 ? static_cast<int>((num_layers - plan.first_stage_layers - plan.last_stage_layers) / middle) : 0;
}

int chunks_per_stage(const ParallelPlan& plan) {
  return plan.schedule == Schedule::interleaved ? std::max(1, plan.virtual_stages) : 1;
}

int layers_in_chunk(const ParallelPlan& plan, std::int64_t num_layers, int stage, int chunk) {
  const int v = chunks_per_stage(plan);
  const std::size_t vs = static_cast<std::size_t>(chunk) * static_cast<std::size_t>(plan.pp) + static_cast<std::size_t>(stage);
  if (!plan.pipeline_layout.empty())
    return vs < plan.pipeline_layout.decoders.size() ? plan.pipeline_layout.decoders[vs] : 0;
  if (!plan.embedding_in_split && !plan.loss_in_split) return layers_on_stage(plan, num_layers, stage) / v;
  int layers = static_cast<int>(split_layers(plan, num_layers) / (static_cast<std::int64_t>(plan.pp) * v));
  if (plan.embedding_in_split && stage == 0 && chunk == 0) --layers;
  if (plan.loss_in_split && stage == plan.pp - 1 && chunk == v - 1) --layers;
  return layers;
}

int first_layer_of_chunk(const ParallelPlan& plan, std::int64_t num_layers, int stage, int chunk) {
  int first = 0;
  for (int vs = 0; vs < chunk * plan.pp + stage; ++vs) first += layers_in_chunk(plan, num_layers, vs % plan.pp, vs / plan.pp);
  return first;
}

std::array<int, 2> cp_chunks(int cp, int rank) { return {rank, 2 * cp - 1 - rank}; }

std::int64_t cp_causal_pairs(std::int64_t seq, int cp, int rank) {
  const std::int64_t chunk = seq / (2LL * cp);
  std::int64_t pairs = 0;
  // Query i (0-based) of the sequence sees keys 0..i: i + 1 of them.
  for (const int c : cp_chunks(cp, rank)) {
    const std::int64_t first = c * chunk, last = first + chunk - 1;
    pairs += (last + 1) * (last + 2) / 2 - first * (first + 1) / 2;
  }
  return pairs;
}

bool propose_uneven_stages(std::int64_t num_layers, int pp, int& first, int& last, int chunks) {
  // In units of `chunks` layers: every stage's count must be a multiple of it.
  const std::int64_t v = std::max(1, chunks);
  if (pp < 2 || num_layers % (pp * v) == 0 || num_layers % v != 0) return false;
  const std::int64_t units = num_layers / v;
  if (pp == 2) {
    last = static_cast<int>(units / 2 * v);  // the LM head's stage gets the smaller half
    first = static_cast<int>(num_layers - last);
    return last >= v;
  }
  const std::int64_t per_middle = ((num_layers + pp - 1) / pp + v - 1) / v;
  const std::int64_t rest = units - per_middle * (pp - 2);
  if (rest < 2) return false;
  first = static_cast<int>((rest + 1) / 2 * v);
  last = static_cast<int>(rest * v - first);
  return first < per_middle * v + 1;
}

RankMapping::RankMapping(const ParallelPlan& plan, int gpus_per_node)
    : tp_(plan.tp),
      pp_(plan.pp),
      dp_(plan.dp),
      cp_(plan.cp),
      ep_(plan.ep),
      etp_(plan.expert_tp()),
      gpus_per_node_(gpus_per_node) {
  if (tp_ <= 0 || pp_ <= 0 || dp_ <= 0 || cp_ <= 0 || ep_ <= 0 || etp_ <= 0 || gpus_per_node_ <= 0)
    throw std::invalid_argument("RankMapping: sizes must be positive");
  if ((tp_ * cp_ * dp_) % (ep_ * etp_) != 0)
    throw std::invalid_argument("RankMapping: ETP x EP must divide TP x CP x DP");
  auto size_of = [&](RankAxis a) {
    return a == RankAxis::tp ? tp_ : a == RankAxis::cp ? cp_ : a == RankAxis::dp ? dp_ : pp_;
  };
  int step = 1;
  for (RankAxis a : plan.order.axes()) {
    stride_[static_cast<std::size_t>(a)] = step;
    step *= size_of(a);
  }
}

RankCoord RankMapping::coord(int rank) const {
  if (rank < 0 || rank >= world_size()) throw std::out_of_range("RankMapping::coord: rank out of range");
  RankCoord c;
  c.rank = rank;
  c.node = rank / gpus_per_node_;
  c.gpu = rank % gpus_per_node_;
  c.tp = (rank / stride(RankAxis::tp)) % tp_;
  c.cp = (rank / stride(RankAxis::cp)) % cp_;
  c.dp = (rank / stride(RankAxis::dp)) % dp_;
  c.pp = (rank / stride(RankAxis::pp)) % pp_;
  return c;
}

int RankMapping::rank_of(int tp, int pp, int dp, int cp) const {
  return tp * stride(RankAxis::tp) + cp * stride(RankAxis::cp) + dp * stride(RankAxis::dp) + pp * stride(RankAxis::pp);
}

std::vector<int> RankMapping::tp_group(int pp, int dp, int cp) const {
  std::vector<int> g;
  for (int t = 0; t < tp_; ++t) g.push_back(rank_of(t, pp, dp, cp));
  return g;
}

std::vector<int> RankMapping::pp_group(int tp, int dp, int cp) const {
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p) g.push_back(rank_of(tp, p, dp, cp));
  return g;
}

std::vector<int> RankMapping::dp_group(int tp, int pp) const {
  std::vector<int> g;
  for (int d = 0; d < dp_ * cp_; ++d) g.push_back(rank_of_data(tp, pp, d));
  return g;
}

std::vector<int> RankMapping::cp_group(int tp, int pp, int dp) const {
  std::vector<int> g;
  for (int k = 0; k < cp_; ++k) g.push_back(rank_of(tp, pp, dp, k));
  return g;
}

std::vector<int> RankMapping::ep_group(int pp, int edp, int etp) const {
  std::vector<int> g;
  for (int e = 0; e < ep_; ++e) g.push_back(rank_of_stage_index(pp, etp + etp_ * (e + ep_ * edp)));
  return g;
}

std::vector<int> RankMapping::expert_dp_group(int pp, int ep, int etp) const {
  std::vector<int> g;
  const int edp = tp_ * cp_ * dp_ / (etp_ * ep_);
  for (int d = 0; d < edp; ++d) g.push_back(rank_of_stage_index(pp, etp + etp_ * (ep + ep_ * d)));
  return g;
}

std::vector<std::vector<int>> RankMapping::ep_groups() const {
  std::vector<std::vector<int>> out;
  const int edp = tp_ * cp_ * dp_ / (etp_ * ep_);
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < edp; ++d)
      for (int t = 0; t < etp_; ++t) out.push_back(ep_group(p, d, t));
  return out;
}

std::vector<std::vector<int>> RankMapping::expert_dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int e = 0; e < ep_; ++e)
      for (int t = 0; t < etp_; ++t) out.push_back(expert_dp_group(p, e, t));
  return out;
}

std::vector<std::vector<int>> RankMapping::tp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d)
      for (int k = 0; k < cp_; ++k) out.push_back(tp_group(p, d, k));
  return out;
}

std::vector<std::vector<int>> RankMapping::pp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_; ++d)
    for (int k = 0; k < cp_; ++k)
      for (int t = 0; t < tp_; ++t) out.push_back(pp_group(t, d, k));
  return out;
}

std::vector<std::vector<int>> RankMapping::dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int t = 0; t < tp_; ++t) out.push_back(dp_group(t, p));
  return out;
}

std::vector<std::vector<int>> RankMapping::cp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int d = 0; d < dp_; ++d)
      for (int t = 0; t < tp_; ++t) out.push_back(cp_group(t, p, d));
  return out;
}

int RankMapping::nodes_spanned(const std::vector<int>& ranks) const {
  std::set<int> nodes;
  for (int r : ranks) nodes.insert(r / gpus_per_node_);
  return static_cast<int>(nodes.size());
}

bool RankMapping::tp_crosses_nodes() const {
  for (const auto& g : tp_groups())
    if (nodes_spanned(g) > 1) return true;
  return false;
}

nlohmann::json plan_layout_json(const ParallelPlan& p) {
  nlohmann::json j{{"tp", p.tp},
                   {"pp", p.pp},
                   {"dp", p.dp},
                   {"micro_batch", p.micro_batch},
                   {"global_batch", p.global_batch},
                   {"seq_length", p.seq_length},
                   {"virtual_stages", p.virtual_stages},
                   {"zero_stage", p.zero_stage},
                   {"recompute", std::string(to_string(p.recompute))},
                   {"sequence_parallel", p.sequence_parallel},
                   {"schedule", std::string(to_string(p.schedule))},
                   {"rank_order", p.order.str()}};
  // Only when not bf16: the files of bf16 plans stay as they were.
  if (p.precision != Precision::bf16) j["precision"] = std::string(to_string(p.precision));
  if (p.fp8_param_gather) j["fp8_param_gather"] = true;
  if (p.fp8_attention) j["fp8_attention"] = true;
  if (p.precision_aware_optimizer) j["precision_aware_optimizer"] = true;
  if (p.adam_moment_bytes != 4) j["adam_moment_bytes"] = p.adam_moment_bytes;
  if (p.optimizer != OptimizerKind::adam) j["optimizer"] = std::string(to_string(p.optimizer));
  if (p.recompute_modules != 0) j["recompute_modules"] = recompute_modules_string(p.recompute_modules);
  // Only when not uniform 1: the files of other plans stay as they were.
  if (p.recompute_layers_set()) {
    j["recompute_method"] = std::string(to_string(p.recompute_method));
    j["recompute_num_layers"] = p.recompute_num_layers;
  }
  if (p.offload_layers > 0) j["offload_activations"] = p.offload_layers;
  if (p.offload_modules != 0) j["offload_modules"] = offload_modules_string(p.offload_modules);
  return j;
}

}  // namespace cuboid
