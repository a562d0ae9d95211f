# Sourced by scripts/gpu-check.sh and scripts/fragmentation-seeds.sh: the
# one-thread workloads whose seeds both report, and how both read
# `cuemm random`'s figures, so that the quick run and the GPU check measure
# the same thing. (Its readers are checked by
# tests/scripts/check_fragmentation_failures.sh.)

# Workloads run seed by seed: RMM's random workload at several sizes and
# live sets (the smaller ones where segment boundaries cost most), and the
# programs' patterns (a queue freed oldest first: up to 1 MiB, 200 deep, and
# up to 4 MiB, 100 deep).
seed_workloads=("--max-size 4M --live 512M" "--max-size 1M --live 512M" "--max-size 256K --live 64M"
                "--max-size 64M --live 256M" "--max-size 4M --live 128M" "--pattern training"
                "--pattern training --shapes per-layer" "--pattern temporaries" "--pattern inference"
                "--pattern queue" "--pattern queue --max-size 4M --depth 100")
# `cuemm random`'s length for a workload: RMM's runs 20,000 operations; the patterns have their own.
length_of() { case "$1" in --pattern*) ;; *) echo --operations 20000 ;; esac; }
# The reserved/live figures of `cuemm random` or `cuemm replay` output on stdin.
reserved_over_live() { grep -o 'reserved/live [0-9.]*' | cut -d' ' -f2; }
# The same for one run, or "failed" where it printed none (a seed that fails must not just vanish from a mean).
reserved_over_live_or_failed() { local ratio; ratio=$(reserved_over_live); echo "${ratio:-failed}"; }
# The best fit's figure that a manager's run prints under its own ("... 1.063 of its peak live"), or "failed".
same_order_reference_or_failed() {
  local ratio; ratio=$(grep -o '[0-9.]* of its peak live' | cut -d' ' -f1); echo "${ratio:-failed}"
}
# The runs of a fragmentation report (gpu-check's bench_fragmentation.txt, on stdin: "== WORKLOAD,
# MANAGER" then the run's output) that printed no reserved/live, one a line, and each line of seeds
# with one that failed. A run left out for the deadline ("== ...: not run") is no failure.
# (tests/scripts/check_fragmentation_failures.sh)
fragmentation_failures() {
  awk 'function close_run() { if (run != "" && !seen) print run; run = "" }
       /^== seeds / { close_run(); if (/:.* failed( |$)/) print substr($0, 4); next }
       /^== .*: not run/ { close_run(); next }
       /^== / { close_run(); run = substr($0, 4); seen = 0; next }
       /reserved\/live/ { seen = 1 }
       END { close_run() }'
}
