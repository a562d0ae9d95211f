import cProfile, pstats, time, weakref
import numpy as np
from numba import cuda
cuda.current_context()
for i in range(2000): a = cuda.device_array(256, dtype=np.uint8); del a
mm = cuda.current_context().memory_manager
b = mm._get_bridge()
def t(label, f, n=20000):
    s = time.perf_counter_ns()
    for _ in range(n): f()
    print(f"{label}: {(time.perf_counter_ns()-s)/n:.0f} ns")
t("bridge.memalloc+release", lambda: b.memalloc(256, "").release())
t("bridge.memory_info (a call that returns at once... and asks the driver)", b.memory_info, 2000)
import cuemm._core as core
t("core.driver_kind (a trivial call)", core.driver_kind)
from numba.cuda.cudadrv import driver as d
t("CUdeviceptr", lambda: d.binding.CUdeviceptr(12345678))
t("weakref.proxy", lambda: weakref.proxy(mm.context))
t("mm.memalloc", lambda: mm.memalloc(256))
t("device_array", lambda: cuda.device_array(256, dtype=np.uint8))
cProfile.run("for _ in range(5000): cuda.device_array(256, dtype=np.uint8)", "/tmp/p.out")
pstats.Stats("/tmp/p.out").sort_stats("tottime").print_stats(14)
