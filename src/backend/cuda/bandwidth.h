// Measures the GPU's read bandwidth with a streaming kernel (16-byte loads, one pass over a buffer
// several times larger than L2), so benchmarks can state their % of the roofline of the card as
// found, beside the 4.46 TB/s of DESIGN.md.
#pragma once

#include <cstddef>

namespace fdpp::cuda {

// Bytes per second, median of `repetitions` timed passes over `bytes` (after one warm-up pass).
double measure_read_bandwidth(size_t bytes = size_t{4} << 30, int repetitions = 20);

}  // namespace fdpp::cuda
