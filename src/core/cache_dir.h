// fdpp's cache folder, where the default model, calibration files and dispatch tables are kept:
// $FDPP_CACHE, else $XDG_CACHE_HOME/fdpp, else ~/.cache/fdpp (./.cache/fdpp without HOME).
#pragma once

#include <string>

namespace fdpp {

std::string cache_dir();

}  // namespace fdpp
