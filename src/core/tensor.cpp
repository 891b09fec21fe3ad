#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace fdpp {

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace fdpp
