"""The cuemm package and its Numba plugin, on whichever driver Numba uses
(the simulated one here through NUMBA_CUDA_DRIVER, libcuda on a GPU)."""
import subprocess
import textwrap
import sys

import pytest

PLUGIN = {"NUMBA_CUDA_MEMORY_MANAGER": "cuemm"}
# For scenarios that compare pointers: a ctypes or cuda.bindings pointer as a number.
# For scenarios that check an error: `call()` must raise `error` with `words` in its message.
REFUSED = """
        def refused(call, error, words):
            try:
                call()
            except error as caught:
                assert words in str(caught), caught
            else:
                raise AssertionError(f"no {error.__name__} ({words})")
"""
PLAIN_POINTERS = """
        def plain(value):
            if hasattr(value, "value"):
                return value.value
            return int(value) if type(value).__name__ == "CUdeviceptr" else value
"""


def test_import_needs_no_numba(run_python):
    out = run_python("""
        import sys, cuemm
        assert "numba" not in sys.modules
        print(sorted(cuemm.bundled_managers()))
        cuemm._numba_memory_manager   # made on first use, importing Numba then
        assert "numba" in sys.modules
    """)
    assert "pool" in out and "async" in out


def test_the_version_is_the_projects(run_python):
    # One version for the library, the package and the pip build.
    import pathlib, re
    root = pathlib.Path(__file__).resolve().parents[2]
    cmake = re.search(r"project\(cuemm VERSION ([0-9.]+)", (root / "CMakeLists.txt").read_text()).group(1)
    package = re.search(r'(?m)^version = "([0-9.]+)"', (root / "pyproject.toml").read_text()).group(1)
    out = run_python("import cuemm; print(cuemm.__version__)")
    assert out.strip() == cmake == package, (out, cmake, package)


def test_every_public_name_is_exported(run_python):
    # `from cuemm import *` gives each function and class the package defines
    # without a leading underscore, and nothing it does not have.
    out = run_python("""
        import inspect, cuemm
        public = sorted(name for name, value in vars(cuemm).items()
                        if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value)))
        print(sorted(set(public) ^ set(cuemm.__all__)))
        namespace = {}
        exec("from cuemm import *", namespace)
        print(sorted(set(cuemm.__all__) - set(namespace)))
    """)
    assert out.split("\n")[:2] == ["[]", "[]"], out


def test_the_expandable_pool_assembles_blocks_for_numba(run_python):
    # Eight arrays of 1 MiB over four pages, the second and the fifth freed:
    # an array of 1.5 MiB is made of those two holes, not of a new page.
    run_python("""
        import gc
        import numpy as np
        import cuemm
        cuemm.use_cuemm_for_numba("pool", expandable=True, assemble_blocks=True, thread_cache_size=0,
                                  dedicated_size="64M")
        from numba import cuda
        mib = 1 << 20
        arrays = [cuda.to_device(np.full(mib // 4, i, dtype=np.float32)) for i in range(8)]
        del arrays[4], arrays[1]
        gc.collect()
        cuda.current_context().deallocations.clear()
        before = cuemm.statistics()["pool"]
        made = cuda.to_device(np.arange(3 * mib // 8, dtype=np.float32))
        after = cuemm.statistics()["pool"]
        assert after["blocks_assembled"] == before["blocks_assembled"] + 1, after
        assert after["reserved_bytes"] == before["reserved_bytes"], (before, after)
        assert (made.copy_to_host() == np.arange(3 * mib // 8, dtype=np.float32)).all()
        for kept, value in zip(arrays, (0, 2, 3, 5, 6, 7)):
            assert (kept.copy_to_host() == value).all(), value
    """)


def test_bad_choices_are_clear_errors(run_python):
    run_python(REFUSED + """
        import cuemm
        refused(lambda: cuemm.use_cuemm_for_numba("sparkly"), ValueError, "sparkly")
        refused(lambda: cuemm.use_cuemm_for_numba("pool", colour="red"), TypeError, "colour")
    """)


def test_every_option_of_a_bundled_manager_can_be_chosen_from_python(run_python):
    # The options come from the library's table of settings, so none is missing here.
    run_python(REFUSED + """
        import os
        import cuemm
        names = {name for name, _meaning, _managers in cuemm._core.settings()}
        options = cuemm.manager_options()
        assert sorted(options) == sorted(cuemm.bundled_managers()), options
        pool_settings = ({name for name in names if name.startswith("CUEMM_POOL_")} |
                         {"CUEMM_PINNED_HOST_POOL", "CUEMM_PINNED_MAXIMUM_CACHED"})
        assert set(options["pool"].values()) == pool_settings, options["pool"]
        assert options["pool"]["initial_size"] == "CUEMM_POOL_INITIAL_SIZE"
        assert options["async"] == {"release_threshold": "CUEMM_ASYNC_RELEASE_THRESHOLD",
                                    "exportable": "CUEMM_ASYNC_EXPORTABLE",
                                    "pinned_host_pool": "CUEMM_PINNED_HOST_POOL",
                                    "pinned_maximum_cached": "CUEMM_PINNED_MAXIMUM_CACHED"}, options["async"]
        assert options["default"] == {}, options["default"]
        cuemm.use_cuemm_for_numba("async", pinned_host_pool=False, release_threshold="1G")
        assert os.environ["CUEMM_PINNED_HOST_POOL"] == "0" and os.environ["CUEMM_ASYNC_RELEASE_THRESHOLD"] == "1G"
        refused(lambda: cuemm.use_cuemm_for_numba("default", initial_size="1G"), TypeError, "initial_size")
    """)


def test_a_bad_value_is_refused_at_the_choice_and_changes_nothing(run_python):
    # Not at Numba's first allocation, deep in its stack: at use_cuemm_for_numba().
    run_python(REFUSED + """
        import os
        import cuemm
        before = dict(os.environ)
        refused(lambda: cuemm.use_cuemm_for_numba("pool", initial_size="lots"), ValueError,
                "CUEMM_POOL_INITIAL_SIZE must be a byte count")
        refused(lambda: cuemm.use_cuemm_for_numba("pool", assemble_blocks=True), ValueError, "expandable")
        refused(lambda: cuemm.use_cuemm_for_numba("async", adaptors="log,statistics,log"), ValueError,
                "the adaptor 'log' is named twice")
        refused(lambda: cuemm.use_cuemm_for_numba("default", adaptors="limit"), ValueError, "CUEMM_LIMIT")
        assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
        cuemm.use_cuemm_for_numba("pool", initial_size="4M", adaptors="limit", limit="1G")
        from numba import cuda
        cuda.device_array(1000)
        assert cuemm.statistics()["pool"]["reserved_bytes"] >= 4 << 20
    """)


def test_another_managers_setting_is_warned_of_at_the_choice(run_python):
    # A pool's size set in the shell, and then the default manager chosen: said, not ignored.
    run_python("""
        import warnings
        import cuemm
        def cuemms_warnings(manager):  # (importing Numba may warn of other things)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cuemm.use_cuemm_for_numba(manager)
            return [str(w.message) for w in caught if "does not read" in str(w.message)]
        assert cuemms_warnings("default") == [
            "CUEMM_POOL_INITIAL_SIZE set, but the default manager does not read it"]
        assert cuemms_warnings("pool") == []  # its own option
    """, CUEMM_POOL_INITIAL_SIZE="8M")


def test_a_misspelt_setting_is_named_once_when_numba_first_allocates(run_python):
    # The variable would otherwise be ignored without a word.
    out = run_python("""
        import os, tempfile
        import numpy as np
        from numba import cuda
        with tempfile.TemporaryFile() as captured:
            kept = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                arrays = [cuda.to_device(np.ones(1000)) for _ in range(3)]
            finally:
                os.dup2(kept, 2)
            captured.seek(0)
            print(captured.read().decode())
    """, CUEMM_POOL_INITAL_SIZE="64M", **PLUGIN)
    warning = "CUEMM_POOL_INITAL_SIZE is not a setting cuemm reads (did you mean CUEMM_POOL_INITIAL_SIZE?)"
    assert out.count(warning) == 1, out


def test_choosing_cuemm_after_numba_made_a_context_is_an_error(run_python):
    # A context keeps its manager: a choice that could not reach it says so,
    # changes nothing, and works again once the context is closed.
    run_python(REFUSED + """
        import os
        import numpy as np
        from numba import cuda
        import cuemm

        first = cuda.to_device(np.ones(4))
        refused(lambda: cuemm.use_cuemm_for_numba("pool"), RuntimeError, "device 0 has one already")
        assert "CUEMM_MEMORY_MANAGER" not in os.environ
        del first
        cuda.close()
        cuemm.use_cuemm_for_numba("pool", thread_cache_size="64M")
        second = cuda.to_device(np.arange(4.0))
        assert type(cuda.current_context().memory_manager).__name__ == "CuemmNumbaManager"
        cuemm.use_cuemm_for_numba("pool", thread_cache_size="64M")  # the same choice again: nothing to refuse
        refused(lambda: cuemm.use_cuemm_for_numba("async"), RuntimeError, "CUEMM_MEMORY_MANAGER would not reach it")
        refused(lambda: cuemm.use_cuemm_for_numba("pool", thread_cache_size="0"), RuntimeError,
                "CUEMM_POOL_THREAD_CACHE_SIZE would not reach it")
        assert os.environ["CUEMM_POOL_THREAD_CACHE_SIZE"] == "64M"
        assert (second.copy_to_host() == np.arange(4.0)).all()
    """)


def test_device_arrays_round_trip_and_are_counted(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        assert type(cuda.current_context().memory_manager).__name__ == "CuemmNumbaManager"
        arrays = [np.arange(n, dtype=np.float64) for n in (1, 100, 10_000, 1_000_000)]
        device = [cuda.to_device(a) for a in arrays]
        for a, d in zip(arrays, device):
            assert (d.copy_to_host() == a).all()
        stats = cuemm.statistics()
        assert stats["device"]["current_count"] == 4, stats
        assert stats["device"]["current_bytes"] == sum(a.nbytes for a in arrays), stats
        # The pool's own figures: what it took from the driver, and how.
        pool = stats["pool"]
        assert pool["in_use_bytes"] >= sum(a.nbytes for a in arrays), pool
        assert pool["reserved_bytes"] >= pool["in_use_bytes"], pool
        assert pool["driver_allocations"] - pool["driver_frees"] == pool["segments"] >= 1, pool
        assert pool["gpu_waits_avoided"] == 0, pool  # (the GPU is idle here: no wait to avoid)
        del device, d
        import gc; gc.collect()
        cuda.current_context().deallocations.clear()
        assert cuemm.statistics()["device"]["current_bytes"] == 0
        info = cuda.current_context().get_memory_info()
        assert 0 < info.free <= info.total
    """, **PLUGIN)


def test_pinned_mapped_and_pinned_ranges(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        from numba.cuda.cudadrv import driver
        import cuemm
        for n in (512, 1 << 17):
            p = cuda.pinned_array(n, dtype=np.float32)
            p[:] = 2
            d = cuda.to_device(p)
            assert (d.copy_to_host() == 2).all()
            m = cuda.mapped_array(n, dtype=np.float32)
            m[:] = 3
            seen = np.zeros(n, dtype=np.float32)
            driver.device_to_host(seen, m.gpu_data, m.nbytes)  # read through the device mapping
            assert (seen == 3).all()
        host = np.ones(4096)
        with cuda.pinned(host):
            d = cuda.to_device(host)
        assert (d.copy_to_host() == 1).all()
        stats = cuemm.statistics()
        assert stats["pinned"]["total_count"] >= 3 and stats["mapped"]["total_count"] >= 2, stats
        assert stats["mapped"]["current_count"] == 1, stats  # m, still referenced
        view = m[10:20]
        del m
        assert cuemm.statistics()["mapped"]["current_count"] == 1, "a view keeps its mapped array alive"
        del view
        assert cuemm.statistics()["mapped"]["current_count"] == 0, "a dropped mapped array was not given back"
    """, **PLUGIN)


def test_the_pinned_host_pools_figures_count_its_reuse(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        for _ in range(200):
            p = cuda.pinned_array(4096, dtype=np.uint8)
            del p
        figures = cuemm.statistics()["pinned_host_pool"]
        # One block bought, then reused (a few more while its first seals were pending).
        assert figures["misses"] >= 1 and figures["hits"] >= 150, figures
        assert figures["hits"] + figures["misses"] == 200, figures
        # One thread's loop: its own front serves it, without the pool's lock.
        assert figures["hits"] - 10 <= figures["front_hits"] <= figures["hits"], figures
        assert figures["cached_bytes"] == figures["allocated_bytes"] >= 4096, figures  # all released, all kept
        assert figures["seals"] >= 1, figures  # a released block waits for the GPU's queued work before reuse
    """, NUMBA_CUDA_MEMORY_MANAGER="cuemm", CUEMM_MEMORY_MANAGER="pool")
    # The default manager pools no pinned memory: no such figures.
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        p = cuda.pinned_array(4096, dtype=np.uint8)
        assert "pinned_host_pool" not in cuemm.statistics(), cuemm.statistics()
    """, NUMBA_CUDA_MEMORY_MANAGER="cuemm", CUEMM_MEMORY_MANAGER="default")


def test_a_mapped_pointer_is_numbas_mapped_memory_in_one_object(run_python):
    run_python(PLAIN_POINTERS + """
        import numpy as np
        from numba import cuda
        from numba.cuda.cudadrv import driver
        import cuemm

        m = cuda.mapped_array(1000, dtype=np.int32)
        ours = m.gpu_data
        # What Numba's own MappedMemory holds for this memory (it asks the
        # driver for the device address; cuemm's pool knew it already).
        numbas = driver.MappedMemory(ours.context, ours.host_pointer, ours.size)
        for name, value in vars(numbas).items():
            if name in ("_finalizer", "is_managed", "refct"):
                continue  # ours frees by holding the allocation, not by a finalizer
            assert name in vars(ours), name
            assert plain(getattr(ours, name)) == plain(value), (name, getattr(ours, name), value)
        assert memoryview(ours).nbytes == 4000  # exports the buffer itself
        # A view on the device side takes and gives back a reference: its
        # death must not free the memory under the array.
        view = ours.view(400, 800)
        assert plain(view.device_pointer) == plain(ours.device_pointer) + 400
        del view
        m[:] = np.arange(1000)
        seen = np.zeros(1000, dtype=np.int32)
        driver.device_to_host(seen, m.gpu_data, m.nbytes)
        assert (seen == np.arange(1000)).all()
        assert cuemm.statistics()["mapped"]["current_count"] == 1
        del m, ours
        assert cuemm.statistics()["mapped"]["current_count"] == 0, "a dropped mapped array was not given back"
    """, **PLUGIN)


CHILD = """
import pickle, sys
from numba import cuda
with open(sys.argv[1], "rb") as source:
    handle = pickle.load(source)
with handle as array:
    values = array.copy_to_host().tolist()
assert values == list(range(1000)), values[:10]
print("child ok")
"""


def share_with_a_child(run_python, tmp_path, setup="", check="", **environment):
    """Runs a parent that sends the second of two arrays to a child process (CHILD, which checks its
    values) through a pickled IPC handle; `setup` runs first, `check` once the handle is made. Returns
    the parent's output."""
    payload, child = tmp_path / "handle.pickle", tmp_path / "child.py"
    child.write_text(CHILD)
    pad = " " * 8  # the indentation of the code below, which run_python dedents
    return run_python(f"""
        import pickle, subprocess, sys
        import numpy as np
        from numba import cuda
{textwrap.indent(textwrap.dedent(setup), pad)}
        first = cuda.to_device(np.zeros(1000, dtype=np.int32))
        second = cuda.to_device(np.arange(1000, dtype=np.int32))
        handle = second.get_ipc_handle()
{textwrap.indent(textwrap.dedent(check), pad)}
        with open({str(payload)!r}, "wb") as out:
            pickle.dump(handle, out)
        result = subprocess.run([sys.executable, {str(child)!r}, {str(payload)!r}], capture_output=True, text=True,
                                timeout=120)
        print(result.stdout, result.stderr)
        assert result.returncode == 0
    """, **environment)


def test_ipc_handles_carry_the_offset_of_suballocated_blocks(run_python, tmp_path):
    out = share_with_a_child(run_python, tmp_path, check='print("offset", handle._ipc_handle.offset)', **PLUGIN)
    assert "child ok" in out
    assert "offset 0" not in out, "the second block should sit inside a segment, not at its start"


def test_the_log_the_statistics_and_the_plot(run_python, tmp_path):
    log, svg = tmp_path / "log.csv", tmp_path / "memory.svg"
    run_python(f"""
        import numpy as np
        from numba import cuda
        import cuemm
        cuemm.use_cuemm_for_numba("pool", log=True)
        a = cuda.device_array(1000)
        b = cuda.device_array(2000)
        p = cuda.pinned_array(3000, dtype=np.uint8)
        del a
        cuemm.write_log({str(log)!r})
        cuemm.plot({str(svg)!r})
    """)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("Event Type,Device ID,Address,Stream,Size (bytes)")
    allocs = [line for line in lines if line.startswith("Alloc,")]
    assert len(allocs) == 2 and ",8000," in allocs[0] and ",16000," in allocs[1]
    assert "<string>" in allocs[0], "the Python caller should be the location"
    pinned = [line for line in lines if ",3000," in line and not line.startswith("Free,")]
    assert len(pinned) == 1 and "<string>" in pinned[0], lines
    assert any(line.startswith("Free,") for line in lines)
    assert svg.read_text().startswith("<svg") and "polyline" in svg.read_text()


def test_write_log_and_plot_read_the_log_adaptors_file_and_say_when_there_is_no_log(run_python, tmp_path):
    # The log adaptor (adaptors="log") writes a file rather than memory:
    # write_log() and plot() read that file back (they read an empty log
    # before). With log=True as well, the log in memory serves, holding the
    # same rows. Without any log they say how to keep one.
    file, copy, svg = tmp_path / "adaptor.csv", tmp_path / "copy.csv", tmp_path / "memory.svg"
    run_python(f"""
        import numpy as np
        from numba import cuda
        import cuemm
        {REFUSED}
        cuemm.use_cuemm_for_numba("pool", adaptors="statistics,log", log_file={str(file)!r})
        a = cuda.device_array(1000)
        del a
        cuemm.write_log({str(copy)!r})
        cuemm.plot({str(svg)!r})
    """)
    assert copy.read_text() == file.read_text()
    rows = copy.read_text().splitlines()
    assert rows[0].startswith("Event Type,") and rows[1].startswith("Alloc,") and ",8000," in rows[1], rows
    assert rows[2].startswith("Free,") and ",8000," in rows[2], rows
    assert svg.read_text().startswith("<svg") and "polyline" in svg.read_text()

    both = tmp_path / "both.csv"
    run_python(f"""
        from numba import cuda
        import cuemm
        cuemm.use_cuemm_for_numba("pool", log=True, adaptors="log", log_file={str(file)!r})
        a = cuda.device_array(3000)
        cuemm.write_log({str(both)!r})
    """)
    in_memory = [row.split(",")[0] + row.split(",")[4] for row in both.read_text().splitlines()[1:]]
    in_file = [row.split(",")[0] + row.split(",")[4] for row in file.read_text().splitlines()[1:]]
    # (The file goes on to the array's free as the process ends.)
    assert in_memory == ["Alloc24000"] and in_file[:1] == in_memory, (in_memory, in_file)

    run_python(f"""
        from numba import cuda
        import cuemm
        {REFUSED}
        cuemm.use_cuemm_for_numba("pool")
        a = cuda.device_array(10)
        refused(lambda: cuemm.plot({str(svg)!r}), RuntimeError, "keeps no log")
        refused(lambda: cuemm.write_log({str(copy)!r}), RuntimeError, 'adaptors="log"')
    """)


def test_the_expandable_pool_serves_numba(run_python):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        cuemm.use_cuemm_for_numba("pool", expandable=True, thread_cache_size=0)
        arrays = [np.arange(n, dtype=np.float64) for n in (1, 1000, 300_000, 2_000_000)]
        device = [cuda.to_device(a) for a in arrays]
        for a, d in zip(arrays, device):
            assert (d.copy_to_host() == a).all()
    """)


@pytest.mark.parametrize("setting", [{}, {"CUEMM_POOL_EXPANDABLE": "1"}, {"CUEMM_MEMORY_MANAGER": "async"}],
                         ids=["pool", "expandable", "async"])
def test_each_gpu_allocates_from_its_own_manager_and_arrays_copy_between_them(run_python, setting):
    # Two simulated devices here (peers, as two GPUs of one host usually are);
    # on a GPU machine, whatever it has.
    out = run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        if len(cuda.gpus) < 2:
            print("only one device")
            raise SystemExit(0)
        host = np.arange(100_000, dtype=np.int32)
        arrays = []
        for i in range(2):
            with cuda.gpus[i]:
                assert type(cuda.current_context().memory_manager).__name__ == "CuemmNumbaManager"
                arrays.append(cuda.to_device(host + i))
                assert cuemm.statistics(i)["device"]["current_count"] == 1, cuemm.statistics(i)
        for i in range(2):
            with cuda.gpus[i]:
                assert (arrays[i].copy_to_host() == host + i).all()
        with cuda.gpus[0]:   # from GPU 0's context into GPU 1's array (numba-cuda's peer copy)
            arrays[1].copy_to_device(arrays[0])
            # A copy between devices does not wait for the host: the driver
            # returned before it was done for the expandable pool's and the
            # driver pool's memory on two H200s (README, "Several GPUs").
            cuda.synchronize()
        with cuda.gpus[1]:
            assert (arrays[1].copy_to_host() == host).all()
        print("two devices ok")
    """, CUEMM_SIM_DEVICES=2, CUEMM_SIM_PEER_ACCESS=1, **PLUGIN, **setting)
    if "only one device" in out:
        pytest.skip("needs two devices (this GPU machine has one)")
    assert "two devices ok" in out


def test_the_expandable_pools_arena_blocks_open_in_another_process(run_python, tmp_path):
    # Arena memory has no driver handle: cuemm's own IpcHandle names its mappings.
    out = share_with_a_child(run_python, tmp_path, setup="""
        import cuemm
        from cuemm.numba_plugin import CuemmIpcHandle
        cuemm.use_cuemm_for_numba("pool", expandable=True, thread_cache_size=0)
    """, check="""
        assert isinstance(handle._ipc_handle, CuemmIpcHandle), type(handle._ipc_handle)
        print("offset", handle._ipc_handle.offset)
    """)
    assert "child ok" in out
    assert "offset 0" not in out, "the second block should follow the first in the arena"


@pytest.mark.parametrize("manager", ["pool", "async", "default"])
def test_a_child_forked_after_cuda_started_is_refused_at_once_with_the_fork_named(run_python, manager):
    # Python's multiprocessing forks by default on Linux. The child holds the
    # parent's managers as copies (caches of the parent's blocks, locks the
    # parent's threads held): cuemm refuses it before any of them, and its
    # arrays of the parent's memory drop without a wait. The parent goes on.
    out = run_python("""
        import gc, os, threading, time
        from numba import cuda
        plugin = cuda.current_context().memory_manager  # cuemm's Numba plugin
        cuda.device_array(1 << 16)  # freed at once: a block in the pool's cache
        kept = cuda.device_array(1 << 16)
        stop = False
        def churn():  # a thread inside the manager when the process forks
            while not stop:
                cuda.device_array(4096)
        churning = threading.Thread(target=churn)
        churning.start()
        time.sleep(0.05)
        pid = os.fork()
        if pid == 0:
            failures = []
            for name, call in [("memalloc", lambda: plugin.memalloc(1 << 16)),
                               ("get_memory_info", lambda: plugin.get_memory_info())]:
                try:
                    call()
                    failures.append(name + ": not refused")
                except Exception as error:
                    if "fork" not in str(error):
                        failures.append(f"{name}: {type(error).__name__}: {error}")
            del kept
            gc.collect()
            os.write(1, ("\\n".join(failures) or "child: refused").encode() + b"\\n")
            os._exit(1 if failures else 0)
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError("the forked child waited (killed after 60 s)")
            time.sleep(0.05)
        stop = True
        churning.join()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert (cuda.to_device(list(range(8))).copy_to_host() == list(range(8))).all()
        print("parent: went on")
    """, CUEMM_MEMORY_MANAGER=manager, **PLUGIN)
    assert "child: refused" in out and "parent: went on" in out, out


def test_threads_allocate_safely(run_python):
    run_python("""
        import threading
        import numpy as np
        from numba import cuda
        errors = []
        def work(seed):
            try:
                for i in range(50):
                    a = np.full(1000 + seed * 10 + i, seed, dtype=np.int64)
                    d = cuda.to_device(a)
                    if not (d.copy_to_host() == seed).all():
                        errors.append(seed)
            except Exception as error:
                errors.append(error)
        cuda.current_context()
        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
    """, **PLUGIN)


def test_arrays_made_on_one_thread_and_dropped_on_another_come_back(run_python):
    # A loader thread makes device arrays and hands them over; the main
    # thread checks and drops them, so the pool's blocks are freed on a
    # thread other than the one that took them.
    run_python("""
        import queue, threading
        import numpy as np
        from numba import cuda
        import cuemm
        cuda.current_context()
        handed = queue.Queue(maxsize=8)
        def load():
            for i in range(200):
                n = (1 << 20) // 8 if i % 3 else 64 + i  # 1 MiB, or a few hundred bytes
                handed.put((i, cuda.to_device(np.full(n, i, dtype=np.int64))))
            handed.put(None)
        loader = threading.Thread(target=load)
        loader.start()
        checked = 0
        while (item := handed.get()) is not None:
            i, array = item
            assert (array.copy_to_host() == i).all(), i
            del array, item
            checked += 1
        loader.join()
        assert checked == 200
        import gc; gc.collect()
        cuda.current_context().deallocations.clear()
        stats = cuemm.statistics()
        assert stats["device"]["current_bytes"] == 0, stats["device"]
        assert stats["pool"]["in_use_bytes"] == 0, stats["pool"]
        # Freed on this thread, reused by the loader: the pool holds a few
        # of them at once, not 200 (70 MiB).
        assert stats["pool"]["reserved_bytes"] <= 48 << 20, stats["pool"]
    """, **PLUGIN)


def test_pinned_arrays_made_on_one_thread_and_dropped_on_another_are_reused(run_python):
    # Pinned staging buffers as a data loader keeps them: a loader thread
    # makes pinned arrays and fills them, the main thread copies each to the
    # device and drops it. The pinned host pool buys a few blocks, not one a
    # batch, and the loader takes most of them back from its own cache.
    run_python("""
        import queue, threading
        import numpy as np
        from numba import cuda
        import cuemm
        cuda.current_context()
        handed = queue.Queue(maxsize=8)
        count = 600
        def load():
            for i in range(count):
                staging = cuda.pinned_array(4096, dtype=np.int32)
                staging[:] = i
                handed.put((i, staging))
            handed.put(None)
        loader = threading.Thread(target=load)
        loader.start()
        while (item := handed.get()) is not None:
            i, staging = item
            assert (cuda.to_device(staging).copy_to_host() == i).all(), i
            del staging, item
        loader.join()
        import gc; gc.collect()
        figures = cuemm.statistics()["pinned_host_pool"]
        assert figures["hits"] + figures["misses"] == count, figures
        assert figures["misses"] <= 200, figures  # blocks bought: those out at once and the caches' rotations
        assert figures["front_hits"] >= figures["hits"] // 2, figures  # the loader's own cache, refilled in batches
        assert figures["cached_bytes"] == figures["allocated_bytes"], figures  # every one came back
    """, **PLUGIN)


@pytest.mark.parametrize("batch_bytes, queued", [(4 << 20, "queued_large_frees"), (256 << 10, "queued_small_frees")])
def test_device_arrays_made_on_one_thread_and_dropped_on_another_are_reused(run_python, batch_bytes, queued):
    # A loader thread puts batches on the device, the main thread reads each
    # back and drops it. The main thread's frees queue for the loader, which
    # is at work in the pool (4 MiB: Note [Large frees from another thread];
    # 256 KiB, once the loader has taken back what the main thread's cache
    # kept: Note [Classes a thread frees for others]), and the pool reuses
    # the blocks rather than grow with every batch.
    run_python(f"""
        import queue, threading
        import numpy as np
        from numba import cuda
        import cuemm
        cuda.current_context()
        handed = queue.Queue(maxsize=8)
        count, words = 400, {batch_bytes} // 4
        def load():
            for i in range(count):
                handed.put((i, cuda.to_device(np.full(words, i, dtype=np.int32))))
            handed.put(None)
        loader = threading.Thread(target=load)
        loader.start()
        while (item := handed.get()) is not None:
            i, batch = item
            assert (batch.copy_to_host() == i).all(), i
            del batch, item
        loader.join()
        import gc; gc.collect()
        figures = cuemm.statistics()["pool"]
        assert figures["{queued}"] > 0, figures
        assert figures["in_use_bytes"] == 0, figures  # every block came back
        # Those out at once and a rotation's, not one a batch.
        assert figures["reserved_bytes"] <= max(64 * {batch_bytes}, 32 << 20), figures
    """, **PLUGIN)


def test_the_pinned_host_pools_cap_can_be_chosen_from_python(run_python):
    # A burst of pinned arrays released at once: with a cap of 1 MiB, at most
    # four times it stays cached (the blocks not yet idle).
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        cuemm.use_cuemm_for_numba("pool", pinned_maximum_cached="1M")
        arrays = [cuda.pinned_array(1 << 20, dtype=np.uint8) for _ in range(12)]
        del arrays
        figures = cuemm.statistics()["pinned_host_pool"]
        assert figures["allocated_bytes"] <= 4 << 20, figures
        assert figures["cached_bytes"] == figures["allocated_bytes"], figures
    """)


def test_bad_input_raises_python_errors(run_python):
    run_python("""
        from numba import cuda
        import cuemm
        manager = cuda.current_context().memory_manager
        for bad, error in [(-5, ValueError), (0, ValueError), ("x", TypeError), (2**62, MemoryError)]:
            try:
                manager.memalloc(bad)
            except error:
                pass
            else:
                raise AssertionError(f"memalloc({bad!r}) did not raise {error.__name__}")
        bridge = manager._get_bridge()
        allocation = bridge.memalloc(100)
        allocation.release()
        allocation.release()  # twice is harmless
        try:
            allocation.address
        except RuntimeError as error:
            assert "released" in str(error)
        else:
            raise AssertionError("a released allocation still has an address")
        # The fast path: (Allocation, the address as the given type); dropping the
        # Allocation gives the memory back.
        class Pointer(int):
            pass
        allocation, pointer = bridge.allocator(Pointer).memalloc(4096)
        assert type(pointer) is Pointer and pointer == allocation.address and allocation.size == 4096
        in_use = cuemm.statistics()["device"]["current_bytes"]
        del allocation
        assert cuemm.statistics()["device"]["current_bytes"] == in_use - 4096
        def refuse(address):
            raise KeyError(address)
        try:
            bridge.allocator(refuse).memalloc(4096)
        except KeyError:
            pass
        else:
            raise AssertionError("the pointer type's error was lost")
        assert cuemm.statistics()["device"]["current_bytes"] == in_use - 4096  # and nothing leaked
        # Pointer objects are reused per address; each still names its own allocation's address.
        allocator = bridge.allocator(Pointer)
        live = [allocator.memalloc(size) for size in (256, 256, 65536, 4 << 20) * 8]
        assert all(pointer == allocation.address for allocation, pointer in live)
        assert len({pointer for _, pointer in live}) == len(live)
        for _ in range(3):
            live = [allocator.memalloc(256) for _ in range(200)]
            assert all(pointer == allocation.address for allocation, pointer in live)
            del live
        # memalloc_memory: Numba's whole memalloc, the memory object made in C++.
        class Memory:
            def __init__(self, context, pointer, size):
                self.context, self.pointer, self.size = context, pointer, size
        context = object()
        memory = bridge.allocator(Pointer, Memory, context).memalloc_memory(4096)
        assert type(memory) is Memory and memory.context is context and memory.size == 4096
        assert memory.pointer == memory._allocation.address and type(memory.pointer) is Pointer
        assert cuemm.statistics()["device"]["current_bytes"] == in_use
        del memory
        assert cuemm.statistics()["device"]["current_bytes"] == in_use - 4096
        def refusing_memory(context, pointer, size):
            raise KeyError(size)
        for make, error in [(lambda: bridge.allocator(Pointer, refusing_memory).memalloc_memory(4096), KeyError),
                            (lambda: bridge.allocator(Pointer).memalloc_memory(4096), TypeError),
                            (lambda: bridge.allocator(Pointer, 5), TypeError)]:
            try:
                make()
            except error:
                pass
            else:
                raise AssertionError(f"no {error.__name__}")
        assert cuemm.statistics()["device"]["current_bytes"] == in_use - 4096  # nothing leaked
        # Numba's calls reach it directly once the bridge exists.
        assert type(manager.memalloc).__name__ == "builtin_function_or_method", manager.memalloc
        for bad, error in [(-1, ValueError), ("x", TypeError)]:
            try:
                bridge.allocator(int).memalloc(bad)
            except error:
                pass
            else:
                raise AssertionError(f"allocator().memalloc({bad!r}) did not raise {error.__name__}")
        host = bridge.allocator(int).memhostalloc
        for bad, error in [((-1, False, False, False), ValueError), (("x", False, False, False), TypeError),
                           ((64,), TypeError), ((0, False, False, False), ValueError)]:
            try:
                host(*bad)
            except error:
                pass
            else:
                raise AssertionError(f"allocator().memhostalloc{bad!r} did not raise {error.__name__}")
        pinned, mapped = host(4096, False, False, False), host(4096, True, False, False)
        assert pinned.host_address and mapped.host_address and mapped.address and pinned.size == 4096
        assert bridge.statistics()["mapped"]["current_count"] >= 1
        try:
            bridge.allocator(5)
        except TypeError as error:
            assert "pointer_type" in str(error)
        else:
            raise AssertionError("a pointer type that is not callable was accepted")
        # Sizes past 64 bits, through every entry point: errors that name the call and the size.
        in_use = cuemm.statistics()["device"]["current_bytes"]
        entry_points = [("memalloc", manager.memalloc), ("memalloc", lambda size: bridge.memalloc_at(size, "")),
                        ("memhostalloc", lambda size: host(size, False, False, False)),
                        ("memhostalloc", bridge.memhostalloc), ("memallocmanaged", bridge.memallocmanaged),
                        ("mempin", lambda size: bridge.mempin(None, 4096, size)),
                        ("get_ipc_handle", lambda size: bridge.ipc_handle(4096, size))]
        for name, call in entry_points:
            for bad, error, words in [(2**64, OverflowError, "larger than any allocation"),
                                      (-2**70, ValueError, "must not be negative")]:
                try:
                    call(bad)
                except error as raised:
                    assert str(raised).startswith(name + ":") and words in str(raised) and str(bad) in str(raised), raised
                else:
                    raise AssertionError(f"{name}({bad}) did not raise {error.__name__}")
        assert cuemm.statistics()["device"]["current_bytes"] == in_use  # nothing leaked
        # An IPC handle of something that is not device memory: a TypeError that says what it got.
        for bad in (None, 4096, "x"):
            try:
                manager.get_ipc_handle(bad)
            except TypeError as raised:
                assert "get_ipc_handle" in str(raised) and type(bad).__name__ in str(raised), raised
            else:
                raise AssertionError(f"get_ipc_handle({bad!r}) did not raise TypeError")
    """, **PLUGIN)


def test_device_pointers_made_from_a_learnt_instance_match_numbas_own(run_python):
    # memalloc_memory copies one learnt instance's attributes rather than
    # running the pointer class's __init__: the result must hold what __init__
    # would have made, and a class whose __init__ computes from its arguments
    # must be called as before.
    run_python(PLAIN_POINTERS + """
        import numpy as np
        from numba import cuda
        from numba.cuda.cudadrv import driver
        from cuemm import numba_plugin as plugin

        cuda.device_array(16)  # makes the bridge
        context = cuda.current_context()
        manager = context.memory_manager
        bridge = manager._bridge
        allocator = bridge.allocator(plugin._device_pointer, plugin._DeviceMemory, manager._context_proxy)
        assert allocator.makes_without_init, "Numba's MemoryPointer should be made from a learnt instance"
        made = [allocator.memalloc_memory(n) for n in (256, 1000, 1 << 20)]
        for memory in made:
            through_init = plugin._DeviceMemory(manager._context_proxy, memory.device_pointer, memory.size)
            assert set(vars(memory)) == set(vars(through_init)) | {"_allocation"}, (vars(memory), vars(through_init))
            for name, value in vars(through_init).items():
                assert plain(getattr(memory, name)) == plain(value), (name, getattr(memory, name), value)
            assert type(memory) is plugin._DeviceMemory
            assert plain(memory.device_pointer) == memory._allocation.address
        del memory, through_init
        assert [m.size for m in made] == [256, 1000, 1 << 20]
        assert len({plain(m.device_pointer) for m in made}) == 3
        # A view and an array on the memory behave as on Numba's own pointer.
        array = cuda.devicearray.DeviceNDArray((64,), (4,), np.dtype(np.int32), gpu_data=made[0])
        array.copy_to_device(np.arange(64, dtype=np.int32))
        assert (array[8:16].copy_to_host() == np.arange(8, 16)).all()
        current = bridge.statistics()["device"]["current_count"]
        made[0].free()
        assert bridge.statistics()["device"]["current_count"] == current - 1
        del array
        made.pop(0)
        made.pop()
        assert bridge.statistics()["device"]["current_count"] == current - 2, "a dropped pointer kept its memory"

        class Computed(plugin._DeviceMemory):
            def __init__(self, context, pointer, size):
                super().__init__(context, pointer, size)
                self.end = plain(pointer) + size  # from the arguments: no copy can hold it

        computed = bridge.allocator(plugin._device_pointer, Computed, manager._context_proxy)
        assert not computed.makes_without_init
        memory = computed.memalloc_memory(512)
        assert memory.end == memory._allocation.address + 512
        class Slotted(plugin._DeviceMemory):
            __slots__ = ("kind",)  # stored outside the instance's __dict__: no copy of it can hold it

            def __init__(self, context, pointer, size):
                super().__init__(context, pointer, size)
                self.kind = "device"

        slotted = bridge.allocator(plugin._device_pointer, Slotted, manager._context_proxy)
        assert not slotted.makes_without_init
        assert slotted.memalloc_memory(256).kind == "device"
        unlearnt = bridge.allocator(plugin._device_pointer, plugin._DeviceMemory, manager._context_proxy,
                                           learn_memory_type=False)
        assert not unlearnt.makes_without_init and unlearnt.memalloc_memory(64).size == 64
    """, **PLUGIN)


def test_fast_path_allocations_outlive_their_bridge_and_its_reset(run_python):
    # The fast path's Allocation gives its memory back through the bridge's
    # statistics adaptor: it must keep the bridge alive, and a release after
    # the bridge's reset() is not counted (reset gave that memory back).
    run_python("""
        import gc
        import cuemm._core as core
        bridge = core.Bridge(0, "pool")
        bridge.initialize()
        allocate = bridge.allocator(int).memalloc
        kept = [allocate(size) for size in (256, 1 << 20, 8 << 20)]
        assert bridge.statistics()["device"]["current_bytes"] == 256 + (1 << 20) + (8 << 20)
        kept.pop()[0].release()
        assert bridge.statistics()["device"]["current_bytes"] == 256 + (1 << 20)
        bridge.reset()
        assert bridge.statistics()["device"]["current_bytes"] == 0
        kept.pop()
        assert bridge.statistics()["device"]["current_bytes"] == 0, "a release after reset was counted"
        allocation, pointer = allocate(4096)
        assert pointer == allocation.address
        del bridge, allocate, kept
        gc.collect()
        assert allocation.alive and allocation.size == 4096
        allocation.release()
        assert not allocation.alive
    """)


def test_defer_cleanup_reset_and_the_async_manager(run_python):
    run_python("""
        from numba import cuda
        import cuemm
        cuemm.use_cuemm_for_numba("async")
        with cuda.defer_cleanup():
            d = cuda.device_array(1000)
            del d
        a = cuda.device_array(100)
        try:
            a.get_ipc_handle()
        except NotImplementedError as error:
            assert "CUEMM_MEMORY_MANAGER=pool" in str(error)
        else:
            raise AssertionError("the async manager exported an IPC handle")
        cuda.current_context().reset()
        b = cuda.to_device([1, 2, 3])
        assert list(b.copy_to_host()) == [1, 2, 3]
    """)


def test_an_exportable_async_pools_blocks_open_in_another_process(run_python, tmp_path):
    # No driver handle: cuemm's own IpcHandle, opened by cuemm in the child.
    out = share_with_a_child(run_python, tmp_path, setup="""
        import cuemm
        from cuemm.numba_plugin import CuemmIpcHandle
        cuemm.use_cuemm_for_numba("async", exportable=True)
    """, check="assert isinstance(handle._ipc_handle, CuemmIpcHandle), type(handle._ipc_handle)")
    assert "child ok" in out


def test_tracking_lists_what_python_still_holds_with_its_call_sites(run_python):
    run_python("""
        import inspect
        from numba import cuda
        import cuemm
        def line_below():
            return inspect.currentframe().f_back.f_lineno + 1
        kept_line = line_below()
        kept = cuda.device_array(1000, dtype="u1")
        gone = cuda.device_array(5000, dtype="u1")
        pinned_line = line_below()
        pinned = cuda.pinned_array(4096, dtype="u1")
        del gone
        listed = cuemm.outstanding()
        assert [(r["kind"], r["size"]) for r in listed] == [("device", 1000), ("pinned", 4096)], listed
        assert listed[0]["address"] == kept.__cuda_array_interface__["data"][0], listed
        assert listed[0]["call_site"] == f"<string>:{kept_line}", listed
        assert listed[1]["call_site"] == f"<string>:{pinned_line}", listed
        assert 0 <= listed[0]["start"] <= listed[1]["start"], listed
        report = cuemm.leak_report()
        assert "2 allocation(s) outstanding" in report and f"<string>:{kept_line}" in report, report
        del kept, pinned
        assert cuemm.outstanding() == [] and cuemm.leak_report() == ""
    """, CUEMM_ADAPTORS="tracking", **PLUGIN)
    # Without the tracking adaptor: an error that says how to add it.
    run_python("""
        from numba import cuda
        import cuemm
        held = cuda.device_array(10)
        try:
            cuemm.outstanding()
        except RuntimeError as error:
            assert "CUEMM_ADAPTORS=tracking" in str(error), error
        else:
            raise AssertionError("outstanding() without tracking did not raise")
    """, **PLUGIN)


def test_a_limit_is_what_numba_sees_as_memory(run_python):
    run_python("""
        from numba import cuda
        context = cuda.current_context()
        free, total = context.get_memory_info()
        assert total == 64 << 20 and free == 64 << 20, (free, total)
        held = cuda.device_array(40 << 20, dtype="u1")
        free, total = context.get_memory_info()
        assert free == 24 << 20, free
        try:
            cuda.device_array(free + 1, dtype="u1")
        except MemoryError as error:
            assert "limit" in str(error), error
        else:
            raise AssertionError("an array past the limit was allocated")
        rest = cuda.device_array(free, dtype="u1")  # what it says is free is served
    """, CUEMM_ADAPTORS="limit", CUEMM_LIMIT="64M", **PLUGIN)


def test_a_limit_given_alone_is_applied(run_python):
    # use_cuemm_for_numba(limit=...) without adaptors="limit" caps Numba too.
    run_python(REFUSED + """
        import cuemm
        cuemm.use_cuemm_for_numba("pool", limit="32M")
        from numba import cuda
        free, total = cuda.current_context().get_memory_info()
        assert total == 32 << 20, total
        refused(lambda: cuda.device_array(33 << 20, dtype="u1"), MemoryError, "limit")
    """)


@pytest.mark.parametrize("manager", ["pool", "async", "default"])
def test_release_unused_memory_gives_back_what_no_array_holds(run_python, manager):
    run_python("""
        import numpy as np
        from numba import cuda
        import cuemm
        # Before anything is allocated there is nothing to give back (and no error).
        nothing = cuemm.release_unused_memory()
        kept = cuda.to_device(np.arange(1 << 18, dtype=np.uint32))
        arrays = [cuda.device_array((i % 7 + 1) << 20, dtype="u1") for i in range(40)]
        pinned = [cuda.pinned_array(4 << 20, dtype="u1") for _ in range(3)]
        del arrays, pinned
        with cuda.defer_cleanup():
            assert set(cuemm.release_unused_memory().values()) == {0}, "released under defer_cleanup"
        released = cuemm.release_unused_memory()
        assert sorted(released) == ["deferred_bytes", "deferred_frees", "device_bytes", "pinned_host_bytes"]
        assert sorted(nothing) == sorted(released) and set(nothing.values()) == {0}, nothing
        if MANAGER != "default":
            assert released["device_bytes"] > 0, released
            assert released["pinned_host_bytes"] >= 4 << 20, released
        if MANAGER == "pool":
            reserved = cuemm.statistics()["pool"]["reserved_bytes"]
            assert reserved <= 32 << 20, (reserved, released)
        again = cuemm.release_unused_memory()
        assert again["device_bytes"] == again["pinned_host_bytes"] == again["deferred_frees"] == 0, again
        assert (kept.copy_to_host() == np.arange(1 << 18, dtype=np.uint32)).all()
        after = cuda.to_device(np.ones(1000))
        assert after.copy_to_host().sum() == 1000
    """.replace("MANAGER", repr(manager)), CUEMM_MEMORY_MANAGER=manager, **PLUGIN)


def test_segments_show_where_the_pools_free_bytes_lie(run_python):
    run_python("""
        from numba import cuda
        import cuemm
        held = [cuda.device_array(3 << 20, dtype="u1") for _ in range(6)]
        del held[1::2]  # 3 MiB holes between held arrays,
        cuda.current_context().deallocations.clear()  # once Numba's deferred frees have run
        segments = cuemm.segments()
        assert segments and [s["address"] for s in segments] == sorted(s["address"] for s in segments)
        assert set(segments[0]) == {"kind", "address", "size", "mapped_bytes", "free_bytes", "free_blocks",
                                    "largest_free_block"}, segments[0]
        pool = cuemm.statistics()["pool"]
        assert sum(s["size"] for s in segments) == pool["reserved_bytes"], (segments, pool)
        assert sum(s["free_bytes"] for s in segments) == (pool["reserved_bytes"] - pool["in_use_bytes"]
                                                          - pool["quarantined_bytes"] - pool["cached_bytes"])
        assert max(s["largest_free_block"] for s in segments) >= 3 << 20, segments
        assert sum(s["free_blocks"] for s in segments) >= 2, segments
    """, CUEMM_MEMORY_MANAGER="pool", CUEMM_POOL_THREAD_CACHE_SIZE="0", **PLUGIN)
    run_python("""
        from numba import cuda
        import cuemm
        cuda.device_array(10, dtype="u1")
        try:
            cuemm.segments()
        except ValueError as error:
            assert "pool manager" in str(error) and "'async'" in str(error), error
        else:
            raise AssertionError("segments() of the async manager")
    """, CUEMM_MEMORY_MANAGER="async", **PLUGIN)


def test_out_of_memory_says_where_the_pools_free_bytes_lie(run_python):
    run_python("""
        from numba import cuda
        import cuemm
        held = [cuda.device_array(2 << 20, dtype="u1") for _ in range(8)]
        del held[::2]  # four 2 MiB holes in the pool's 16 MiB
        cuda.current_context().deallocations.clear()
        try:
            cuda.device_array(4 << 20, dtype="u1")
        except MemoryError as error:
            message = str(error)
            for part in (" block(s), the largest 2.00 MiB", "maximum 16.00 MiB", "the device has"):
                assert part in message, (part, message)
        else:
            raise AssertionError("a 4 MiB array fit in 2 MiB holes")
        again = cuda.device_array(2 << 20, dtype="u1")  # a hole still serves its size
    """, CUEMM_MEMORY_MANAGER="pool", CUEMM_POOL_MAXIMUM_SIZE="16M", CUEMM_POOL_THREAD_CACHE_SIZE="0",
        CUEMM_POOL_DEDICATED_SIZE="1T", CUEMM_POOL_EXPANDABLE="0", **PLUGIN)  # (one range has no holes' ends)


def test_an_out_of_memory_handler_frees_memory_elsewhere_and_numba_retries(run_python):
    run_python("""
        import gc
        from numba import cuda
        import cuemm
        gc.disable()  # the cycle below goes only when the handler collects it
        program_cache = [cuda.device_array(10 << 20, dtype="u1") for _ in range(6)]
        calls = []
        def drop_cache(size, attempt):
            calls.append((size, attempt))
            freed = bool(program_cache)
            program_cache.clear()
            return freed
        assert cuemm.on_out_of_memory(drop_cache) is None
        fits = cuda.device_array(16 << 20, dtype="u1")
        assert calls == [(16 << 20, 1)], calls
        try:
            cuda.device_array(60 << 20, dtype="u1")
        except MemoryError as error:
            assert "limit" in str(error), error
        else:
            raise AssertionError("60 MiB beside 16 fitted under a 64 MiB limit")
        assert calls[-1] == (60 << 20, 1), calls

        # An array kept alive only by a reference cycle: gc.collect() frees it.
        class Node:
            pass
        node = Node()
        node.self, node.array = node, cuda.device_array(40 << 20, dtype="u1")
        del node, fits
        assert cuemm.on_out_of_memory(lambda size, attempt: attempt == 1 and gc.collect() > 0) is drop_cache
        collected = cuda.device_array(40 << 20, dtype="u1")

        # A handler that raises fails the allocation with its exception; one
        # that allocates and runs out inside is not called again.
        def raising(size, attempt):
            raise KeyError("the handler gave up")
        cuemm.on_out_of_memory(raising)
        try:
            cuda.device_array(40 << 20, dtype="u1")
        except KeyError as error:
            assert "the handler gave up" in str(error), error
        else:
            raise AssertionError("the handler's exception was lost")
        attempts = []
        def allocating(size, attempt):
            attempts.append(attempt)
            try:
                cuda.device_array(40 << 20, dtype="u1")
            except MemoryError:
                pass
            return attempt < 2
        cuemm.on_out_of_memory(allocating)
        try:
            cuda.device_array(40 << 20, dtype="u1")
        except MemoryError:
            pass
        assert attempts == [1, 2], attempts
        # One that always asks again gets 100 retries, then a MemoryError
        # that says so, not a loop that never ends.
        attempts.clear()
        def always(size, attempt):
            attempts.append(attempt)
            return True
        assert cuemm.on_out_of_memory(always) is allocating
        try:
            cuda.device_array(40 << 20, dtype="u1")
        except MemoryError as error:
            assert "still asked to try again after 100 retries" in str(error), error
        else:
            raise AssertionError("40 MiB beside 40 fitted under a 64 MiB limit")
        assert attempts == list(range(1, 102)), attempts
        assert cuemm.on_out_of_memory(allocating) is always
        assert cuemm.on_out_of_memory(None) is allocating
        try:
            cuemm.on_out_of_memory(5)
        except TypeError as error:
            assert "callable" in str(error), error
        else:
            raise AssertionError("a handler that cannot be called was taken")
        assert cuemm.statistics()["device"]["current_bytes"] == 40 << 20
    """, CUEMM_ADAPTORS="limit", CUEMM_LIMIT="64M", **PLUGIN)
