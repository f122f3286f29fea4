#!/usr/bin/env bash
# Builds the layad container image from this checkout with podman and prints its name on the last
# line. No image registry is used: the binaries come from this tree (cargo build --release), the
# root from Debian's package archive (debootstrap), and Containerfile puts them together FROM
# scratch.
#
#   deploy/container/build.sh                       # release build, image localhost/layad:<version>
#   BIN_DIR=target/debug deploy/container/build.sh  # binaries already built (test.sh, .ci/run)
#
# Environment:
#   IMAGE      the name to tag (default localhost/layad:<workspace version>)
#   BIN_DIR    a directory holding layad and layad-worker-gpu already built; their debug info is
#              stripped in the image. Default: `cargo build --release` and target/release
#              (or $CARGO_TARGET_DIR/release).
#   MIRROR     the Debian mirror (default http://deb.debian.org/debian), SUITE (default bookworm)
#
# Needs: podman (Debian's podman 4.3 here), and for the root once: debootstrap, chroot and root
# (the root is cached in target/container/, keyed by suite and package list; delete it to take
# newer security updates). Exits 2, saying what is missing, when it cannot build.
set -euo pipefail
cd "$(dirname "$0")/../.."

die() {
    echo "build.sh: $1" >&2
    exit 2
}
command -v podman >/dev/null || die "podman is not installed (apt install podman)"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
IMAGE=${IMAGE:-localhost/layad:$version}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
# minbase (dpkg, apt, bash, coreutils, glibc) plus the CA bundle for https to the Hub.
PACKAGES=ca-certificates
work=target/container
started=$(date +%s)

# --- The binaries -------------------------------------------------------------------------------
if [ -z "${BIN_DIR:-}" ]; then
    cargo build --release -p layad -p layad-worker-gpu --bins
    BIN_DIR=${CARGO_TARGET_DIR:-target}/release
fi
for bin in layad layad-worker-gpu; do
    [ -x "$BIN_DIR/$bin" ] || die "$BIN_DIR/$bin is missing: build it (cargo build --release --bins) or set BIN_DIR"
done

# --- The root -----------------------------------------------------------------------------------
# debootstrap's minimal variant, brought up to date from the security archive, without the
# documentation, manual pages, locales and apt's package lists (the image never runs apt), and
# with the unprivileged user the image runs as.
rootfs="$work/rootfs-$SUITE-$(echo "$PACKAGES" | tr ' ,' '--').tar"
if [ ! -s "$rootfs" ]; then
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt install debootstrap), and $rootfs is not built"
    [ "$(id -u)" = 0 ] || die "making the root ($rootfs) needs root for debootstrap and chroot; run once as root"
    mkdir -p "$work"
    root=$(mktemp -d "$work/root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "build.sh: debootstrap $SUITE from $MIRROR (once; cached in $rootfs)" >&2
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2 ||
        die "debootstrap failed (no network to $MIRROR?)"
    cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot "$root" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade && apt-get clean' >&2 ||
        die "the security updates could not be installed (no network to $SECURITY?)"
    chroot "$root" groupadd --gid 10001 layad
    chroot "$root" useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin layad
    install -d -m 0755 -o 10001 -g 10001 "$root/data"
    : >"$root/etc/resolv.conf"
    rm -rf "$root"/usr/share/{doc,man,info,locale,lintian} "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
        "$root"/var/log/* "$root"/tmp/* "$root"/dev/*
    # The package list is kept (what is inside, for scanners), readable by `dpkg -l` in the image.
    tar --numeric-owner --xattrs -C "$root" -cf "$rootfs.part" .
    mv "$rootfs.part" "$rootfs"
    rm -rf "$root"
    trap - EXIT
fi

# --- The image ----------------------------------------------------------------------------------
context="$work/context"
rm -rf "$context"
mkdir -p "$context/bin"
ln "$rootfs" "$context/rootfs.tar" 2>/dev/null || cp "$rootfs" "$context/rootfs.tar"
for bin in layad layad-worker-gpu; do
    # Debug info is for debuggers, not for the image (a debug build's is most of its size).
    objcopy --strip-debug "$BIN_DIR/$bin" "$context/bin/$bin" 2>/dev/null || cp "$BIN_DIR/$bin" "$context/bin/$bin"
done
cp deploy/container/layad-probe "$context/bin/"
chmod 0755 "$context"/bin/*
podman build --format docker --file deploy/container/Containerfile --tag "$IMAGE" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$context" >&2
rm -rf "$context"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build.sh: built $IMAGE from $BIN_DIR in $(($(date +%s) - started)) s: $((size / 1000000)) MB uncompressed" >&2
echo "$IMAGE"
