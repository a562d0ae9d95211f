"""Runs numba-cuda's own test suite twice, with Numba's default memory manager
and with NUMBA_CUDA_MEMORY_MANAGER=cuemm, and prints both summaries and every
test whose outcome differs. Exits non-zero if a test fails or errors under
cuemm that passes (or is skipped) under the default, except the tests that open
raw IPC handles without their offset (docs/ipc-offsets.md), which run again
with CUEMM_POOL_DEDICATED_SIZE=0 and must pass there.

Usage: compare_numba_cuda_suite.py PYTHONPATH_OF_CUEMM [test modules...]
(default modules: the selection of ../shared/GPU-NOTES.md). With
CUEMM_COMPARE_SAVE_BASELINE=FILE the default manager's outcomes are kept in
FILE; with CUEMM_COMPARE_BASELINE=FILE a later run of some of the same
modules (under another cuemm manager) takes them from there rather than
running the default manager again. Needs the GPU
machine's workarounds, which this script sets up itself in a temporary folder:
a stand-in `filecheck` package whose Matcher skips, and np.row_stack.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

DEFAULT_MODULES = [
    "numba.cuda.tests.cudadrv",
    "numba.cuda.tests.cudapy.test_ipc",
    "numba.cuda.tests.cudapy.test_cuda_array_interface",
    "numba.cuda.tests.cudapy.test_array",
    "numba.cuda.tests.cudapy.test_montecarlo",
    "numba.cuda.tests.cudapy.test_matmul",
]

WORKAROUNDS = {
    "filecheck/__init__.py": "",
    "filecheck/matcher.py": (
        "import unittest\n\n"
        "class Matcher:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise unittest.SkipTest('FileCheck is not installed on this machine')\n"
    ),
    "filecheck/options.py": "class Options:\n    def __init__(self, *args, **kwargs):\n        pass\n",
    "filecheck/parser.py": (
        "class Parser:\n    def __init__(self, *args, **kwargs):\n        pass\n\n"
        "def pattern_for_opts(*args, **kwargs):\n    return None\n"
    ),
    "filecheck/finput.py": "class FInput:\n    def __init__(self, *args, **kwargs):\n        pass\n",
    "sitecustomize.py": "import numpy as np\nif not hasattr(np, 'row_stack'):\n    np.row_stack = np.vstack\n",
}

# Tests that open a raw IPC handle without its offset: no suballocating pool
# can pass them (docs/ipc-offsets.md). They run again with every block in a
# segment of its own, where they must pass.
RAW_HANDLE_TESTS = ["numba.cuda.tests.cudapy.test_ipc.TestIpcMemory.test_ipc_handle"]
RAW_HANDLE_SETTING = {"CUEMM_POOL_DEDICATED_SIZE": "0"}

OUTCOME = re.compile(r"^(test\w*) \(([\w.]+)\)\s*(?:\.\.\.)?\s*(.*)$")


def run(label, environment, modules):
    result = subprocess.run([sys.executable, "-m", "numba.runtests", "-v", *modules], env=environment,
                            capture_output=True, text=True, timeout=1800)
    outcomes = {}
    for line in (result.stderr + result.stdout).splitlines():
        match = OUTCOME.match(line.strip())
        if not match:
            continue
        name = f"{match.group(2)}.{match.group(1)}" if not match.group(2).endswith(match.group(1)) else match.group(2)
        text = match.group(3)
        if text.startswith("ok"):
            outcomes[name] = "ok"
        elif text.startswith("skipped"):
            outcomes[name] = "skipped"
        elif "FAIL" in text:
            outcomes[name] = "FAIL"
        elif "ERROR" in text:
            outcomes[name] = "ERROR"
    summary = [line for line in result.stderr.splitlines() if line.startswith(("Ran ", "OK", "FAILED"))]
    print(f"{label}: {' '.join(summary)} (exit {result.returncode})")
    print_counts(label, outcomes)
    return outcomes, result


def print_counts(label, outcomes, source=""):
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("ok", "FAIL", "ERROR", "skipped")}
    print(f"{label}: {counts['ok']} ok, {counts['FAIL']} failed, {counts['ERROR']} errors, {counts['skipped']} skipped"
          f"{source}")


def earlier_baseline(modules):
    """The default manager's outcomes of `modules` from CUEMM_COMPARE_BASELINE,
    where that run covered every one of them; else None (run it here)."""
    path = os.environ.get("CUEMM_COMPARE_BASELINE")
    if not path or not os.path.exists(path):
        return None
    with open(path) as source:
        saved = json.load(source)
    def within(name, module):
        return name == module or name.startswith(module + ".")
    if not all(any(within(module, covered) for covered in saved["modules"]) for module in modules):
        return None
    outcomes = {name: outcome for name, outcome in saved["outcomes"].items()
                if any(within(name, module) for module in modules)}
    print_counts("default", outcomes, f" (from the earlier run in {path})")
    return outcomes


def main():
    cuemm_path = sys.argv[1]
    modules = sys.argv[2:] or DEFAULT_MODULES
    with tempfile.TemporaryDirectory() as shims:
        for path, text in WORKAROUNDS.items():
            os.makedirs(os.path.dirname(os.path.join(shims, path)), exist_ok=True)
            with open(os.path.join(shims, path), "w") as out:
                out.write(text)
        base = dict(os.environ)
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [shims, base.get("PYTHONPATH", "")]))
        base.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
        default = earlier_baseline(modules)
        if default is None:
            default, _ = run("default", base, modules)
            if os.environ.get("CUEMM_COMPARE_SAVE_BASELINE"):
                with open(os.environ["CUEMM_COMPARE_SAVE_BASELINE"], "w") as out:
                    json.dump({"modules": modules, "outcomes": default}, out)
        with_cuemm = dict(base, NUMBA_CUDA_MEMORY_MANAGER="cuemm",
                          PYTHONPATH=os.pathsep.join([cuemm_path, base["PYTHONPATH"]]))
        cuemm, cuemm_run = run("cuemm", with_cuemm, modules)
        # Only the pool can give a raw handle of offset 0 (CUEMM_POOL_DEDICATED_SIZE=0); the
        # async manager's blocks have no driver handle at all, only cuemm's (docs/ipc-offsets.md).
        pool = os.environ.get("CUEMM_MEMORY_MANAGER", "pool") == "pool"
        raw_handle_tests = [name for name in RAW_HANDLE_TESTS if name in cuemm] if pool else []
        dedicated = {}
        if raw_handle_tests:
            dedicated, _ = run("cuemm, CUEMM_POOL_DEDICATED_SIZE=0", dict(with_cuemm, **RAW_HANDLE_SETTING),
                               raw_handle_tests)
    worse = sorted(name for name, outcome in cuemm.items()
                   if outcome in ("FAIL", "ERROR") and default.get(name) in ("ok", "skipped"))
    better = sorted(name for name, outcome in cuemm.items()
                    if outcome == "ok" and default.get(name) in ("FAIL", "ERROR"))
    skipped_only_with_cuemm = sorted(name for name, outcome in cuemm.items()
                                     if outcome == "skipped" and default.get(name) == "ok")
    documented = [name for name in worse if name in RAW_HANDLE_TESTS]
    undocumented = [name for name in worse if name not in RAW_HANDLE_TESTS]
    dedicated_failures = [name for name in raw_handle_tests if dedicated.get(name) != "ok"]
    print(f"difference: {len(undocumented)} fail or error only under cuemm"
          f" (and {len(documented)} raw-handle test(s), docs/ipc-offsets.md), {len(better)} pass only under cuemm, "
          f"{len(skipped_only_with_cuemm)} skipped only under cuemm (Numba skips some tests for any external manager)")
    if pool:
        print(f"raw-handle tests with CUEMM_POOL_DEDICATED_SIZE=0: "
              f"{len(raw_handle_tests) - len(dedicated_failures)} of {len(raw_handle_tests)} pass")
    else:
        print("raw-handle tests: not run again (this manager's blocks have no driver IPC handle)")
    for name in undocumented:
        print(f"  worse under cuemm: {name}")
    for name in documented:
        why = "passes with CUEMM_POOL_DEDICATED_SIZE=0" if pool else "this manager has no driver handle"
        print(f"  worse under cuemm, documented ({why}): {name}")
    for name in dedicated_failures:
        print(f"  fails even with CUEMM_POOL_DEDICATED_SIZE=0: {name}")
    for name in skipped_only_with_cuemm:
        print(f"  skipped under cuemm: {name}")
    if undocumented:
        tail = "\n".join(cuemm_run.stderr.splitlines()[-80:])
        print(tail)
    return 1 if undocumented or dedicated_failures or not cuemm else 0


if __name__ == "__main__":
    sys.exit(main())
