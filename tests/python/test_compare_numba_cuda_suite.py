"""tests/numba/compare_numba_cuda_suite.py decides whether numba-cuda's suite passes under cuemm on the
GPU machine: what it misreads there, no run of it shows."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "numba"))

import compare_numba_cuda_suite as suite  # noqa: E402

MODULES = ["numba.cuda.tests.cudapy.test_a", "numba.cuda.tests.cudapy.test_b"]


def test_outcomes_are_read_even_where_a_test_wrote_between_its_name_and_its_outcome():
    output = "\n".join([
        "test_one (numba.cuda.tests.cudapy.test_a.TestA.test_one) ... ok",
        "test_two (numba.cuda.tests.cudapy.test_a.TestA.test_two) ... /x/warnings.py:9: NumbaPerformanceWarning: low occupancy",
        "  warn(NumbaPerformanceWarning(msg))",
        "ok",
        "test_three (numba.cuda.tests.cudapy.test_a.TestA) ... skipped 'no second GPU'",
        "test_four (numba.cuda.tests.cudapy.test_b.TestB.test_four) ... expected failure",
        "ok",  # not test_four's: an expected failure has its outcome already
        "test_five (numba.cuda.tests.cudapy.test_b.TestB.test_five) ... ERROR",
        "test_six (numba.cuda.tests.cudapy.test_b.TestB.test_six) ... ",
        "FAIL",
        "test_seven (numba.cuda.tests.cudapy.test_b.TestB.test_seven) ... ",  # the process died in it
    ])
    assert suite.parse_outcomes(output) == {
        "numba.cuda.tests.cudapy.test_a.TestA.test_one": "ok",
        "numba.cuda.tests.cudapy.test_a.TestA.test_two": "ok",
        "numba.cuda.tests.cudapy.test_a.TestA.test_three": "skipped",
        "numba.cuda.tests.cudapy.test_b.TestB.test_five": "ERROR",
        "numba.cuda.tests.cudapy.test_b.TestB.test_six": "FAIL",
    }


def test_a_run_under_cuemm_that_died_halfway_is_not_a_pass():
    default = {f"numba.cuda.tests.cudapy.test_a.T.test_{i}": "ok" for i in range(4)}
    cuemm = {name: outcome for name, outcome in list(default.items())[:2]}
    worse, missing, better, skipped = suite.compare(default, cuemm, MODULES)
    assert missing == sorted(list(default)[2:])
    assert (worse, better, skipped) == ([], [], [])


def test_an_error_that_only_cuemm_has_counts_though_the_default_run_never_named_the_test():
    default = {"numba.cuda.tests.cudapy.test_a.T.test_x": "ok",
               "unittest.loader._FailedTest.test_b": "ERROR"}  # numba-cuda's own, in both runs
    cuemm = dict(default, **{"unittest.loader._FailedTest.test_a": "ERROR"})
    worse, missing, _, _ = suite.compare(default, cuemm, MODULES)
    assert worse == ["unittest.loader._FailedTest.test_a"]
    assert missing == []


def test_the_same_failures_skips_and_passes_make_no_difference():
    default = {"numba.cuda.tests.cudapy.test_a.T.test_ok": "ok",
               "numba.cuda.tests.cudapy.test_a.T.test_fails": "FAIL",
               "numba.cuda.tests.cudapy.test_b.T.test_errs": "ERROR",
               "numba.cuda.tests.cudapy.test_b.T.test_skipped": "skipped"}
    assert suite.compare(default, dict(default), MODULES) == ([], [], [], [])
    cuemm = dict(default, **{"numba.cuda.tests.cudapy.test_a.T.test_fails": "ok",
                             "numba.cuda.tests.cudapy.test_a.T.test_ok": "skipped"})
    assert suite.compare(default, cuemm, MODULES) == (
        [], [], ["numba.cuda.tests.cudapy.test_a.T.test_fails"], ["numba.cuda.tests.cudapy.test_a.T.test_ok"])


def test_a_saved_baseline_gives_the_modules_asked_for_and_the_tests_that_no_module_names(tmp_path, monkeypatch):
    saved = tmp_path / "baseline.json"
    saved.write_text(suite.json.dumps({
        "modules": MODULES,
        "outcomes": {"numba.cuda.tests.cudapy.test_a.T.test_x": "ok",
                     "numba.cuda.tests.cudapy.test_b.T.test_y": "ok",
                     "unittest.loader._FailedTest.test_c": "ERROR"}}))
    monkeypatch.setenv("CUEMM_COMPARE_BASELINE", str(saved))
    assert suite.earlier_baseline(["numba.cuda.tests.cudapy.test_a"]) == {
        "numba.cuda.tests.cudapy.test_a.T.test_x": "ok", "unittest.loader._FailedTest.test_c": "ERROR"}
    assert suite.earlier_baseline(["numba.cuda.tests.cudapy.test_other"]) is None  # not in that run
