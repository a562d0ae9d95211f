"""Runs numba-cuda's own test suite twice, with Numba's default memory manager
and with NUMBA_CUDA_MEMORY_MANAGER=cuemm, and prints both summaries and every
test whose outcome differs. Exits non-zero if a test fails or errors under
cuemm that does not under the default, or never ends under cuemm (its process
died or stopped first) where it passed or was skipped under the default. The
exception: the tests that open raw IPC handles without their offset
(docs/ipc-offsets.md), which run again with CUEMM_POOL_DEDICATED_SIZE=0 and
must pass there.

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
# What unittest's verbose runner writes on a line of its own where the test wrote
# something (a warning on stderr, say) after its name.
LATE_OUTCOME = re.compile(r"^(ok|FAIL|ERROR|skipped\b.*)$")


def outcome_of(text):
    if text.startswith("ok"):
        return "ok"
    if text.startswith("skipped"):
        return "skipped"
    if "FAIL" in text:
        return "FAIL"
    if "ERROR" in text:
        return "ERROR"
    return None


def parse_outcomes(output):
    """Each test's outcome (ok, skipped, FAIL or ERROR) from unittest's verbose output, by
    module.Class.test name. Expected failures are left out, as are tests whose run never
    ended (the process died in them)."""
    outcomes = {}
    pending = None  # a test named without its outcome yet
    for line in output.splitlines():
        line = line.strip()
        match = OUTCOME.match(line)
        if match:
            name = f"{match.group(2)}.{match.group(1)}" if not match.group(2).endswith(match.group(1)) else match.group(2)
            outcome = outcome_of(match.group(3))
            if outcome:
                outcomes[name] = outcome
            pending = None if outcome or match.group(3).startswith("expected failure") else name
        elif pending and LATE_OUTCOME.match(line):
            outcomes[pending] = outcome_of(line)
            pending = None
    return outcomes


def run(label, environment, modules):
    result = subprocess.run([sys.executable, "-m", "numba.runtests", "-v", *modules], env=environment,
                            capture_output=True, text=True, timeout=1800)
    outcomes = parse_outcomes(result.stderr + "\n" + result.stdout)
    summary = [line for line in result.stderr.splitlines() if line.startswith(("Ran ", "OK", "FAILED"))]
    print(f"{label}: {' '.join(summary)} (exit {result.returncode})")
    print_counts(label, outcomes)
    return outcomes, result


def print_counts(label, outcomes, source=""):
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("ok", "FAIL", "ERROR", "skipped")}
    print(f"{label}: {counts['ok']} ok, {counts['FAIL']} failed, {counts['ERROR']} errors, {counts['skipped']} skipped"
          f"{source}")


def within(name, module):
    return name == module or name.startswith(module + ".")


def compare(default, cuemm, modules):
    """How the run under cuemm differs from the default manager's, as four sorted lists:
    - worse: failed or erred under cuemm, and did not under the default manager (a test the
      default run never reached counts: a module that cannot even be loaded under cuemm);
    - missing: of `modules`, passed or was skipped under the default manager and has no
      outcome under cuemm (its process died or stopped before it: a crash is no pass);
    - better: passed under cuemm, failed or erred under the default manager;
    - skipped only under cuemm: skipped there, passed under the default manager."""
    worse = sorted(name for name, outcome in cuemm.items()
                   if outcome in ("FAIL", "ERROR") and default.get(name) not in ("FAIL", "ERROR"))
    missing = sorted(name for name, outcome in default.items()
                     if outcome in ("ok", "skipped") and name not in cuemm
                     and any(within(name, module) for module in modules))
    better = sorted(name for name, outcome in cuemm.items()
                    if outcome == "ok" and default.get(name) in ("FAIL", "ERROR"))
    skipped_only_with_cuemm = sorted(name for name, outcome in cuemm.items()
                                     if outcome == "skipped" and default.get(name) == "ok")
    return worse, missing, better, skipped_only_with_cuemm


def earlier_baseline(modules):
    """The default manager's outcomes of `modules` from CUEMM_COMPARE_BASELINE,
    where that run covered every one of them; else None (run it here)."""
    path = os.environ.get("CUEMM_COMPARE_BASELINE")
    if not path or not os.path.exists(path):
        return None
    with open(path) as source:
        saved = json.load(source)
    if not all(any(within(module, covered) for covered in saved["modules"]) for module in modules):
        return None
    outcomes = {name: outcome for name, outcome in saved["outcomes"].items()
                if any(within(name, module) for module in modules)}
    print_counts("default", outcomes, f" (from the earlier run in {path})")
    # Outcomes named outside every module of that run (unittest's loader names a module it
    # could not load so) are kept too, but not counted: which module they stand for is unknown.
    outcomes.update({name: outcome for name, outcome in saved["outcomes"].items()
                     if not any(within(name, module) for module in saved["modules"])})
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
    worse, missing, better, skipped_only_with_cuemm = compare(default, cuemm, modules)
    documented = [name for name in worse if name in RAW_HANDLE_TESTS]
    undocumented = [name for name in worse if name not in RAW_HANDLE_TESTS]
    dedicated_failures = [name for name in raw_handle_tests if dedicated.get(name) != "ok"]
    print(f"difference: {len(undocumented)} fail or error only under cuemm"
          f" (and {len(documented)} raw-handle test(s), docs/ipc-offsets.md), {len(missing)} never ended under cuemm, "
          f"{len(better)} pass only under cuemm, "
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
    for name in missing[:20]:
        print(f"  never ended under cuemm: {name}")
    if len(missing) > 20:
        print(f"  ... and {len(missing) - 20} more")
    if undocumented or missing:
        tail = "\n".join(cuemm_run.stderr.splitlines()[-80:])
        print(tail)
    return 1 if undocumented or missing or dedicated_failures or not cuemm else 0


if __name__ == "__main__":
    sys.exit(main())
