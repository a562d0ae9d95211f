"""Host memory running out inside cuemm's C++ code, under Numba: each C++
allocation that a Python call makes fails in turn (tests/support/
preloaded_host_faults.cpp, LD_PRELOAD'ed), and the call either works or
raises MemoryError; the manager's counts stay right, nothing leaks, and the
next call works."""
import importlib.util
import os

import pytest

from test_numba_plugin import PLUGIN


def preloaded_faults_library():
    """The fault library beside the simulated driver in the build's lib folder, or None."""
    spec = importlib.util.find_spec("cuemm")
    if spec is None or not spec.submodule_search_locations:
        return None
    build = os.path.dirname(os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0])))
    path = os.path.join(build, "lib", "libcuemm_preloaded_host_faults.so")
    return path if os.path.exists(path) else None


LIBRARY = preloaded_faults_library()
pytestmark = [
    pytest.mark.skipif(LIBRARY is None, reason="needs the build's libcuemm_preloaded_host_faults.so (a build with "
                                               "the tests, PYTHONPATH at its python folder)"),
    # (The GPU machine's build carries a C++ runtime of its own, as the C++
    # suite's host_allocation_faults_reach_the_library() finds there: no
    # preloaded operator new reaches it.)
    pytest.mark.skipif(os.environ.get("CUEMM_DRIVER") != "sim",
                       reason="runs on the simulated driver (CUEMM_DRIVER=sim), whose builds share the system's C++ "
                              "runtime, which the preloaded operator new stands in for"),
]

# The pool alone, and under all four adaptors.
SETTINGS = [{}, {"CUEMM_ADAPTORS": "statistics,log,tracking,limit", "CUEMM_LIMIT": "1G", "CUEMM_LOG_FILE": "/dev/null"}]

# fault_each(call, check, threaded): for n = 1, 2, ... until a run reaches no
# nth allocation, first gives back what the manager keeps (so that the call
# grows the pool again), then runs call() with its nth C++ allocation failing
# (on a new thread of its own where `threaded`: the thread's cache is made
# then too), then check() with call()'s result where it worked (MemoryError
# is the only error allowed); then nothing may be left in use, and the same
# call, with no fault, must work. Returns how many allocations it failed.
HARNESS = """
        import ctypes, gc, threading
        import numpy as np
        import cuemm
        from numba import cuda
        faults = ctypes.CDLL(None)
        arm, fired = faults.cuemm_host_faults_arm, faults.cuemm_host_faults_fired
        arm.argtypes = [ctypes.c_uint64]

        def in_use():
            gc.collect()
            cuda.current_context().deallocations.clear()
            return cuemm.statistics()["pool"]["in_use_bytes"]

        def fault_each(call, check, threaded=False):
            base = in_use()
            n = 0
            while True:
                n += 1
                cuemm.release_unused_memory()
                outcome = {}

                def attempt():
                    arm(n)
                    try:
                        outcome["result"] = call()
                    except MemoryError as error:
                        outcome["error"] = error
                    finally:
                        outcome["hit"] = fired()
                        arm(0)

                if threaded:
                    thread = threading.Thread(target=attempt)
                    thread.start()
                    thread.join()
                else:
                    attempt()
                hit = outcome["hit"]
                assert "error" not in outcome or hit, f"MemoryError without the injected fault: {outcome['error']}"
                if "result" in outcome:
                    check(outcome.pop("result"))
                outcome.clear()
                assert in_use() == base, f"fault {n}: bytes left in use"
                check(call())
                assert in_use() == base, f"after fault {n}: bytes left in use"
                if not hit:
                    return n - 1
"""


@pytest.mark.parametrize("setting", SETTINGS, ids=["pool", "pool-under-adaptors"])
def test_numbas_arrays_through_the_plugin(run_python, setting):
    out = run_python(HARNESS + """
        data = np.arange(4096, dtype=np.uint32)
        large = np.arange(1 << 21, dtype=np.uint32)  # 8 MiB: a segment of its own

        def same(expected):
            def check(array):
                assert (array.copy_to_host() == expected).all(), "an array made beside a fault lost its contents"
            return check

        faulted = 0
        for threaded in (False, True):
            faulted += fault_each(lambda: cuda.to_device(data), same(data), threaded)
            faulted += fault_each(lambda: cuda.to_device(large), same(large), threaded)
        print("faulted", faulted)
    """, LD_PRELOAD=LIBRARY, **PLUGIN, **setting)
    faulted = int(out.split("faulted")[1])
    assert faulted > 0, "no C++ allocation was failed: the library did not stand in for the runtime's"


@pytest.mark.parametrize("setting", SETTINGS, ids=["pool", "pool-under-adaptors"])
def test_arrays_on_a_stream(run_python, setting):
    out = run_python(HARNESS + """
        s = cuda.stream()

        def make(count):
            def call():
                array = cuemm.device_array(count, dtype=np.uint32, stream=s)
                array.copy_to_device(np.full(count, 5, dtype=np.uint32), stream=s)
                return array
            return call

        def check(array):
            values = array.copy_to_host(stream=s)
            s.synchronize()
            assert (values == 5).all(), "an array made beside a fault lost its contents"

        faulted = 0
        for threaded in (False, True):
            for count in (1 << 16, 1 << 21):
                faulted += fault_each(make(count), check, threaded)
        print("faulted", faulted)
    """, LD_PRELOAD=LIBRARY, **PLUGIN, **setting)
    assert int(out.split("faulted")[1]) > 0, "no C++ allocation was failed: the library did not stand in for the runtime's"
