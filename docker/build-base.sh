#!/usr/bin/env bash
# Build a local stand-in for python:3.11-slim when no image registry can be reached: a minimal
# Debian (debootstrap --variant=minbase) with Debian's python3.11, python3-venv and pip, imported
# into Docker as one layer. Needs root, debootstrap and a Debian package mirror (by default the
# first one this host's apt uses; override with DEBIAN_MIRROR).
#
#   docker/build-base.sh [TAG]          # default TAG: mpc-erm-base:bookworm
#   docker build --build-arg BASE_IMAGE=mpc-erm-base:bookworm -f docker/Dockerfile .
set -euo pipefail

TAG=${1:-mpc-erm-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}

die() { echo "build-base.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap and chroot)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
command -v docker >/dev/null || die "docker not found"

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    # deb822 sources (URIs: ...) or one-line sources (deb URI suite ...); the first Debian main archive.
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
             | awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}')
    if [ -z "$mirror" ]; then
        mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                 | awk '$1 == "deb" && $2 !~ /^\[/ && $2 !~ /security/ {print $2; exit}')
    fi
fi

work=$(mktemp -d /tmp/mpc-erm-base.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

echo "build-base.sh: debootstrap $SUITE from ${mirror:-the default mirror of debootstrap} into $work/rootfs"
if ! nice -n 19 debootstrap --variant=minbase \
        --include=python3.11,python3.11-venv,python3-venv,python3-pip,ca-certificates \
        "$SUITE" "$work/rootfs" ${mirror:+"$mirror"} > "$work/debootstrap.log" 2>&1; then
    tail -30 "$work/debootstrap.log" >&2
    die "debootstrap failed"
fi
echo "build-base.sh: $(grep -c '^I: Extracting' "$work/debootstrap.log") packages unpacked"

# Slim it like the official slim images: no apt lists, caches, docs, man pages or locales.
rootfs=$work/rootfs
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/*.log \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
       "$rootfs"/usr/share/locale/* "$rootfs"/tmp/* 2>/dev/null || true
chroot "$rootfs" python3 -c 'import venv, ensurepip, ssl, sqlite3; print("python", __import__("sys").version.split()[0], "ok")'

tar --numeric-owner -C "$rootfs" -c . \
    | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' \
        -m "debootstrap $SUITE minbase + python3.11, python3-venv, pip" - "$TAG"
docker image inspect --format '{{.Id}} {{.Size}}' "$TAG"
echo "build-base.sh: built $TAG"
