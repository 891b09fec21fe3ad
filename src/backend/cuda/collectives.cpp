#include "backend/cuda/collectives.h"

#include <dlfcn.h>

#include <mutex>

#include "backend/cuda/check.h"
#include "fdpp/error.h"

#ifdef FDPP_HAVE_NCCL_H
#include <nccl.h>
#endif

namespace fdpp::cuda {

#ifdef FDPP_HAVE_NCCL_H
namespace {

// The NCCL entry points fdpp uses, resolved from libnccl.so.2 at first use.
struct Nccl {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclCommInitAll) comm_init_all = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  std::string error;  // why it could not be loaded
};

const Nccl& nccl() {
  static const Nccl n = [] {
    Nccl r;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      r.error = fmt::format("NCCL (libnccl.so.2) could not be loaded: {}; install NCCL or add its lib folder to "
                            "LD_LIBRARY_PATH",
                            dlerror());
      return r;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && r.error.empty()) r.error = fmt::format("libnccl.so.2 has no {}", name);
    };
    sym(r.get_version, "ncclGetVersion");
    sym(r.comm_init_all, "ncclCommInitAll");
    sym(r.comm_destroy, "ncclCommDestroy");
    sym(r.all_reduce, "ncclAllReduce");
    sym(r.all_gather, "ncclAllGather");
    sym(r.error_string, "ncclGetErrorString");
    return r;
  }();
  check(n.error.empty(), "--tensor-parallel: {}", n.error);
  return n;
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL error in {}: {}", what, nccl().error_string(r));
}

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }

}  // namespace

std::string CommGroup::nccl_version() {
  try {
    int v = 0;
    nccl_check(nccl().get_version(&v), "ncclGetVersion");
    return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  } catch (const Error& e) {
    return e.what();
  }
}

CommGroup::CommGroup(const std::vector<int>& devices) : devices_(devices) {
  check(!devices.empty(), "tensor parallelism: no devices");
  int count = 0;
  FDPP_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : devices)
    check(d >= 0 && d < count, "--tensor-parallel {}: this machine has {} GPU{}", devices.size(), count,
          count == 1 ? "" : "s");
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  nccl_check(nccl().comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  for (ncclComm_t c : comms) comms_.push_back(c);
}

CommGroup::~CommGroup() {
  for (void* c : comms_)
    if (c != nullptr) nccl().comm_destroy(as_comm(c));
}

void all_reduce_sum(void* buf, size_t count, DType dtype, void* comm, cudaStream_t stream) {
  nccl_check(nccl().all_reduce(buf, buf, count, dtype == DType::F16 ? ncclFloat16 : ncclBfloat16, ncclSum,
                               as_comm(comm), stream),
             "ncclAllReduce");
}

void all_gather_f32(const float* in, float* out, size_t count, void* comm, cudaStream_t stream) {
  nccl_check(nccl().all_gather(in, out, count, ncclFloat32, as_comm(comm), stream), "ncclAllGather");
}

#else  // built without nccl.h: one GPU only

namespace {
[[noreturn]] void no_nccl() { fail("--tensor-parallel: fdpp was built without NCCL's header (nccl.h); one GPU only"); }
}  // namespace
std::string CommGroup::nccl_version() { return "not built with NCCL"; }
CommGroup::CommGroup(const std::vector<int>&) { no_nccl(); }
CommGroup::~CommGroup() = default;
void all_reduce_sum(void*, size_t, DType, void*, cudaStream_t) { no_nccl(); }
void all_gather_f32(const float*, float*, size_t, void*, cudaStream_t) { no_nccl(); }

#endif

}  // namespace fdpp::cuda
