// Sampling parameters, with llama.cpp's defaults. temperature <= 0 means greedy (argmax).
#pragma once

#include <cstdint>

namespace fdpp {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;           // <= 0: off
  float top_p = 0.95f;      // >= 1: off
  float min_p = 0.05f;      // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;   // how many recent tokens the penalty looks at; -1: all
  uint64_t seed = 0xf0d0ULL;
};

}  // namespace fdpp
