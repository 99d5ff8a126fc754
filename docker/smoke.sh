#!/usr/bin/env bash
# End-to-end smoke run of the Docker deployment (not part of CI: it needs a Docker daemon and
# takes minutes). Builds the image, brings the compose consortium up (init → 3 parties + dealer,
# healthy → coordinator submits the job), waits for the coordinator, checks the downloaded result,
# and always takes everything down again (`down -v`). Exits non-zero on any failure.
#
#   docker/smoke.sh                                   # base python:3.11-slim (built locally if unpullable)
#   BASE_IMAGE=mpc-erm-base:bookworm docker/smoke.sh  # the debootstrap base (docker/build-base.sh)
#
# Environment: BASE_IMAGE, MPC_ERM_IMAGE (tag to build; mpc-erm:smoke), COMPOSE ("docker compose"
# or "docker-compose"; found automatically), SMOKE_TIMEOUT_S (coordinator deadline, 1800),
# SMOKE_UP_TIMEOUT_S (until all daemons are healthy, 900), SMOKE_SKIP_WHEELHOUSE=1 (reuse
# docker/wheelhouse as it is), MPC_ERM_OUT_DIR (results; default
# docker/out/smoke-<time>/, kept afterwards).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
compose_file=$here/docker-compose.yml
base=${BASE_IMAGE:-python:3.11-slim}
image=${MPC_ERM_IMAGE:-mpc-erm:smoke}
project=${COMPOSE_PROJECT_NAME:-mpcermsmoke}
out=${MPC_ERM_OUT_DIR:-$here/out/smoke-$(date +%Y%m%d-%H%M%S)}
deadline=${SMOKE_TIMEOUT_S:-1800}
SECONDS=0

say() { printf 'smoke [%4ds]: %s\n' "$SECONDS" "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info --format '{{.ServerVersion}}' >/dev/null 2>&1 || die "no Docker daemon answers (is dockerd running?)"
if [ -n "${COMPOSE:-}" ]; then
    read -r -a compose_cmd <<< "$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
    compose_cmd=(docker-compose)
else
    die "neither 'docker compose' (v2) nor 'docker-compose' (v1) found"
fi
dc() { "${compose_cmd[@]}" -p "$project" -f "$compose_file" "$@"; }
say "docker $(docker info --format '{{.ServerVersion}}') (client $(docker version --format '{{.Client.Version}}')), compose: ${compose_cmd[*]} ($("${compose_cmd[@]}" version --short 2>/dev/null || echo '?'))"

# ------------------------------------------------------------------ base image, wheels, image
if ! docker image inspect "$base" >/dev/null 2>&1; then
    case "$base" in
        mpc-erm-base:*)
            say "base image $base missing: building it (docker/build-base.sh)"
            "$here/build-base.sh" "$base" ;;
        *)
            say "base image $base missing: pulling"
            if ! docker pull "$base"; then
                say "cannot pull $base (no registry?): using the debootstrap base mpc-erm-base:bookworm instead"
                base=mpc-erm-base:bookworm
                if ! docker image inspect "$base" >/dev/null 2>&1; then
                    command -v debootstrap >/dev/null || die "no debootstrap to build $base (apt-get install debootstrap)"
                    say "building $base (docker/build-base.sh)"
                    "$here/build-base.sh" "$base"
                fi
            fi ;;
    esac
fi
say "base image: $base"

if [ "${SMOKE_SKIP_WHEELHOUSE:-0}" = 1 ] && compgen -G "$here/wheelhouse/torch-2.13.0*.whl" >/dev/null; then
    say "reusing docker/wheelhouse ($(ls "$here"/wheelhouse/*.whl | wc -l) wheels)"
else
    say "staging wheels (docker/build-wheelhouse.sh)"
    "$here/build-wheelhouse.sh"
fi

say "building $image"
nice -n 19 docker build -f "$here/Dockerfile" --build-arg "BASE_IMAGE=$base" -t "$image" "$root" \
    > "${TMPDIR:-/tmp}/mpc-erm-smoke-build.log" 2>&1 \
    || { tail -40 "${TMPDIR:-/tmp}/mpc-erm-smoke-build.log" >&2; die "docker build failed"; }
tail -3 "${TMPDIR:-/tmp}/mpc-erm-smoke-build.log"
size=$(docker image inspect --format '{{.Size}}' "$image")
user=$(docker image inspect --format '{{.Config.User}}' "$image")
say "image $image: $((size / 1000000)) MB, user '$user'"
case "$user" in ""|root|0|root:*|0:*) die "image runs as root" ;; esac
tools=$(docker run --rm --entrypoint sh "$image" -c 'for t in gcc cc g++ make ld; do command -v $t; done; true')
[ -z "$tools" ] || die "build tools in the final image: $tools"
docker run --rm "$image" python3 -m mpc_erm.mpc.install_check || die "install check failed in the image"

# ------------------------------------------------------------------ the consortium
export MPC_ERM_IMAGE=$image MPC_ERM_OUT_DIR=$out BASE_IMAGE=$base
mkdir -p "$out"
chmod 0777 "$out"  # the coordinator runs as the image's user (uid 10001)

status=1
cleanup() {
    if [ "$status" -ne 0 ]; then
        say "logs of every service:"
        dc logs --no-color 2>&1 | tail -200 || true
    fi
    say "compose down -v"
    dc down -v --remove-orphans >/dev/null 2>&1 || dc down -v --remove-orphans || true
    if [ "$status" -eq 0 ]; then
        say "PASSED in ${SECONDS}s"
    else
        say "FAILED after ${SECONDS}s" >&2
    fi
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM

dc config -q
dc down -v --remove-orphans >/dev/null 2>&1 || true  # leftovers of an interrupted run
say "compose up (init, then alice, bob, carol, dealer until healthy, then the coordinator)"
# up returns once init has completed and the coordinator has started, i.e. once all four daemons
# were healthy; bounded, as a daemon that never gets healthy (restarting) could keep it waiting.
timeout "${SMOKE_UP_TIMEOUT_S:-900}" "${compose_cmd[@]}" -p "$project" -f "$compose_file" up -d --no-build \
    || die "compose up failed (or a daemon never became healthy)"

cid=$(docker ps -aq --filter "label=com.docker.compose.project=$project" \
                    --filter "label=com.docker.compose.service=coordinator")
[ -n "$cid" ] || die "no coordinator container"
for svc in alice bob carol dealer; do
    c=$(docker ps -aq --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.service=$svc")
    say "$svc: $(docker inspect --format '{{.State.Status}}, health {{.State.Health.Status}}' "$c")"
done
say "waiting for the coordinator (at most ${deadline}s)"
code=$(timeout "$deadline" docker wait "$cid") || die "the coordinator did not finish in ${deadline}s"
say "coordinator log:"
docker logs "$cid" 2>&1 | grep -v '"phase": "\(training\|dealing\)"' | tail -60
[ "$code" = 0 ] || die "the coordinator exited with status $code"

# ------------------------------------------------------------------ the result
result=$out/latest
[ -d "$result" ] || die "no result directory $result"
for f in model.safetensors privacy_report.json metrics.json; do
    [ -s "$result/$f" ] || die "result file missing or empty: $f"
done
say "result $(readlink "$result"): $(cd "$result" && ls | tr '\n' ' ')"
# Checked with the image's Python: the host needs none.
docker run --rm -i -v "$out:/out:ro" --entrypoint python3 "$image" - /out/latest/privacy_report.json \
    /out/latest/metrics.json <<'PY' || die "result check failed"
import json, sys
report = json.load(open(sys.argv[1]))
metrics = json.load(open(sys.argv[2]))
eps, delta = report["epsilon"], report["delta"] + report.get("delta_sampler", 0.0)
print(f"privacy report: epsilon {eps}, delta {delta}, mechanism {report.get('mechanism')}, "
      f"parties {report.get('parties')}, n {report.get('n')}, trust {report.get('trust_model')!r}")
assert "train_own_rows" not in metrics, "metrics on a party's own rows must not leave the party"
test = metrics.get("test")
print("metrics: " + (", ".join(f"test {k} {v:.4g}" for k, v in test.items()) if test else
                     "no public test set (metrics on each party's own rows stay in its .private/)"))
assert eps <= 1.0 + 1e-12, f"epsilon {eps} > 1"
assert delta <= 1e-7 * (1 + 1e-9), f"delta {delta} > 1e-7"
assert "dealer" in str(report.get("trust_model", "")), report.get("trust_model")
PY
status=0
