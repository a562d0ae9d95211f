set -u
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUEMM_BUILD_TESTS=OFF -DCUEMM_BUILD_EXAMPLES=OFF -DCUEMM_BUILD_BENCHMARKS=OFF -DCUEMM_BUILD_PYTHON=OFF >/dev/null && cmake --build /tmp/b --target cuemm_tool >/dev/null || exit 1
t=/tmp/b/bin/cuemm
export CUEMM_DRIVER=cuda CUEMM_POOL_THREAD_CACHE_SIZE=0
for r in 1 2; do
  for sp in 0 30 200; do
    echo "== spin $sp round $r"; XSPIN=$sp $t bench --managers pool --threads 1,16 --sizes 256,1M,64M --repeats 2 | grep -A2 "thread(s)\|over 1" | grep "^pool"
  done
done
for r in 1 2; do for sp in 0 200; do for a in tracking limit; do echo "== spin $sp adaptor $a (caches on) round $r"; XSPIN=$sp CUEMM_LIMIT=1T CUEMM_ADAPTORS=$a CUEMM_POOL_THREAD_CACHE_SIZE=256M $t bench --managers pool --threads 1,16 --sizes 256,1M --repeats 2 2>&1 | grep -A2 "thread(s)\|over 1" | grep "^pool"; done; done; done
