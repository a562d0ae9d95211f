// cuemm/version.hpp: which cuemm a program runs with (for bug reports, and
// for a plugin built against one version and loaded beside another).
#pragma once

namespace cuemm {

// "MAJOR.MINOR.PATCH" of the library loaded: CMake's project version, the
// Python package's too.
const char* version();

}  // namespace cuemm
