// What only fdpp tune needs of the dispatch tables (engine/dispatch_table.h): the profiling plan
// (which M to measure), ranges from the measured times, what a static choice would lose against
// them, merging a new table into a file, and where the table goes. CUDA-free, so that the CPU test
// binary checks the rules; tune.cpp does the measuring on the GPU.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/dispatch_table.h"

namespace fdpp {

// "1-64,128,256" -> sorted, unique M values in [1, kDispatchMaxM]; `flag` names the flag in errors.
std::vector<int> parse_m_list(const std::string& text, const std::string& flag);

// Ranges from measurements: at every measured M the chosen implementation is within `tolerance`
// (0.02 = 2%) of the fastest measured there, with as few ranges as that allows (greedy: from each
// M on, the acceptable implementation that stays acceptable longest; ties to the faster). Between
// two measured M the earlier choice continues, cut at its limit (then the next choice, or cuBLAS
// above the last measured M). Throws if some measured M has no time at all.
std::vector<DispatchRange> ranges_from_times(const ShapeTimes& t, double tolerance, const LinearLimits& limits = {});

// Adds t to f: into the table of the same (gpu, SMs, dtype) when there is one (shapes of the same
// [n, k] replaced, others kept), else as a new table.
void merge_dispatch_table(DispatchFile& f, const DispatchTable& t);

// The loss of always using the implementation `policy` gives for an M (a static choice) against the
// ranges chosen, over the measured M: the worst ratio - 1 and where, and the mean.
struct StaticChoiceLoss {
  double worst = NAN, mean = NAN;
  int at_m = 0;
  int missing = 0;  // measured M where the static choice has no time
};
StaticChoiceLoss static_choice_loss(const ShapeTimes& t, const std::vector<DispatchRange>& chosen_ranges,
                                    const std::function<LinearImpl(int)>& policy);

// Where fdpp tune writes without --out: beside the model when that is writable (an empty model path:
// none), else the cache file of this GPU.
std::string default_tune_output(const std::string& model_path, const std::string& gpu, int sm_count);

}  // namespace fdpp
