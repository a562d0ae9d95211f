// Uses an installed cuemm: headers, library and the simulated driver beside it.
#include <cstdio>
#include <vector>

#include <cuemm/cuemm.hpp>

int main() {
  std::vector<int> values{1, 2, 3, 4, 5};
  auto array = cuemm::to_device(values);
  const bool same = array.copy_to_host() == values;
  std::printf("installed cuemm (%s): round trip %s\n", cuemm::driver::Driver::get().library_path().c_str(),
              same ? "ok" : "FAILED");
  return same ? 0 : 1;
}
