#!/usr/bin/env bash
# One command that measures the judge on a GPU: at most 9 minutes on one H100, with only what the
# image has (torch with CUDA, Triton, pytest; no package registry: kernelrl runs from this checkout
# through PYTHONPATH, bubblewrap comes from the .deb beside this script when bwrap is missing).
#
#   bash benchmarks/gpu_check.sh OUT [--kernelbench DIR] [--cuda-l1 PATH] [--budget SECONDS] [--dry-run]
#                                    [--steps NAME,NAME] [--limit NAME=SECONDS]...
#
# --steps runs only the named steps (the others are recorded as skipped); --limit replaces a step's
# own limit. Together they let a second command on a still-warm machine finish the steps the first
# one cut, e.g. --steps cuda_l1,throughput --limit cuda_l1=300.
#
# KernelBench and CUDA-L1's published kernels are data the user brings: --kernelbench (or
# $KERNELBENCH) names a KernelBench checkout, --cuda-l1 (or $CUDA_L1) the published kernels
# (optimized_cuda_code/h100.json); without one, its step writes a line saying it was skipped.
#
# Steps, most valuable first, each under its own time limit (clipped to what is left of --budget,
# 540 s by default; a step with under 5 s left is skipped and says so):
#   env         environment and clocks (gpu_env.py)                                  -> env.txt
#   floor       the per-call floor of the worker's timing bracket (call_floor.py)    -> floor.jsonl
#   workers     a CPU worker's start per containment level, forked or spawned       -> log.txt
#               (worker_start.py: whether this machine forks the judge's CPU workers)
#   aa          A/A: the reference against copies of itself on 2 tasks (calibrate)   -> log.txt
#   kernelbench a KernelBench level-1 sample, eager and torch.compile baselines      -> kernelbench.json
#   cuda_l1     a sample of CUDA-L1's H100 kernels re-timed                          -> cuda_l1.json
#   throughput  evaluations per hour, one task's six candidates judged one by one,   -> log.txt
#               with kept reference workers and without (eval_throughput.py)
#   streams     side-stream, second-context, event and graph tests (pytest, gpu)     -> tests.jsonl
#   gpu_tests   every other gpu-marked test                                          -> tests.jsonl
# The measurements come before the tests: the 2026-11-26 lease spent its first 100 s on the tests'
# cold nvcc builds and then cut every measuring step before it printed a row. Each measuring
# script prints (and writes its JSON) row by row, so a step cut by its limit keeps what it finished.
# OUT gets at most 8 files, each appended to as results end: env.txt, steps.jsonl (one line per step:
# name, limit, seconds, exit code, timed_out, skipped and why, the lowest MemAvailable while it ran,
# OOM kills meanwhile; a step ended by a signal before its limit says so, with the kernel's log in
# log.txt), tests.jsonl (one line per test, written by
# gpu_check_plugin.py as each test ends), log.txt (every step's output), floor.jsonl,
# kernelbench.json and cuda_l1.json (rewritten by those scripts as each row lands).
#
# --dry-run: on a CPU, every step starts with tiny CPU settings and stops within its own short
# limit ($GPU_CHECK_DRY_LIMIT, 20 s by default); a step cut by its limit is recorded as timed_out.
# tests/test_gpu_check.py runs it. Nothing is claimed from a dry run's figures.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
DRY=0
BUDGET=540
KB=${KERNELBENCH:-}
CL1=${CUDA_L1:-}
ONLY=""
declare -A LIMITS=()
ALL_STEPS=" env floor workers aa kernelbench cuda_l1 throughput streams gpu_tests "
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --kernelbench) KB=$2; shift ;;
        --cuda-l1) CL1=$2; shift ;;
        --budget) BUDGET=$2; shift ;;
        --steps) ONLY=" ${2//,/ } "; shift ;;
        --limit)
            [[ "$2" =~ ^([a-z_0-9]+)=([0-9]+)$ ]] || { echo "gpu_check: --limit takes NAME=SECONDS, not '$2'" >&2; exit 2; }
            LIMITS[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
        -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
        *) [ -z "$OUT" ] || { echo "gpu_check: one output folder only" >&2; exit 2; }; OUT=$1 ;;
    esac
    shift
done
[ -n "$OUT" ] || { echo "usage: gpu_check.sh OUT [--kernelbench DIR] [--cuda-l1 PATH] [--budget S] [--dry-run] [--steps A,B] [--limit NAME=S]" >&2; exit 2; }
for name in $ONLY "${!LIMITS[@]}"; do
    [[ "$ALL_STEPS" == *" $name "* ]] || { echo "gpu_check: no step named '$name' (steps:$ALL_STEPS)" >&2; exit 2; }
done
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
STEPS=$OUT/steps.jsonl
export GPU_CHECK_TESTS=$OUT/tests.jsonl
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
export PYTHONPATH="$ROOT:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export KERNELRL_CACHE=${KERNELRL_CACHE:-$WORK/cache}
# The tests' build cache (tests/conftest.py) is the scripts' one: a CUDA source built once (a cold
# nvcc build took 52 s on the 2026-11-26 H100) serves every later step, and every process shares
# the one device lock under it (locks/cuda-0.lock), so parallel tests overlap builds, not timing.
export KERNELRL_TEST_CACHE=${KERNELRL_TEST_CACHE:-$KERNELRL_CACHE}
export PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=$((START + BUDGET))
DRY_LIMIT=${GPU_CHECK_DRY_LIMIT:-20}

if [ "$DRY" = 1 ]; then
    DEV=cpu; SIZE=small; QUICK=--quick
else
    DEV=cuda; SIZE=full; QUICK=
fi

note() { echo "gpu_check: $*" | tee -a "$LOG" >&2; }

# A step's line in steps.jsonl. Every value is a number or a word this script chose. The last two
# say what the step left of the machine's memory: the lowest MemAvailable sampled while it ran, and
# how many processes the kernel's OOM killer ended meanwhile (/proc/vmstat's oom_kill): the
# 2026-11-30 lease's cuda_l1 step died by SIGKILL 19 s before its limit and nothing recorded why.
record() {  # name limit seconds rc timed_out skipped reason [min_mem_available_gib oom_kills]
    printf '{"step": "%s", "limit_s": %s, "seconds": %s, "rc": %s, "timed_out": %s, "skipped": %s, "reason": "%s", "min_mem_available_gib": %s, "oom_kills": %s}\n' \
        "$1" "$2" "$3" "$4" "$5" "$6" "$7" "${8:-null}" "${9:-null}" >> "$STEPS"
}

oom_kills() { awk '$1 == "oom_kill" { print $2; found = 1 } END { if (!found) print "null" }' /proc/vmstat 2>/dev/null || echo null; }

# MemAvailable (KiB) every half second into FILE until killed.
sample_memory() {  # file
    while :; do
        awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo 2>/dev/null >> "$1"
        sleep 0.5
    done
}

# A step --steps did not name: recorded as skipped and nothing else. True when it was not named.
unselected() {  # name
    [ -n "$ONLY" ] && [[ "$ONLY" != *" $1 "* ]] || return 1
    record "$1" 0 0 null false true "not in --steps"
}

run_step() {  # name limit command...
    local name=$1 limit=$2 left t0 t1 rc timed_out
    shift 2
    unselected "$name" && return
    [ -n "${LIMITS[$name]:-}" ] && limit=${LIMITS[$name]}
    [ "$DRY" = 1 ] && limit=$DRY_LIMIT
    left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        note "step $name skipped: ${left}s of the budget left"
        record "$name" "$limit" 0 null false true "budget spent"
        return
    fi
    echo "=== step $name, limit ${limit}s, $(date -u +%Y-%m-%dT%H:%M:%SZ): $*" >> "$LOG"
    local mem=$WORK/mem.$name oom0 oom1 sampler min_gib seconds reason=""
    oom0=$(oom_kills)
    : > "$mem"
    sample_memory "$mem" &
    sampler=$!
    t0=$(date +%s.%N)
    # timeout signals the step's whole process group (workers included); KILL 5 s after TERM.
    GPU_CHECK_STEP=$name timeout --kill-after=5 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    oom1=$(oom_kills)
    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    min_gib=$(sort -n "$mem" | head -n 1 | awk '{ printf "%.1f", $1 / 1048576 }')
    # 124: timeout ended the step at its limit; 137 is that too only once the limit has passed (the
    # step ignored TERM), else something else sent SIGKILL (timeout then dies by the same signal).
    timed_out=false
    if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && awk -v s="$seconds" -v l="$limit" 'BEGIN { exit !(s >= l) }'; }; then
        timed_out=true
    elif [ "$rc" -gt 128 ]; then
        reason="ended by signal $((rc - 128)) before its limit"
        { echo "=== step $name ended by signal $((rc - 128)); MemAvailable now $(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo) kB, OOM kills ${oom0} -> ${oom1}; the kernel's log:"
          dmesg 2>&1 | tail -n 30; } >> "$LOG"
    fi
    [ "$oom0" != null ] && [ "$oom1" != null ] && oom1=$((oom1 - oom0)) || oom1=null
    record "$name" "$limit" "$seconds" "$rc" "$timed_out" false "$reason" "${min_gib:-null}" "$oom1"
    echo "=== step $name: rc $rc, timed_out $timed_out${reason:+, $reason}" >> "$LOG"
}

skip_step() {  # name reason
    unselected "$1" && return
    note "step $1 skipped: $2"
    record "$1" 0 0 null false true "$2"
}

# bubblewrap from the .deb beside this script where bwrap is missing (no registry needed).
if ! command -v bwrap >/dev/null 2>&1; then
    deb=$(ls "$ROOT"/benchmarks/bubblewrap_*.deb 2>/dev/null | head -n 1)
    if [ -n "$deb" ]; then
        mkdir -p "$WORK/deb"
        if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$deb" "$WORK/deb"
        else
            "$PYTHON" "$ROOT/benchmarks/gpu_env.py" --extract-deb "$deb" "$WORK/deb"
        fi
        if [ -x "$WORK/deb/usr/bin/bwrap" ] && "$WORK/deb/usr/bin/bwrap" --version >/dev/null 2>&1; then
            export PATH="$WORK/deb/usr/bin:$PATH"
            note "bwrap from $(basename "$deb") put on PATH"
        else
            note "bwrap from $(basename "$deb") does not run here; workers will be less than fully contained"
        fi
    else
        note "no bwrap and no bubblewrap .deb; workers will be less than fully contained"
    fi
fi

if [ "$DRY" = 1 ]; then
    STREAM_TESTS=(tests/judge/test_worker_cuda.py)
else
    # pytest runs node ids in the order given: the torch-level ones (no build) first.
    STREAM_TESTS=(tests/judge/test_worker_cuda.py)
    for f in side_stream_cuda current_stream_switched_cuda cuda_event_disable_timing cuda_event_timer_patch \
             cuda_graph_stale_replay precision_flags_cuda freed_memory_cuda second_context_cuda \
             sync_patched_side_stream_cuda token_paste_stream_cuda cpp_pool_stream_cuda; do
        [ -f "$ROOT/tests/fixtures/redteam/$f.py" ] && STREAM_TESTS+=("tests/checks/test_redteam.py::test_redteam_dynamic_defences_alone[$f]")
    done
fi
PYTEST=("$PYTHON" -m pytest -p gpu_check_plugin -p no:cacheprovider -q -rA)
# pytest-xdist (in the GPU image) runs the gpu tests 8 at a time: their cold builds overlap on the
# machine's cores while the device lock keeps timing one group at a time. Not in a dry run (2 cores).
if [ "$DRY" = 0 ] && "$PYTHON" -c "import xdist" >/dev/null 2>&1; then
    PYTEST+=(-n 8)
fi

cd "$ROOT" || exit 2
run_step env 30 bash -c 'set -o pipefail; "$0" benchmarks/gpu_env.py "$1" | tee "$2"' "$PYTHON" "$DEV" "$OUT/env.txt"
run_step floor 25 "$PYTHON" benchmarks/call_floor.py --device "$DEV" --n "$([ "$DRY" = 1 ] && echo 200 || echo 2000)" \
    --json "$OUT/floor.jsonl"
run_step workers 40 "$PYTHON" benchmarks/worker_start.py --n 2
# At --size small one A/A group took 44-57 s on the H100 (2026-11-27: reference load 8 s, checks 8 s,
# 400 rounds 9 s, spot checks of its trusted copies 7.6 s, no longer made); at full size no run
# ended within 80 s. The 2026-11-27 lease's full-size KernelBench baseline took 77 s (a 3D
# convolution with torch.compile), no CUDA-L1 kernel of 6 was judged in 130 s, and 12 candidates
# (two hang for their 20 s limit) did not end in 50 s: hence 3 kernels and one task's six candidates.
run_step aa 100 "$PYTHON" benchmarks/calibrate_tasks.py --device "$DEV" --size small --runs 1 --tolerance 0.02 \
    --tasks level1/softmax level1/rmsnorm $QUICK
if [ -n "$KB" ] && [ -d "$KB" ]; then
    run_step kernelbench 120 "$PYTHON" benchmarks/kernelbench_gpu.py "$KB" --device "$DEV" --size "$SIZE" --levels 1 \
        --sample "$([ "$DRY" = 1 ] && echo 1 || echo 3)" --no-examples --concurrency 8 $QUICK \
        $([ "$DRY" = 1 ] && echo --no-compile) --json "$OUT/kernelbench.json"
else
    skip_step kernelbench "no KernelBench checkout: pass --kernelbench DIR or set KERNELBENCH"
fi
if [ -n "$CL1" ] && [ -e "$CL1" ]; then
    run_step cuda_l1 150 "$PYTHON" benchmarks/cuda_l1_retime.py "$CL1" --device "$DEV" --size "$SIZE" \
        --sample "$([ "$DRY" = 1 ] && echo 1 || echo 3)" --seed 0 --concurrency 8 $QUICK --json "$OUT/cuda_l1.json"
else
    skip_step cuda_l1 "no CUDA-L1 kernels: pass --cuda-l1 PATH or set CUDA_L1"
fi
# One by one, each candidate is a group of its own: the kept reference worker (EvalConfig.kept_references)
# spares every group after the first the reference's load (8 s on the 2026-11-27 H200, CUDA's start
# included), and 0 shows what that is worth. The batched path's figure is the fourth lease's.
run_step throughput 150 "$PYTHON" benchmarks/eval_throughput.py --device "$DEV" --only pytorch --paths one \
    --kept-references 8,0 --timeout 10 --limit 1
run_step streams 100 "${PYTEST[@]}" -m gpu "${STREAM_TESTS[@]}"
DESELECT=()
for t in "${STREAM_TESTS[@]}"; do DESELECT+=(--deselect "$t"); done
run_step gpu_tests 600 "${PYTEST[@]}" -m gpu tests "${DESELECT[@]}"

note "done in $(($(date +%s) - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
