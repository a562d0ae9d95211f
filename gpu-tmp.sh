set -u
L=$OUT; export OUT=/tmp/gl
CUEMM_GPU_TESTS_ONLY=1 CUEMM_GPU_SKIP_PYTHON=1 CUEMM_GPU_SKIP_FRAGMENTATION=1 CUEMM_COMMIT=49cf0b3 BUILD_DIR=/tmp/cuemm-gpu-build timeout 420 bash scripts/gpu-check.sh > /tmp/gl-stdout.txt 2>&1; echo "gpu-check rc $?"
tail -n 8 /tmp/gl-stdout.txt; cp /tmp/gl/ctest.log $L/ 2>/dev/null
t=/tmp/cuemm-gpu-build/bin/cuemm
export CUEMM_DRIVER=cuda CUEMM_LIMIT=1T
for r in 1 2; do for a in none limit tracking statistics; do
  echo "== adaptor $a round $r"; CUEMM_ADAPTORS=$([ $a = none ] || echo $a) $t bench --managers pool --threads 1,16 --sizes 256,1M,64M --repeats 2 2>&1 | grep -A2 "thread(s)\|over 1" | grep "^pool"
done; done
