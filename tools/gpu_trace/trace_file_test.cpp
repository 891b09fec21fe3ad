// fdpp_gpu_trace_write_test FILE: a synthetic trace through the writer of libfdpp_gpu_trace.so
// (trace_file.h), which tests/gpu_trace_test.py reads back with bench/gpu_busy.py: the two sides
// of the format checked where no GPU runs. The test holds the expected numbers of this content.
#include <cstdio>

#include "trace_file.h"

int main(int argc, char** argv) {
  using namespace fdpp::gpu_trace;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fdpp_gpu_trace_write_test FILE\n");
    return 2;
  }
  TraceWriter w;
  if (!w.open(argv[1])) {
    std::perror(argv[1]);
    return 1;
  }
  constexpr auto K = static_cast<uint8_t>(Kind::Kernel);
  constexpr auto C = static_cast<uint8_t>(Kind::Memcpy);
  constexpr auto S = static_cast<uint8_t>(Kind::Memset);
  w.clock(1'000'000'000, 1'700'000'000'000'000'000);
  const uint32_t attention = w.name_id("void fdpp::cuda::decode_attention_kernel<128>(fdpp::cuda::DecodeArgs)");
  const uint32_t gemv = w.name_id("gemv_kernel");
  w.add({1'000'000, 3'000'000, 7, 0, 0, 0, C, 1});            // loading: before the first attention kernel
  w.add({10'000'000, 10'100'000, 13, attention, 0, 0, K, 0});
  w.add({10'100'005, 10'200'000, 13, gemv, 4, 0, K, 0});      // 5 ns after: a gap under 10 us
  w.add({10'150'000, 10'250'000, 14, 0, 0, 0, S, 0});         // overlaps: the union runs to 10.25 ms
  w.add({10'300'000, 10'400'000, 13, attention, 4, 0, K, 0});  // 50 us gap
  w.add({12'400'000, 12'500'000, 13, gemv, 4, 0, K, 0});      // 2 ms gap
  w.add({5'000'000, 5'000'000, 13, gemv, 0, 0, K, 0});        // end == start: not counted
  w.flush_records();
  w.add({12'500'000, 12'600'000, 13, 0, 0, 0, C, 2});         // touches the one before: no gap
  w.add({20'000'000, 20'100'000, 13, gemv, 0, 1, K, 0});      // another device
  w.stats(3, 2);
  w.clock(2'000'000'000, 1'700'000'001'000'000'100);
  return w.close() ? 0 : 1;
}
