#include "backend/cuda/linear.h"

namespace fdpp::cuda {

namespace {
cudaDataType_t cuda_type(DType d) { return d == DType::F16 ? CUDA_R_16F : CUDA_R_16BF; }
}  // namespace

CublasLtLinear::CublasLtLinear(size_t workspace_bytes) : workspace_(workspace_bytes) {
  FDPP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

CublasLtLinear::~CublasLtLinear() {
  for (auto& [key, p] : plans_) {
    cublasLtMatmulDescDestroy(p.op);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
  }
  cublasLtDestroy(handle_);
}

CublasLtLinear::Plan& CublasLtLinear::plan(int M, int N, int K, DType dtype, bool bias, bool fp32_out) {
  const Key key{M, N, K, static_cast<int>(dtype), bias, fp32_out};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  // Row-major y[M,N] = x[M,K] w[N,K]^T is column-major y^T[N,M] = w[N,K] (stored K x N, so op T)
  // times x^T[K,M] (stored K x M, op N).
  Plan p;
  FDPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  FDPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  FDPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    FDPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const cudaDataType_t bias_type = cuda_type(dtype);
    FDPP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  const cudaDataType_t t = cuda_type(dtype);
  FDPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, t, K, N, K));
  FDPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, t, K, M, K));
  FDPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, fp32_out ? CUDA_R_32F : t, N, M, N));

  cublasLtMatmulPreference_t pref = nullptr;
  FDPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.bytes();
  FDPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no algorithm for [{}, {}] x [{}, {}]^T", M, K, N, K);
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void CublasLtLinear::run(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
                         bool fp32_out, cudaStream_t stream) {
  check(M > 0 && N > 0 && K > 0, "linear: bad shape M={} N={} K={}", M, N, K);
  Plan& p = plan(M, N, K, dtype, bias != nullptr, fp32_out);
  if (bias != nullptr)
    FDPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.f, beta = 0.f;
  FDPP_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                   workspace_.get(), workspace_.bytes(), stream));
}

}  // namespace fdpp::cuda
