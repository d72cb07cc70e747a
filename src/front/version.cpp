// The library's version at run time, for C++ (reservoir/version.hpp) and C
// (reservoir_version() in reservoir/reservoir.h). The numbers come from CMake's
// project(VERSION) through the generated header.
#include "reservoir/version.hpp"

#include "reservoir/reservoir.h"

namespace reservoir {

const char* version() noexcept {
  return kVersionString;
}

Version version_numbers() noexcept {
  return Version{kVersionMajor, kVersionMinor, kVersionPatch};
}

}  // namespace reservoir

extern "C" const char* reservoir_version(void) {
  return reservoir::kVersionString;
}
