// Megatron-LM (d98e8a64) and Megatron-Bridge (v0.6.0 on Megatron-Core
// cd4afffa): both end in Megatron-Core's parallel state, DDP config and
// schedules, so one derivation (derive) follows each reader, which turns the
// export into Megatron-Core's settings with the defaults of what it leaves out.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "cuboid/core/pipeline_layout.hpp"
#include "resolve_common.hpp"

namespace cuboid::resolve {

namespace {

// A setting's value and the rule that gave it.
template <typename T>
struct Ruled {
  T value{};
  std::string source;
};

// Megatron-Core's settings as a reader found them (`core` names the
// Megatron-Core commit of its sources).
struct Mcore {
  std::string core;
  std::int64_t world = 0;
  std::int64_t num_layers = 0;
  Ruled<std::int64_t> tp, pp, cp, ep, etp, micro, global;
  Ruled<std::string> cp_comm, dispatcher, flex_backend, recompute, attention, precision, hidden_dropout, attention_dropout,
      optimizer;
  bool moe = false;
  Ruled<std::int64_t> vpp;  // 0: none
  Ruled<bool> overlap_p2p, batch_p2p, sequence_parallel, dist_opt, fsdp, overlap_grad, overlap_param, grad_fp32,
      fusion, tp_pp_dp, fp8_param_gather, bf16;
  Ruled<bool> ep_overlap;  // overlap_moe_expert_parallel_comm
  Ruled<bool> delay_wgrad;  // delay_wgrad_compute
  // moe_expert_rank_capacity_factor as written ("None": unset), the op
  // fuser HybridEP's factor needs, moe_paged_stash.
  Ruled<std::string> rank_capacity;
  Ruled<bool> op_fuser, paged_stash;
  Ruled<std::string> fsdp_strategy;
  // Megatron-FSDP's main gradients' dtype as written ("auto": the parameters').
  Ruled<std::string> fsdp_grads;
  // The precision-aware optimizer, and Adam's two moments' dtypes as written.
  Ruled<bool> precision_aware;
  Ruled<std::string> exp_avg, exp_avg_sq;
  // TransformerConfig.fp8_dot_product_attention.
  Ruled<bool> fp8_attention;
  // OptimizerConfig.overlap_param_gather_with_optimizer_step, and whether
  // the checkpoints are torch's (Megatron-LM's use_dist_ckpt off).
  Ruled<bool> param_in_step;
  bool torch_ckpt = false;
  Ruled<bool> align_param;  // DistributedDataParallelConfig.align_param_gather
  Ruled<std::int64_t> ddp_bucket;  // DistributedDataParallelConfig.bucket_size (0: None, Megatron-Core's rule)
};

// Bytes per element of an optimizer state's dtype as Megatron-LM's flags or
// Megatron-Core's OptimizerConfig spell it.
std::int64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "fp32" || dtype == "torch.float32" || dtype == "torch.float") return 4;
  if (dtype == "fp8" || dtype == "torch.uint8") return 1;
  return 2;
}

// Bytes per Megatron-FSDP gradient: fp32 4; bf16, fp16 and auto (the bf16
// or FP8 parameters': bf16, param_and_grad_buffer.py
// _resolve_group_grad_dtype) 2.
std::int64_t fsdp_grad_bytes(const std::string& dtype) {
  return dtype == "fp32" || dtype == "torch.float32" || dtype == "torch.float" ? 4 : 2;
}

std::string at(const Mcore& m, std::string_view file_line, std::string_view what) {
  return fmt::format("megatron/core/{}@{}: {}", file_line, m.core, what);
}

int strategy_stage(const std::string& s) {
  if (s == "optim_grads_params") return 3;
  if (s == "optim_grads") return 2;
  if (s == "optim") return 1;
  return 0;
}

// What Megatron-Core derives from the settings, and its start-up assertions.
ResolvedRun derive(Builder& b, const Mcore& m) {
  const std::string world_src = "the export's launch line (torchrun --nnodes x --nproc_per_node)";
  b.set("world", m.world, world_src);
  b.set("tp", m.tp.value, m.tp.source);
  b.set("pp", m.pp.value, m.pp.source);
  b.set("cp", m.cp.value, m.cp.source);
  const std::int64_t model = m.tp.value * m.pp.value * m.cp.value;
  if (model <= 0 || m.world % model != 0) {
    b.fail(fmt::format("world {} is not divisible by TP x PP x CP = {} (megatron/training/arguments.py:432@d98e8a64, "
                       "Megatron-Bridge training/config.py:1023@v0.6.0)",
                       m.world, model));
    return b.done();
  }
  const std::int64_t dp = m.world / model;
  b.set("dp", dp, "world / (TP x PP x CP): megatron/training/arguments.py:448@d98e8a64, Megatron-Bridge "
                  "training/config.py:1026@v0.6.0 get_data_parallel_size");
  if (m.cp.value > 1) b.set("cp_comm", m.cp_comm.value, m.cp_comm.source);
  if (m.moe) {
    b.set("ep", m.ep.value, m.ep.source);
    b.set("etp", m.etp.value, m.etp.source);
    b.set("moe_dispatcher", m.dispatcher.value, m.dispatcher.source);
    if (m.dispatcher.value == "flex") b.set("moe_flex_backend", m.flex_backend.value, m.flex_backend.source);
    b.set("moe_ep_overlap", m.ep_overlap.value, m.ep_overlap.source);
    if (m.ep_overlap.value) b.set("moe_delay_wgrad", m.delay_wgrad.value, m.delay_wgrad.source);
    if (m.delay_wgrad.value && !m.ep_overlap.value)
      b.fail(at(m, m.core == "d98e8a64" ? "transformer/transformer_config.py:3074" : "transformer/transformer_config.py:2749",
                "delay_wgrad_compute asserts overlap_moe_expert_parallel_comm"));
    // transformer_config.py __post_init__: the rank capacity factor with
    // hybridep (or ncclep) only, hybridep's with the op fuser; the paged
    // stash with a factor.
    const bool lm_core = m.core == "d98e8a64";
    const bool factor = m.rank_capacity.value != "None";
    if (factor && m.flex_backend.value != "hybridep" && m.flex_backend.value != "ncclep")
      b.fail(at(m, lm_core ? "transformer/transformer_config.py:1868" : "transformer/transformer_config.py:1692",
                "moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend hybridep or ncclep"));
    if (factor && m.flex_backend.value == "hybridep" && !m.op_fuser.value)
      b.fail(at(m, lm_core ? "transformer/transformer_config.py:1875" : "transformer/transformer_config.py:1698",
                "moe_expert_rank_capacity_factor with hybridep requires use_transformer_engine_op_fuser"));
    if (m.paged_stash.value && !factor)
      b.fail(at(m, lm_core ? "transformer/transformer_config.py:2213" : "transformer/transformer_config.py:1907",
                "moe_paged_stash requires moe_expert_rank_capacity_factor"));
    if (m.dispatcher.value == "flex") {
      b.set("moe_rank_capacity_factor", m.rank_capacity.value, m.rank_capacity.source);
      b.set("moe_paged_stash", m.paged_stash.value, m.paged_stash.source);
    }
    if (m.ep_overlap.value && m.pp.value > 1 && m.vpp.value == 0)
      b.fail(at(m, m.core == "d98e8a64" ? "transformer/transformer_config.py:3008" : "transformer/transformer_config.py:2675",
                "overlap_moe_expert_parallel_comm with PP > 1 asserts virtual_pipeline_model_parallel_size is set"));
    const std::int64_t expert_dp = m.world / (m.etp.value * m.ep.value * m.pp.value);
    if (m.tp_pp_dp.value && m.pp.value > 1 && expert_dp != dp)
      b.fail(at(m, "parallel_state.py:898", fmt::format("with rank order tp-pp-dp and PP {} the experts' data-parallel "
                                                        "size {} must equal the layers' {}",
                                                        m.pp.value, expert_dp, dp)));
  }
  b.set("micro_batch", m.micro.value, m.micro.source);
  b.set("global_batch", m.global.value, m.global.source);
  const std::int64_t per_step = m.micro.value * dp;
  if (per_step <= 0 || m.global.value % per_step != 0)
    b.fail(at(m, "num_microbatches_calculator.py:381",
              fmt::format("global batch {} is not divisible by micro-batch x DP = {}", m.global.value, per_step)));
  else
    b.set("num_micro_batches", m.global.value / per_step,
          at(m, "num_microbatches_calculator.py:388", "global batch / (micro-batch x DP)"));
  const std::int64_t vpp = m.vpp.value > 1 ? m.vpp.value : 1;
  b.set("virtual_stages", m.pp.value > 1 ? vpp : 1, m.vpp.source);
  const char* schedule = m.pp.value == 1 ? "none" : vpp > 1 ? "interleaved" : "1f1b";
  b.set("schedule", schedule,
        at(m, m.core == "d98e8a64" ? "pipeline_parallel/schedules.py:163" : "pipeline_parallel/schedules.py:158",
           "get_forward_backward_func: interleaved with a virtual pipeline size, 1F1B with PP > 1, none without"));
  if (m.pp.value > 1 && vpp > 1) {
    if (m.overlap_p2p.value && m.batch_p2p.value)
      b.fail(at(m, m.core == "d98e8a64" ? "pipeline_parallel/schedules.py:1087" : "pipeline_parallel/schedules.py:1066",
                "overlap_p2p_comm and batch_p2p_comm together raise ValueError"));
    // Megatron-LM's validation refuses the batched p2p with PP 2 (several
    // sends and receives between the same two ranks in one batch); Megatron-
    // Core's schedule runs it, which is not the exchange cuboid prices.
    if (!m.overlap_p2p.value && m.pp.value <= 2)
      b.fail(fmt::format("the interleaved schedule with PP {} and batched, unoverlapped p2p (megatron/training/"
                         "arguments.py:1006@d98e8a64 asserts PP > 2 for it; {}; {})",
                         m.pp.value, m.overlap_p2p.source, m.batch_p2p.source));
  }
  b.set("sequence_parallel", m.sequence_parallel.value, m.sequence_parallel.source);
  b.set("recompute", m.recompute.value, m.recompute.source);
  // ZeRO: Megatron FSDP's sharding strategy, else the distributed optimizer.
  if (m.fsdp.value) {
    b.set("zero_stage", static_cast<std::int64_t>(strategy_stage(m.fsdp_strategy.value)),
          m.fsdp_strategy.source + "; " + m.fsdp.source);
  } else {
    b.set("zero_stage", static_cast<std::int64_t>(m.dist_opt.value ? 1 : 0), m.dist_opt.source);
  }
  b.set("zero1_grad_all_reduce", !m.dist_opt.value,
        at(m, m.core == "d98e8a64" ? "distributed/param_and_grad_buffer.py:710" : "distributed/param_and_grad_buffer.py:704",
           "the distributed optimizer reduce-scatters the gradient buckets, else they are all-reduced"));
  b.set("dp_overlap", m.overlap_grad.value, m.overlap_grad.source);
  // Megatron-LM's validate_args only (Megatron-Bridge has no such check).
  const bool lm = m.core == "d98e8a64";
  if (lm && m.overlap_param.value && !m.overlap_grad.value)
    b.fail("--overlap-param-gather without --overlap-grad-reduce (megatron/training/arguments.py:1028@d98e8a64 asserts "
           "it; " + m.overlap_param.source + ")");
  if (lm && m.overlap_param.value && !m.dist_opt.value && !m.fsdp.value)
    b.fail("the parameter all-gather overlapped without the distributed optimizer or FSDP "
           "(megatron/training/arguments.py:1025@d98e8a64)");
  if (lm && m.param_in_step.value) {
    // arguments.py:1066-1074@d98e8a64 validate_args.
    if (!m.dist_opt.value) b.fail("--overlap-param-gather-with-optimizer-step without the distributed optimizer "
                                  "(megatron/training/arguments.py:1067@d98e8a64)");
    if (!m.overlap_param.value) b.fail("--overlap-param-gather-with-optimizer-step without --overlap-param-gather "
                                       "(megatron/training/arguments.py:1069@d98e8a64)");
    if (m.vpp.value == 0) b.fail("--overlap-param-gather-with-optimizer-step without an interleaved schedule "
                                 "(megatron/training/arguments.py:1071@d98e8a64)");
    if (!m.torch_ckpt) b.fail("--overlap-param-gather-with-optimizer-step with a distributed checkpoint format "
                              "(megatron/training/arguments.py:1073@d98e8a64; --ckpt-format default torch_dist)");
  }
  b.set("overlap_param_gather_with_optimizer_step", m.param_in_step.value, m.param_in_step.source);
  b.set("align_param_gather", m.align_param.value, m.align_param.source);
  b.set("ddp_bucket_size", resolve::ddp_bucket(m.ddp_bucket.value), m.ddp_bucket.source);
  b.set("dp_grad_bytes", static_cast<std::int64_t>(m.grad_fp32.value ? 4 : 2), m.grad_fp32.source);
  if (m.fsdp.value) b.set("fsdp_grad_bytes", fsdp_grad_bytes(m.fsdp_grads.value), m.fsdp_grads.source);
  b.set("grad_accum_fusion", m.fusion.value, m.fusion.source);
  b.set("rank_order", megatron_order(m.tp_pp_dp.value), m.tp_pp_dp.source);
  b.set("attention", m.attention.value, m.attention.source);
  b.set("params_bytes", static_cast<std::int64_t>(m.bf16.value ? 2 : 4), m.bf16.source);
  b.set("precision", m.precision.value, m.precision.source);
  if (m.precision.value != "bf16") b.set("fp8_param_gather", m.fp8_param_gather.value, m.fp8_param_gather.source);
  if (m.precision.value != "bf16") b.set("fp8_attention", m.fp8_attention.value, m.fp8_attention.source);
  b.set("hidden_dropout", m.hidden_dropout.value, m.hidden_dropout.source);
  b.set("attention_dropout", m.attention_dropout.value, m.attention_dropout.source);
  b.set("optimizer", m.optimizer.value, m.optimizer.source);
  b.set("precision_aware_optimizer", m.precision_aware.value, m.precision_aware.source);
  if (dtype_bytes(m.exp_avg.value) != dtype_bytes(m.exp_avg_sq.value))
    b.fail("Adam's moments in two dtypes (exp_avg " + m.exp_avg.value + ", exp_avg_sq " + m.exp_avg_sq.value +
           "): cuboid prices both in one");
  if (!m.precision_aware.value && (dtype_bytes(m.exp_avg.value) != 4 || dtype_bytes(m.exp_avg_sq.value) != 4))
    b.fail("Adam's moments in " + m.exp_avg.value + " without the precision-aware optimizer (megatron/core/optimizer/"
           "optimizer_config.py __post_init__ asserts fp32 without it)");
  b.set("adam_moment_bytes", dtype_bytes(m.exp_avg.value), m.exp_avg.source + "; " + m.exp_avg_sq.source);
  return b.done();
}

// The quantized-GEMM recipe as the plan spells it.
std::string precision_of(const std::string& fp8_recipe, bool fp8, bool fp4) {
  if (fp4) return "nvfp4";
  if (!fp8) return "bf16";
  if (fp8_recipe == "delayed") return "fp8-delayed";
  if (fp8_recipe == "tensorwise") return "fp8-current";
  if (fp8_recipe == "blockwise") return "fp8-blockwise";
  if (fp8_recipe == "mxfp8") return "mxfp8";
  return "fp8-" + fp8_recipe;
}

}  // namespace

ResolvedRun megatron_lm(const ExportResult& e) {
  const ExportedOptions a = read_megatron_args(e.text);
  auto has = [&](const char* flag) { return a.count(flag) > 0; };
  auto num = [&](const char* flag, std::int64_t fallback) {
    return has(flag) ? to_int(a.find(flag)->second, flag) : fallback;
  };
  auto args = [](std::string_view line, std::string_view what) {
    return fmt::format("megatron/training/arguments.py:{}@d98e8a64: {}", line, what);
  };
  auto tc = [](std::string_view line, std::string_view what) {
    return fmt::format("megatron/core/transformer/transformer_config.py:{}@d98e8a64: {}", line, what);
  };
  Mcore m;
  m.core = "d98e8a64";
  m.world = launch_world(e.text);
  m.num_layers = num("--num-layers", 0);
  m.tp = {num("--tensor-model-parallel-size", 1), "--tensor-model-parallel-size (default 1)"};
  m.pp = {num("--pipeline-model-parallel-size", 1), "--pipeline-model-parallel-size (default 1)"};
  m.cp = {num("--context-parallel-size", 1), "--context-parallel-size (default 1)"};
  m.cp_comm = {option_or(a, "--cp-comm-type", "p2p"), args("3221", "--cp-comm-type, default p2p")};
  m.moe = has("--num-experts");
  m.ep = {num("--expert-model-parallel-size", 1), "--expert-model-parallel-size (default 1)"};
  m.etp = {num("--expert-tensor-parallel-size", m.tp.value), args("588", "--expert-tensor-parallel-size, default TP")};
  m.dispatcher = {option_or(a, "--moe-token-dispatcher-type", "allgather"),
                  tc("891", "moe_token_dispatcher_type, default allgather")};
  m.flex_backend = {option_or(a, "--moe-flex-dispatcher-backend", "deepep"),
                    tc("898", "moe_flex_dispatcher_backend, default deepep")};
  m.rank_capacity = {option_or(a, "--moe-expert-rank-capacity-factor", "None"),
                     tc("1019", "moe_expert_rank_capacity_factor, default None")};
  m.op_fuser = {has("--use-transformer-engine-op-fuser"), tc("525", "use_transformer_engine_op_fuser, default False")};
  m.paged_stash = {has("--moe-paged-stash"), tc("1364", "moe_paged_stash, default False")};
  if (!has("--micro-batch-size") || !has("--global-batch-size"))
    throw std::invalid_argument("the Megatron-LM export has no --micro-batch-size or --global-batch-size");
  m.micro = {num("--micro-batch-size", 0), "--micro-batch-size"};
  m.global = {num("--global-batch-size", 0), "--global-batch-size"};
  // Virtual stages: one of three flags (arguments.py:949-979), 1 read as none.
  if (has("--pipeline-model-parallel-layout")) {
    const PipelineLayout layout =
        parse_pipeline_layout(unquote_value(option_or(a, "--pipeline-model-parallel-layout", "")), "export",
                              "--pipeline-model-parallel-layout");
    m.vpp = {static_cast<std::int64_t>(layout.decoders.size()) / m.pp.value,
             args("950", "the layout's virtual stages / PP")};
  } else if (has("--num-virtual-stages-per-pipeline-rank")) {
    m.vpp = {num("--num-virtual-stages-per-pipeline-rank", 0), args("977", "--num-virtual-stages-per-pipeline-rank")};
  } else if (has("--num-layers-per-virtual-pipeline-stage")) {
    const std::int64_t split = m.num_layers + has("--account-for-embedding-in-pipeline-split") +
                               has("--account-for-loss-in-pipeline-split");
    m.vpp = {split / m.pp.value / num("--num-layers-per-virtual-pipeline-stage", 1),
             args("974", "(layers / PP) / --num-layers-per-virtual-pipeline-stage")};
  } else {
    m.vpp = {0, args("983", "no virtual-stage flag: no virtual pipeline")};
  }
  m.ep_overlap = {has("--overlap-moe-expert-parallel-comm"),
                  "--overlap-moe-expert-parallel-comm (megatron/core/model_parallel_config.py:343@d98e8a64, default off)"};
  m.delay_wgrad = {has("--delay-wgrad-compute"),
                   "--delay-wgrad-compute (megatron/core/model_parallel_config.py:348@d98e8a64, default off)"};
  m.overlap_p2p = {!has("--no-overlap-p2p-communication"),
                   args("3118", "--no-overlap-p2p-communication is store_false: overlapped by default")};
  m.batch_p2p = {!m.overlap_p2p.value, "megatron/training/argument_utils.py:307@d98e8a64: batch_p2p_comm = not "
                                       "overlap_p2p_comm"};
  m.sequence_parallel = {has("--sequence-parallel") && m.tp.value > 1,
                         args("1439", "--sequence-parallel, turned off with TP 1")};
  const std::string granularity = option_or(a, "--recompute-granularity", "none");
  m.recompute = {granularity, tc("532", "--recompute-granularity (default None: no recomputation)")};
  // transformer_config.py:1908-1925: full granularity needs a method and a
  // layer count (megatron/core/recompute.py checkpointed_forward).
  if (granularity == "full")
    m.recompute.value =
        full_recompute(option_or(a, "--recompute-method", ""), option_or(a, "--recompute-num-layers", ""));
  m.fsdp = {has("--use-megatron-fsdp"), "--use-megatron-fsdp"};
  m.fsdp_strategy = {option_or(a, "--data-parallel-sharding-strategy", "optim_grads_params"),
                     args("3190", "--data-parallel-sharding-strategy, default optim_grads_params")};
  m.fsdp_grads = {option_or(a, "--megatron-fsdp-main-grads-dtype", "auto"),
                  args("3691", "--megatron-fsdp-main-grads-dtype, default auto: the parameters' dtype, bf16 for "
                               "FP8 parameters (megatron_fsdp/param_and_grad_buffer.py _resolve_group_grad_dtype)")};
  m.dist_opt = {has("--use-distributed-optimizer") || m.fsdp.value,
                has("--use-megatron-fsdp") ? args("1135", "Megatron FSDP turns the distributed optimizer on")
                                           : "--use-distributed-optimizer (default off)"};
  m.overlap_grad = {has("--overlap-grad-reduce"), args("3121", "--overlap-grad-reduce, default off")};
  m.overlap_param = {has("--overlap-param-gather"), args("3148", "--overlap-param-gather, default off")};
  m.param_in_step = {has("--overlap-param-gather-with-optimizer-step"),
                     args("3150", "--overlap-param-gather-with-optimizer-step, default off")};
  m.torch_ckpt = option_or(a, "--ckpt-format", "torch_dist") == "torch";
  m.align_param = {!has("--no-align-param-gather"), args("3152", "--no-align-param-gather (store_false: aligned by default)")};
  m.ddp_bucket = {num("--ddp-bucket-size", 0),
                  args("3125", "--ddp-bucket-size, default None: training.py resolve_ddp_bucket_size's "
                               "max(40000000, 1000000 x DP x CP)")};
  m.bf16 = {has("--bf16") || has("--fp16"), args("1194", "params_dtype fp32 unless --bf16 or --fp16")};
  m.grad_fp32 = {!has("--grad-reduce-in-bf16"),
                 args("1213", "with --bf16 the gradients accumulate and reduce in fp32 unless --grad-reduce-in-bf16")};
  m.fusion = {!has("--no-gradient-accumulation-fusion"),
              args("2944", "--no-gradient-accumulation-fusion is store_false: fused by default")};
  m.tp_pp_dp = {has("--use-tp-pp-dp-mapping"),
                "megatron/training/initialize.py:395@d98e8a64: order tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping, "
                "else tp-cp-ep-dp-pp"};
  m.attention = {option_or(a, "--attention-backend", "auto") == "unfused" ? "unfused" : "fused",
                 tc("151", "--attention-backend (default auto: Transformer Engine's fused kernel)")};
  m.precision = {precision_of(option_or(a, "--fp8-recipe", "delayed"), has("--fp8-format"), has("--fp4-format")),
                 tc("594", "--fp8-format / --fp4-format with their recipe (fp8_recipe default delayed)")};
  m.fp8_param_gather = {has("--fp8-param-gather") || has("--fp4-param-gather"), "--fp8-param-gather / --fp4-param-gather"};
  m.hidden_dropout = {probability(option_or(a, "--hidden-dropout", "0.1"), "--hidden-dropout"),
                      tc("188", "--hidden-dropout, default 0.1")};
  m.attention_dropout = {probability(option_or(a, "--attention-dropout", "0.1"), "--attention-dropout"),
                         tc("191", "--attention-dropout, default 0.1")};
  m.optimizer = {option_or(a, "--optimizer", "adam"), args("2913", "--optimizer, default adam")};
  m.precision_aware = {has("--use-precision-aware-optimizer"), args("3667", "--use-precision-aware-optimizer, default off")};
  m.fp8_attention = {false, args("2333", "fp8_dot_product_attention: no CLI argument exists (default False)")};
  m.exp_avg = {option_or(a, "--exp-avg-dtype", "fp32"), args("3675", "--exp-avg-dtype, default fp32")};
  m.exp_avg_sq = {option_or(a, "--exp-avg-sq-dtype", "fp32"), args("3680", "--exp-avg-sq-dtype, default fp32")};
  Builder b("megatron");
  if (m.fsdp.value && e.text.find("\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n") != std::string::npos)
    b.fail(args("1166", "Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1, and the script exports 1"));
  return derive(b, m);
}

ResolvedRun megatron_bridge(const ExportResult& e) {
  const ExportedOptions o = read_python_fields(e.text, "cfg", "model.");
  auto has = [&](const char* key) { return o.count(key) > 0; };
  auto num = [&](const char* key, std::int64_t fallback) {
    return has(key) ? to_int(o.find(key)->second, key) : fallback;
  };
  // A field the script sets, or the default of the config it builds on.
  auto flag = [&](const char* key, bool fallback, std::string default_source) -> Ruled<bool> {
    if (has(key)) return {truthy(o.find(key)->second), fmt::format("the script's cfg.{}", key)};
    return {fallback, std::move(default_source)};
  };
  const std::string common = "Megatron-Bridge recipes/common.py:{}@v0.6.0 _pretrain_common: {}";
  auto mc = [](std::string_view file_line, std::string_view what) {
    return fmt::format("megatron/core/{}@cd4afffa: {}", file_line, what);
  };
  if (option_or(o, "base_config", "") != "_pretrain_common")
    throw std::invalid_argument("the Megatron-Bridge export does not build on _pretrain_common()");
  Mcore m;
  m.core = "cd4afffa";
  m.world = launch_world(e.text);
  m.num_layers = num("model.num_layers", 0);
  m.tp = {num("model.tensor_model_parallel_size", 1), "GPTModelProvider tensor_model_parallel_size"};
  m.pp = {num("model.pipeline_model_parallel_size", 1), "GPTModelProvider pipeline_model_parallel_size"};
  m.cp = {num("model.context_parallel_size", 1), "GPTModelProvider context_parallel_size"};
  m.cp_comm = {option_or(o, "model.cp_comm_type", "p2p"), "GPTModelProvider cp_comm_type"};
  m.moe = has("model.num_moe_experts");
  m.ep = {num("model.expert_model_parallel_size", 1), "GPTModelProvider expert_model_parallel_size (default 1)"};
  m.etp = {num("model.expert_tensor_parallel_size", m.tp.value),
           mc("model_parallel_config.py:130", "expert_tensor_parallel_size, None: TP")};
  m.dispatcher = {option_or(o, "model.moe_token_dispatcher_type", "allgather"),
                  mc("transformer/transformer_config.py:862", "moe_token_dispatcher_type, default allgather")};
  m.flex_backend = {option_or(o, "model.moe_flex_dispatcher_backend", "deepep"),
                    mc("transformer/transformer_config.py:869", "moe_flex_dispatcher_backend, default deepep")};
  m.rank_capacity = {option_or(o, "model.moe_expert_rank_capacity_factor", "None"),
                     mc("transformer/transformer_config.py:977", "moe_expert_rank_capacity_factor, default None")};
  m.op_fuser = flag("model.use_transformer_engine_op_fuser", false,
                    mc("transformer/transformer_config.py:511", "use_transformer_engine_op_fuser, default False"));
  m.paged_stash = flag("model.moe_paged_stash", false,
                       mc("transformer/transformer_config.py:1268", "moe_paged_stash, default False"));
  m.micro = {num("train.micro_batch_size", 2), fmt::format(fmt::runtime(common), 67, "micro_batch_size 2 unless set")};
  m.global = {num("train.global_batch_size", 32), fmt::format(fmt::runtime(common), 66, "global_batch_size 32 unless set")};
  const std::string vpp = option_or(o, "model.virtual_pipeline_model_parallel_size", "None");
  m.vpp = {vpp == "None" ? 0 : to_int(vpp, "virtual_pipeline_model_parallel_size"),
           mc("model_parallel_config.py:86", "virtual_pipeline_model_parallel_size, default None")};
  m.ep_overlap = flag("model.overlap_moe_expert_parallel_comm", false,
                      mc("model_parallel_config.py:343", "overlap_moe_expert_parallel_comm, default False"));
  m.delay_wgrad = flag("model.delay_wgrad_compute", false, mc("model_parallel_config.py:348", "delay_wgrad_compute, default False"));
  m.overlap_p2p = flag("model.overlap_p2p_comm", false, mc("model_parallel_config.py:385", "overlap_p2p_comm, default False"));
  m.batch_p2p = flag("model.batch_p2p_comm", true, mc("model_parallel_config.py:390", "batch_p2p_comm, default True"));
  m.sequence_parallel = flag("model.sequence_parallel", false, mc("model_parallel_config.py:94", "sequence_parallel, default False"));
  Builder b("megatron-bridge");
  if (m.sequence_parallel.value && m.tp.value == 1)
    b.fail(mc("model_parallel_config.py:504", "sequence parallelism without tensor parallelism raises ValueError"));
  const std::string granularity = option_or(o, "model.recompute_granularity", "None");
  m.recompute = {granularity == "None" ? "none" : granularity,
                 mc("transformer/transformer_config.py:518", "recompute_granularity, default None")};
  if (granularity == "full")
    m.recompute.value =
        full_recompute(option_or(o, "model.recompute_method", ""), option_or(o, "model.recompute_num_layers", ""));
  m.fsdp = flag("ddp.use_megatron_fsdp", false,
                mc("distributed/distributed_data_parallel_config.py:90", "use_megatron_fsdp, default False"));
  m.fsdp_grads = {option_or(o, "ddp.megatron_fsdp_main_grads_dtype", "None"),
                  mc("distributed/distributed_data_parallel_config.py:192",
                     "megatron_fsdp_main_grads_dtype, default None (auto): the parameters' dtype, bf16 for FP8 "
                     "parameters (megatron_fsdp/param_and_grad_buffer.py _resolve_group_grad_dtype)")};
  m.fsdp_strategy = {option_or(o, "ddp.data_parallel_sharding_strategy", "optim_grads_params"),
                     fmt::format(fmt::runtime(common), 86, "data_parallel_sharding_strategy optim_grads_params unless set")};
  // Validation syncs the DDP and optimizer flags: either on turns both on
  // (training/config.py:1950-1962), and FSDP turns them on (1073-1076).
  const Ruled<bool> ddp_dist = flag("ddp.use_distributed_optimizer", true,
                                    fmt::format(fmt::runtime(common), 87, "ddp.use_distributed_optimizer True"));
  const Ruled<bool> opt_dist = flag("optimizer.use_distributed_optimizer", true,
                                    "Megatron-Bridge recipes/utils/optimizer_utils.py:150@v0.6.0: the recipe's "
                                    "optimizer sets use_distributed_optimizer=True");
  m.dist_opt = {ddp_dist.value || opt_dist.value || m.fsdp.value,
                "Megatron-Bridge training/config.py:1953@v0.6.0: the DDP and optimizer flags synced, on if either is ("
                    + ddp_dist.source + "; " + opt_dist.source + ")" +
                    (m.fsdp.value ? "; training/config.py:1075: Megatron FSDP turns it on" : "")};
  // Megatron-Core's emerging optimizers: "dist_muon" is Muon with the
  // layer-wise distributed optimizer (optimizer/__init__.py:744-754@cd4afffa),
  // which shards the states as ZeRO 1 does, whatever the DDP flag says.
  const std::string optimizer = unquote_value(option_or(o, "optimizer.optimizer", "\"adam\""));
  if (optimizer == "dist_muon")
    m.dist_opt = {true, "Megatron-LM megatron/core/optimizer/__init__.py:744-754@cd4afffa: optimizer dist_muon is muon "
                        "with the layer-wise distributed optimizer"};
  m.overlap_grad = flag("ddp.overlap_grad_reduce", true, fmt::format(fmt::runtime(common), 83, "overlap_grad_reduce True"));
  const Ruled<bool> ddp_param = flag("ddp.overlap_param_gather", true,
                                     fmt::format(fmt::runtime(common), 84, "overlap_param_gather True"));
  const Ruled<bool> opt_param = flag("optimizer.overlap_param_gather", false,
                                     mc("optimizer/optimizer_config.py:330", "overlap_param_gather, default False"));
  m.align_param = flag("ddp.align_param_gather", false,
                       mc("distributed/distributed_data_parallel_config.py:24", "align_param_gather, default False"));
  const std::string bucket = option_or(o, "ddp.bucket_size", "None");
  m.ddp_bucket = {bucket == "None" ? 0 : to_int(bucket, "ddp.bucket_size"),
                  bucket == "None" ? mc("distributed/distributed_data_parallel_config.py:48",
                                        "bucket_size, default None: distributed_data_parallel.py:68-69's max(40000000, "
                                        "1000000 x DP x CP); the script leaves comm_overlap None")
                                   : std::string("the script's cfg.ddp.bucket_size")};
  m.param_in_step = flag("optimizer.overlap_param_gather_with_optimizer_step", false,
                         mc("optimizer/optimizer_config.py:337", "overlap_param_gather_with_optimizer_step, default False"));
  m.overlap_param = {ddp_param.value || opt_param.value,
                     "Megatron-Bridge training/config.py:1967@v0.6.0: synced, on if either is (" + ddp_param.source +
                         "; " + opt_param.source + ")"};
  // Mixed precision: the recipe's MixedPrecisionConfig overwrites every
  // field of the model, optimizer and DDP configs it shares
  // (mixed_precision.py:138-156 update_config_with_precision_overrides,
  // called from training/config.py:1872 runtime_config_update).
  std::string recipe = option_or(o, "mixed_precision", "bf16_mixed");
  if (recipe.size() > 2 && recipe.compare(recipe.size() - 2, 2, "()") == 0) recipe.resize(recipe.size() - 2);
  struct Recipe {
    const char* name;
    const char* precision;
    bool fp8_param_gather;
    int line;
  };
  static constexpr Recipe kRecipes[] = {
      {"bf16_mixed", "bf16", false, 185},
      {"bf16_with_fp8_delayed_scaling_mixed", "fp8-delayed", true, 217},
      {"bf16_with_mxfp8_mixed", "mxfp8", true, 255},
      {"bf16_with_fp8_current_scaling_mixed", "fp8-current", true, 285},
      {"bf16_with_fp8_subchannel_scaling_mixed", "fp8-blockwise", false, 373},
      {"bf16_with_nvfp4_mixed", "nvfp4", true, 405},
  };
  const Recipe* r = nullptr;
  for (const Recipe& k : kRecipes)
    if (recipe == k.name) r = &k;
  if (r == nullptr) throw std::invalid_argument("the Megatron-Bridge export names an unknown mixed-precision recipe " + recipe);
  const std::string mp = fmt::format("Megatron-Bridge training/mixed_precision.py:{}@v0.6.0 {}()", r->line, r->name);
  m.bf16 = {true, mp + ": bf16 parameters"};
  m.precision = {r->precision, mp};
  const bool fp4 = std::string_view(r->precision) == "nvfp4";
  m.fp8_param_gather = flag(fp4 ? "mixed_precision.fp4_param_gather" : "mixed_precision.fp8_param_gather",
                            r->fp8_param_gather, mp + " sets the parameter gather");
  if (std::string_view(r->precision) == "fp8-current" &&
      truthy(option_or(o, "mixed_precision.first_last_layers_bf16", "True")))
    b.fail(mp + " keeps the first and last layers in bf16 (first_last_layers_bf16), which cuboid does not price");
  m.grad_fp32 = flag("mixed_precision.grad_reduce_in_fp32", true,
                     "Megatron-Bridge training/mixed_precision.py:47@v0.6.0: MixedPrecisionConfig grad_reduce_in_fp32 "
                     "True, which setup() copies over ddp.grad_reduce_in_fp32 (mixed_precision.py:155)");
  if (m.grad_fp32.source.rfind("the script", 0) == 0)
    m.grad_fp32.source += ", which setup() copies over ddp.grad_reduce_in_fp32 (mixed_precision.py:155@v0.6.0)";
  m.fusion = flag("model.gradient_accumulation_fusion", true,
                  "Megatron-Bridge models/gpt_provider.py:205@v0.6.0: on where the fused kernel is installed");
  m.tp_pp_dp = flag("dist.use_tp_pp_dp_mapping", false, "Megatron-Bridge DistributedInitConfig use_tp_pp_dp_mapping, "
                                                         "default False");
  if (m.fsdp.value && m.tp_pp_dp.value)
    b.fail("Megatron-Bridge training/config.py:1115@v0.6.0 asserts use_tp_pp_dp_mapping is not used with Megatron FSDP");
  const std::string backend = option_or(o, "model.attention_backend", "AttnBackend.auto");
  m.attention = {backend == "AttnBackend.unfused" ? "unfused" : "fused",
                 mc("transformer/transformer_config.py:144", "attention_backend, default auto")};
  m.hidden_dropout = {probability(option_or(o, "model.hidden_dropout", "0.1"), "hidden_dropout"),
                      mc("transformer/transformer_config.py:181", "hidden_dropout, default 0.1")};
  m.attention_dropout = {probability(option_or(o, "model.attention_dropout", "0.1"), "attention_dropout"),
                         mc("transformer/transformer_config.py:184", "attention_dropout, default 0.1")};
  m.optimizer = {optimizer == "dist_muon" ? std::string("muon") : optimizer,
                 o.count("optimizer.optimizer") != 0
                     ? std::string("optimizer.optimizer (megatron/core/optimizer/optimizer_config.py@cd4afffa)")
                     : std::string("Megatron-Bridge recipes/utils/optimizer_utils.py:140@v0.6.0: OptimizerConfig(optimizer=\"adam\")")};
  m.fp8_attention = flag("mixed_precision.fp8_dot_product_attention", false,
                         "Megatron-Bridge training/mixed_precision.py:58@v0.6.0 MixedPrecisionConfig "
                         "fp8_dot_product_attention, default False (setup copies it to the model's TransformerConfig)");
  m.precision_aware = flag("optimizer.use_precision_aware_optimizer", false,
                           mc("optimizer/optimizer_config.py:187", "use_precision_aware_optimizer, default False"));
  m.exp_avg = {option_or(o, "optimizer.exp_avg_dtype", "torch.float32"),
               mc("optimizer/optimizer_config.py:203", "exp_avg_dtype, default torch.float32")};
  m.exp_avg_sq = {option_or(o, "optimizer.exp_avg_sq_dtype", "torch.float32"),
                  mc("optimizer/optimizer_config.py:206", "exp_avg_sq_dtype, default torch.float32")};
  return derive(b, m);
}

}  // namespace cuboid::resolve
