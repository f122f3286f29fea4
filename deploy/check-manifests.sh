#!/usr/bin/env bash
# Validates the deployment files against their schemas, offline once the tools are installed:
#   - kubernetes/layad.yaml with kubernetes-validate --strict (Kubernetes' own OpenAPI schemas, for
#     1.30, the oldest the manifest supports — preStop's sleep action — and the tool's default);
#   - compose/compose.yaml with check-jsonschema against the Compose Specification's schema
#     (vendored in check-jsonschema as vendor.compose-spec);
#   - both with yamllint (line length 120);
#   - every image they name is the one deploy/container/build.sh tags, at this version.
# The tools come from PyPI, pinned, into a venv in target/deploy-venv; where pip cannot install
# them (no network) this says SKIPPED and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/deploy-venv
tools="kubernetes-validate==1.37.0 check-jsonschema==0.39.0 yamllint==1.38.0"
if [ ! -f "$venv/.installed" ] || [ "$(cat "$venv/.installed")" != "$tools" ]; then
    rm -rf "$venv"
    # shellcheck disable=SC2086 # the pins are words
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q $tools; } >/dev/null 2>&1; then
        rm -rf "$venv"
        echo "check-manifests: SKIPPED: could not install $tools from PyPI (no network?)"
        exit 0
    fi
    echo "$tools" >"$venv/.installed"
fi

k8s=deploy/kubernetes/layad.yaml
compose=deploy/compose/compose.yaml
"$venv/bin/kubernetes-validate" --quiet --strict -k 1.30.0 "$k8s"
"$venv/bin/kubernetes-validate" --quiet --strict "$k8s"
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$compose"
"$venv/bin/yamllint" --strict -d '{extends: default, rules: {line-length: {max: 120}}}' "$k8s" "$compose"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
bad=$(grep -hE '^\s*image: .*layad' "$k8s" "$compose" | grep -vE "image: (localhost/)?layad:$version\$" || true)
[ -z "$bad" ] || {
    echo "check-manifests: these images are not build.sh's layad:$version:" >&2
    echo "$bad" >&2
    exit 1
}
echo "check-manifests: $k8s (Kubernetes 1.30 and 1.37, strict) and $compose (compose-spec) valid; images layad:$version"
