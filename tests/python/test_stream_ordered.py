"""cuemm.device_array(stream=...) and its kin: Numba arrays allocated on a stream
and given back on it (cuemm.stream_ordered), on whichever driver Numba uses."""
import os

import pytest

from test_numba_plugin import PLUGIN, REFUSED

PTX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "test_kernels.ptx")

# spin_fill(array, value, stream, spin_ns): the project's test kernel, which
# waits spin_ns on the GPU and then writes `value` into every uint32 of
# `array`, launched on `stream` through the driver Numba uses (the simulated
# one runs it too). Numba's own kernels would need NVVM, which the simulated
# setting lacks.
KERNELS = f"""
        import ctypes, os
        from numba import cuda
        cuda.current_context()  # (its context current: the module loads there)
        _driver = ctypes.CDLL(os.environ.get("NUMBA_CUDA_DRIVER") or "libcuda.so.1")
        _module = ctypes.c_void_p()
        with open({PTX!r}, "rb") as _ptx:
            assert _driver.cuModuleLoadData(ctypes.byref(_module), _ptx.read() + b"\\0") == 0
        _spin_fill = ctypes.c_void_p()
        assert _driver.cuModuleGetFunction(ctypes.byref(_spin_fill), _module, b"cuemm_spin_fill_u32") == 0

        def address(array):
            return array.__cuda_array_interface__["data"][0]

        def spin_fill(array, value, stream, spin_ns):
            assert array.dtype == "uint32"
            arguments = [ctypes.c_uint64(address(array)), ctypes.c_uint32(value), ctypes.c_uint64(array.size),
                         ctypes.c_uint64(spin_ns)]
            pointers = (ctypes.c_void_p * 4)(*[ctypes.addressof(argument) for argument in arguments])
            assert _driver.cuLaunchKernel(_spin_fill, 64, 1, 1, 256, 1, 1, 0, ctypes.c_void_p(int(stream)),
                                          pointers, None) == 0
"""


@pytest.mark.parametrize("setting", [{}, {"CUEMM_MEMORY_MANAGER": "async"},
                                     {"CUEMM_ADAPTORS": "statistics,log,tracking,limit", "CUEMM_LIMIT": "1G"}],
                         ids=["pool", "async", "pool-under-adaptors"])
def test_arrays_on_a_stream_hold_their_data_and_are_counted(run_python, setting):
    run_python("""
        import gc
        import numpy as np
        from numba import cuda
        import cuemm
        s = cuda.stream()
        host = np.arange(100_000, dtype=np.float64)
        d = cuemm.to_device(host, stream=s)
        assert d.stream is s and d.gpu_data.stream_handle == int(s), (d.stream, d.gpu_data.stream_handle)
        assert (d.copy_to_host(stream=s) == host).all()
        fortran = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
        f = cuemm.to_device(fortran, stream=s)
        assert f.strides == fortran.strides and f.shape == (3, 4), (f.strides, f.shape)
        assert (f.copy_to_host(stream=s) == fortran).all()
        like = cuemm.device_array_like(fortran, stream=s)
        assert like.strides == fortran.strides and like.dtype == np.int16
        on_default = cuemm.device_array([5, 7], dtype=np.int32)  # (stream 0: Numba's default stream)
        assert on_default.gpu_data.stream_handle == int(cuda.default_stream())
        empty = cuemm.device_array((4, 0), dtype=np.float32, stream=s)
        assert empty.size == 0 and empty.copy_to_host().shape == (4, 0)
        raw = cuemm.memalloc(1000, stream=s)
        assert raw.size == 1000
        s.synchronize()
        stats = cuemm.statistics()["device"]
        expected = host.nbytes + fortran.nbytes * 2 + 5 * 7 * 4 + 1000
        assert stats["current_count"] == 5 and stats["current_bytes"] == expected, stats
        raw.free()  # Numba's explicit free: given back on the stream, once
        try:
            raw.free()
        except RuntimeError as error:
            assert "dead memory" in str(error), error
        else:
            raise AssertionError("a second free() passed")
        del d, f, like, on_default, empty, raw
        gc.collect()
        # No Numba deferral: each block went back on its stream as its array went.
        assert cuemm.statistics()["device"]["current_bytes"] == 0, cuemm.statistics()
        if "pool" in cuemm.statistics():
            assert cuemm.statistics()["pool"]["in_use_bytes"] == 0, cuemm.statistics()["pool"]
    """, **PLUGIN, **setting)


def test_the_log_names_the_stream_of_each_allocation_and_free(run_python, tmp_path):
    log = tmp_path / "log.csv"
    out = run_python(f"""
        import gc
        from numba import cuda
        import cuemm
        s = cuda.stream()
        d = cuemm.device_array(4096, dtype="uint8", stream=s)
        del d
        gc.collect()
        print(hex(int(s)))
        cuemm.write_log({str(log)!r})
    """, CUEMM_LOG="1", **PLUGIN)
    rows = [line.split(",") for line in log.read_text().splitlines()[1:]]
    stream_rows = [row for row in rows if row[3] != "0"]
    assert [(row[0], row[4]) for row in stream_rows] == [("Alloc", "4096"), ("Free", "4096")], rows
    assert stream_rows[0][3] == stream_rows[1][3] == out.strip(), (stream_rows, out)


@pytest.mark.parametrize("stream", ["default", "own"])
def test_a_block_freed_on_a_stream_is_reused_at_once_there_after_its_work(run_python, stream):
    # Numba's default stream, or a stream the program made: the next array
    # there takes the block at once (no seal, no wait on the host), and its
    # writes run after the dropped array's kernel.
    # (A stream of the program's only where the pool's seals cover every
    # stream: where the driver records an event for a whole context,
    # cuCtxRecordEvent, from CUDA 12.5; Note [Same-stream reuse]. Asked of
    # the driver as the pool asks, not told by its version: a driver may
    # refuse the call, as CI's run of a driver before 12.5 does.)
    out = run_python(KERNELS + f"""
        import sys
        import numpy as np
        import cuemm
        def context_events_work():
            if not hasattr(_driver, "cuCtxRecordEvent"):
                return False
            context, event = ctypes.c_void_p(), ctypes.c_void_p()
            assert _driver.cuCtxGetCurrent(ctypes.byref(context)) == 0
            assert _driver.cuEventCreate(ctypes.byref(event), 2) == 0  # (CU_EVENT_DISABLE_TIMING)
            recorded = _driver.cuCtxRecordEvent(context, event)
            assert _driver.cuEventDestroy_v2(event) == 0
            return recorded == 0
        if {stream!r} == "own" and not context_events_work():
            print("skip: this driver records no event for a whole context")
            sys.exit(0)
        s = cuda.default_stream() if {stream!r} == "default" else cuda.stream()
        for count in (1 << 18, 1 << 21):  # 1 MiB (the thread's cache) and 8 MiB (a segment of its own)
            a = cuemm.device_array(count, dtype=np.uint32, stream=s)
            first = address(a)
            spin_fill(a, 7, s, 200_000_000)
            seals = cuemm.statistics()["pool"]["seals"]
            del a
            b = cuemm.device_array(count, dtype=np.uint32, stream=s)
            assert address(b) == first, "the stream's own free was not reused at once"
            assert cuemm.statistics()["pool"]["seals"] == seals, "a free on the same stream waited for a seal"
            b.copy_to_device(np.full(count, 9, dtype=np.uint32), stream=s)
            values = b.copy_to_host(stream=s)
            s.synchronize()
            assert (values == 9).all(), f"{{(values == 7).sum()}} of the kernel's writes landed after the copy"
            del b
        print("ok")
    """, **PLUGIN)
    if out.startswith("skip"):
        pytest.skip(f"a stream of the program's is reused at once only where seals cover every stream "
                    f"(cuCtxRecordEvent, CUDA 12.5); {out.strip()[len('skip: '):]}")
    assert "ok" in out


@pytest.mark.parametrize("freeing", ["stream", "default"])
@pytest.mark.parametrize("count", [1 << 18, 1 << 21], ids=["1MiB", "8MiB"])
def test_another_stream_gets_the_block_only_after_the_freeing_streams_work(run_python, count, freeing):
    # A kernel still writes the dropped array on its stream; an array
    # allocated on stream t and written there must keep what t wrote, whether
    # or not it got the same block (the pool waits for the kernel's stream
    # before it hands the block to another).
    out = run_python(KERNELS + f"""
        import numpy as np
        import cuemm
        s = cuda.stream() if {freeing!r} == "stream" else cuda.default_stream()
        t = cuda.stream()
        count = {count}
        a = cuemm.device_array(count, dtype=np.uint32, stream=s)
        first = address(a)
        spin_fill(a, 7, s, 300_000_000)
        del a
        b = cuemm.device_array(count, dtype=np.uint32, stream=t)
        b.copy_to_device(np.full(count, 9, dtype=np.uint32), stream=t)
        t.synchronize()
        s.synchronize()
        values = b.copy_to_host()
        assert (values == 9).all(), f"{{(values == 7).sum()}} of the kernel's late writes landed in t's array"
        print("same block" if address(b) == first else "another block")
    """, **PLUGIN)
    assert "block" in out


def test_numbas_per_thread_default_stream_is_the_default_where_numba_is_set_to_it(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        # (Numba's handle stays 0: its calls take the per-thread variants. cuemm's
        # driver calls do not, so its frees name the per-thread stream outright.)
        d = cuemm.to_device(np.arange(10))
        assert d.gpu_data.stream_handle == 2, d.gpu_data.stream_handle  # CU_STREAM_PER_THREAD
        assert (d.copy_to_host() == np.arange(10)).all()
    """, NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM=1, **PLUGIN)


def test_a_stream_stays_alive_until_the_free_queued_on_it(run_python):
    run_python("""
        import gc, weakref
        import numpy as np
        from numba import cuda
        import cuemm
        s = cuda.stream()
        kept = weakref.ref(s)
        d = cuemm.to_device(np.arange(1000), stream=s)
        del s
        gc.collect()
        assert kept() is not None, "the array's stream went while the array lived"
        assert (d.copy_to_host() == np.arange(1000)).all()
        del d
        gc.collect()
        assert kept() is None, "the stream outlived the array that kept it"
        assert cuemm.statistics()["device"]["current_bytes"] == 0
    """, **PLUGIN)


def test_streams_of_other_libraries_and_raw_handles(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        s = cuda.stream()

        class Foreign:  # another library's stream, by CUDA's stream protocol
            def __cuda_stream__(self):
                return (0, int(s))

        d = cuemm.to_device(np.arange(10), stream=Foreign())
        assert d.gpu_data.stream_handle == int(s)
        e = cuemm.to_device(np.arange(10), stream=int(s))
        assert e.gpu_data.stream_handle == int(s)
        assert (d.copy_to_host() == e.copy_to_host()).all()
    """, **PLUGIN)


def test_threads_allocate_and_drop_arrays_on_their_own_streams(run_python):
    run_python("""
        import threading
        import numpy as np
        from numba import cuda
        import cuemm
        cuda.current_context()
        failures = []
        handed_over = []

        def work(seed):
            try:
                rng = np.random.default_rng(seed)
                s = cuda.stream()
                for i in range(150):
                    host = rng.integers(0, 1 << 30, size=int(rng.integers(1, 300_000)), dtype=np.int64)
                    d = cuemm.to_device(host, stream=s)
                    back = d.copy_to_host(stream=s)
                    s.synchronize()
                    if not (back == host).all():
                        failures.append(f"thread {seed}: array {i} lost its contents")
                    if i % 10 == 0:
                        handed_over.append(d)  # dropped by another thread
                    elif handed_over and i % 10 == 5:
                        handed_over.pop(0)
            except Exception as error:
                failures.append(repr(error))

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        handed_over.clear()
        assert cuemm.statistics()["device"]["current_bytes"] == 0, cuemm.statistics()
    """, **PLUGIN)


def test_arrays_alive_across_a_reset_give_nothing_back_and_say_nothing(run_python):
    run_python("""
        import gc, os, tempfile
        import numpy as np
        from numba import cuda
        import cuemm
        s = cuda.stream()
        d = cuemm.to_device(np.arange(1000), stream=s)
        cuda.current_context().reset()  # gives every block back, d's too
        said = tempfile.TemporaryFile()
        stderr = os.dup(2)
        os.dup2(said.fileno(), 2)
        del d
        gc.collect()
        os.dup2(stderr, 2)
        said.seek(0)
        assert said.read() == b"", "dropping an array that a reset gave back said something"
        e = cuemm.to_device(np.arange(5), stream=cuda.stream())
        assert (e.copy_to_host() == np.arange(5)).all()
        assert cuemm.statistics()["device"]["current_count"] == 1, cuemm.statistics()
    """, **PLUGIN)


def test_without_numba_allocating_through_cuemm(run_python):
    # Numba keeps its own manager; the arrays still come from cuemm's pool.
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        assert type(cuda.current_context().memory_manager).__name__ != "CuemmNumbaManager"
        d = cuemm.to_device(np.arange(100), stream=cuda.stream())
        assert (d.copy_to_host() == np.arange(100)).all()
        assert cuemm.statistics()["device"]["current_count"] == 1
    """)


def test_bad_input_is_a_clear_error(run_python):
    run_python(REFUSED + """
        import numpy as np
        from numba import cuda
        import cuemm
        s = cuda.stream()
        refused(lambda: cuemm.device_array(10, stream="s"), TypeError, "stream must be a Numba stream")
        refused(lambda: cuemm.device_array(10, stream=-1), ValueError, "must not be negative (got -1)")
        refused(lambda: cuemm.memalloc(-5, stream=s), ValueError, "size must not be negative (got -5)")
        refused(lambda: cuemm.memalloc(0, stream=s), ValueError, "at least 1 byte (got 0)")
        refused(lambda: cuemm.memalloc(1 << 62, stream=s), MemoryError, str(1 << 62))
        assert cuemm.statistics()["device"]["current_bytes"] == 0
        d = cuemm.to_device(np.arange(3), stream=s)  # (the manager still serves)
        assert list(d.copy_to_host()) == [0, 1, 2]
    """, **PLUGIN)


def test_the_default_manager_says_it_has_no_stream_ordered_calls(run_python):
    run_python("""
        from numba import cuda
        import cuemm
        try:
            cuemm.device_array(10, stream=cuda.stream())
        except NotImplementedError as error:
            assert "'default'" in str(error) and "pool or async" in str(error), error
        else:
            raise AssertionError("the default manager allocated on a stream")
    """, CUEMM_MEMORY_MANAGER="default", **PLUGIN)


def test_a_stream_of_another_device_is_refused(run_python):
    out = run_python("""
        from numba import cuda
        import cuemm
        if len(cuda.gpus) < 2:
            print("only one device")
            raise SystemExit(0)
        with cuda.gpus[1]:
            other = cuda.stream()
        try:
            cuemm.device_array(10, stream=other)
        except ValueError as error:
            assert "belongs to device 1" in str(error) and "current device is 0" in str(error), error
        else:
            raise AssertionError("an array of device 0 was allocated on device 1's stream")
    """, CUEMM_SIM_DEVICES=2, **PLUGIN)
    if "only one device" in out:
        pytest.skip("needs two devices (this GPU machine has one)")
