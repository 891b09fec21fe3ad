// fdpp devices: the CPU threads and CUDA GPUs fdpp can use.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "subcommands.h"
#include <omp.h>

#include <cstdlib>

#include "backend/cpu/quant_matmul.h"
#include "runtime/backend_select.h"
#ifdef FDPP_HAVE_CUDA
#include "backend/cuda/device_query.h"
#endif

namespace fdpp::cli {

namespace {

int run_devices() {
  fmt::print("cpu: {} threads by default ({} physical cores; OMP_NUM_THREADS or -t/--threads sets it), kernels {}\n",
             std::getenv("OMP_NUM_THREADS") != nullptr ? omp_get_max_threads() : physical_cpu_cores(),
             physical_cpu_cores(), cpu::isa_name(cpu::best_isa()));
#ifdef FDPP_HAVE_CUDA
  std::string why;
  const auto gpus = cuda::list_gpus(&why);
  if (gpus.empty()) fmt::print("cuda: {}; the CPU backend will be used\n", why);
  for (const auto& g : gpus)
    fmt::print("cuda:{} {} (sm_{}{}, {} SMs, {} memory, {} L2)\n", g.index, g.name, g.sm_major, g.sm_minor,
               g.multiprocessors, human_bytes(static_cast<double>(g.total_memory)), human_bytes(static_cast<double>(g.l2_bytes)));
#else
  fmt::print("cuda: not compiled in (built with FDPP_CUDA=OFF or without nvcc); the CPU backend will be used\n");
#endif
  return 0;
}

}  // namespace

Subcommand register_devices(CLI::App& app) {
  return {app.add_subcommand("devices", "list the CPU threads and CUDA GPUs fdpp can use"), run_devices};
}

}  // namespace fdpp::cli
