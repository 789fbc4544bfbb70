// DeepSpeed v0.16.4 (e2dc3eeb): ds_config.json and the PipelineModule
// arguments and launch line the notes give. The config decides the batch,
// precision, ZeRO and the optimizer wrapper; the model code decides the
// attention kernel, dropout and the optimizer itself, which are not resolved.
#include <fmt/format.h>

#include <regex>
#include <stdexcept>
#include <string>

#include "resolve_common.hpp"

namespace cuboid::resolve {

namespace {

std::string ds(std::string_view file_line, std::string_view what) {
  return fmt::format("deepspeed/runtime/{}@v0.16.4: {}", file_line, what);
}

enum class Wrapper { bf16, zero, fp16, none };

}  // namespace

ResolvedRun deepspeed(const ExportResult& e) {
  const ExportedOptions c = read_json_leaves(e.text);
  auto num = [&](const char* key, std::int64_t fallback) {
    return c.count(key) ? to_int(c.find(key)->second, key) : fallback;
  };
  auto on = [&](const char* key) { return c.count(key) && truthy(c.find(key)->second); };
  Builder b("deepspeed");
  const int world = launch_world(e.notes);
  std::int64_t pp = 1;
  std::smatch m;
  if (std::regex_search(e.notes, m, std::regex(R"(PipelineModule\(layers=\[\.\.\.\], num_stages=(\d+))")))
    pp = to_int(m[1].str(), "num_stages");
  const std::string launch = "the notes' launch line (deepspeed --num_nodes x --num_gpus)";
  b.set("world", static_cast<std::int64_t>(world), launch);
  b.set("tp", std::int64_t{1}, "ds_config.json has no tensor-parallel size (the model code would have to split)");
  b.set("pp", pp, "PipelineModule(num_stages=...) in the notes (pipe/module.py), 1 without one");
  b.set("cp", std::int64_t{1}, "ds_config.json has no context parallelism");
  const std::int64_t dp = world / pp;
  b.set("dp", dp, ds("config.py:726", "the config's world size is the data-parallel group's: world / num_stages "
                                      "(PipeDataParallelTopology)"));
  const std::int64_t micro = num("train_micro_batch_size_per_gpu", 0);
  const std::int64_t gas = num("gradient_accumulation_steps", 1);
  const std::int64_t train = num("train_batch_size", 0);
  b.set("micro_batch", micro, "train_micro_batch_size_per_gpu");
  b.set("global_batch", train, "train_batch_size");
  if (train != micro * gas * dp)
    b.fail(ds("config.py:931", fmt::format("train_batch_size {} != micro {} x accumulation {} x DP {}", train, micro,
                                           gas, dp)));
  b.set("num_micro_batches", gas, "gradient_accumulation_steps");
  b.set("virtual_stages", std::int64_t{1}, "the pipeline engine has no virtual stages");
  b.set("schedule", pp > 1 ? "1f1b" : "none", ds("pipe/schedule.py:189", "TrainSchedule, a 1F1B schedule"));
  b.set("sequence_parallel", false, "ds_config.json has no sequence parallelism");
  const std::int64_t interval = num("pipeline.activation_checkpoint_interval", 0);
  if (pp > 1) {
    b.set("recompute", interval > 0 ? "full" : "none",
          ds("pipe/engine.py:212", "pipeline.activation_checkpoint_interval > 0 checkpoints every layer group (0: "
                                   "the PipelineModule argument, whose default is 0)"));
    if (interval > 0 && e.notes.find("checkpointable_layers=[\"DecoderLayer\"]") == std::string::npos)
      b.fail(ds("pipe/module.py:648", "without checkpointable_layers every layer with parameters is checkpointed, the "
                                      "embedding too, which then gets no gradient"));
  }
  const bool bf16 = on("bf16.enabled");
  const bool fp16 = on("fp16.enabled");
  const std::int64_t stage = num("zero_optimization.stage", 0);
  if (pp > 1 && stage >= 2) b.fail(ds("pipe/engine.py:78", "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"));
  // engine.py:1010-1025 get_data_types: bf16 without ZeRO accumulates in fp32
  // by default, otherwise in the model's dtype.
  std::string accum = bf16 && stage == 0 ? "fp32" : bf16 ? "bf16" : fp16 ? "fp16" : "fp32";
  if (c.count("data_types.grad_accum_dtype")) accum = c.find("data_types.grad_accum_dtype")->second;
  if (accum.size() >= 2 && accum.front() == '"') accum = accum.substr(1, accum.size() - 2);
  // engine.py:1300-1350 _do_optimizer_sanity_check: which wrapper runs.
  Wrapper w = Wrapper::none;
  if (stage > 0) w = bf16 && accum == "fp32" && stage == 1 ? Wrapper::bf16 : Wrapper::zero;
  else if (bf16 && (accum == "fp32" || pp > 1)) w = Wrapper::bf16;
  else if (fp16) w = Wrapper::fp16;
  else if (bf16) b.fail(ds("engine.py:1341", "bf16 without ZeRO and without a pipeline needs fp32 accumulation"));
  const std::string wsrc = ds("engine.py:1316", "the optimizer wrapper by dtype, accumulation dtype and ZeRO stage");
  b.set("params_bytes", std::int64_t{bf16 || fp16 ? 2 : 4}, "bf16.enabled / fp16.enabled");
  b.set("precision", "bf16", "ds_config.json selects 16-bit (bf16 or fp16) GEMMs; it has no FP8 keys");
  // BF16_Optimizer partitions the fp32 master weights and Adam's moments over
  // DP and all-gathers the parameters after the step, with ZeRO 0 as with 1.
  const std::int64_t zero = w == Wrapper::bf16 && dp > 1 ? 1 : w == Wrapper::zero ? stage : 0;
  b.set("zero_stage", zero,
        w == Wrapper::bf16 ? wsrc + "; BF16_Optimizer partitions the optimizer over DP (bf16_optimizer.py:156)"
                           : wsrc + "; zero_optimization.stage (default 0, zero/config.py:91)");
  b.set("zero1_grad_all_reduce", w != Wrapper::zero,
        w == Wrapper::zero ? ds("zero/config.py:104", "reduce_scatter True: each partition's gradients reduced to it")
                           : ds("engine.py:2062", "the gradients all-reduced in full (buffered_allreduce_fallback)"));
  b.set("dp_grad_bytes", std::int64_t{w == Wrapper::bf16 ? 4 : 2},
        w == Wrapper::bf16 ? "BF16_Optimizer accumulates and reduces fp32 gradients (grad_accum_dtype fp32)"
                           : "the 16-bit gradients reduced in the model's dtype");
  bool overlap = false;
  std::string overlap_src;
  if (pp > 1) {
    overlap_src = ds("pipe/schedule.py:240", "ReduceGrads after the last micro-batch's backward (pipe/engine.py:293)");
  } else if (w == Wrapper::zero) {
    overlap = c.count("zero_optimization.overlap_comm") ? truthy(c.find("zero_optimization.overlap_comm")->second)
                                                        : stage == 3;
    overlap_src = ds("zero/config.py:353", "overlap_comm, default on for ZeRO-3 only");
  } else {
    overlap_src = ds("engine.py:2055", "the gradients reduced at the accumulation boundary, after the backward");
  }
  b.set("dp_overlap", overlap, overlap_src);
  b.set("grad_accum_fusion", false, "DeepSpeed adds each micro-batch's gradients in a pass of its own");
  b.set("rank_order", "tp-dp-pp", ds("pipe/topology.py:232", "PipeDataParallelTopology: data-parallel ranks inside "
                                                               "each pipeline stage's"));
  return b.done();
}

}  // namespace cuboid::resolve
