// cuboid calibrate: the sweeps on every rank, the fits and the card on rank 0.
#include "cuboid/calibrate/calibrate.hpp"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuboid/calibrate/core_share.hpp"
#include "cuboid/calibrate/gemm_sweep.hpp"
#include "cuboid/calibrate/nccl_table.hpp"
#include "cuboid/calibrate/results.hpp"
#include "cuboid/calibrate/sweep_plan.hpp"
#include "cuboid/core/cluster.hpp"
#include "cuboid/core/error.hpp"
#include "cuboid/core/files.hpp"
#include "cuboid/core/host.hpp"
#include "cuboid/core/json_reader.hpp"
#include "cuboid/exec/exec_error.hpp"
#include "cuboid/exec/launch.hpp"
#include "cuboid/exec/host_exchange.hpp"
#include "cuboid/exec/host_memory.hpp"
#include "cuboid/exec/mpi_comm.hpp"
#include "cuboid/exec/registry.hpp"
#include "cuboid/io/planfile.hpp"
#include "cuboid_config.hpp"
#include "cuboid/exec/op_timer.hpp"

namespace cuboid::calibrate {

namespace {

const std::string kCl = "command line";
constexpr std::int64_t kMinCollectiveBytes = 1024;  // nccl-tests' usual -b 1K

std::vector<CalibrationJob> load_jobs(const CalibrateOptions& o, const Cluster& cluster, int world_size) {
  std::vector<CalibrationJob> jobs;
  for (const std::string& path : o.plan_paths) {
    const PlanFile pf = read_plan_file(path);
    check_plan_matches_cluster(pf, cluster);
    exec::check_executable(pf.model, pf.plan, pf.source);
    // A card holds the backend's own GEMM rates; an FP8 plan's step would run
    // its GEMMs emulated on the host (cpu) and measure that.
    if (pf.plan.precision != Precision::bf16)
      throw InputError(pf.source, "parallel.precision",
                       "calibrate measures the backend's bf16 / f32 GEMMs and the plan's step; this plan's " +
                           std::string(to_string(pf.plan.precision)) + " GEMMs would run emulated",
                       "calibrate with the same layout in bf16 (cuboid plan without --precision)");
    exec::check_world_size(world_size, pf.plan, pf.source);
    jobs.push_back(CalibrationJob{pf.model, pf.plan, pf.source});
  }
  if (!o.model_path.empty()) {
    CalibrationJob j{load_model(o.model_path), ParallelPlan{}, o.model_path};
    exec::check_executable(j.model, j.plan, o.model_path);
    j.plan.dp = world_size;
    j.plan.global_batch = world_size;
    j.plan.seq_length = j.model.seq_length;
    jobs.push_back(std::move(j));
  }
  if (jobs.empty())
    throw InputError(kCl, "--plan", "no plan or model to calibrate for",
                     "give --plan plan.json (from cuboid plan --out) or --model FILE");
  return jobs;
}

exec::Communicator* group_comm(exec::ProcessGroups& g, Group kind, FlexLeg leg = FlexLeg::none) {
  if (leg == FlexLeg::intra) return g.ep_intra.get();
  if (leg == FlexLeg::rail) return g.ep_rail.get();
  switch (kind) {
    case Group::tp: return g.tp.get();
    case Group::pp: return g.pp.get();
    case Group::dp: return g.dp.get();
    case Group::ep: return g.ep.get();
    case Group::cp: return g.cp.get();
    case Group::none: break;
  }
  return g.world.get();
}

std::string device_name(exec::Backend& be) {
  return be.name() == "cpu" ? "cpu (one core per rank)" : be.device_name();
}

// The input card's JSON with the calibration added; a "gpu" given as a path
// relative to the input card is inlined so the new card works from anywhere.
nlohmann::json calibrated_card(const CalibrateOptions& o, const Calibration& cal, const std::string& when) {
  nlohmann::json card = read_json_file(o.cluster_path);
  if (card.contains("gpu") && card["gpu"].is_string()) {
    const std::filesystem::path base = std::filesystem::path(o.cluster_path).parent_path();
    card["gpu"] = read_json_file((base / card["gpu"].get<std::string>()).string());
  }
  const std::string before = card.value("description", "");
  card["description"] = fmt::format(
      "Calibrated by cuboid calibrate on {} (backend {}, {}, {} ranks measuring at once; command: {}) from {}{}{}", when,
      cal.backend, cal.device, cal.ranks, cal.created_by, o.cluster_path, before.empty() ? "" : ": ", before);
  card["calibration"] = calibration_to_json(cal);
  return card;
}

void print_collective_tables(const Combined& c, const std::string& type) {
  for (const auto& [key, table] : c.collectives) {
    const bool reduces = key.collective == Collective::all_reduce || key.collective == Collective::reduce_scatter;
    std::cout << fmt::format("#\n# {}: {} groups of {} ranks ({}), {}, {}\n#\n", to_string(key.collective),
                             table.group, key.group_size, key.tier, type,
                             key.cold ? "cold buffers (as the DP collectives find them)"
                                      : "hot buffers (as the layers' exchanges find them)");
    std::cout << nccl_table_header();
    double busbw_sum = 0;
    for (const CollectiveRow& r : table.rows) {
      NcclRow row{r.size_bytes, r.count, type, reduces ? "sum" : "none",
                  key.collective == Collective::broadcast ? 0 : -1, r.time_ns * 1e-3,
                  bus_factor(key.collective, key.group_size), r.wrong};
      std::cout << format_nccl_row(row);
      busbw_sum += algbw_GBps(static_cast<double>(r.size_bytes), row.time_us) * row.bus_factor;
    }
    std::cout << fmt::format("# Avg bus bandwidth    : {:.3f} GB/s\n",
                             table.rows.empty() ? 0.0 : busbw_sum / static_cast<double>(table.rows.size()));
  }
}

// Sorted by size and made monotone (isotonic regression of the medians): on
// an oversubscribed machine a small message can wait for a descheduled
// partner rank and take longer than a larger one. That is noise, not the
// curve; the loader still rejects a stored series whose times fall.
std::vector<SizeSample> monotone(std::vector<SizeSample> samples, const std::string& what,
                                 std::vector<std::string>& adjusted) {
  std::stable_sort(samples.begin(), samples.end(),
                   [](const SizeSample& a, const SizeSample& b) { return a.bytes < b.bytes; });
  const int changed = make_monotone(samples);
  if (changed > 0)
    adjusted.push_back(fmt::format("{}: {} of {} medians pooled (time fell as the size grew)", what, changed,
                                   samples.size()));
  return samples;
}

// Fits every kernel and collective; a fit the reader would reject (e.g. a
// slope that is not positive) is reported and left out, never written.
Calibration fit_all(const Combined& c, Calibration cal, std::vector<std::string>& rejected,
                    std::vector<std::string>& adjusted) {
  auto fit_kernels = [&](const std::map<std::string, std::vector<SizeSample>>& tables, const std::string& where,
                         std::map<std::string, KernelCalibration>& into) {
    for (const auto& [name, raw] : tables) {
      try {
        const std::vector<SizeSample> samples = monotone(raw, "kernel " + name + where, adjusted);
        into[name] = fit_kernel(samples, "cuboid calibrate", "kernels." + name + where);
      } catch (const InputError& e) {
        rejected.push_back(fmt::format("kernel {}{}: {}", name, where, e.what()));
      }
    }
  };
  cal.gemms = c.gemms;
  fit_kernels(c.kernels, "", cal.kernels);
  for (const CombinedPool& p : c.other_pools) {
    OperandPoolTables& t = cal.other_pools.emplace_back();
    t.gemm_operand_pool_bytes = p.pool_bytes;
    t.gemms = p.gemms;
    fit_kernels(p.kernels, fmt::format(" (operand pool {:.1f} MiB)", p.pool_bytes / (1 << 20)), t.kernels);
  }
  for (const auto& [key, table] : c.collectives) {
    std::vector<SizeSample> samples;
    for (const CollectiveRow& r : table.rows) samples.push_back(SizeSample{static_cast<double>(r.size_bytes), r.time_ns});
    const std::string field = fmt::format("collectives.{}.{}.{}{}", to_string(key.collective), key.tier,
                                          key.group_size, key.cold ? ".cold" : "");
    samples = monotone(std::move(samples), field, adjusted);
    try {
      cal.collectives[key] = fit_collective(key.collective, key.group_size, samples, "cuboid calibrate", field);
    } catch (const InputError& e) {
      rejected.push_back(fmt::format("{}: {}", field, e.what()));
    }
  }
  return cal;
}

void print_fits(const Calibration& cal, const std::vector<std::string>& rejected,
                const std::vector<std::string>& adjusted) {
  std::cout << "\nfits: collectives, time = alpha + size * bus_factor / busbw\n";
  std::cout << fmt::format("{:<16} {:<11} {:>5} {:<7} {:>10} {:>11} {:>10} {:>8}\n", "collective", "tier", "ranks",
                           "buffers", "alpha(us)", "busbw(GB/s)", "max|res|", "samples");
  for (const auto& [key, f] : cal.collectives)
    std::cout << fmt::format("{:<16} {:<11} {:>5} {:<7} {:>10.2f} {:>11.3f} {:>9.1f}% {:>8}\n",
                             to_string(key.collective), key.tier, key.group_size, key.cold ? "cold" : "hot",
                             f.alpha_ns * 1e-3, f.busbw_GBps,
                             100 * f.fit.max_abs_residual, f.samples.size());
  std::cout << "\nfits: memory-bound kernels, time = alpha + bytes / bandwidth (workload bytes)\n";
  std::cout << fmt::format("{:<20} {:>10} {:>10} {:>10} {:>8}\n", "kernel", "alpha(us)", "GB/s", "max|res|", "samples");
  for (const auto& [name, k] : cal.kernels)
    std::cout << fmt::format("{:<20} {:>10.2f} {:>10.3f} {:>9.1f}% {:>8}\n", name, k.fit.alpha_ns * 1e-3,
                             k.fit.ns_per_byte > 0 ? 1.0 / k.fit.ns_per_byte : 0.0, 100 * k.fit.max_abs_residual,
                             k.samples.size());
  std::vector<GemmSample> own, fp8;
  for (const GemmSample& g : cal.gemms) (g.format == GemmFormat::fp8 ? fp8 : own).push_back(g);
  if (!own.empty()) {
    auto tflops = [](const GemmSample& s) {
      return 2.0 * static_cast<double>(s.m * s.n) * static_cast<double>(s.k * s.batch) / s.time_ns * 1e-3;
    };
    const auto [lo, hi] = std::minmax_element(own.begin(), own.end(),
                                              [&](const GemmSample& a, const GemmSample& b) { return tflops(a) < tflops(b); });
    std::cout << fmt::format("\nGEMM: {} shapes; achieved TFLOP/s per rank: best {:.4f} ({}x{}x{} batch {}), "
                             "worst {:.4f} ({}x{}x{} batch {})\n",
                             own.size(), tflops(*hi), hi->m, hi->n, hi->k, hi->batch, tflops(*lo), lo->m, lo->n,
                             lo->k, lo->batch);
    if (!fp8.empty()) {
      const auto [flo, fhi] = std::minmax_element(
          fp8.begin(), fp8.end(), [&](const GemmSample& a, const GemmSample& b) { return tflops(a) < tflops(b); });
      std::cout << fmt::format("FP8 GEMM (E4M3, per-tensor scales, the GEMM alone): {} shapes; best {:.4f} "
                               "({}x{}x{}), worst {:.4f} ({}x{}x{})\n",
                               fp8.size(), tflops(*fhi), fhi->m, fhi->n, fhi->k, tflops(*flo), flo->m, flo->n,
                               flo->k);
    }
    if (cal.gemm_operand_pool_bytes > 0)
      std::cout << fmt::format("GEMM operands rotated over {:.1f} MiB, the plans' step working set (weights, fp32 "
                               "gradients, activations in flight) of the ranks on one core, as cached as in the step\n",
                               cal.gemm_operand_pool_bytes / (1 << 20));
    for (const OperandPoolTables& t : cal.other_pools)
      std::cout << fmt::format("and over {:.1f} MiB for the plans of that working set: {} GEMM shapes, {} kernels "
                               "(a plan is priced from the pool nearest its own working set)\n",
                               t.gemm_operand_pool_bytes / (1 << 20), t.gemms.size(), t.kernels.size());
  }
  for (const std::string& a : adjusted) std::cout << "made monotone (isotonic regression): " << a << "\n";
  for (const std::string& r : rejected) std::cout << "not calibrated (fit rejected, the datasheet model stays): " << r << "\n";
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The collective sweep's sizes: 1 KiB to --max-size by x2 (--quick: to 1 MiB by x16).
std::vector<std::int64_t> collective_sizes(const CalibrateOptions& o) {
  // A collective's send and receive buffers of 64 GiB each: more than any GPU holds (H200: 141 GB).
  constexpr std::int64_t kMaxCollectiveBytes = std::int64_t{1} << 36;
  if (o.max_size_bytes > kMaxCollectiveBytes)
    throw InputError(kCl, "--max-size", fmt::format("{} bytes is above the limit of {} (64 GiB)", o.max_size_bytes, kMaxCollectiveBytes),
                     "give at most 68719476736 (default 268435456 = 256 MiB)");
  const std::int64_t largest = o.quick ? std::min<std::int64_t>(o.max_size_bytes, 1 << 20) : o.max_size_bytes;
  return size_ladder(kMinCollectiveBytes, largest, o.quick ? 16 : 2, "--max-size");
}

}  // namespace

StepFootprint step_footprint(const std::vector<CalibrationJob>& jobs, const GpuProfile& gpu, int element_bytes,
                             double ranks_per_core, bool quick) {
  double working_set = 0, whole_step = 0;
  for (const CalibrationJob& j : jobs) {
    working_set = std::max(working_set, step_working_set_bytes(j.model, j.plan, gpu, element_bytes));
    whole_step = std::max(whole_step, step_memory_bytes(j.model, j.plan, gpu, element_bytes));
  }
  return StepFootprint{operand_pool_bytes(working_set, ranks_per_core, quick),
                       operand_pool_bytes(whole_step, ranks_per_core, quick)};
}

std::vector<StepFootprint> job_footprints(const std::vector<CalibrationJob>& jobs, const GpuProfile& gpu,
                                          int element_bytes, double ranks_per_core, bool quick) {
  std::vector<StepFootprint> out;
  for (const CalibrationJob& j : jobs) out.push_back(step_footprint({j}, gpu, element_bytes, ranks_per_core, quick));
  return out;
}

std::vector<std::string> measure_and_gather(exec::Backend& backend, std::unique_ptr<exec::Communicator> comm,
                                            exec::HostExchange& exchange, const std::vector<CalibrationJob>& jobs,
                                            const Cluster& cluster, const CalibrateOptions& o,
                                            const CoreShare& share, const StepFootprint& footprint,
                                            exec::Watchdog* watchdog, SweepSeconds& seconds) {
  const int gpus_per_node = cluster.gpus_per_node;
  const Statistic stat = parse_statistic(o.statistic, "--statistic");
  const std::vector<std::int64_t> sizes = collective_sizes(o);
  const int rank = comm->rank();
  const auto t0 = std::chrono::steady_clock::now();

  RankResults mine;
  mine.rank = rank;
  // The plans grouped by their own operand pool (job_footprints): the
  // largest pool's tables are the card's, the others its other_pools, so
  // that a plan is priced from samples measured in its own cache state.
  const std::vector<StepFootprint> own = job_footprints(
      jobs, cluster.gpu, static_cast<int>(exec::dtype_bytes(backend.compute_dtype())), share.ranks_per_core, o.quick);
  std::map<std::size_t, std::vector<std::size_t>, std::greater<>> by_pool;  // largest first
  for (std::size_t i = 0; i < jobs.size(); ++i) by_pool[own[i].working_set].push_back(i);
  auto tables_of = [&](std::size_t pool) -> std::pair<std::vector<GemmSample>*, std::vector<KernelMeasurement>*> {
    if (pool == by_pool.begin()->first) return {&mine.gemms, &mine.kernels};
    for (PoolResults& p : mine.other_pools)
      if (p.pool_bytes == pool) return {&p.gemms, &p.kernels};
    PoolResults& p = mine.other_pools.emplace_back();
    p.pool_bytes = pool;
    return {&p.gemms, &p.kernels};
  };
  // GEMMs: every shape of the pool's plans, and the grid around them.
  for (const auto& [pool, members] : by_pool) {
    std::set<GemmProblem> base;
    for (const std::size_t i : members)
      for (const GemmProblem& p : plan_gemm_problems(jobs[i].model, jobs[i].plan)) base.insert(p);
    GemmSweepOptions go;
    if (o.quick) go = GemmSweepOptions{std::size_t{64} << 20, 1, 3, 5, 2};
    go.pool_bytes = pool;
    go.turns = share.turns;
    go.lead_call = o.backend != "cpu";
    go.turn = share.turn;
    const std::vector<GemmProblem> grid = gemm_grid({base.begin(), base.end()}, o.quick);
    std::vector<std::vector<GemmSample>> gemm_repeats;
    for (int r = 0; r < o.repeat; ++r) gemm_repeats.push_back(run_gemm_sweep(backend, *comm, grid, go, watchdog));
    std::vector<GemmSample>& gemms = *tables_of(pool).first;
    gemms = combine_repeats(gemm_repeats, stat);
    // A GPU with FP8 GEMMs: the same shapes' FP8 GEMMs too (GemmFormat::fp8),
    // which an FP8 plan's linear layers are priced from.
    if (backend.native_fp8_gemm()) {
      std::vector<std::vector<GemmSample>> fp8_repeats;
      for (int r = 0; r < o.repeat; ++r) fp8_repeats.push_back(run_fp8_gemm_sweep(backend, *comm, grid, go, watchdog));
      const std::vector<GemmSample> fp8 = combine_repeats(fp8_repeats, stat);
      gemms.insert(gemms.end(), fp8.begin(), fp8.end());
    }
  }
  seconds.gemm = since(t0);

  // Kernels and collectives, on each plan's own process groups.
  std::set<std::pair<int, std::string>> swept;  // (group size, tier) already measured
  KernelSweepOptions ko;
  ko.quick = o.quick;
  if (o.quick) ko.measured_steps = 3;
  ko.turns = share.turns;
  ko.turn = share.turn;
  CollectiveSweepOptions co;
  if (o.quick) co = CollectiveSweepOptions{2, 5, 9, std::int64_t{1} << 20};
  for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
    const CalibrationJob& j = jobs[ji];
    // What the optimizer's kernels find evicted (step_cache.hpp): this plan's step.
    ko.step_memory_bytes = own[ji].whole_step;
    exec::ProcessGroups groups =
        exec::make_process_groups(std::move(comm), RankMapping(j.plan, gpus_per_node), j.model.moe.enabled(),
                                  j.model.moe.enabled() && j.plan.ep > 1 && j.plan.moe_dispatcher == MoeDispatcher::flex);
    const auto tk = std::chrono::steady_clock::now();
    std::vector<std::vector<KernelMeasurement>> kernel_repeats;
    std::vector<std::vector<GemmSample>> layer_gemm_repeats;
    for (int r = 0; r < o.repeat; ++r) {
      LayerSweep layer =
          run_kernel_sweep(backend, groups.tp.get(), *groups.world, j.model, j.plan, ko, watchdog, groups.ep.get(),
                           groups.cp.get(), groups.flex.intra != nullptr ? &groups.flex : nullptr);
      const std::vector<KernelMeasurement> a =
          run_optimizer_sweep(backend, *groups.world, j.model, j.plan, ko, watchdog);
      layer.kernels.insert(layer.kernels.end(), a.begin(), a.end());
      kernel_repeats.push_back(std::move(layer.kernels));
      layer_gemm_repeats.push_back(std::move(layer.gemms));
    }
    const std::vector<KernelMeasurement> k = combine_repeats(kernel_repeats, stat);
    const auto [pool_gemms, kernels] = tables_of(own[ji].working_set);
    kernels->insert(kernels->end(), k.begin(), k.end());
    // The layer's GEMMs replace the pool sweep's at their shapes: they ran
    // as the step runs them (docs/calibration.md, "The step's GEMMs"). Not
    // where ranks share a core: the layer's ranks run at once, and a card
    // charges each compute op ranks_per_core x a sample timed alone.
    if (share.turns == 1) merge_layer_gemms(*pool_gemms, combine_repeats(layer_gemm_repeats, stat));
    seconds.kernel += since(tk);
    const auto tc = std::chrono::steady_clock::now();
    for (const GroupShape& shape : plan_group_shapes(j.plan, gpus_per_node)) {
      if (!swept.insert({shape.size, shape.tier}).second) continue;
      // Each group shape in both cache states: hot for the layers'
      // exchanges, cold for the data-parallel ones (CollectiveKey::cold),
      // whichever kind of group the plan gives this shape.
      for (const bool cold : {false, true}) {
        CollectiveSweepOptions state = co;
        state.evict_bytes = cold ? footprint.whole_step : 0;
        groups.world->barrier();
        for (const CollectiveMeasurement& m :
             run_collective_sweep(backend, *group_comm(groups, shape.group, shape.leg), sizes, state, watchdog))
          mine.collectives.push_back(CollectiveRecord{CollectiveKey{m.collective, shape.tier, shape.size, cold},
                                                      std::string(to_string(shape.group)), m});
      }
    }
    seconds.collective += since(tc);
    comm = std::move(groups.world);
  }

  // Over the host exchange (MPI or the TCP store): the device world may be NCCL's.
  return exchange.gather(to_json(mine).dump(), 0);
}

int run_calibrate(const CalibrateOptions& o) {
  if (o.repeat < 1 || o.repeat > 100)
    throw InputError(kCl, "--repeat", "is " + std::to_string(o.repeat), "give 1 to 100 (3 on a noisy machine)");
  exec::check_timeout_flag(o.timeout_s);
  if (o.out_path.empty()) throw InputError(kCl, "--out", "is required", "give --out calibrated.json");
  exec::check_mpi_wait_word(o.mpi_wait);
  // Bad flags are refused before the launch (measure_and_gather reads them again).
  (void)parse_statistic(o.statistic, "--statistic");
  (void)collective_sizes(o);
  const Cluster cluster = load_cluster(o.cluster_path);
  const exec::LaunchInfo launch = exec::detect_launch(exec::process_environment());
  const std::vector<CalibrationJob> jobs = load_jobs(o, cluster, launch.world_size);
  // The inputs are read: the outputs are checked against them before any measuring.
  std::vector<OutputPath> outputs{{"--out", o.out_path}};
  if (!o.raw_path.empty()) outputs.push_back({"--raw", o.raw_path});
  check_output_paths(outputs);
  exec::World world = exec::start_world(launch, o.backend, o.timeout_s);
  const std::string mpi_wait = exec::apply_mpi_wait(world, o.mpi_wait);
  // As cuboid run holds it (cuboid/exec/host_memory.hpp): a sweep's buffers
  // and MPI's temporaries reuse touched pages instead of faulting afresh.
  exec::hold_freed_host_memory();
  const CoreShare share =
      core_share(world.exchange->all_gather(cpu_place(world.hostname)), world.exchange->rank(),
                 world.mpi ? exec::mpi_ranks_on_node() : 1, exec::cpus_online(), o.backend == "cpu");
  for (const CalibrationJob& j : jobs) exec::check_world_size(world.exchange->size(), j.plan, j.source);

  std::unique_ptr<exec::Backend> backend = exec::make_backend(o.backend, exec::backend_options(launch, o.backend));
  // The device world, as cuboid run makes it: NCCL for cuda (GPU buffers
  // cannot go to MPI), MPI's world for cpu.
  exec::Watchdog watchdog(launch.rank, o.timeout_s);  // also over ncclCommInitRank, which waits for every peer
  watchdog.enter("creating the communicators (ncclCommInitRank / MPI_Comm_dup)");
  exec::attach_device_world(world, *backend);
  watchdog.leave();
  const int rank = world.exchange->rank();
  const auto t0 = std::chrono::steady_clock::now();
  SweepSeconds seconds;
  const int element_bytes = static_cast<int>(exec::dtype_bytes(backend->compute_dtype()));
  const StepFootprint footprint = step_footprint(jobs, cluster.gpu, element_bytes, share.ranks_per_core, o.quick);
  const std::vector<std::string> all =
      measure_and_gather(*backend, std::move(world.comm), *world.exchange, jobs, cluster, o, share, footprint,
                         &watchdog, seconds);
  if (rank != 0) return 0;
  std::vector<RankResults> ranks;
  nlohmann::json raw = nlohmann::json::array();
  for (const std::string& text : all) {
    raw.push_back(nlohmann::json::parse(text));
    ranks.push_back(rank_results_from_json(raw.back()));
  }
  const Combined combined = combine(ranks);
  if (share.ranks_per_core > 1)
    std::cout << fmt::format("cuboid calibrate: {:g} ranks per core (MPI waits: {}): GEMMs and the optimizer timed "
                             "in {} turns, one rank per core; the calibration charges each compute op {:g} x its "
                             "sample (launch the runs with the same binding)\n",
                             share.ranks_per_core, mpi_wait, share.turns, share.ranks_per_core);
  std::cout << fmt::format("cuboid calibrate: {} ranks, backend {}, {} plan(s); {} GEMM shapes, {} kernels, {} "
                           "collective tables in {:.1f} s (GEMMs {:.1f} s, kernels {:.1f} s, collectives {:.1f} s)\n",
                           world.exchange->size(), backend->name(), jobs.size(), combined.gemms.size(),
                           combined.kernels.size(), combined.collectives.size(), since(t0), seconds.gemm,
                           seconds.kernel, seconds.collective);
  const std::string type = backend->compute_dtype() == exec::DType::bf16 ? "bfloat16" : "float";
  print_collective_tables(combined, type);

  Calibration cal;
  cal.backend = std::string(backend->name());
  cal.device = device_name(*backend);
  cal.created_by = (o.command_line.empty() ? std::string("cuboid ") + CUBOID_VERSION : o.command_line) +
                   " (MPI waits: " + mpi_wait + ")";
  cal.ranks = world.exchange->size();
  cal.activation_bytes_per_element = element_bytes;
  cal.ranks_per_core = share.ranks_per_core;
  cal.gemm_operand_pool_bytes = static_cast<double>(footprint.working_set);
  if (const HostInfo host = read_host_info(); !host.empty()) cal.host = host;
  std::vector<std::string> rejected, adjusted;
  cal = fit_all(combined, std::move(cal), rejected, adjusted);
  print_fits(cal, rejected, adjusted);

  const std::string when = fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", fmt::gmtime(std::chrono::system_clock::now()));
  if (!o.raw_path.empty())
    write_output_file(o.raw_path, nlohmann::json{{"schema", "cuboid.calibration-raw/1"},
                                                     {"created", when},
                                                     {"backend", cal.backend},
                                                     {"ranks", raw}}
                                              .dump(1) +
                                          "\n");
  if (combined.wrong > 0) {
    std::cerr << fmt::format("cuboid: calibrate FAILED: {} elements of the collectives' results were wrong (see "
                             "#wrong); the card was not written\n",
                             combined.wrong);
    return 1;
  }
  const nlohmann::json card = calibrated_card(o, cal, when);
  // The card must load before it is written (the reader refits and checks everything).
  (void)cluster_from_json(card, o.out_path, std::filesystem::path(o.out_path).parent_path());
  write_output_file(o.out_path, card.dump(2) + "\n");
  std::cout << "calibrated cluster card written to " << o.out_path << "\n";
  return 0;
}

}  // namespace cuboid::calibrate
