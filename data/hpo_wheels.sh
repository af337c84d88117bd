#!/usr/bin/env bash
# Download, here, the Python packages that the GPU HPO benchmark (benchmarks/hpo.py --gpu)
# needs and the lent GPU machine lacks, and pack them to be carried there.
#
#   bash data/hpo_wheels.sh            download (once) and pack into .whl/hpo-1, .whl/hpo-2, ...
#   bash data/hpo_wheels.sh --check    also install the packed set into a fresh Python 3.12
#                                      venv here (with the machine's own packages from PyPI)
#                                      and import everything the benchmark imports
#
# The GPU machine has torch, Lightning, numpy, scipy, pandas, matplotlib, nvidia-ml-py and
# more (/work/.library/device/KINDS.md), but not optuna, catboost, gensim or SQLAlchemy.
# Their cp312 manylinux wheels and the dependencies the machine lacks are listed below,
# pinned to the versions the development venv tests with. catboost's wheel alone is
# 97 MB, and a device call carries at most 64 MiB with the working tree (about 35 MB), so
# the wheels are installed here into one folder laid out as pip's --target lays it out
# (--platform manylinux, cp312), pruned (tests, Jupyter widgets), its shared libraries
# stripped, packed as one tar.xz (39 MB) and split into parts of at most
# PART_MIB (20) MiB, one folder each (.whl/hpo-N/, with MANIFEST: the parts' count and
# the archive's sha256). On the machine, `bash data/gpu_window.sh hpo-site` gathers the
# parts carried by successive calls into /tmp/hpo-parts and unpacks them into /tmp/site
# once all have arrived (data/README.md, "The GPU HPO benchmark").
#
# .whl/ is ignored through .git/info/exclude (added here if missing), as the device
# README asks (in a git worktree, whose exclude file is the main checkout's, through
# .whl/.gitignore instead): the parts travel only when a call names them in `carry`.
set -euo pipefail

[[ -d src/costaware && -d data ]] || { echo "hpo_wheels: run it from the repository root" >&2; exit 2; }
check=0
case "${1:-}" in
    "") ;;
    --check) check=1 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "hpo_wheels: unknown argument '$1' (--check or nothing)" >&2; exit 2 ;;
esac

# name==version of every wheel the machine lacks (dependencies it has are left out:
# numpy, scipy, pandas, matplotlib, six, packaging, tqdm, PyYAML, typing-extensions,
# MarkupSafe, wrapt; SQLAlchemy 2.1 needs greenlet only for asyncio; catboost's plotly is
# imported only by its widgets, and costaware's only by its HTML report)
WHEELS=(
    optuna==5.0.0
    alembic==1.20.1
    colorlog==6.12.0
    Mako==1.4.3
    SQLAlchemy==2.1.9
    catboost==1.2.10
    graphviz==0.21
    gensim==4.4.0
    smart_open==9.0.2
)
#: requirements of those wheels that the machine already has (KINDS.md's package list)
ON_MACHINE="numpy scipy pandas matplotlib six packaging tqdm pyyaml typing-extensions markupsafe wrapt colorama tomli plotly"
PART_MIB="${PART_MIB:-20}"
PY="${PYTHON:-python3}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

mkdir -p .whl
if ! git check-ignore -q .whl/probe 2>/dev/null; then
    if [[ -d .git ]]; then  # a plain checkout: as the device README says
        echo '/.whl/' >>.git/info/exclude
    else  # a worktree shares its exclude file with the main checkout: leave that alone
        echo '*' >.whl/.gitignore  # ignores the folder, itself included
    fi
fi
dl=.whl/download
mkdir -p "$dl"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$dl" "${WHEELS[@]}"
echo "hpo_wheels: $(ls "$dl"/*.whl | wc -l) wheels in $dl ($(du -sh "$dl" | cut -f1))"

# every requirement of every wheel is either another wheel here or on the machine
"$PY" - "$dl" "$ON_MACHINE" <<'EOF'
import re, sys, zipfile
from pathlib import Path
from email.parser import Parser

def norm(name): return re.sub(r"[-_.]+", "-", name).lower()

here, machine = Path(sys.argv[1]), {norm(n) for n in sys.argv[2].split()}
have, needs = set(), {}
for whl in sorted(here.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    name = norm(msg["Name"])
    have.add(name)
    for req in msg.get_all("Requires-Dist") or []:
        if "extra ==" in req:
            continue
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "win32" in marker or "python_version < \"3.11\"" in marker:
            continue  # not on a Linux Python 3.12
        needs.setdefault(norm(re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0]), []).append(name)
missing = {d: by for d, by in needs.items() if d not in have and d not in machine}
if missing:
    sys.exit(f"hpo_wheels: requirements neither carried nor on the machine: {missing}")
print(f"hpo_wheels: every requirement of the {len(have)} wheels is carried or on the machine")
EOF

site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
packed=0
if ((check)) && [[ -f .whl/hpo-1/MANIFEST ]] \
    && grep -qxF "wheels ${WHEELS[*]}" .whl/hpo-1/MANIFEST; then
    packed=1  # --check of the parts packed before from the same wheels
    sum="$(awk '$1 == "sha256" { print $2 }' .whl/hpo-1/MANIFEST)"
    echo "hpo_wheels: checking the parts packed before ($(du -shc .whl/hpo-[0-9]* | tail -1 | cut -f1))"
fi
if ((!packed)); then
# one folder as pip --target lays it out for the machine, pruned and stripped
"$PY" -m pip install --quiet --no-index --no-deps --no-compile --only-binary=:all: \
    --python-version 3.12 --implementation cp "${PLATFORMS[@]}" --target "$site/site" \
    "$dl"/*.whl
(
    cd "$site/site"
    rm -rf bin share ./*.data
    find . -depth -type d \( -name tests -o -name test -o -name __pycache__ \) -exec rm -rf {} +
    find . -name '*.so' -exec strip --strip-unneeded {} + 2>/dev/null || true
)
echo "hpo_wheels: installed and pruned: $(du -sh "$site/site" | cut -f1)"
tar -C "$site/site" -cf - . | xz -T0 -6 >"$site/hpo-site.tar.xz"
sum="$(sha256sum "$site/hpo-site.tar.xz" | cut -d' ' -f1)"
rm -rf .whl/hpo-[0-9]*
(cd "$site" && split -b "${PART_MIB}M" -d -a 2 hpo-site.tar.xz hpo-site.tar.xz.part)
parts=("$site"/hpo-site.tar.xz.part*)
n=${#parts[@]}
for i in "${!parts[@]}"; do
    dir=".whl/hpo-$((i + 1))"
    mkdir -p "$dir"
    mv "${parts[$i]}" "$dir/"
    printf 'parts %s\nsha256 %s\nwheels %s\n' "$n" "$sum" "${WHEELS[*]}" >"$dir/MANIFEST"
done
echo "hpo_wheels: $(du -sh "$site/hpo-site.tar.xz" | cut -f1) in $n parts:"
du -sh .whl/hpo-[0-9]*
fi

if ((check)); then
    # a fresh Python 3.12 venv: the machine's own packages from PyPI (without torch:
    # catboost, gensim, optuna and SQLAlchemy do not import it), then the packed set
    py312="${PY312:-}"
    if [[ -z "$py312" ]]; then
        for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
            if "$c" --version >/dev/null 2>&1; then py312="$c"; break; fi
        done
    fi
    [[ -n "$py312" ]] || { echo "hpo_wheels: no python3.12 here for --check (PY312=...)" >&2; exit 1; }
    echo "hpo_wheels: checking with $("$py312" --version) at $py312"
    venv="$site/venv"
    "$py312" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet numpy scipy pandas matplotlib six packaging \
        tqdm PyYAML typing-extensions MarkupSafe wrapt
    mkdir -p "$site/unpacked"
    cat .whl/hpo-[0-9]*/hpo-site.tar.xz.part* | tee >(sha256sum | cut -d' ' -f1 >"$site/sum") \
        | xz -d | tar -x -C "$site/unpacked"
    sleep 1
    [[ "$(cat "$site/sum")" == "$sum" ]] || { echo "hpo_wheels: the parts do not add up" >&2; exit 1; }
    PYTHONPATH="$site/unpacked" "$venv/bin/python" - <<'EOF'
import tempfile, os
import optuna, catboost, gensim, sqlalchemy, alembic, smart_open
from gensim.models.doc2vec import Doc2Vec, TaggedDocument
from gensim.models.doc2vec_inner import train_document_dbow
import numpy as np
from catboost import CatBoostRegressor
m = CatBoostRegressor(iterations=5, verbose=False, allow_writing_files=False)
m.fit(np.random.rand(20, 3), np.random.rand(20))
d = tempfile.mkdtemp()
study = optuna.create_study(storage=f"sqlite:///{os.path.join(d, 'o.db')}")
study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
docs = [TaggedDocument(["a", "b"], [0]), TaggedDocument(["b", "c"], [1])]
Doc2Vec(docs, vector_size=4, min_count=1, epochs=2)
print("hpo_wheels --check: optuna", optuna.__version__, "catboost", catboost.__version__,
      "gensim", gensim.__version__, "SQLAlchemy", sqlalchemy.__version__,
      "imported and ran under", __import__("sys").version.split()[0])
EOF
fi
