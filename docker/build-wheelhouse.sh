#!/usr/bin/env bash
# Stage every third-party wheel the image needs into docker/wheelhouse/ (git-ignored), so that
# `docker build` installs with --no-index: no index or CUDA wheel is reachable from the build.
#
#   docker/build-wheelhouse.sh          # PYTHON=python3.11 by default; must be CPython 3.11
#
# torch must be the CPU build 2.13.0: pip here has to resolve torch==2.13.0 to a +cpu wheel
# (from a local find-links directory or the CPU index, e.g. PIP_EXTRA_INDEX_URL); the script
# fails if it does not, or if any nvidia-* wheel turns up. When the project's .venv exists its
# versions are used as constraints, so the image runs what the test suite ran. Sdists (e.g.
# antlr4-python3-runtime) are built into wheels here, so the image's builder needs no compiler.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
wh=${WHEELHOUSE:-$here/wheelhouse}
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3

ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$ver" = 3.11 ] || { echo "build-wheelhouse.sh: $py is Python $ver; the image needs 3.11 wheels" >&2; exit 1; }

mkdir -p "$wh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" - "$root/pyproject.toml" > "$tmp/requirements.txt" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(deps + ["setuptools>=68", "wheel"]))  # + the build backend for the project itself
PY
: > "$tmp/constraints.txt"
if [ -x "$root/.venv/bin/python" ]; then
    "$root/.venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null \
        | grep -v -e '^#' -e '^-e ' -e ' @ ' -e '^crypten==' > "$tmp/constraints.txt" || true
fi

echo "build-wheelhouse.sh: $(wc -l < "$tmp/requirements.txt") requirements, $(wc -l < "$tmp/constraints.txt") constraints -> $wh"
# (pip's notes about extra file:// index directories that lack a package are dropped.)
quiet() { { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2; }
nice -n 19 "$py" -m pip wheel --quiet --wheel-dir "$wh" --find-links "$wh" \
    -r "$tmp/requirements.txt" -c "$tmp/constraints.txt" 2> >(quiet)
# CrypTen's metadata requires the dead `sklearn` package and torchvision: no dependencies (as `make install`).
nice -n 19 "$py" -m pip wheel --quiet --wheel-dir "$wh" --find-links "$wh" --no-deps "crypten==0.4.1" 2> >(quiet)

shopt -s nullglob
torch=("$wh"/torch-2.13.0*.whl)
[ ${#torch[@]} -eq 1 ] || { echo "build-wheelhouse.sh: expected one torch 2.13.0 wheel, found ${#torch[@]}" >&2; exit 1; }
case "${torch[0]}" in
    *+cpu*) ;;
    *) echo "build-wheelhouse.sh: ${torch[0]##*/} is not the CPU build (need torch-2.13.0+cpu)" >&2; exit 1 ;;
esac
cuda=("$wh"/nvidia_* "$wh"/nvidia-* "$wh"/triton-*)
[ ${#cuda[@]} -eq 0 ] || { echo "build-wheelhouse.sh: CUDA wheels in the wheelhouse: ${cuda[*]##*/}" >&2; exit 1; }
echo "build-wheelhouse.sh: $(ls "$wh"/*.whl | wc -l) wheels, $(du -sh "$wh" | cut -f1), ${torch[0]##*/}"
