#include "backend/cuda/linear_dispatch.h"

#include <string_view>

#include <algorithm>

#include "io/gguf.h"

namespace fdpp::cuda {

static_assert(LinearLimits{}.gemv_max_m == kGemvMaxM, "dispatch_table.h's default GEMV limit must be kGemvMaxM");
static_assert(LinearLimits{}.flat_max_m == kFlatGemmMaxM,
              "dispatch_table.h's default flat GEMM limit must be kFlatGemmMaxM");

LinearLimits kernel_linear_limits() { return LinearLimits{kGemvMaxM, kFlatGemmMaxM}; }

const char* dtype_name(DType dtype) { return dtype == DType::F16 ? "f16" : "bf16"; }

GpuIdentity current_gpu() {
  GpuIdentity g;
  FDPP_CUDA_CHECK(cudaGetDevice(&g.device));
  cudaDeviceProp p{};
  FDPP_CUDA_CHECK(cudaGetDeviceProperties(&p, g.device));
  g.name = p.name;
  g.sm_count = p.multiProcessorCount;
  g.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  return g;
}

LinearDispatcher::LinearDispatcher(DType dtype, const DispatchSelectOptions& options)
    : dtype_(dtype), gpu_(current_gpu()) {
  chooser_ = LinearChooser::load(options, gpu_.name, gpu_.sm_count, dtype_name(dtype), kernel_linear_limits());
}

LinearDispatcher::LinearDispatcher(DType dtype, LinearChooser chooser)
    : dtype_(dtype), gpu_(current_gpu()), chooser_(std::move(chooser)) {}

bool LinearDispatcher::fuses(LinearImpl impl, Epilogue epilogue) {
  if (impl != LinearImpl::Cublas) return true;
  return epilogue == Epilogue::Store || epilogue == Epilogue::StoreF32;
}

namespace {
// Buffers may only grow outside graph capture (an allocation cannot be captured); the old buffer is
// freed by cudaFree, which waits for the kernels that may still use it.
void grow_outside_capture(DeviceBuffer& buffer, size_t bytes, cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  FDPP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  check(capturing == cudaStreamCaptureStatusNone,
        "linear dispatch: {} needs {} bytes ({} reserved) during CUDA-graph capture; call LinearDispatcher::reserve "
        "(or run the shape once) before capturing",
        what, bytes, buffer.bytes());
  buffer = DeviceBuffer(bytes);
}
}  // namespace

void LinearDispatcher::ensure_flat_workspace(size_t bytes, cudaStream_t stream) {
  if (bytes <= flat_ws_.bytes()) return;
  grow_outside_capture(flat_ws_, bytes, stream, "the flat GEMM's workspace");
  FDPP_CUDA_CHECK(cudaMemsetAsync(flat_ws_.get(), 0, bytes, stream));
}

void* LinearDispatcher::scratch(size_t bytes, cudaStream_t stream) {
  if (bytes > scratch_.bytes()) grow_outside_capture(scratch_, bytes, stream, "cuBLAS's unfused epilogue scratch");
  return scratch_.get();
}

void LinearDispatcher::reserve(int max_m, std::span<const LinearShape> shapes, bool cublas_epilogues,
                               cudaStream_t stream) {
  check(max_m >= 1 && max_m <= kDispatchMaxM, "linear dispatch: reserve for M = {} (not in [1, {}])", max_m,
        kDispatchMaxM);
  size_t ws = 0, sc = 0;
  for (const LinearShape& s : shapes) {
    check(s.n >= 1 && s.k >= 1, "linear dispatch: reserve for shape {} [{}, {}]", s.name, s.n, s.k);
    // Not assumed monotone in M (split-K plans change with M): every M the flat GEMM can take.
    for (int m = 1; m <= std::min(max_m, kFlatGemmMaxM); ++m)
      ws = std::max(ws, flat_gemm_workspace_bytes(m, s.n, s.k, gpu_.sm_count));
    if (cublas_epilogues) sc = std::max(sc, static_cast<size_t>(max_m) * static_cast<size_t>(s.n) * sizeof(float));
  }
  ensure_flat_workspace(ws, stream);
  if (sc > 0) scratch(sc, stream);
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

LinearImpl LinearDispatcher::fp8_choice(int M, int N, int K, Epilogue epilogue, bool bias) const {
  const bool cublas_ok = !cublas_unsupported_.count({M, N, K, static_cast<int>(epilogue) + 100, bias});
  switch (chooser_.mode()) {
    case LinearMode::Cublas:
      if (cublas_ok) return LinearImpl::Cublas;
      break;
    case LinearMode::Gemv:
      if (M <= kFp8GemvMaxM) return LinearImpl::Gemv;
      break;
    case LinearMode::Flat:
      if (M <= kFlatGemmMaxM) return LinearImpl::Flat;
      break;
    default:
      if (M <= kFp8GemvDefaultMaxM) return LinearImpl::Gemv;
      if (M <= kFp8FlatDefaultMaxM) return LinearImpl::Flat;
  }
  return cublas_ok ? LinearImpl::Cublas : LinearImpl::Flat;
}

void LinearDispatcher::reserve_fp8(int max_m, std::span<const LinearShape> shapes, cudaStream_t stream) {
  check(max_m >= 1, "linear dispatch: reserve_fp8 for M = {}", max_m);
  size_t x_bytes = 0, sc = 0;
  for (const LinearShape& s : shapes) {
    x_bytes = std::max(x_bytes, static_cast<size_t>(max_m) * static_cast<size_t>(s.k));
    // The engine's FP8 layers use Store and SwiGLU; cuBLASLt's SwiGLU writes gate and up here in 16
    // bits (AddF32's fp32 product, which only tests use, grows the scratch outside capture).
    sc = std::max(sc, static_cast<size_t>(max_m) * static_cast<size_t>(s.n) * 2);
  }
  const size_t need = (x_bytes + 15) / 16 * 16 + static_cast<size_t>(max_m) * sizeof(float);
  if (need > fp8_x_.bytes()) grow_outside_capture(fp8_x_, need, stream, "the fp8 activations' scratch");
  size_t ws = 0;  // the flat GEMM's FP8 plans (their split-K differs from the 16-bit ones)
  for (const LinearShape& s : shapes)
    for (int m = 1; m <= std::min(max_m, kFlatGemmMaxM); ++m)
      ws = std::max(ws, flat_gemm_workspace_bytes(m, s.n, s.k, gpu_.sm_count, WeightFormat::Fp8));
  ensure_flat_workspace(ws, stream);
  if (sc > 0) scratch(sc, stream);
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void LinearDispatcher::run_fp8(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y,
                               int M, int N, int K, DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(dtype == dtype_, "linear dispatch: a {} call on a dispatcher for {}", dtype_name(dtype), dtype_name(dtype_));
  check(M >= 1 && N >= 1 && K >= 1, "linear: bad shape M={} N={} K={}", M, N, K);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "linear: the SwiGLU epilogue needs an even N (gate; up), not {}",
        N);
  const LinearImpl impl = fp8_choice(M, N, K, epilogue, bias != nullptr);
  if (impl == LinearImpl::Gemv) {
    fp8_gemv(x, w8, w_scale, bias, y, M, N, K, dtype, epilogue, stream);
    return;
  }
  if (impl == LinearImpl::Flat) {  // more than kFlatGemmMaxM rows where cuBLASLt has no algorithm: in parts
    const int64_t columns = epilogue == Epilogue::SwiGLU ? N / 2 : N;
    const int64_t out_bytes = epilogue == Epilogue::StoreF32 || epilogue == Epilogue::AddF32 ? 4 : 2;
    for (int r = 0; r < M; r += kFlatGemmMaxM) {
      const int rows = std::min(kFlatGemmMaxM, M - r);
      ensure_flat_workspace(flat_gemm_workspace_bytes(rows, N, K, gpu_.sm_count, WeightFormat::Fp8), stream);
      flat_gemm_fp8(static_cast<const char*>(x) + int64_t(r) * K * 2, w8, w_scale, bias,
                    static_cast<char*>(y) + int64_t(r) * columns * out_bytes, rows, N, K, dtype, epilogue,
                    flat_ws_.get(), flat_ws_.bytes(), stream);
    }
    return;
  }
  const size_t x_bytes = (static_cast<size_t>(M) * K + 15) / 16 * 16;
  if (x_bytes + M * sizeof(float) > fp8_x_.bytes())
    grow_outside_capture(fp8_x_, x_bytes + M * sizeof(float), stream, "the fp8 activations' scratch");
  auto* x8 = static_cast<uint8_t*>(fp8_x_.get());
  auto* x_scale = reinterpret_cast<float*>(x8 + x_bytes);
  quantize_rows_fp8(x, dtype, M, K, x8, x_scale, stream);
  const size_t elems = static_cast<size_t>(M) * static_cast<size_t>(N);
  try {
    switch (epilogue) {
      case Epilogue::Store:
      case Epilogue::StoreF32:
        cublas_.run_fp8(x8, x_scale, w8, w_scale, bias, y, M, N, K, dtype, epilogue == Epilogue::StoreF32, stream);
        return;
      case Epilogue::SwiGLU: {
        void* gate_up = scratch(elems * 2, stream);
        cublas_.run_fp8(x8, x_scale, w8, w_scale, bias, gate_up, M, N, K, dtype, false, stream);
        silu_mul(gate_up, y, M, N / 2, dtype, stream);
        return;
      }
      case Epilogue::AddF32: {
        auto* acc = static_cast<float*>(scratch(elems * sizeof(float), stream));
        cublas_.run_fp8(x8, x_scale, w8, w_scale, bias, acc, M, N, K, dtype, true, stream);
        add_f32(static_cast<float*>(y), acc, static_cast<int64_t>(elems), stream);
        return;
      }
    }
  } catch (const Error& e) {
    if (std::string_view(e.what()).find("cuBLASLt has no algorithm") == std::string_view::npos) throw;
    cublas_unsupported_.insert({M, N, K, static_cast<int>(epilogue) + 100, bias != nullptr});
    run_fp8(x, w8, w_scale, bias, y, M, N, K, dtype, epilogue, stream);
  }
}

LinearImpl LinearDispatcher::int4_choice(int M) const {
  return M <= kFlatGemmMaxM && chooser_.mode() != LinearMode::Cublas ? LinearImpl::Flat : LinearImpl::Cublas;
}

void LinearDispatcher::reserve_int4(int max_m, std::span<const LinearShape> shapes, bool act_order,
                                    cudaStream_t stream) {
  check(max_m >= 1, "linear dispatch: reserve_int4 for M = {}", max_m);
  size_t ws = 0, w_bytes = 0, x_bytes = 0, sc = 0;
  for (const LinearShape& s : shapes) {
    for (int m = 1; m <= std::min(max_m, kFlatGemmMaxM); ++m)
      ws = std::max(ws, flat_gemm_workspace_bytes(m, s.n, s.k, gpu_.sm_count, WeightFormat::Int4));
    if (int4_choice(max_m) == LinearImpl::Cublas) {
      w_bytes = std::max(w_bytes, static_cast<size_t>(s.n) * static_cast<size_t>(s.k) * 2);
      sc = std::max(sc, static_cast<size_t>(max_m) * static_cast<size_t>(s.n) * 2);  // SwiGLU's gate and up
    }
    if (act_order) x_bytes = std::max(x_bytes, static_cast<size_t>(max_m) * static_cast<size_t>(s.k) * 2);
  }
  ensure_flat_workspace(ws, stream);
  if (w_bytes > w16_.bytes()) grow_outside_capture(w16_, w_bytes, stream, "the 4-bit weights' scratch");
  if (x_bytes > int4_x_.bytes()) grow_outside_capture(int4_x_, x_bytes, stream, "the act-order activations' scratch");
  if (sc > 0) scratch(sc, stream);
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void LinearDispatcher::run_int4(const void* x, const uint32_t* q4, const Int4Matrix& m, const void* bias, void* y,
                                int M, int N, int K, DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(dtype == dtype_, "linear dispatch: a {} call on a dispatcher for {}", dtype_name(dtype), dtype_name(dtype_));
  check(M >= 1 && N >= 1 && K >= 1, "linear: bad shape M={} N={} K={}", M, N, K);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "linear: the SwiGLU epilogue needs an even N (gate; up), not {}",
        N);
  if (m.perm != nullptr) {
    const size_t x_bytes = static_cast<size_t>(M) * static_cast<size_t>(K) * 2;
    if (x_bytes > int4_x_.bytes()) grow_outside_capture(int4_x_, x_bytes, stream, "the act-order activations' scratch");
    gather_columns(x, m.perm, M, K, int4_x_.get(), stream);
    x = int4_x_.get();
  }
  if (int4_choice(M) == LinearImpl::Flat) {
    ensure_flat_workspace(flat_gemm_workspace_bytes(M, N, K, gpu_.sm_count, WeightFormat::Int4), stream);
    flat_gemm_int4(x, q4, m.zs, m.group_size, m.zs_stride, bias, y, M, N, K, dtype, epilogue, flat_ws_.get(),
                   flat_ws_.bytes(), stream);
    return;
  }
  const size_t w_bytes = static_cast<size_t>(N) * static_cast<size_t>(K) * 2;
  if (w_bytes > w16_.bytes()) grow_outside_capture(w16_, w_bytes, stream, "the 4-bit weights' scratch");
  int4_dequantize(q4, m, N, K, dtype, w16_.get(), stream);
  // cuBLASLt, or the flat GEMM over the dequantized weights where it has no algorithm (run_impl).
  run_impl(LinearImpl::Cublas, x, w16_.get(), bias, y, M, N, K, dtype, epilogue, stream);
}

int LinearDispatcher::gguf_flat_min_m(uint32_t ggml_type) {
  return ggml_type == static_cast<uint32_t>(gguf::GgmlType::Q4_0) ? 6 : kGgufFlatMinM;
}

int LinearDispatcher::gguf_flat_min_m(const GgufMatrix& m) {
  int rows = kGgufFlatMinM;
  for (int i = 0; i < m.count; ++i) rows = std::max(rows, gguf_flat_min_m(m.segments[i].type));
  return rows;
}

LinearImpl LinearDispatcher::gguf_choice(int M, bool flat_types, int flat_min_m) const {
  switch (chooser_.mode()) {
    case LinearMode::Cublas: return LinearImpl::Cublas;
    case LinearMode::Gemv: return LinearImpl::Gemv;  // the block GEMV at every M, 8 rows a launch
    case LinearMode::Flat:
      if (M > kFlatGemmMaxM) return LinearImpl::Cublas;
      return flat_types ? LinearImpl::Flat : LinearImpl::Gemv;
    default:
      if (M > kFlatGemmMaxM) return LinearImpl::Cublas;
      return flat_types && M >= flat_min_m ? LinearImpl::Flat : LinearImpl::Gemv;
  }
}

LinearImpl LinearDispatcher::gguf_choice(int M, const GgufMatrix& m) const {
  bool flat_types = !m.empty();
  for (int i = 0; i < m.count; ++i) {
    WeightFormat format;
    flat_types = flat_types && flat_gemm_gguf_format(m.segments[i].type, format);
  }
  return gguf_choice(M, flat_types, gguf_flat_min_m(m));
}

void LinearDispatcher::reserve_gguf(int max_m, std::span<const LinearShape> shapes, cudaStream_t stream) {
  check(max_m >= 1, "linear dispatch: reserve_gguf for M = {}", max_m);
  size_t x_bytes = 0, w_bytes = 0, sc = 0, ws = 0;
  bool flat = false;  // a shape the flat GEMM can take
  const int flat_rows = std::min(max_m, kFlatGemmMaxM);
  for (const LinearShape& s : shapes) {
    // The block GEMV's 8-bit x up to its rows, and a SwiGLU over two segment types' scratch.
    const int gemv_rows = gguf_choice(max_m, false) == LinearImpl::Gemv ? max_m : flat_rows;
    if (gguf_choice(gemv_rows, false) == LinearImpl::Gemv) {
      x_bytes = std::max(x_bytes, gguf_act_bytes(gemv_rows, s.k));
      sc = std::max(sc, static_cast<size_t>(gemv_rows) * static_cast<size_t>(s.n) * 2);
    }
    if (gguf_choice(flat_rows, true) == LinearImpl::Flat && s.k % 256 == 0) {
      flat = true;
      sc = std::max(sc, static_cast<size_t>(flat_rows) * static_cast<size_t>(s.n) * 2);
    }
    if (gguf_choice(max_m, false) == LinearImpl::Cublas) {
      w_bytes = std::max(w_bytes, static_cast<size_t>(s.n) * static_cast<size_t>(s.k) * 2);
      sc = std::max(sc, static_cast<size_t>(max_m) * static_cast<size_t>(s.n) * 2);  // SwiGLU's gate and up
    }
  }
  // The flat GEMM's split-K workspace for any segment of these rows: its plan depends on the
  // segment's row count, which a shape does not tell, so the bound over every N.
  if (flat)
    for (const WeightFormat f : {WeightFormat::GgufQ4K, WeightFormat::GgufQ5K, WeightFormat::GgufQ6K,
                                 WeightFormat::GgufQ4_0, WeightFormat::GgufQ4_1, WeightFormat::GgufQ8_0})
      ws = std::max(ws, flat_gemm_workspace_bound(flat_rows, gpu_.sm_count, f));
  ensure_flat_workspace(ws, stream);
  if (x_bytes > gguf_x_.bytes()) grow_outside_capture(gguf_x_, x_bytes, stream, "the GGUF products' 8-bit x");
  if (w_bytes > w16_.bytes()) grow_outside_capture(w16_, w_bytes, stream, "the dequantized weights' scratch");
  if (sc > 0) scratch(sc, stream);
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void LinearDispatcher::run_gguf(const void* x, const GgufMatrix& m, const void* bias, void* y, int M, int N, int K,
                                DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(dtype == dtype_, "linear dispatch: a {} call on a dispatcher for {}", dtype_name(dtype), dtype_name(dtype_));
  check(M >= 1 && N >= 1 && K >= 1, "linear: bad shape M={} N={} K={}", M, N, K);
  check(!m.empty() && m.rows() == N, "linear: a GGUF matrix of {} rows for N = {}", m.rows(), N);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "linear: the SwiGLU epilogue needs an even N (gate; up), not {}",
        N);
  const size_t elem = 2;  // bytes of a 16-bit value of x, y and bias
  const LinearImpl impl = gguf_choice(M, m);
  if (impl == LinearImpl::Cublas) {
    const size_t w_bytes = static_cast<size_t>(N) * static_cast<size_t>(K) * elem;
    if (w_bytes > w16_.bytes()) grow_outside_capture(w16_, w_bytes, stream, "the dequantized weights' scratch");
    size_t row = 0;
    for (int i = 0; i < m.count; ++i) {
      gguf_dequantize(m.segments[i], K, dtype, w16_.as<uint8_t>() + row * K * elem, stream);
      row += static_cast<size_t>(m.segments[i].rows);
    }
    run_impl(LinearImpl::Cublas, x, w16_.get(), bias, y, M, N, K, dtype, epilogue, stream);
    return;
  }
  // SwiGLU over two segments (gate and up of different types): each into the scratch, then silu_mul.
  const bool split_swiglu = epilogue == Epilogue::SwiGLU && m.count > 1;
  void* out = split_swiglu ? scratch(static_cast<size_t>(M) * static_cast<size_t>(N) * elem, stream) : y;
  const Epilogue ep = split_swiglu ? Epilogue::Store : epilogue;
  auto segment_bias = [&](int col) {
    return bias == nullptr ? nullptr : static_cast<const uint8_t*>(bias) + static_cast<size_t>(col) * elem;
  };
  if (impl == LinearImpl::Flat) {  // 16-bit x straight into the flat GEMM over each segment's blocks
    int col = 0;
    for (int i = 0; i < m.count; ++i) {
      const GgufSegment& seg = m.segments[i];
      WeightFormat format;
      flat_gemm_gguf_format(seg.type, format);
      ensure_flat_workspace(flat_gemm_workspace_bytes(M, seg.rows, K, gpu_.sm_count, format), stream);
      flat_gemm_gguf(x, seg.type, seg.blocks, segment_bias(col), out, M, seg.rows, K, N, col, dtype, ep,
                     flat_ws_.get(), flat_ws_.bytes(), stream);
      col += seg.rows;
    }
  } else {
    const size_t x_bytes = gguf_act_bytes(M, K);
    if (x_bytes > gguf_x_.bytes()) grow_outside_capture(gguf_x_, x_bytes, stream, "the GGUF products' 8-bit x");
    gguf_quantize_x(x, M, K, dtype, m.has_legacy(), m.has_k_quants(), gguf_x_.get(), stream);
    for (int r0 = 0; r0 < M; r0 += kGgufGemvMaxRows) {
      const int rows = std::min(kGgufGemvMaxRows, M - r0);
      int col = 0;
      for (int i = 0; i < m.count; ++i) {
        gguf_gemv(m.segments[i], gguf_x_.get(), M, r0, rows, K, segment_bias(col), out, N, col, dtype, ep, stream);
        col += m.segments[i].rows;
      }
    }
  }
  if (split_swiglu) silu_mul(out, y, M, N / 2, dtype, stream);
}

void LinearDispatcher::run(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
                           Epilogue epilogue, cudaStream_t stream) {
  run_impl(chooser_.choose(M, N, K), x, w, bias, y, M, N, K, dtype, epilogue, stream);
}

void LinearDispatcher::run_impl(LinearImpl impl, const void* x, const void* w, const void* bias, void* y, int M, int N,
                                int K, DType dtype, Epilogue epilogue, cudaStream_t stream) {
  check(dtype == dtype_, "linear dispatch: a {} call on a dispatcher for {}", dtype_name(dtype), dtype_name(dtype_));
  check(M >= 1 && N >= 1 && K >= 1, "linear: bad shape M={} N={} K={}", M, N, K);
  check(M <= chooser_.limits().max_m(impl), "linear: {} takes M <= {}, not {}", linear_impl_name(impl),
        chooser_.limits().max_m(impl), M);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "linear: the SwiGLU epilogue needs an even N (gate; up), not {}",
        N);
  switch (impl) {
    case LinearImpl::Gemv:
      gemv_ex(x, w, bias, y, M, N, K, dtype, epilogue, stream);
      return;
    case LinearImpl::Flat: {
      ensure_flat_workspace(flat_gemm_workspace_bytes(M, N, K, gpu_.sm_count), stream);
      flat_gemm(x, w, bias, y, M, N, K, dtype, epilogue, flat_ws_.get(), flat_ws_.bytes(), stream);
      return;
    }
    case LinearImpl::Cublas:
      // cuBLASLt has no algorithm for some shapes whose N is not a multiple of 8 (seen on the
      // H200: N = 1001, K = 4096, fp16, at M = 1 and M = 100): the flat GEMM computes those, 64
      // rows at a time.
      if (cublas_unsupported_.count({M, N, K, static_cast<int>(epilogue), bias != nullptr})) {
        run_flat_rows(x, w, bias, y, M, N, K, dtype, epilogue, stream);
        return;
      }
      try {
        run_cublas(x, w, bias, y, M, N, K, dtype, epilogue, stream);
      } catch (const Error& e) {
        if (std::string_view(e.what()).find("cuBLASLt has no algorithm") == std::string_view::npos) throw;
        cublas_unsupported_.insert({M, N, K, static_cast<int>(epilogue), bias != nullptr});
        run_flat_rows(x, w, bias, y, M, N, K, dtype, epilogue, stream);
      }
      return;
  }
}

void LinearDispatcher::run_flat_rows(const void* x, const void* w, const void* bias, void* y, int M, int N, int K,
                                     DType dtype, Epilogue epilogue, cudaStream_t stream) {
  // Row r of y starts at r * (columns) elements of (bytes each).
  const int64_t columns = epilogue == Epilogue::SwiGLU ? N / 2 : N;
  const int64_t bytes = epilogue == Epilogue::StoreF32 || epilogue == Epilogue::AddF32 ? 4 : 2;
  for (int r = 0; r < M; r += kFlatGemmMaxM) {
    const int rows = std::min(kFlatGemmMaxM, M - r);
    run_impl(LinearImpl::Flat, static_cast<const char*>(x) + int64_t(r) * K * 2, w, bias,
             static_cast<char*>(y) + int64_t(r) * columns * bytes, rows, N, K, dtype, epilogue, stream);
  }
}

void LinearDispatcher::run_cublas(const void* x, const void* w, const void* bias, void* y, int M, int N, int K,
                                  DType dtype, Epilogue epilogue, cudaStream_t stream) {
  const size_t elems = static_cast<size_t>(M) * static_cast<size_t>(N);
  switch (epilogue) {
    case Epilogue::Store:
      cublas_.run(x, w, bias, y, M, N, K, dtype, false, stream);
      return;
    case Epilogue::StoreF32:
      cublas_.run(x, w, bias, y, M, N, K, dtype, true, stream);
      return;
    case Epilogue::SwiGLU: {
      void* gate_up = scratch(elems * 2, stream);
      cublas_.run(x, w, bias, gate_up, M, N, K, dtype, false, stream);
      silu_mul(gate_up, y, M, N / 2, dtype, stream);
      return;
    }
    case Epilogue::AddF32: {
      auto* acc = static_cast<float*>(scratch(elems * sizeof(float), stream));
      cublas_.run(x, w, bias, acc, M, N, K, dtype, true, stream);
      add_f32(static_cast<float*>(y), acc, static_cast<int64_t>(elems), stream);
      return;
    }
  }
}

}  // namespace fdpp::cuda
