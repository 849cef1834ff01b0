#!/bin/sh
# The image's system packages: a JDK 17 (Spark's JVM, and javac for its non-forking checkpoint
# filesystem). Debian 12 (bookworm) has openjdk-17; Debian 13 does not, so the base is pinned.
# `--check` only verifies that they are present (how the test suite runs this step on a host).
set -eu
PACKAGES="openjdk-17-jdk-headless"
if [ "${1:-}" = "--check" ]; then
    for cmd in java javac; do
        command -v "$cmd" >/dev/null 2>&1 || { echo "missing: $cmd (apt-get install $PACKAGES)"; exit 1; }
    done
    java -version 2>&1 | grep -q '"17\.' || { echo "java is not 17: $(java -version 2>&1 | head -1)"; exit 1; }
    exit 0
fi
apt-get update
apt-get install -y --no-install-recommends $PACKAGES
rm -rf /var/lib/apt/lists/*
