#!/bin/sh
# Installs the packed gateway (the tarball `npm pack` makes) into a folder with
# production dependencies only. The container image (Dockerfile) and
# test/package-install.test.ts both install through this script, so the image's
# layout and the tested layout cannot drift apart.
#
#   deploy/install.sh <package.tgz> <dir> [package-lock.json]
#
# With a lockfile, the dependency tree is exactly the locked one (npm ci);
# without one, npm resolves the package's own ranges. No lifecycle script runs
# (--ignore-scripts): the tarball already holds the built dist/, and no
# production dependency needs one. npm settings such as prefer-offline or a
# cache folder come from NPM_CONFIG_* in the environment.
set -eu

usage() { echo "usage: $0 <package.tgz> <dir> [package-lock.json]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
tarball=$1
dir=$2
lock=${3:-}
[ -f "$tarball" ] || { echo "$0: tarball not found: $tarball" >&2; exit 2; }
[ -z "$lock" ] || [ -f "$lock" ] || { echo "$0: lockfile not found: $lock" >&2; exit 2; }
mkdir -p "$dir"
[ -z "$(ls -A "$dir")" ] || { echo "$0: $dir is not empty" >&2; exit 2; }

# npm pack puts every file under package/; the files end up owned by whoever
# runs this (root in the image), so the unprivileged runtime user cannot change them.
tar -xzf "$tarball" -C "$dir" --strip-components=1 --no-same-owner
if [ -n "$lock" ]; then
  cp "$lock" "$dir/package-lock.json"
  (cd "$dir" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund)
else
  (cd "$dir" && npm install --omit=dev --ignore-scripts --no-audit --no-fund --no-package-lock)
fi
