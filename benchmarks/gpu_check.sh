#!/usr/bin/env bash
# One command that measures what an RL run needs of the judge on one GPU, in 420 s of steps (a lent
# machine gives 15 minutes in all: its start, this command, and a second command that finishes what
# this one cut), with only what the image has (torch with CUDA, Triton, pytest; no package registry:
# kernelrl runs from this checkout through PYTHONPATH, bubblewrap comes from the .deb beside this
# script when bwrap is missing, unpacked under OUT). It installs nothing.
#
#   bash benchmarks/gpu_check.sh OUT [--data DIR] [--cache DIR] [--budget SECONDS] [--dry-run | --rehearse]
#                                    [--steps NAME,NAME] [--limit NAME=SECONDS]...
#   bash benchmarks/gpu_check.sh --prepare DIR --cuda-l1 FILE [--kernelbench CHECKOUT]   (here, before a lease)
#
# Data the user brings (never shipped): CUDA-L1's published kernels (optimized_cuda_code/h100.json,
# each entry a KernelBench problem and its kernel) and, for the optional kernelbench step, a
# KernelBench checkout. `--prepare DIR` copies them into DIR (default .gpu-data, ignored by git) and
# checks that every entry the steps name is there; DIR is then carried to the lent machine (the
# device tool's `carry`), where `--data DIR` (default .gpu-data when it exists) finds them.
#
# Writes: OUT (results; its .work folder, the temporary files every step makes, workers' folders
# included, is removed at the end) and the build cache (--cache, default .gpu-cache, or
# $KERNELRL_CACHE), which is kept: a second command on the same machine reuses its CUDA, Triton and
# extension builds. Nothing else: TMPDIR points into OUT/.work and no bytecode is written.
#
# Steps of the plan, most valuable first, each under its own limit (clipped to what is left of
# --budget, 420 s by default; a step with under 5 s left is skipped and says so):
#   env     environment, clocks, device memory (gpu_env.py)                                  -> env.txt
#   floor   the per-call floor of the worker's timing bracket (call_floor.py)                -> floor.jsonl
#   batch   the realistic batch: 4 KernelBench level-1/2 tasks at full size x 8 candidates     -> log.txt
#           (published CUDA, a second build, Triton, PyTorch, wrong, raising, one hanging),
#           evaluations/hour cold, then warm, with the phase split (eval_throughput.py)
#   spread  identical code at three kernel lengths (~0.05, ~0.4, ~3 ms): 3 copies each in one   -> log.txt
#           group, their spread (identical_paid.py --numel)
#   level1  five level-1 tasks at full size with CUDA-L1's kernels, a GEMM and elementwise ops  -> cuda_l1.json
#   hacks   the CUDA hack fixtures under the judge (side stream, second context, graph replay,  -> tests.jsonl
#           event-timer patch, patched synchronise, freed memory; the persisting-L2 carveout emptied)
# Optional steps, run only when --steps names them: workers (a CPU worker's start per containment
# level), aa (A/A on 2 tasks), kernelbench (3 level-1 tasks, eager and compile baselines: needs a
# KernelBench checkout), throughput (the built-in PyTorch half one by one), gpu_tests (every other
# gpu-marked test; longer than any budget).
# Every step's line in steps.jsonl also says the lowest MemAvailable and the highest device memory in
# use (nvidia-smi, sampled every 0.5 s) while it ran, and the OOM killer's kills meanwhile.
#
# --dry-run prints the plan (each step, its limit, its command, whether its data is here) and the
# budget it fits, runs nothing, and exits 3 when the limits exceed the budget. --rehearse runs every
# step on a CPU with tiny settings, each within $GPU_CHECK_DRY_LIMIT seconds (20 by default):
# tests/test_gpu_check.py does. Nothing is claimed from a rehearsal's figures.
# OUT gets at most 8 files: env.txt, steps.jsonl, tests.jsonl, log.txt, floor.jsonl, cuda_l1.json,
# kernelbench.json (each appended or rewritten as results land, so a step cut by its limit keeps
# what it finished).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
MODE=run
BUDGET=420
DATA=""
PREPARE=""
CACHE=${KERNELRL_CACHE:-}
KB=${KERNELBENCH:-}
CL1=${CUDA_L1:-}
ONLY=""
declare -A LIMITS=()
PLAN_STEPS="env floor batch spread level1 hacks"
OPTIONAL_STEPS="workers aa kernelbench throughput gpu_tests"  # run only when --steps names them
ALL_STEPS=" $PLAN_STEPS $OPTIONAL_STEPS "
# The batch's tasks and the level-1 step's, by entry name in CUDA-L1's file.
BATCH_TASKS=level1/28,level1/48,level1/13,level2/54
LEVEL1_TASKS="level1/3 level1/32 level1/23 level1/42 level1/88"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) MODE=plan ;;
        --rehearse) MODE=rehearse ;;
        --prepare) PREPARE=${2:-}; MODE=prepare; shift ;;
        --data) DATA=$2; shift ;;
        --cache) CACHE=$2; shift ;;
        --kernelbench) KB=$2; shift ;;
        --cuda-l1) CL1=$2; shift ;;
        --budget)
            [[ "$2" =~ ^[0-9]+$ ]] || { echo "gpu_check: --budget takes whole seconds, not '$2'" >&2; exit 2; }
            BUDGET=$2; shift ;;
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
PYTHON=${PYTHON:-python3}

# --prepare: copy the user's data into one folder to carry, and check it holds what the steps name.
if [ "$MODE" = prepare ]; then
    [ -n "$PREPARE" ] || { echo "gpu_check: --prepare takes a folder" >&2; exit 2; }
    [ -n "$CL1" ] && [ -f "$CL1" ] || { echo "gpu_check: --prepare needs --cuda-l1 FILE (CUDA-L1's optimized_cuda_code/h100.json)" >&2; exit 2; }
    mkdir -p "$PREPARE" || exit 2
    cp "$CL1" "$PREPARE/h100.json" || exit 2
    if [ -n "$KB" ]; then
        [ -d "$KB/KernelBench/level1" ] || { echo "gpu_check: $KB is not a KernelBench checkout (no KernelBench/level1)" >&2; exit 2; }
        rm -rf "$PREPARE/KernelBench" && mkdir -p "$PREPARE/KernelBench" && cp -r "$KB/KernelBench/level1" "$KB/KernelBench/level2" "$PREPARE/KernelBench/" || exit 2
    fi
    PYTHONPATH="$ROOT" PYTHONDONTWRITEBYTECODE=1 "$PYTHON" - "$PREPARE/h100.json" "$BATCH_TASKS" "$LEVEL1_TASKS" <<'EOF' || exit 2
import sys
from kernelrl.checks.audit import read_entries
have = {e.name for e in read_entries(sys.argv[1]) if e.code and e.task is not None}
need = sys.argv[2].split(",") + sys.argv[3].split()
missing = [n for n in need if n not in have]
if missing:
    sys.exit(f"gpu_check: {sys.argv[1]} has no kernel with its task for {', '.join(missing)}")
print(f"gpu_check: {sys.argv[1]}: {len(have)} kernels with their tasks, every one the steps name among them")
EOF
    echo "gpu_check: prepared $PREPARE ($(du -sh "$PREPARE" | cut -f1)); carry it and pass --data $PREPARE"
    exit 0
fi

[ -n "$OUT" ] || { echo "usage: gpu_check.sh OUT [--data DIR] [--cache DIR] [--budget S] [--dry-run|--rehearse] [--steps A,B] [--limit NAME=S]" >&2; exit 2; }
for name in $ONLY "${!LIMITS[@]}"; do
    [[ "$ALL_STEPS" == *" $name "* ]] || { echo "gpu_check: no step named '$name' (steps:$ALL_STEPS)" >&2; exit 2; }
done
[ -z "$DATA" ] && [ -d "$ROOT/.gpu-data" ] && DATA=$ROOT/.gpu-data
if [ -n "$DATA" ]; then
    [ -d "$DATA" ] || { echo "gpu_check: --data $DATA is not a folder" >&2; exit 2; }
    [ -z "$CL1" ] && [ -f "$DATA/h100.json" ] && CL1=$DATA/h100.json
    [ -z "$KB" ] && [ -d "$DATA/KernelBench" ] && KB=$DATA
fi
CACHE=${CACHE:-$ROOT/.gpu-cache}

if [ "$MODE" = rehearse ]; then
    DEV=cpu; SIZE=small; QUICK=--quick; NUMEL=4096,65536,1048576
else
    DEV=cuda; SIZE=full; QUICK=; NUMEL=8388608,67108864,536870912
fi
# The steps: name, own limit, command. Which run is decided by --steps (the plan's steps when not given).
declare -A LIMIT=([env]=20 [floor]=15 [batch]=150 [spread]=45 [level1]=90 [hacks]=80
                  [workers]=40 [aa]=100 [kernelbench]=120 [throughput]=150 [gpu_tests]=600)
declare -A NEEDS=([batch]=CL1 [level1]=CL1 [kernelbench]=KB)
HACKS=()
for f in side_stream_cuda second_context_cuda cuda_graph_stale_replay cuda_event_timer_patch sync_patched_side_stream_cuda \
         freed_memory_cuda current_stream_switched_cuda; do
    [ -f "$ROOT/tests/fixtures/redteam/$f.py" ] && HACKS+=("tests/checks/test_redteam.py::test_redteam_dynamic_defences_alone[$f]")
done
HACKS+=("tests/judge/harness/test_worker_cuda.py::test_the_persisting_l2_carveout_is_empty_after_an_eviction")
PYTEST=("$PYTHON" -m pytest -p gpu_check_plugin -p no:cacheprovider -q -rA)
# pytest-xdist (in the GPU image) runs the gpu tests 8 at a time: their cold builds overlap on the
# machine's cores while the device lock keeps timing one group at a time. Not in a rehearsal (2 cores).
if [ "$MODE" != rehearse ] && "$PYTHON" -c "import xdist" >/dev/null 2>&1; then
    PYTEST+=(-n 8)
fi
command_of() {  # name -> the step's command, one word per line
    case "$1" in
        env) printf '%s\n' bash -c 'set -o pipefail; "$0" benchmarks/gpu_env.py "$1" | tee "$2"' "$PYTHON" "$DEV" "$OUT/env.txt" ;;
        floor) printf '%s\n' "$PYTHON" benchmarks/call_floor.py --device "$DEV" --n "$([ "$MODE" = rehearse ] && echo 200 || echo 2000)" --json "$OUT/floor.jsonl" ;;
        batch) printf '%s\n' "$PYTHON" benchmarks/eval_throughput.py --cuda-l1 "$CL1" --tasks "$BATCH_TASKS" --device "$DEV" --size "$SIZE" \
                   --only all --paths batched --warm --timeout 10 --cache-dir "$CACHE/throughput" ;;
        spread) printf '%s\n' "$PYTHON" benchmarks/identical_paid.py --numel "$NUMEL" --copies 3 --device "$DEV" --size "$SIZE" \
                    --max-timing-s 1.0 --cache-dir "$CACHE" ;;
        level1) printf '%s\n' "$PYTHON" benchmarks/cuda_l1_retime.py "$CL1" --device "$DEV" --size "$SIZE" --only $LEVEL1_TASKS \
                    --sample 5 --seed 0 --concurrency 8 $QUICK --cache-dir "$CACHE" --json "$OUT/cuda_l1.json" ;;
        hacks) printf '%s\n' "${PYTEST[@]}" -m gpu "${HACKS[@]}" ;;
        workers) printf '%s\n' "$PYTHON" benchmarks/worker_start.py --n 2 ;;
        aa) printf '%s\n' "$PYTHON" benchmarks/calibrate_tasks.py --device "$DEV" --size small --runs 1 --tolerance 0.02 \
                --tasks level1/softmax level1/rmsnorm $QUICK ;;
        kernelbench) printf '%s\n' "$PYTHON" benchmarks/kernelbench_gpu.py "$KB" --device "$DEV" --size "$SIZE" --levels 1 \
                         --sample "$([ "$MODE" = rehearse ] && echo 1 || echo 3)" --no-examples --concurrency 8 $QUICK \
                         $([ "$MODE" = rehearse ] && echo --no-compile) --json "$OUT/kernelbench.json" ;;
        throughput) printf '%s\n' "$PYTHON" benchmarks/eval_throughput.py --device "$DEV" --only pytorch --paths one \
                        --kept-references 8,0 --timeout 10 --limit 1 --cache-dir "$CACHE/throughput-builtin" ;;
        gpu_tests) local deselect=(); for t in "${HACKS[@]}"; do deselect+=(--deselect "$t"); done
                   printf '%s\n' "${PYTEST[@]}" -m gpu tests "${deselect[@]}" ;;
    esac
}
SELECTED=${ONLY:-" $PLAN_STEPS "}
missing_data() {  # name -> why its data is missing, or nothing
    case "${NEEDS[$1]:-}" in
        CL1) [ -n "$CL1" ] && [ -f "$CL1" ] || echo "no CUDA-L1 kernels: pass --data DIR (see --prepare), --cuda-l1 PATH or set CUDA_L1" ;;
        KB) [ -n "$KB" ] && [ -d "$KB" ] || echo "no KernelBench checkout: pass --data DIR (see --prepare), --kernelbench DIR or set KERNELBENCH" ;;
    esac
}
limit_of() { echo "${LIMITS[$1]:-${LIMIT[$1]}}"; }

if [ "$MODE" = plan ]; then
    total=0
    echo "gpu_check plan: budget ${BUDGET} s; writes under $OUT and the build cache $CACHE (kept)"
    for name in $ALL_STEPS; do
        if [[ "$SELECTED" != *" $name "* ]]; then
            printf '  %-11s %4s    (not run: %s)\n' "$name" - "$([[ " $PLAN_STEPS " == *" $name "* ]] && echo "not in --steps" || echo "optional, name it in --steps")"
            continue
        fi
        why=$(missing_data "$name")
        limit=$(limit_of "$name")
        [ -z "$why" ] && total=$((total + limit))
        printf '  %-11s %4s s  %s\n' "$name" "$limit" "${why:+(skipped: $why) }$(command_of "$name" | tr '\n' ' ' | cut -c1-160)"
    done
    echo "gpu_check plan: steps' limits add to ${total} s of a ${BUDGET} s budget ($((BUDGET - total)) s spare)"
    [ "$total" -le "$BUDGET" ] || { echo "gpu_check: the plan's limits (${total} s) exceed the budget (${BUDGET} s)" >&2; exit 3; }
    exit 0
fi

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
STEPS=$OUT/steps.jsonl
export GPU_CHECK_TESTS=$OUT/tests.jsonl
WORK=$OUT/.work
rm -rf "$WORK" && mkdir -p "$WORK/tmp" "$CACHE" || exit 2
# Everything temporary (the judge's worker folders, pytest's, compilers') lands in OUT/.work.
export TMPDIR=$WORK/tmp PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$ROOT:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export KERNELRL_CACHE=$CACHE
# The tests' build cache (tests/conftest.py) is the scripts' one: a CUDA source built once (a cold
# nvcc build took 52 s on the 2026-11-26 H100) serves every later step, and every process shares
# the one device lock under it (locks/cuda-0.lock), so parallel tests overlap builds, not timing.
export KERNELRL_TEST_CACHE=${KERNELRL_TEST_CACHE:-$KERNELRL_CACHE}
export PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE=$((START + BUDGET))
DRY_LIMIT=${GPU_CHECK_DRY_LIMIT:-20}

note() { echo "gpu_check: $*" | tee -a "$LOG" >&2; }

# A step's line in steps.jsonl. Every value is a number or a word this script chose. The last three
# say what the step left of the machine's memory: the lowest MemAvailable and the highest device
# memory in use sampled while it ran, and how many processes the kernel's OOM killer ended meanwhile
# (/proc/vmstat's oom_kill): the 2026-11-30 lease's cuda_l1 step died by SIGKILL 19 s before its
# limit and nothing recorded why.
record() {  # name limit seconds rc timed_out skipped reason [min_mem_available_gib oom_kills max_gpu_mem_used_gib]
    printf '{"step": "%s", "limit_s": %s, "seconds": %s, "rc": %s, "timed_out": %s, "skipped": %s, "reason": "%s", "min_mem_available_gib": %s, "oom_kills": %s, "max_gpu_mem_used_gib": %s}\n' \
        "$1" "$2" "$3" "$4" "$5" "$6" "$7" "${8:-null}" "${9:-null}" "${10:-null}" >> "$STEPS"
}

oom_kills() { awk '$1 == "oom_kill" { print $2; found = 1 } END { if (!found) print "null" }' /proc/vmstat 2>/dev/null || echo null; }

# MemAvailable (KiB) into FILE.host, and every GPU's memory in use (MiB) into FILE.gpu, every half second until killed.
sample_memory() {  # file
    local smi
    smi=$(command -v nvidia-smi)
    while :; do
        awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo 2>/dev/null >> "$1.host"
        [ -n "$smi" ] && "$smi" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null >> "$1.gpu"
        sleep 0.5
    done
}

run_step() {  # name
    local name=$1 limit left t0 t1 rc timed_out cmd=()
    if [[ "$SELECTED" != *" $name "* ]]; then
        record "$name" 0 0 null false true "$([[ " $PLAN_STEPS " == *" $name "* ]] && echo "not in --steps" || echo "optional, not in --steps")"
        return
    fi
    local why
    why=$(missing_data "$name")
    if [ -n "$why" ]; then
        note "step $name skipped: $why"
        record "$name" 0 0 null false true "$why"
        return
    fi
    mapfile -t cmd < <(command_of "$name")
    limit=$(limit_of "$name")
    [ "$MODE" = rehearse ] && limit=$DRY_LIMIT
    left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        note "step $name skipped: ${left}s of the budget left"
        record "$name" "$limit" 0 null false true "budget spent"
        return
    fi
    echo "=== step $name, limit ${limit}s, $(date -u +%Y-%m-%dT%H:%M:%SZ): ${cmd[*]}" >> "$LOG"
    local mem=$WORK/mem.$name oom0 oom1 sampler min_gib max_gpu seconds reason=""
    oom0=$(oom_kills)
    : > "$mem.host"; : > "$mem.gpu"
    sample_memory "$mem" &
    sampler=$!
    t0=$(date +%s.%N)
    # timeout signals the step's whole process group (workers included); KILL 5 s after TERM.
    GPU_CHECK_STEP=$name timeout --kill-after=5 "$limit" "${cmd[@]}" >> "$LOG" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    oom1=$(oom_kills)
    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    min_gib=$(sort -n "$mem.host" | head -n 1 | awk '{ printf "%.1f", $1 / 1048576 }')
    max_gpu=$(sort -n "$mem.gpu" | tail -n 1 | awk '{ printf "%.1f", $1 / 1024 }')
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
    record "$name" "$limit" "$seconds" "$rc" "$timed_out" false "$reason" "${min_gib:-null}" "$oom1" "${max_gpu:-null}"
    echo "=== step $name: rc $rc, timed_out $timed_out${reason:+, $reason}" >> "$LOG"
}

# bubblewrap from the .deb beside this script where bwrap is missing (no registry needed), under OUT.
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

cd "$ROOT" || exit 2
for name in $ALL_STEPS; do
    run_step "$name"
done
note "done in $(($(date +%s) - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' '); build cache kept in $CACHE"
rm -rf "$WORK"
