#include "cuemm/version.hpp"

namespace cuemm {

const char* version() { return CUEMM_VERSION_STRING; }  // (set by CMakeLists.txt)

}  // namespace cuemm
