#include "cuboid/exec/op_timer.hpp"

#include <signal.h>
#include <unistd.h>

#include <string_view>

#include <fmt/format.h>

#include "cuboid/exec/host_memory.hpp"
#include "cuboid/core/op_names.hpp"

namespace cuboid::exec {

OpDesc gemm_desc(const char* name, Pass pass, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  OpDesc d;
  d.name = name;
  d.kind = OpKind::gemm;
  d.pass = pass;
  d.m = m;
  d.n = n;
  d.k = k;
  d.batch = batch;
  d.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
  return d;
}

OpDesc attention_desc(const char* name, Pass pass, std::int64_t nq, std::int64_t nk, std::int64_t head_dim,
                      std::int64_t batch, bool causal) {
  OpDesc d;
  d.name = name;
  d.kind = OpKind::attention_core;
  d.pass = pass;
  d.m = nq;
  d.n = head_dim;
  d.k = nk;
  d.batch = batch;
  d.flops = 4.0 * static_cast<double>(nq) * static_cast<double>(nk) * static_cast<double>(head_dim) *
            static_cast<double>(batch) * (causal ? 0.5 : 1.0) *
            (std::string_view(name) == op::attn_flash_bwd ? 2.5 : 1.0);
  return d;
}

OpDesc mem_desc(const char* name, Pass pass, double bytes) {
  OpDesc d;
  d.name = name;
  d.kind = OpKind::memory_bound;
  d.pass = pass;
  d.bytes = bytes;
  return d;
}

OpDesc comm_desc(const char* name, Pass pass, Collective c, Group g, double bytes, int group_size) {
  OpDesc d;
  d.name = name;
  d.kind = c == Collective::send_recv ? OpKind::p2p : OpKind::collective;
  d.pass = pass;
  d.collective = c;
  d.group = g;
  d.comm_bytes = bytes;
  d.group_size = group_size;
  return d;
}

namespace {
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

// --- SIGTERM: say where this rank was -------------------------------------------
// Only async-signal-safe work in the handler: atomics, a stack buffer, write(2).
namespace {

std::atomic<const std::atomic<const char*>*> g_current_op{nullptr};
std::atomic<int> g_rank{-1};
struct sigaction g_previous_sigterm {};

void append(char* buf, std::size_t& n, std::size_t cap, const char* text) {
  while (*text != '\0' && n + 1 < cap) buf[n++] = *text++;
}

extern "C" void on_sigterm(int sig) {
  char buf[512];
  std::size_t n = 0;
  append(buf, n, sizeof(buf), "cuboid: rank ");
  char digits[16];
  int len = 0;
  for (int r = g_rank.load(); len == 0 || r > 0; r /= 10) digits[len++] = static_cast<char>('0' + r % 10);
  while (len > 0 && n + 1 < sizeof(buf)) buf[n++] = digits[--len];
  append(buf, n, sizeof(buf), ": stopped by SIGTERM (the launcher is ending the job; did another rank fail?)");
  const std::atomic<const char*>* current = g_current_op.load();
  const char* op = current != nullptr ? current->load() : nullptr;
  if (op != nullptr) {
    append(buf, n, sizeof(buf), " while in op '");
    append(buf, n, sizeof(buf), op);
    append(buf, n, sizeof(buf), "'");
  } else {
    append(buf, n, sizeof(buf), " between ops");
  }
  append(buf, n, sizeof(buf), "\n");
  (void)!::write(STDERR_FILENO, buf, n);
  // Then end as SIGTERM would have ended us.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

Watchdog::Watchdog(int rank, double timeout_s) : rank_(rank), timeout_(static_cast<std::int64_t>(timeout_s * 1e9)) {
  g_rank.store(rank);
  g_current_op.store(&op_);
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, &g_previous_sigterm);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  ::sigaction(SIGTERM, &g_previous_sigterm, nullptr);
  g_current_op.store(nullptr);
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::enter(const char* op) noexcept {
  since_ns_.store(now_ns(), std::memory_order_relaxed);
  op_.store(op, std::memory_order_release);
}

void Watchdog::leave() noexcept { op_.store(nullptr, std::memory_order_release); }

void Watchdog::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(50));
    if (stop_) break;
    const char* op = op_.load(std::memory_order_acquire);
    // NCCL finds some failures on its own (a peer that died, a network
    // error) and only reports them when asked: every communicator, each tick.
    if (std::optional<std::string> error = first_async_error())
      end_job(fmt::format("{} while in op '{}'", *error, op == nullptr ? "(none)" : op));
    if (op == nullptr) continue;
    const std::int64_t waited = now_ns() - since_ns_.load(std::memory_order_relaxed);
    if (waited < timeout_.count()) continue;
    // From this thread: the main thread is stuck inside the op (in MPI or on
    // the device), so it cannot end the job itself. end_job aborts every
    // communicator of this rank, not only the world's.
    end_job(fmt::format("op '{}' did not finish within --timeout-s {:.3g} s (a peer rank died or hangs)", op,
                        static_cast<double>(timeout_.count()) / 1e9));
  }
}

TimerEvent& OpTimer::event(std::size_t i) {
  while (events_.size() <= i) events_.push_back(backend_.create_event());
  return events_[i];
}

void OpTimer::begin_step(bool measured) {
  measured_ = measured;
  pending_.clear();
  next_event_ = 0;
  faults_at_begin_ = minor_page_faults();
  backend_.record(event(next_event_++));  // the step's start
}

void OpTimer::begin(const OpDesc& desc) {
  if (watchdog_ != nullptr) watchdog_->enter(desc.name);
  const std::size_t i = next_event_;
  next_event_ += 2;
  backend_.record(event(i));
  pending_.push_back(Pending{desc, i});
}

void OpTimer::end() {
  backend_.record(event(pending_.back().start + 1));
  // A host-blocking op (MPI) has finished here; device ops are only queued,
  // and a hang inside them shows up in the synchronize at the end of the step.
  if (watchdog_ != nullptr) watchdog_->leave();
}

double OpTimer::end_step() {
  const std::size_t last = next_event_++;
  backend_.record(event(last));
  if (watchdog_ != nullptr) watchdog_->enter("synchronize (end of step)");
  backend_.synchronize();
  if (watchdog_ != nullptr) watchdog_->leave();
  const double step_s = static_cast<double>(backend_.elapsed_ns(events_[0], events_[last])) * 1e-9;
  if (!measured_) return step_s;
  step_faults_.push_back(minor_page_faults() - faults_at_begin_);
  std::map<std::string, std::pair<double, std::int64_t>> sums;
  for (const Pending& p : pending_) {
    const double s = static_cast<double>(backend_.elapsed_ns(events_[p.start], events_[p.start + 1])) * 1e-9;
    auto [it, fresh] = stats_.try_emplace(std::string(p.desc.name));
    if (fresh) it->second.desc = p.desc;
    auto& acc = sums[it->first];
    acc.first += s;
    acc.second += 1;
  }
  for (auto& [name, st] : stats_) {
    const auto it = sums.find(name);
    st.step_seconds.push_back(it == sums.end() ? 0.0 : it->second.first);
    if (it != sums.end()) st.calls_per_step = it->second.second;
  }
  steps_.push_back(step_s);
  return step_s;
}

}  // namespace cuboid::exec
