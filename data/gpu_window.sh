#!/usr/bin/env bash
# One step of ground-truth collection on a lent GPU machine, torch-only, run from the
# repository root. Each step fits in one 10-minute device command and writes under $OUT
# (./gpu-out when $OUT is unset); copy what comes back to data/gpu/ (data/oom/ for the oom
# step's probes) and commit it.
#
#   bash data/gpu_window.sh check                  GPU tests (if pytest is installed) and the environment
#   bash data/gpu_window.sh ops-held [MINUTES]     re-time the op cases of seed 0 held (opbench schema 2)
#   bash data/gpu_window.sh corpus SEED SHARD [MINUTES]   measure one shard of the whole-model corpus,
#                                                  or shards in turn (SHARD as FIRST-LAST) until MINUTES
#   bash data/gpu_window.sh broad SEED SHARD [MINUTES]    the same for the broad families' corpus (gpu-broad:
#                                                  ConvNeXt, EfficientNet, Swin, mixers, LLaMA, T5,
#                                                  Inception, ResNeXt/RegNet, recurrent LMs; 3 shards
#                                                  a seed), into h100-broad-shardI.jsonl.gz and so on
#   bash data/gpu_window.sh small SEED [MINUTES]   measure the CPU corpus (350 small models of every
#                                                  family) on the GPU: the host-bound steps that only
#                                                  the MLP family has in the GPU corpus
#   bash data/gpu_window.sh oom [MINUTES] [CAPS]   bisect the batch size at which one configuration of
#                                                  each corpus family stops fitting under memory caps
#                                                  (GiB, default 12,24,8,40; set_per_process_memory_fraction),
#                                                  every run a labelled row (costaware.measure.oomprobe); with
#                                                  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set,
#                                                  the same into a file of its own (COSTAWARE_FAMILIES=a,b
#                                                  narrows the families)
#   bash data/gpu_window.sh alloctrace [MINUTES]   the caching allocator's own events (its memory history)
#                                                  for the runs on either side of every boundary the
#                                                  committed oom probes bisected, into data/oom/
#                                                  (costaware.measure.alloctrace; benchmarks/alloc_fidelity.py
#                                                  says whether the allocator model or the dry run misses);
#                                                  with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set,
#                                                  the expandable-segment probes' boundaries, into a file of
#                                                  their own
#   bash data/gpu_window.sh rnn-layers [MINUTES]   the allocator's events of 32 uncapped LSTM and GRU language
#                                                  models of 1-4 layers (default 3 minutes), into data/oom/:
#                                                  what cuDNN allocates for a multi-layer call, which
#                                                  benchmarks/alloc_fidelity.py sets against the dry run
#   bash data/gpu_window.sh repeat SEED SHARD [N] [MINUTES]   measure the first N (default 40) configurations
#                                                  of a committed shard again, into a file named after
#                                                  today's date: how far two windows (or two machines) differ;
#                                                  each row also profiles its ops in the step (--in-context)
#   bash data/gpu_window.sh hpo-site               unpack the packed Python packages the HPO benchmark
#                                                  needs (data/hpo_wheels.sh) into /tmp/site, once
#                                                  every part has been carried here (.whl/hpo-N)
#   bash data/gpu_window.sh hpo [MINUTES]          the GPU HPO benchmark (benchmarks/hpo.py --gpu),
#                                                  MINUTES (default 8.5) of trials, resumed from
#                                                  data/hpo/; hpo-site first
#
# Files are named after the GPU (h100-..., h200-...: memory transfers across GPUs of one
# generation, time does not) and each step first copies the committed file of the same
# name from data/gpu/ into $OUT, so an interrupted shard resumes where it stopped.
# On 2026-11-26 an H200 window (15 minutes of device time, one start) measured corpus 0
# shard 0 and 96 of shard 1's 115 (4m22s a shard there) and 2,195 held op cases.
# Next window, whichever GPU: broad 0 0-2 first (issue 42: the families the corpus lacks,
# 275 configurations estimated at 19 minutes on an H100, so two or three commands; it
# resumes). Then small 0 (on a GPU without that file yet). Its 350 small models of every family add to
# the whole-model rows and are the host-bound steps the time model lacks: held out by
# family, its worst error is the MLPs', the only family of the GPU corpus whose steps
# are that small (docs/predictions.md, "The GPU issue-time model, probed offline"). At
# the corpus's 2.3 s a configuration it takes about 13 minutes, two commands (it resumes).
# Then repeat 0 0 (the noise between windows, which the accuracy benchmark reports as
# repeats, and each op's time inside the step, which benchmarks/in_context.py sets against
# the op model; about 2 minutes without the profiles, and its 4 minutes stop it cleanly),
# then on an H200 corpus 0 1-4 and ops-held, on an H100 corpus 1 0-4 (a shard takes 4-5 minutes, so one command measures about two; shards
# already complete are skipped in seconds). Plan a 15-minute window as one command of
# about 9 minutes (the start takes 1-2 minutes of it); a 30-minute one starts with check.
# For issue 40, on any GPU with 12 GiB free: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# bash data/gpu_window.sh alloctrace 3 records the 18 runs at the expandable probes'
# boundaries (six families at 12 GiB; the default step took about 2.5 s a run): with one
# segment per pool no driver address decides a tie, and benchmarks/alloc_fidelity.py then
# says whether the allocator model is exact enough under a cap for a narrower margin there.
# Then rnn-layers (32 small runs, about 2 minutes): cuDNN's reserve and work spaces for
# multi-layer LSTM and GRU calls, which the rnn family's capacity turns on.
#
# The HPO benchmark (issue 45) needs packages the machine lacks: here, bash data/hpo_wheels.sh
# packs them into .whl/hpo-1 and .whl/hpo-2; there, one call carries .whl/hpo-1 and runs
# hpo-site, and the next, at once (the machine stays warm 30 s), carries .whl/hpo-2 and
# runs hpo 8.5 (data/README.md, "The GPU HPO benchmark").
#
# For a test on a machine without a GPU: COSTAWARE_DEVICE=cpu (and COSTAWARE_CORPUS=cpu,
# COSTAWARE_LIMIT=N, COSTAWARE_SHARDS=N) run the same steps on the CPU.
set -euo pipefail

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

die() {
    echo "gpu_window: $*" >&2
    echo >&2
    usage >&2
    exit 2
}

[[ -d src/costaware && -d data ]] || die "run it from the repository root"
step="${1:-}"
case "$step" in
    -h | --help) usage; exit 0 ;;
    check | ops-held | corpus | broad | small | repeat | oom | alloctrace | rnn-layers | hpo-site | hpo) shift ;;
    "") die "no step given" ;;
    *) die "unknown step '$step'" ;;
esac

is_number() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }
case "$step" in
    ops-held)
        minutes="${1:-8}"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    corpus | broad)
        [[ $# -ge 2 ]] || die "$step needs SEED and SHARD"
        seed="$1" shard="$2" minutes="${3:-8.5}"
        [[ "$seed" =~ ^[0-9]+$ ]] || die "SEED and SHARD must be whole numbers, not '$seed'"
        [[ "$shard" =~ ^[0-9]+(-[0-9]+)?$ ]] \
            || die "SHARD must be a whole number or FIRST-LAST, not '$shard'"
        first="${shard%-*}" last="${shard#*-}"
        ((10#$first <= 10#$last)) || die "SHARD FIRST-LAST must not run backwards, not '$shard'"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    small)
        [[ $# -ge 1 ]] || die "small needs SEED"
        seed="$1" minutes="${2:-8.5}"
        [[ "$seed" =~ ^[0-9]+$ ]] || die "small's SEED must be a whole number, not '$seed'"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    oom)
        minutes="${1:-6}" caps="${2:-12,24,8,40}"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        [[ "$caps" =~ ^[0-9]+([.][0-9]+)?(,[0-9]+([.][0-9]+)?)*$ ]] \
            || die "CAPS must be GiB numbers separated by commas, such as 12,24; not '$caps'"
        ;;
    hpo)
        minutes="${1:-8.5}"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    alloctrace)
        minutes="${1:-8}"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    rnn-layers)
        minutes="${1:-3}"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
    repeat)
        [[ $# -ge 2 ]] || die "repeat needs SEED and SHARD"
        seed="$1" shard="$2" count="${3:-40}" minutes="${4:-4}"
        [[ "$seed" =~ ^[0-9]+$ && "$shard" =~ ^[0-9]+$ ]] \
            || die "repeat's SEED and SHARD must be whole numbers, not '$seed' '$shard'"
        [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "N must be a whole number above 0, not '$count'"
        is_number "$minutes" || die "MINUTES must be a number, not '$minutes'"
        ;;
esac

PY="${PYTHON:-python}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
device="${COSTAWARE_DEVICE:-cuda}"
out="${OUT:-gpu-out}"
mkdir -p "$out"

# h100 / h200 / another GPU's short name; "cpu" when testing on the CPU
tag="$("$PY" - "$device" <<'EOF'
import re, sys
import torch
if sys.argv[1] == "cpu":
    print("cpu")
elif not torch.cuda.is_available():
    sys.exit("gpu_window: no CUDA GPU here (set COSTAWARE_DEVICE=cpu to test on the CPU)")
else:
    name = torch.cuda.get_device_name(0)
    m = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name.replace("NVIDIA", ""))
    print((m.group(1) if m else re.sub(r"\W+", "-", name)).lower())
EOF
)"

resume() {  # copy the committed file into $OUT so that the run appends to it
    local name="$1" dir="${2:-data/gpu}"
    if [[ -f "$dir/$name" && ! -f "$out/$name" ]]; then
        cp "$dir/$name" "$out/$name"
        echo "gpu_window: resuming $dir/$name"
    fi
}

summary() {  # rows per status in the file that comes back
    "$PY" - "$1" <<'EOF'
import collections, sys
from costaware.measure.collect import read_rows
rows = list(read_rows(sys.argv[1]))
counts = collections.Counter(str(r.get("status")) for r in rows)
print(f"gpu_window: {sys.argv[1]}: {len(rows)} rows ({dict(sorted(counts.items()))})")
EOF
}

hpo_site() {  # gather the carried parts; unpack them into /tmp/site once all are here
    local parts="${HPO_PARTS:-/tmp/hpo-parts}" site="${HPO_SITE:-/tmp/site}" manifest n sum have
    if [[ -f "$site/.hpo-site-ok" ]]; then
        echo "gpu_window: /tmp/site is unpacked already"
        return 0
    fi
    mkdir -p "$parts"
    for dir in .whl/hpo-[0-9]*; do
        [[ -f "$dir/MANIFEST" ]] || continue
        cp "$dir"/hpo-site.tar.xz.part* "$parts/"
        cp "$dir/MANIFEST" "$parts/MANIFEST"
        echo "gpu_window: took $(basename "$dir") ($(du -sh "$dir" | cut -f1))"
    done
    manifest="$parts/MANIFEST"
    [[ -f "$manifest" ]] || {
        echo "gpu_window: no part of the HPO packages is here: make them with" \
            "'bash data/hpo_wheels.sh' and carry .whl/hpo-1, .whl/hpo-2, ... one a call" >&2
        return 1
    }
    n="$(awk '$1 == "parts" { print $2 }' "$manifest")"
    sum="$(awk '$1 == "sha256" { print $2 }' "$manifest")"
    have="$(find "$parts" -name 'hpo-site.tar.xz.part*' | wc -l)"
    if ((have < n)); then
        echo "gpu_window: $have of the $n parts are here ($(ls "$parts" | tr '\n' ' '));" \
            "carry the others in the next calls, while this machine is warm" >&2
        return 3
    fi
    [[ "$(cat "$parts"/hpo-site.tar.xz.part* | sha256sum | cut -d' ' -f1)" == "$sum" ]] || {
        echo "gpu_window: the parts' sha256 is not the MANIFEST's: parts of two packings?" >&2
        rm -rf "$parts"
        return 1
    }
    mkdir -p "$site"
    cat "$parts"/hpo-site.tar.xz.part* | xz -d | tar -x -C "$site"
    touch "$site/.hpo-site-ok"
    echo "gpu_window: unpacked the HPO packages into $site ($(du -sh "$site" | cut -f1))"
}

case "$step" in
    hpo-site)
        rc=0
        hpo_site || rc=$?
        exit "$rc"
        ;;
    hpo)
        # on the CPU (a test), the packages may come from the environment instead
        hpo_site || [[ "$device" == cpu ]] || exit 1
        # costaware from src/ (its integrations included); /tmp/site holds only packages the
        # machine lacks, so it shadows none of its own
        export PYTHONPATH="${PYTHONPATH}:${HPO_SITE:-/tmp/site}"
        "$PY" -c "import optuna, catboost, gensim, sqlalchemy, lightning, costaware.integrations.optuna as o; \
print('gpu_window: optuna', optuna.__version__, 'catboost', catboost.__version__, 'lightning', lightning.__version__)"
        name="$tag-hpo-gpu"
        outabs="$(cd "$out" && pwd)"
        resume "$name.jsonl" data/hpo
        work="$(mktemp -d)"
        if [[ -f "data/hpo/$name-stores.tar.gz" ]]; then
            tar -xzf "data/hpo/$name-stores.tar.gz" -C "$work"
            echo "gpu_window: resuming the costaware arm's stores from data/hpo/$name-stores.tar.gz"
        fi
        set +e
        # --minutes stops between trials; the timeout, 1.5 minutes later, ends a trial
        # that runs on, so that the stores below are still packed before the call's limit
        hard="$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 90 }')"
        PYTHONUNBUFFERED=1 timeout --signal=INT --kill-after=20 "$hard" \
            "$PY" benchmarks/hpo.py --gpu --device "$device" \
            --results "$out/$name.jsonl" --workdir "$work" --minutes "$minutes" \
            --json "$out/$name-report.json" ${COSTAWARE_HPO_ARGS:-} 2>&1 | tee "$out/$name-log.txt"
        rc=${PIPESTATUS[0]}
        set -e
        # the stores (SQLite) of the costaware arm, for the next window's resume
        (cd "$work" && tar -czf "$outabs/$name-stores.tar.gz" --exclude='*.tmp' .) || true
        ls -la "$out"
        exit "$rc"
        ;;
    check)
        nvidia-smi 2>/dev/null | tee "$out/nvidia-smi.txt" || echo "gpu_window: no nvidia-smi"
        "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version())" | tee "$out/env.txt"
        if "$PY" -c "import pytest" 2>/dev/null; then
            # costaware as pip lays it out, without pip (the GPU machine has no network)
            site="$(mktemp -d)"
            trap 'rm -rf "$site"' EXIT
            cp -r src/costaware "$site/costaware"
            PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
                "import costaware.integrations as i; print('gpu_window: costaware from', i.__file__)"
            PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -m gpu -q \
                -p no:cacheprovider tests/measure/test_opbench.py tests/measure/test_profile.py \
                tests/integrations/test_gpu_lightning.py \
                2>&1 | tee "$out/gpu-tests.txt"
        else
            echo "gpu_window: pytest is not installed here: the GPU tests were skipped" \
                | tee "$out/gpu-tests.txt"
        fi
        ;;
    ops-held)
        name="$tag-ops-held-seed0.jsonl.gz"
        resume "$name"
        "$PY" -m costaware.measure.opbench --device "$device" --seed 0 --n 40000 \
            --out "$out/$name" --max-minutes "$minutes"
        summary "$out/$name"
        ;;
    corpus | broad)
        kind="${COSTAWARE_CORPUS:-gpu}" infix=""
        if [[ "$step" == broad ]]; then kind="${kind%-broad}-broad" infix="broad-"; fi
        extra=()
        [[ -n "${COSTAWARE_LIMIT:-}" ]] && extra+=(--limit "$COSTAWARE_LIMIT")
        [[ -n "${COSTAWARE_SHARDS:-}" ]] && extra+=(--shards "$COSTAWARE_SHARDS")
        started=$SECONDS
        for ((s = 10#$first; s <= 10#$last; s++)); do
            # the minutes left for this shard; under half a minute, the rest waits
            left="$(awk -v m="$minutes" -v t=$((SECONDS - started)) 'BEGIN { printf "%.3f", m - t / 60 }')"
            if awk -v l="$left" 'BEGIN { exit !(l < 0.5) }'; then
                echo "gpu_window: under half a minute of the $minutes left;" \
                    "shards $s-$last wait for the next command"
                break
            fi
            if [[ "$seed" == 0 ]]; then name="$tag-${infix}shard$s.jsonl.gz"
            else name="$tag-${infix}seed$seed-shard$s.jsonl.gz"; fi
            resume "$name"
            "$PY" -m costaware.measure.collect --corpus "$kind" --seed "$seed" \
                --shard "$s" --device "$device" --timeout 90 --max-minutes "$left" \
                --out "$out/$name" "${extra[@]}"
            summary "$out/$name"
        done
        ;;
    small)
        # the CPU corpus in one shard, on this device: small models of all 16 families
        name="$tag-small-seed$seed.jsonl.gz"
        resume "$name"
        "$PY" -m costaware.measure.collect --corpus cpu --seed "$seed" --shard 0 --shards 1 \
            --device "$device" --timeout 90 --max-minutes "$minutes" --out "$out/$name" \
            ${COSTAWARE_LIMIT:+--limit "$COSTAWARE_LIMIT"}
        summary "$out/$name"
        ;;
    oom)
        # one file per allocator mode: the mode is fixed when CUDA starts
        conf="$(echo "${PYTORCH_CUDA_ALLOC_CONF:-}" | tr -d ' ' | tr '[:upper:]' '[:lower:]')"
        if [[ "$conf" == *expandable_segments:true* ]]; then name="$tag-oom-expandable-seed0.jsonl.gz"
        else name="$tag-oom-seed0.jsonl.gz"; fi
        resume "$name" data/oom
        "$PY" -m costaware.measure.oomprobe --device "$device" --corpus "${COSTAWARE_CORPUS:-gpu}" \
            --caps "$caps" --max-minutes "$minutes" --out "$out/$name" \
            ${COSTAWARE_LIMIT:+--limit "$COSTAWARE_LIMIT"} \
            ${COSTAWARE_FAMILIES:+--families "$COSTAWARE_FAMILIES"}
        summary "$out/$name"
        ;;
    alloctrace)
        # the probes of this process's allocator mode (fixed when CUDA starts), into a file of its own
        conf="$(echo "${PYTORCH_CUDA_ALLOC_CONF:-}" | tr -d ' ' | tr '[:upper:]' '[:lower:]')"
        if [[ "$conf" == *expandable_segments:true* ]]; then
            probes=(data/oom/*-oom-expandable-seed0.jsonl.gz) name="$tag-alloctrace-expandable-seed0.jsonl.gz"
        else
            probes=(data/oom/*-oom-seed0.jsonl.gz) name="$tag-alloctrace-seed0.jsonl.gz"
        fi
        [[ -f "${probes[0]}" ]] || die "no committed oom probes of this allocator mode in data/oom/: run the oom step first"
        resume "$name" data/oom
        "$PY" -m costaware.measure.alloctrace --device "$device" --probes "${probes[@]}" \
            --max-minutes "$minutes" --out "$out/$name" \
            ${COSTAWARE_FAMILIES:+--families "$COSTAWARE_FAMILIES"}
        summary "$out/$name"
        ;;
    rnn-layers)
        name="$tag-alloctrace-rnn-layers.jsonl.gz"
        resume "$name" data/oom
        "$PY" -m costaware.measure.alloctrace --device "$device" --rnn-layers \
            --max-minutes "$minutes" --out "$out/$name"
        summary "$out/$name"
        ;;
    repeat)
        if [[ "$seed" == 0 ]]; then base="shard$shard"; else base="seed$seed-shard$shard"; fi
        [[ -f "data/gpu/$tag-$base.jsonl.gz" ]] \
            || die "nothing to repeat: data/gpu/$tag-$base.jsonl.gz is not committed"
        # the same configurations, a new file: the committed rows stay as they were measured
        # (the latest row of a configuration is the one fit learns, the earlier one a repeat)
        name="$tag-repeat-$(date -u +%Y%m%d)-$base.jsonl.gz"
        resume "$name"
        # --in-context: each op's time inside the step, beside the repeat (benchmarks/in_context.py)
        "$PY" -m costaware.measure.collect --corpus "${COSTAWARE_CORPUS:-gpu}" --seed "$seed" \
            --shard "$shard" --device "$device" --timeout 90 --max-minutes "$minutes" \
            --limit "$count" --in-context --out "$out/$name" \
            ${COSTAWARE_SHARDS:+--shards "$COSTAWARE_SHARDS"}
        summary "$out/$name"
        ;;
esac
