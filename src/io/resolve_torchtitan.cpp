// torchtitan v0.2.2 (73a0e697): the --section.key=value overrides on the
// base TOML the export names, and torchtitan main (b5bcd76c): the Python
// Trainer.Config function. ParallelDims decides the mesh, FSDP's policy the
// ZeRO stage, the base TOML what the overrides leave out.
#include <fmt/format.h>

#include <regex>
#include <stdexcept>
#include <string>

#include "resolve_common.hpp"

namespace cuboid::resolve {

namespace {

std::string tt(std::string_view version, std::string_view file_line, std::string_view what) {
  return fmt::format("torchtitan/{}@{}: {}", file_line, version, what);
}

// What a v0.2.2 base TOML sets that the export may not override.
struct BaseToml {
  const char* name;
  const char* recompute;   // activation_checkpoint.mode
  const char* converters;  // model.converters ("" for none)
  bool compile;
  bool async_tp;
  int line;  // of the [model] table
};
constexpr BaseToml kBaseTomls[] = {
    {"llama3/train_configs/llama3_8b.toml", "selective", "", false, false, 58},
    {"llama3/train_configs/llama3_70b.toml", "full", "", false, false, 54},
    {"llama3/train_configs/llama3_405b.toml", "full", "float8", true, true, 21},
    {"qwen3/train_configs/qwen3_32b.toml", "full", "", false, false, 54},
};

std::string precision_of_converter(const std::string& converters) {
  if (converters.empty()) return "bf16";
  if (converters.find("mx") != std::string::npos) return "mxfp8";
  if (converters.find("float8") != std::string::npos) return "fp8-current";
  return converters;
}

}  // namespace

ResolvedRun torchtitan(std::string_view target, const ExportResult& e) {
  const bool main = target == "torchtitan-main";
  const std::string_view v = main ? "b5bcd76c" : "v0.2.2";
  const ExportedOptions o = main ? read_python_fields(e.text, "config", "") : read_torchtitan_overrides(e.text);
  const BaseToml* base = nullptr;
  if (!main) {
    std::smatch m;
    if (!std::regex_search(e.text, m, std::regex(R"(--job\.config_file \./torchtitan/models/(\S+\.toml))")))
      throw std::invalid_argument("the torchtitan export names no --job.config_file");
    for (const BaseToml& b : kBaseTomls)
      if (m[1].str() == b.name) base = &b;
    if (base == nullptr) throw std::invalid_argument("the torchtitan export names an unknown base TOML " + m[1].str());
  }
  auto num = [&](const std::string& key, std::int64_t fallback) {
    return o.count(key) ? to_int(o.find(key)->second, key) : fallback;
  };
  auto text = [&](const std::string& key, std::string fallback) {
    return o.count(key) ? o.find(key)->second : std::move(fallback);
  };
  Builder b(target);
  const std::int64_t world = launch_world(e.text);
  b.set("world", world, "the export's torchrun line");
  const std::int64_t tp = num("parallelism.tensor_parallel_degree", 1);
  const std::int64_t pp = num("parallelism.pipeline_parallel_degree", 1);
  const std::int64_t cp = num("parallelism.context_parallel_degree", 1);
  const std::int64_t replicate = num("parallelism.data_parallel_replicate_degree", 1);
  std::int64_t shard = num("parallelism.data_parallel_shard_degree", -1);
  if (shard == -1) shard = world / (replicate * cp * tp * pp);
  const std::int64_t dp = replicate * shard;
  b.set("tp", tp, "parallelism.tensor_parallel_degree");
  b.set("pp", pp, "parallelism.pipeline_parallel_degree");
  b.set("cp", cp, "parallelism.context_parallel_degree");
  b.set("dp", dp, tt(v, "distributed/parallel_dims.py:50", "data_parallel_replicate_degree x data_parallel_shard_degree "
                                                         "(-1: the rest of the world)"));
  if (dp * cp * tp * pp != world)
    b.fail(fmt::format("dp_replicate x dp_shard x cp x tp x pp = {} is not the world {} (parallel_dims.py)",
                       dp * cp * tp * pp, world));
  if (cp > 1) b.set("cp_comm", text("parallelism.context_parallel_rotate_method", "allgather") == "alltoall" ? "p2p"
                                                                                                          : "allgather",
                    "parallelism.context_parallel_rotate_method: alltoall passes K/V around the ring");
  if (o.count("parallelism.expert_parallel_degree")) {
    b.set("ep", num("parallelism.expert_parallel_degree", 1), "parallelism.expert_parallel_degree");
    b.set("etp", num("parallelism.expert_tensor_parallel_degree", tp), "parallelism.expert_tensor_parallel_degree");
  }
  std::int64_t micro = 0, global = 0, per_pipeline = 0;
  if (main) {
    const std::int64_t context = num("training.max_context_length", 1);
    micro = num("training.num_tokens_per_microbatch_per_dp_rank", 0) / context;
    global = num("training.num_tokens_per_train_step", 0) / context;
  } else {
    const std::int64_t local = num("training.local_batch_size", 8);
    global = num("training.global_batch_size", -1);
    if (global < 0) global = local * dp;
    micro = pp > 1 ? num("parallelism.pipeline_parallel_microbatch_size", 1) : local;
  }
  if (micro <= 0 || dp <= 0) throw std::invalid_argument("the torchtitan export gives no micro-batch or DP size");
  b.set("micro_batch", micro, main ? "training.num_tokens_per_microbatch_per_dp_rank / max_context_length"
                                   : "parallelism.pipeline_parallel_microbatch_size with PP, else training.local_batch_size");
  b.set("global_batch", global, main ? "training.num_tokens_per_train_step / max_context_length"
                                     : "training.global_batch_size");
  per_pipeline = global / (micro * dp);
  b.set("num_micro_batches", per_pipeline, "global batch / (micro-batch x DP): gradient accumulation x PP micro-batches");
  std::int64_t chunks = 1;
  std::string schedule = "none";
  if (pp > 1) {
    const std::string s = text("parallelism.pipeline_parallel_schedule", "1F1B");
    schedule = s == "1F1B" ? "1f1b" : s == "Interleaved1F1B" ? "interleaved" : s == "GPipe" ? "gpipe" : s;
    const std::int64_t per_stage = num("parallelism.pipeline_parallel_layers_per_stage", 0);
    if (per_stage > 0 && o.count("parallelism.pipeline_parallel_layers_per_stage")) {
      // The model's layers come from the flavour; the export's header says them.
      std::smatch m;
      if (std::regex_search(e.text, m, std::regex(R"(\((\d+) layers, hidden)")))
        chunks = to_int(m[1].str(), "layers") / per_stage / pp;
    }
  }
  b.set("virtual_stages", chunks, "the model's layers / (pipeline_parallel_layers_per_stage x PP)");
  b.set("schedule", schedule, tt(v, "config/job_config.py:396", "parallelism.pipeline_parallel_schedule, default 1F1B"));
  b.set("sequence_parallel", tp > 1, "torchtitan's tensor parallelism shards the norms along the sequence");
  std::string recompute;
  if (main) {
    const std::string ac = text("activation_checkpoint", "base");
    recompute = ac == "None" ? "none" : ac.rfind("FullAC", 0) == 0 ? "full" : ac.rfind("SelectiveAC", 0) == 0 ? "selective-op" : ac;
  } else {
    recompute = text("activation_checkpoint.mode", base->recompute);
    if (recompute == "selective") recompute = "selective-op";  // per-op saving, not Megatron's attention core
  }
  if (recompute != "base")
    b.set("recompute", recompute, main ? "config.activation_checkpoint" : fmt::format("activation_checkpoint.mode, the "
                                                                                      "base TOML's {} unless set", base->recompute));
  const bool fsdp = shard > 1 || cp > 1;
  const std::string policy = text("parallelism.fsdp_reshard_after_forward", "default");
  const bool reshard = policy == "always" || (policy == "default" && pp == 1);
  b.set("zero_stage", std::int64_t{fsdp ? (reshard ? 3 : 2) : 0},
        tt(v, "models/llama3/infra/parallelize.py:319", "FSDP (dp_shard > 1 or CP > 1) reshards after forward "
                                                        "(ZeRO-3) with \"always\", or \"default\" without PP; else ZeRO-2"));
  b.set("dp_overlap", true, "FSDP's reduce-scatter and DDP's buckets run during the backward");
  b.set("dp_grad_bytes", std::int64_t{text("training.mixed_precision_reduce", "float32") == "float32" ? 4 : 2},
        tt(v, "config/job_config.py:290", "training.mixed_precision_reduce, float32"));
  b.set("zero1_grad_all_reduce", !fsdp, "FSDP reduce-scatters, DDP all-reduces");
  b.set("grad_accum_fusion", false, "autograd's AccumulateGrad / FSDP's sharded add, a pass of its own");
  b.set("rank_order", "tp-dp-pp", tt(v, "distributed/parallel_dims.py:97", "the mesh pp, dp_replicate, fsdp, tp (TP "
                                                                           "innermost, PP outermost)"));
  b.set("attention", "fused", "PyTorch's scaled_dot_product_attention (flash / cuDNN kernels)");
  const bool amp = fsdp || main || (tp == 1 && pp == 1);
  b.set("params_bytes", std::int64_t{amp ? 2 : 4},
        amp ? tt(v, "config/job_config.py:282", "training.mixed_precision_param bfloat16 through FSDP")
            : tt(v, "distributed/utils.py:253", "TP or PP without FSDP trains in float32"));
  if (!main) {
    const std::string converters = text("model.converters", base->converters);
    b.set("precision", precision_of_converter(converters),
          fmt::format("model.converters, the base TOML's ({}:{}) unless set", base->name, base->line));
    b.set("compile", text("compile.enable", base->compile ? "true" : "false") == "true",
          fmt::format("compile.enable, the base TOML's {} unless set", base->compile ? "true" : "false"));
    b.set("async_tp", text("parallelism.enable_async_tensor_parallel", base->async_tp ? "true" : "false") == "true",
          tt(v, "config/job_config.py:357", fmt::format("enable_async_tensor_parallel, the base TOML's {} unless set",
                                                       base->async_tp ? "true" : "false")));
  }
  b.set("hidden_dropout", probability(0.0), "torchtitan's llama3 and qwen3 have no dropout");
  b.set("attention_dropout", probability(0.0), "torchtitan's llama3 and qwen3 have no dropout");
  return b.done();
}

}  // namespace cuboid::resolve
