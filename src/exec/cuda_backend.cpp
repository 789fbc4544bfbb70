// The CUDA backend (see cuda_backend.hpp).
#include "cuboid/exec/cuda_backend.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "kernels/kernels.hpp"

namespace cuboid::exec {

namespace {

using kernels::bf16;

}  // namespace

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw ExecError(file, line, launcher_rank(), call_name(call),
                  std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code) + " in `" + call + "`");
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  throw ExecError(file, line, launcher_rank(), call_name(call),
                  std::string(cublasGetStatusName(code)) + ": " + cublasGetStatusString(code) + " in `" + call +
                      "`");
}

CudaStream make_stream() {
  cudaStream_t s = nullptr;
  CUBOID_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return CudaStream(s);
}

CudaEvent make_sync_event() {
  cudaEvent_t e = nullptr;
  CUBOID_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return CudaEvent(e);
}

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

// ---------------------------------------------------------------------------
namespace {

// The element type behind a float span: calls f(float{}) or f(bf16{}).
template <typename F>
void dispatch_float(DType d, const char* op, F&& f) {
  switch (d) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::i32: break;
  }
  throw_exec_error(op, "expected an f32 or bf16 span, got " + std::string(to_string(d)), __FILE__, __LINE__);
}

template <typename T>
T* ptr(DeviceSpan s) noexcept {
  return static_cast<T*>(s.native());
}
template <typename T>
const T* ptr(ConstDeviceSpan s) noexcept {
  return static_cast<const T*>(s.native());
}

// The kernels take one storage type for a layer's activations and parameters
// (the runner keeps them all in compute_dtype); only gradient accumulators
// may differ. Mixed spans are refused rather than converted behind the back.
void require_same_dtype(const char* op, std::initializer_list<ConstDeviceSpan> spans) {
  const DType d = spans.begin()->dtype();
  for (const ConstDeviceSpan& s : spans)
    CUBOID_EXEC_REQUIRE(s.dtype() == d, op,
                        "the cuda backend needs activations and parameters of one dtype, got " +
                            std::string(to_string(d)) + " and " + std::string(to_string(s.dtype())));
}

cudaDataType_t cuda_type(DType d) { return d == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasOperation_t cublas_op(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

int checked_int(std::int64_t v, const char* op, const char* what) {
  CUBOID_EXEC_REQUIRE(v <= std::numeric_limits<int>::max(), op,
                      std::string(what) + " " + std::to_string(v) + " exceeds cuBLAS's 32-bit int");
  return static_cast<int>(v);
}

// cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB suffices before).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

}  // namespace

CudaBackend::CudaBackend(int device) {
  const int count = cuda_device_count();
  CUBOID_EXEC_REQUIRE(count > 0, "cuda", "no NVIDIA GPU is visible (cudaGetDeviceCount reports 0 devices)");
  CUBOID_EXEC_REQUIRE(device >= 0 && device < count, "cuda",
                      "device " + std::to_string(device) + " requested but only " + std::to_string(count) +
                          " visible (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)");
  CUBOID_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUBOID_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  info_ = {device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem};

  // Keep freed memory in the stream-ordered pool instead of returning it to
  // the driver at every sync: the runner allocates per step.
  cudaMemPool_t pool = nullptr;
  CUBOID_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
  CUBOID_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));

  stream_ = make_stream();
  cublasHandle_t handle = nullptr;
  CUBOID_CUBLAS_CHECK(cublasCreate(&handle));
  cublas_ = CublasHandle(handle);
  CUBOID_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_.get()));
  CUBOID_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  CUBOID_CUBLAS_CHECK(cublasSetWorkspace(cublas_.get(), cublas_workspace_, kCublasWorkspaceBytes));
  CUBOID_CUBLAS_CHECK(cublasLtCreate(&cublas_lt_));
}

CudaBackend::~CudaBackend() {
  scratch_ = DeviceBuffer();
  (void)cudaStreamSynchronize(stream_.get());
  cublas_.reset();
  if (cublas_lt_ != nullptr) (void)cublasLtDestroy(cublas_lt_);
  (void)cudaFree(cublas_workspace_);
}

void CudaBackend::synchronize() { CUBOID_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

// --- timing -----------------------------------------------------------------
namespace {
void destroy_event(void* event, void* /*context*/) noexcept { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
}  // namespace

TimerEvent CudaBackend::create_event() {
  cudaEvent_t e = nullptr;
  CUBOID_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled
  return TimerEvent(OwnedHandle(e, &destroy_event, nullptr));
}

void CudaBackend::record(TimerEvent& event) {
  CUBOID_EXEC_REQUIRE(event.native() != nullptr, "record", "the event was not made by create_event()");
  CUBOID_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event.native()), stream_.get()));
}

std::int64_t CudaBackend::elapsed_ns(const TimerEvent& start, const TimerEvent& stop) {
  CUBOID_EXEC_REQUIRE(start.native() != nullptr && stop.native() != nullptr, "elapsed_ns",
                      "the events were not made by create_event()");
  CUBOID_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop.native())));
  float ms = 0.0f;
  CUBOID_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.native()),
                                         static_cast<cudaEvent_t>(stop.native())));
  return std::llround(static_cast<double>(ms) * 1e6);
}

// --- memory -----------------------------------------------------------------
void CudaBackend::free_memory(void* ptr, void* backend) noexcept {
  // Stream-ordered: the memory is reused only after the work already enqueued
  // on the compute stream (which NCCL's stream joins at every call) is done.
  (void)cudaFreeAsync(ptr, static_cast<CudaBackend*>(backend)->stream_.get());
}

DeviceBuffer CudaBackend::alloc_impl(std::size_t elements, DType dtype) {
  if (elements == 0) return DeviceBuffer(OwnedHandle(), 0, dtype);
  void* p = nullptr;
  CUBOID_CUDA_CHECK(cudaMallocAsync(&p, elements * dtype_bytes(dtype), stream_.get()));
  return DeviceBuffer(OwnedHandle(p, &CudaBackend::free_memory, this), elements, dtype);
}

float* CudaBackend::scratch_floats(std::size_t elements) {
  if (scratch_.size() < elements) scratch_ = alloc_impl(elements, DType::f32);
  return static_cast<float*>(scratch_.native());
}

// Pageable host memory: cudaMemcpyAsync returns once the host data is staged,
// so the temporaries below may go out of scope right after.
void CudaBackend::upload_impl(const std::vector<float>& host, DeviceSpan dst) {
  if (host.empty()) return;
  if (dst.dtype() == DType::f32) {
    CUBOID_CUDA_CHECK(cudaMemcpyAsync(dst.native(), host.data(), dst.bytes(), cudaMemcpyHostToDevice, stream_.get()));
    return;
  }
  std::vector<bf16> staged(host.size());
  std::transform(host.begin(), host.end(), staged.begin(), [](float v) { return __float2bfloat16_rn(v); });
  CUBOID_CUDA_CHECK(cudaMemcpyAsync(dst.native(), staged.data(), dst.bytes(), cudaMemcpyHostToDevice, stream_.get()));
}

void CudaBackend::upload_indices_impl(const std::vector<std::int32_t>& host, DeviceSpan dst) {
  if (host.empty()) return;
  CUBOID_CUDA_CHECK(cudaMemcpyAsync(dst.native(), host.data(), dst.bytes(), cudaMemcpyHostToDevice, stream_.get()));
}

std::vector<float> CudaBackend::download_impl(ConstDeviceSpan src) {
  std::vector<float> out(src.size());
  if (src.empty()) return out;
  switch (src.dtype()) {
    case DType::f32:
      CUBOID_CUDA_CHECK(cudaMemcpyAsync(out.data(), src.native(), src.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
      synchronize();
      break;
    case DType::bf16: {
      std::vector<bf16> staged(src.size());
      CUBOID_CUDA_CHECK(
          cudaMemcpyAsync(staged.data(), src.native(), src.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
      synchronize();
      std::transform(staged.begin(), staged.end(), out.begin(), [](bf16 v) { return __bfloat162float(v); });
      break;
    }
    case DType::i32: {
      std::vector<std::int32_t> staged(src.size());
      CUBOID_CUDA_CHECK(
          cudaMemcpyAsync(staged.data(), src.native(), src.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
      synchronize();
      std::transform(staged.begin(), staged.end(), out.begin(), [](std::int32_t v) { return static_cast<float>(v); });
      break;
    }
  }
  return out;
}

void CudaBackend::fill_random_impl(DeviceSpan dst, std::uint64_t seed, float scale) {
  dispatch_float(dst.dtype(), "fill_random", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::fill_random(ptr<T>(dst), static_cast<std::int64_t>(dst.size()), seed, scale,
                                           stream_.get()));
  });
}

void CudaBackend::fill_impl(DeviceSpan dst, float value) {
  const auto n = static_cast<std::int64_t>(dst.size());
  if (dst.dtype() == DType::i32) {
    CUBOID_CUDA_CHECK(kernels::fill(ptr<std::int32_t>(dst), value, n, stream_.get()));
    return;
  }
  dispatch_float(dst.dtype(), "fill", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::fill(ptr<T>(dst), value, n, stream_.get()));
  });
}

void CudaBackend::copy_impl(ConstDeviceSpan src, DeviceSpan dst) {
  if (src.empty()) return;
  if (src.dtype() == dst.dtype()) {
    CUBOID_CUDA_CHECK(
        cudaMemcpyAsync(dst.native(), src.native(), src.bytes(), cudaMemcpyDeviceToDevice, stream_.get()));
    return;
  }
  dispatch_float(dst.dtype(), "copy", [&](auto d) {
    dispatch_float(src.dtype(), "copy", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      CUBOID_CUDA_CHECK(
          kernels::convert(ptr<D>(dst), ptr<S>(src), static_cast<std::int64_t>(src.size()), stream_.get()));
    });
  });
}

void CudaBackend::scale_impl(DeviceSpan x, float alpha) {
  dispatch_float(x.dtype(), "scale", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::scale(ptr<T>(x), alpha, static_cast<std::int64_t>(x.size()), stream_.get()));
  });
}

void CudaBackend::add_impl(DeviceSpan dst, ConstDeviceSpan src) {
  dispatch_float(dst.dtype(), "add", [&](auto d) {
    dispatch_float(src.dtype(), "add", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      CUBOID_CUDA_CHECK(
          kernels::add(ptr<D>(dst), ptr<S>(src), static_cast<std::int64_t>(dst.size()), stream_.get()));
    });
  });
}

// --- GEMM -----------------------------------------------------------------------
// cuBLAS is column-major. A row-major m x n matrix with row stride ld is, to
// cuBLAS, its n x m transpose with the same ld, so row-major C = op(A) op(B)
// is column-major C^T = op(B)^T op(A)^T: swap the operands (and m with n)
// and keep each operand's own transpose flag.
void CudaBackend::gemm_impl(const GemmShape& s, float alpha, ConstDeviceSpan a, ConstDeviceSpan b, float beta,
                            DeviceSpan c) {
  CUBOID_EXEC_REQUIRE(a.dtype() == b.dtype(), "gemm",
                      "A and B must share a dtype, got " + std::string(to_string(a.dtype())) + " and " +
                          std::string(to_string(b.dtype())));
  CUBOID_EXEC_REQUIRE(c.dtype() == a.dtype() || c.dtype() == DType::f32, "gemm",
                      "C must be f32 or A's dtype, got " + std::string(to_string(c.dtype())));
  const int m = checked_int(s.m, "gemm", "m");
  const int n = checked_int(s.n, "gemm", "n");
  const int k = checked_int(s.k, "gemm", "k");
  const int lda = checked_int(s.lda, "gemm", "lda");
  const int ldb = checked_int(s.ldb, "gemm", "ldb");
  const int ldc = checked_int(s.ldc, "gemm", "ldc");
  // bf16 inputs, fp32 accumulate and fp32 scalars; plain fp32 for f32 inputs
  // (no TF32), so the CPU backend's results are the reference at fp32 tolerance.
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (s.batch == 1) {
    CUBOID_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), cublas_op(s.trans_b), cublas_op(s.trans_a), n, m, k, &alpha,
                                     b.native(), cuda_type(b.dtype()), ldb, a.native(), cuda_type(a.dtype()), lda,
                                     &beta, c.native(), cuda_type(c.dtype()), ldc, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const int batch = checked_int(s.batch, "gemm", "batch");
  CUBOID_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_.get(), cublas_op(s.trans_b), cublas_op(s.trans_a), n, m, k, &alpha, b.native(), cuda_type(b.dtype()),
      ldb, s.stride_b, a.native(), cuda_type(a.dtype()), lda, s.stride_a, &beta, c.native(), cuda_type(c.dtype()),
      ldc, s.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
}

// --- quantized GEMM ---------------------------------------------------------------
// Hopper's FP8 GEMM (cuBLASLt) takes both operands K-major ("TN" in column
// major) with one fp32 scale_inv each. Row-major C = Q(op(A)) Q(op(B)) is
// column-major C^T = Q(op(B))^T Q(op(A))^T, so cuBLASLt's A is op(B)^T stored
// n x k row-major and its B is op(A) stored m x k row-major: each operand is
// quantized (fp8.cu: amax, scale, cast) straight into that layout.
namespace {
template <typename T, auto Destroy>
struct LtHandle {
  T handle = nullptr;
  LtHandle() = default;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  ~LtHandle() {
    if (handle != nullptr) (void)Destroy(handle);
  }
};
cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

// One FP8 GEMM's cuBLASLt descriptors and algorithm, made once per shape:
// column-major D[n x m] = qb^T[n x k] qa[k x m] (qb: op(B)^T stored n x k,
// qa: op(A) stored m x k, both K-major), scaled by the two scale_inv.
struct Fp8Matmul {
  LtHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  LtHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> la, lb, lc;
  cublasLtMatmulAlgo_t algo{};

  Fp8Matmul(cublasLtHandle_t lt, std::int64_t m, std::int64_t n, std::int64_t k, Fp8Format fa, Fp8Format fb,
            DType c, const float* a_scale_inv, const float* b_scale_inv, const std::string& device) {
    const char* op = "gemm_quantized";
    CUBOID_EXEC_REQUIRE(!(fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2), op,
                        "cuBLASLt has no E5M2 x E5M2 GEMM (hybrid FP8 quantizes one gradient operand at most)");
    // cuBLASLt's FP8 kernels want the K-major leading dimension a multiple of 16 bytes.
    CUBOID_EXEC_REQUIRE(k % 16 == 0 && m % 16 == 0 && n % 16 == 0, op,
                        "FP8 GEMMs need m, n and k multiples of 16 (m " + std::to_string(m) + ", n " +
                            std::to_string(n) + ", k " + std::to_string(k) + ")");
    CUBOID_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    CUBOID_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    CUBOID_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    // cuBLASLt's A is op(B)^T, its B op(A).
    CUBOID_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &b_scale_inv, sizeof b_scale_inv));
    CUBOID_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &a_scale_inv, sizeof a_scale_inv));
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    CUBOID_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.handle, fp8_type(fb), u(k), u(n), k));
    CUBOID_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.handle, fp8_type(fa), u(k), u(m), k));
    CUBOID_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc.handle, cuda_type(c), u(n), u(m), n));
    LtHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
    CUBOID_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.handle));
    const std::uint64_t workspace = kCublasWorkspaceBytes;
    CUBOID_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof workspace));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    CUBOID_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc.handle, la.handle, lb.handle, lc.handle, lc.handle,
                                                       pref.handle, 1, &heuristic, &found));
    CUBOID_EXEC_REQUIRE(found > 0, op,
                        "cuBLASLt offers no FP8 kernel for m " + std::to_string(m) + ", n " + std::to_string(n) +
                            ", k " + std::to_string(k) + " on " + device + " (FP8 needs compute capability 8.9+)");
    algo = heuristic.algo;
  }

  void run(cublasLtHandle_t lt, float alpha, const void* qa, const void* qb, float beta, void* c, void* workspace,
           cudaStream_t stream) const {
    CUBOID_CUBLAS_CHECK(cublasLtMatmul(lt, desc.handle, &alpha, qb, la.handle, qa, lb.handle, &beta, c, lc.handle, c,
                                       lc.handle, &algo, workspace, kCublasWorkspaceBytes, stream));
  }
};
}  // namespace

bool CudaBackend::native_fp8_gemm() const { return info_.sm_major * 10 + info_.sm_minor >= 89; }

// Hopper's FP8 GEMM (cuBLASLt) takes both operands K-major ("TN" in column
// major) with one fp32 scale_inv each. Row-major C = Q(op(A)) Q(op(B)) is
// column-major C^T = Q(op(B))^T Q(op(A))^T, so cuBLASLt's A is op(B)^T stored
// n x k row-major and its B is op(A) stored m x k row-major: each operand is
// quantized (fp8.cu: amax, scale, cast) straight into that layout.
void CudaBackend::gemm_quantized_impl(const GemmShape& s, float alpha, ConstDeviceSpan a, ConstDeviceSpan b,
                                      float beta, DeviceSpan c, const GemmQuantization& q) {
  if (q.scaling != QuantScaling::per_tensor) {
    Backend::gemm_quantized_impl(s, alpha, a, b, beta, c, q);
    return;
  }
  const char* op = "gemm_quantized";
  CUBOID_EXEC_REQUIRE(a.dtype() == b.dtype(), op, "A and B must share a dtype");
  CUBOID_EXEC_REQUIRE(c.dtype() == a.dtype() || c.dtype() == DType::f32, op, "C must be f32 or A's dtype");
  const std::int64_t m = s.m, n = s.n, k = s.k;
  const auto words = [](std::int64_t bytes) { return static_cast<std::size_t>((bytes + 3) / 4); };
  DeviceBuffer qa = alloc_impl(words(m * k), DType::f32);
  DeviceBuffer qb = alloc_impl(words(n * k), DType::f32);
  DeviceBuffer scales = alloc_impl(6, DType::f32);  // amax, scale, scale_inv of A, then of B
  float* sc = static_cast<float*>(scales.native());
  const Fp8Matmul mm(cublas_lt_, m, n, k, q.a, q.b, c.dtype(), sc + 2, sc + 5, info_.name);
  const bool ta = s.trans_a == Trans::yes, tb = s.trans_b == Trans::yes;
  dispatch_float(a.dtype(), op, [&](auto t) {
    using T = decltype(t);
    // op(A) as m x k: stored m x k as is, stored k x m transposed.
    CUBOID_CUDA_CHECK(kernels::fp8_amax(ptr<T>(a), m * k, sc + 0, stream_.get()));
    CUBOID_CUDA_CHECK(kernels::fp8_scale(sc + 0, q.a == Fp8Format::e5m2, sc + 1, sc + 2, stream_.get()));
    CUBOID_CUDA_CHECK(kernels::fp8_cast(ptr<T>(a), ta ? k : m, ta ? m : k, ta, q.a == Fp8Format::e5m2, sc + 1,
                                        qa.native(), stream_.get()));
    // op(B)^T as n x k: stored n x k as is, stored k x n transposed.
    CUBOID_CUDA_CHECK(kernels::fp8_amax(ptr<T>(b), n * k, sc + 3, stream_.get()));
    CUBOID_CUDA_CHECK(kernels::fp8_scale(sc + 3, q.b == Fp8Format::e5m2, sc + 4, sc + 5, stream_.get()));
    CUBOID_CUDA_CHECK(kernels::fp8_cast(ptr<T>(b), tb ? n : k, tb ? k : n, !tb, q.b == Fp8Format::e5m2, sc + 4,
                                        qb.native(), stream_.get()));
  });
  mm.run(cublas_lt_, alpha, qa.native(), qb.native(), beta, c.native(), cublas_workspace_, stream_.get());
}

std::vector<double> CudaBackend::time_fp8_gemm(std::int64_t m, std::int64_t n, std::int64_t k, int warmup, int calls,
                                               bool lead_call) {
  CUBOID_EXEC_REQUIRE(native_fp8_gemm(), "time_fp8_gemm", info_.name + " has no FP8 tensor cores");
  // Random bf16 operands quantized once (E4M3, per-tensor scales): the GEMM
  // alone is timed, as the cost model prices it beside its quantize kernels.
  DeviceBuffer a = alloc_impl(static_cast<std::size_t>(m * k), DType::bf16);
  DeviceBuffer b = alloc_impl(static_cast<std::size_t>(n * k), DType::bf16);
  DeviceBuffer c = alloc_impl(static_cast<std::size_t>(m * n), DType::bf16);
  fill_random_impl(a.span(), 11, 1.0f);
  fill_random_impl(b.span(), 12, 1.0f);
  const auto words = [](std::int64_t bytes) { return static_cast<std::size_t>((bytes + 3) / 4); };
  DeviceBuffer qa = alloc_impl(words(m * k), DType::f32);
  DeviceBuffer qb = alloc_impl(words(n * k), DType::f32);
  DeviceBuffer scales = alloc_impl(6, DType::f32);
  float* sc = static_cast<float*>(scales.native());
  const bf16* pa = static_cast<const bf16*>(a.native());
  const bf16* pb = static_cast<const bf16*>(b.native());
  CUBOID_CUDA_CHECK(kernels::fp8_amax(pa, m * k, sc + 0, stream_.get()));
  CUBOID_CUDA_CHECK(kernels::fp8_scale(sc + 0, false, sc + 1, sc + 2, stream_.get()));
  CUBOID_CUDA_CHECK(kernels::fp8_cast(pa, m, k, false, false, sc + 1, qa.native(), stream_.get()));
  CUBOID_CUDA_CHECK(kernels::fp8_amax(pb, n * k, sc + 3, stream_.get()));
  CUBOID_CUDA_CHECK(kernels::fp8_scale(sc + 3, false, sc + 4, sc + 5, stream_.get()));
  CUBOID_CUDA_CHECK(kernels::fp8_cast(pb, n, k, false, false, sc + 4, qb.native(), stream_.get()));
  const Fp8Matmul mm(cublas_lt_, m, n, k, Fp8Format::e4m3, Fp8Format::e4m3, DType::bf16, sc + 2, sc + 5, info_.name);
  auto call = [&] {
    mm.run(cublas_lt_, 1.0f, qa.native(), qb.native(), 0.0f, c.native(), cublas_workspace_, stream_.get());
  };
  TimerEvent start = create_event(), stop = create_event();
  std::vector<double> times;
  for (int i = 0; i < warmup + calls; ++i) {
    if (lead_call) call();
    record(start);
    call();
    record(stop);
    const auto ns = static_cast<double>(elapsed_ns(start, stop));
    if (i >= warmup) times.push_back(ns);
  }
  return times;
}

// --- normalisation --------------------------------------------------------------
void CudaBackend::layernorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, ConstDeviceSpan beta,
                                         DeviceSpan y, DeviceSpan mean, DeviceSpan rstd, std::int64_t rows,
                                         std::int64_t cols, float eps) {
  require_same_dtype("layernorm_forward", {x, gamma, beta, y});
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::layernorm_fwd(ptr<T>(x), ptr<T>(gamma), ptr<T>(beta), ptr<T>(y), ptr<float>(mean),
                                             ptr<float>(rstd), rows, cols, eps, stream_.get()));
  });
}

void CudaBackend::layernorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                          ConstDeviceSpan mean, ConstDeviceSpan rstd, DeviceSpan dx,
                                          DeviceSpan dgamma, DeviceSpan dbeta, std::int64_t rows,
                                          std::int64_t cols) {
  require_same_dtype("layernorm_backward", {dy, x, gamma, dx});
  require_same_dtype("layernorm_backward", {dgamma, dbeta});
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto t) {
    dispatch_float(dgamma.dtype(), "layernorm_backward", [&](auto g) {
      using T = decltype(t);
      using G = decltype(g);
      CUBOID_CUDA_CHECK(kernels::layernorm_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(gamma), ptr<float>(mean),
                                               ptr<float>(rstd), ptr<T>(dx), ptr<G>(dgamma), ptr<G>(dbeta), rows,
                                               cols, stream_.get()));
    });
  });
}

void CudaBackend::rmsnorm_forward_impl(ConstDeviceSpan x, ConstDeviceSpan gamma, DeviceSpan y, DeviceSpan rstd,
                                       std::int64_t rows, std::int64_t cols, float eps) {
  require_same_dtype("rmsnorm_forward", {x, gamma, y});
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::rmsnorm_fwd(ptr<T>(x), ptr<T>(gamma), ptr<T>(y), ptr<float>(rstd), rows, cols, eps,
                                           stream_.get()));
  });
}

void CudaBackend::rmsnorm_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, ConstDeviceSpan gamma,
                                        ConstDeviceSpan rstd, DeviceSpan dx, DeviceSpan dgamma, std::int64_t rows,
                                        std::int64_t cols) {
  require_same_dtype("rmsnorm_backward", {dy, x, gamma, dx});
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto t) {
    dispatch_float(dgamma.dtype(), "rmsnorm_backward", [&](auto g) {
      using T = decltype(t);
      using G = decltype(g);
      CUBOID_CUDA_CHECK(kernels::rmsnorm_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(gamma), ptr<float>(rstd), ptr<T>(dx),
                                             ptr<G>(dgamma), rows, cols, stream_.get()));
    });
  });
}

// --- attention softmax ------------------------------------------------------------
void CudaBackend::causal_softmax_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t batch, std::int64_t s,
                                              float scale) {
  require_same_dtype("causal_softmax_forward", {x, y});
  dispatch_float(x.dtype(), "causal_softmax_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::causal_softmax_fwd(ptr<T>(x), ptr<T>(y), batch * s, s, s, scale, stream_.get()));
  });
}

void CudaBackend::causal_softmax_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan y, DeviceSpan dx,
                                               std::int64_t batch, std::int64_t s, float scale) {
  require_same_dtype("causal_softmax_backward", {dy, y, dx});
  dispatch_float(y.dtype(), "causal_softmax_backward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(
        kernels::causal_softmax_bwd(ptr<T>(dy), ptr<T>(y), ptr<T>(dx), batch * s, s, s, scale, stream_.get()));
  });
}

// --- activations ------------------------------------------------------------------
void CudaBackend::gelu_forward_impl(ConstDeviceSpan x, DeviceSpan y) {
  require_same_dtype("gelu_forward", {x, y});
  dispatch_float(x.dtype(), "gelu_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(
        kernels::gelu_fwd(ptr<T>(x), ptr<T>(y), static_cast<std::int64_t>(x.size()), stream_.get()));
  });
}

void CudaBackend::gelu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx) {
  require_same_dtype("gelu_backward", {dy, x, dx});
  dispatch_float(x.dtype(), "gelu_backward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::gelu_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(dx), static_cast<std::int64_t>(x.size()),
                                        stream_.get()));
  });
}

void CudaBackend::swiglu_forward_impl(ConstDeviceSpan x, DeviceSpan y, std::int64_t rows, std::int64_t ffn) {
  require_same_dtype("swiglu_forward", {x, y});
  dispatch_float(x.dtype(), "swiglu_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::swiglu_fwd(ptr<T>(x), ptr<T>(y), rows, ffn, stream_.get()));
  });
}

void CudaBackend::swiglu_backward_impl(ConstDeviceSpan dy, ConstDeviceSpan x, DeviceSpan dx, std::int64_t rows,
                                       std::int64_t ffn) {
  require_same_dtype("swiglu_backward", {dy, x, dx});
  dispatch_float(x.dtype(), "swiglu_backward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::swiglu_bwd(ptr<T>(dy), ptr<T>(x), ptr<T>(dx), rows, ffn, stream_.get()));
  });
}

// --- bias, dropout, residual --------------------------------------------------------
void CudaBackend::scale_rows_impl(DeviceSpan x, ConstDeviceSpan factors, std::int64_t rows, std::int64_t cols) {
  dispatch_float(x.dtype(), "scale_rows", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::scale_rows(ptr<T>(x), ptr<float>(factors), rows, cols, stream_.get()));
  });
}

void CudaBackend::row_dot_impl(ConstDeviceSpan a, ConstDeviceSpan b, DeviceSpan out, std::int64_t rows,
                               std::int64_t cols) {
  require_same_dtype("row_dot", {a, b});
  dispatch_float(a.dtype(), "row_dot", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::row_dot(ptr<T>(a), ptr<T>(b), ptr<float>(out), rows, cols, stream_.get()));
  });
}

// --- fused attention pieces ----------------------------------------------------------
void CudaBackend::attention_softmax_lse_impl(DeviceSpan scores, DeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                             std::int64_t nk, float scale, bool causal) {
  dispatch_float(scores.dtype(), "attention_softmax_lse", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::attention_softmax_lse(ptr<T>(scores), ptr<float>(lse), batch, nq, nk, scale, causal,
                                                     stream_.get()));
  });
}

void CudaBackend::attention_probs_impl(DeviceSpan scores, ConstDeviceSpan lse, std::int64_t batch, std::int64_t nq,
                                       std::int64_t nk, float scale, bool causal) {
  dispatch_float(scores.dtype(), "attention_probs", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(
        kernels::attention_probs(ptr<T>(scores), ptr<float>(lse), batch, nq, nk, scale, causal, stream_.get()));
  });
}

void CudaBackend::attention_softmax_grad_impl(DeviceSpan dp, ConstDeviceSpan p, ConstDeviceSpan delta,
                                              std::int64_t batch, std::int64_t nq, std::int64_t nk, float scale) {
  require_same_dtype("attention_softmax_grad", {dp, p});
  dispatch_float(dp.dtype(), "attention_softmax_grad", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::attention_softmax_grad(ptr<T>(dp), ptr<T>(p), ptr<float>(delta), batch, nq, nk, scale,
                                                      stream_.get()));
  });
}

void CudaBackend::attention_merge_impl(DeviceSpan out, DeviceSpan lse, ConstDeviceSpan blk, ConstDeviceSpan blk_lse,
                                       std::int64_t rows, std::int64_t cols) {
  dispatch_float(out.dtype(), "attention_merge", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::attention_merge(ptr<T>(out), ptr<float>(lse), ptr<T>(blk), ptr<float>(blk_lse), rows,
                                               cols, stream_.get()));
  });
}

void CudaBackend::copy_2d_impl(ConstDeviceSpan src, std::int64_t ld_src, DeviceSpan dst, std::int64_t ld_dst,
                               std::int64_t rows, std::int64_t cols, bool accumulate) {
  dispatch_float(dst.dtype(), "copy_2d", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(
        kernels::copy_2d(ptr<T>(src), ld_src, ptr<T>(dst), ld_dst, rows, cols, accumulate, stream_.get()));
  });
}

void CudaBackend::bias_add_impl(DeviceSpan y, ConstDeviceSpan bias, std::int64_t rows, std::int64_t cols) {
  require_same_dtype("bias_add", {y, bias});
  dispatch_float(y.dtype(), "bias_add", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::bias_add(ptr<T>(y), ptr<T>(bias), rows, cols, stream_.get()));
  });
}

void CudaBackend::bias_backward_impl(ConstDeviceSpan dy, DeviceSpan dbias, std::int64_t rows, std::int64_t cols) {
  dispatch_float(dy.dtype(), "bias_backward", [&](auto t) {
    dispatch_float(dbias.dtype(), "bias_backward", [&](auto g) {
      using T = decltype(t);
      using G = decltype(g);
      CUBOID_CUDA_CHECK(kernels::bias_bwd(ptr<T>(dy), ptr<G>(dbias), rows, cols, stream_.get()));
    });
  });
}

void CudaBackend::dropout_residual_forward_impl(ConstDeviceSpan x, ConstDeviceSpan residual, DeviceSpan out,
                                                float p, std::uint64_t seed) {
  require_same_dtype("dropout_residual_forward", {x, residual, out});
  dispatch_float(x.dtype(), "dropout_residual_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::dropout_add_fwd(ptr<T>(x), ptr<T>(residual), ptr<T>(out),
                                               static_cast<std::int64_t>(x.size()), p, seed, stream_.get()));
  });
}

void CudaBackend::dropout_backward_impl(ConstDeviceSpan dout, DeviceSpan dx, float p, std::uint64_t seed) {
  require_same_dtype("dropout_backward", {dout, dx});
  dispatch_float(dx.dtype(), "dropout_backward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::dropout_bwd(ptr<T>(dout), ptr<T>(dx), static_cast<std::int64_t>(dx.size()), p, seed,
                                           stream_.get()));
  });
}

// --- embedding and loss ---------------------------------------------------------------
void CudaBackend::embedding_forward_impl(ConstDeviceSpan ids, ConstDeviceSpan table, DeviceSpan out,
                                         std::int64_t rows, std::int64_t hidden) {
  require_same_dtype("embedding_forward", {table, out});
  const auto vocab = static_cast<std::int64_t>(table.size()) / hidden;
  dispatch_float(table.dtype(), "embedding_forward", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::embedding_fwd(ptr<std::int32_t>(ids), ptr<T>(table), ptr<T>(out), rows, hidden, vocab,
                                             stream_.get()));
  });
}

void CudaBackend::embedding_backward_impl(ConstDeviceSpan dout, ConstDeviceSpan ids, DeviceSpan dtable,
                                          std::int64_t rows, std::int64_t hidden) {
  const auto vocab = static_cast<std::int64_t>(dtable.size()) / hidden;
  dispatch_float(dout.dtype(), "embedding_backward", [&](auto t) {
    dispatch_float(dtable.dtype(), "embedding_backward", [&](auto g) {
      using T = decltype(t);
      using G = decltype(g);
      CUBOID_CUDA_CHECK(kernels::embedding_bwd(ptr<T>(dout), ptr<std::int32_t>(ids), ptr<G>(dtable), rows, hidden,
                                               vocab, stream_.get()));
    });
  });
}

void CudaBackend::cross_entropy_impl(ConstDeviceSpan logits, ConstDeviceSpan labels, DeviceSpan dlogits,
                                     DeviceSpan loss, std::int64_t rows, std::int64_t vocab) {
  require_same_dtype("cross_entropy", {logits, dlogits});
  CUBOID_EXEC_REQUIRE(loss.dtype() == DType::f32, "cross_entropy", "loss must be f32");
  float* row_loss = scratch_floats(static_cast<std::size_t>(rows));
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto t) {
    using T = decltype(t);
    CUBOID_CUDA_CHECK(kernels::cross_entropy(ptr<T>(logits), ptr<std::int32_t>(labels), ptr<T>(dlogits), row_loss,
                                             ptr<float>(loss), rows, vocab, stream_.get()));
  });
}

// --- optimiser ------------------------------------------------------------------------
void CudaBackend::adam_step_impl(DeviceSpan params, ConstDeviceSpan grads, DeviceSpan m, DeviceSpan v,
                                 const AdamConfig& config, std::int64_t step) {
  CUBOID_EXEC_REQUIRE(params.dtype() == DType::f32 && m.dtype() == DType::f32 && v.dtype() == DType::f32,
                      "adam_step", "params, m and v must be f32 (master weights)");
  const kernels::AdamHyper hp{config.lr, config.beta1, config.beta2, config.eps, config.weight_decay, step};
  dispatch_float(grads.dtype(), "adam_step", [&](auto g) {
    using G = decltype(g);
    CUBOID_CUDA_CHECK(kernels::adam_step(ptr<float>(params), ptr<G>(grads), ptr<float>(m), ptr<float>(v),
                                         static_cast<std::int64_t>(params.size()), hp, stream_.get()));
  });
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options.device);
}

}  // namespace cuboid::exec
