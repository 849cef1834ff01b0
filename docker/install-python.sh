#!/bin/sh
# The image's Python side: a venv at $1 with tickwire and its Spark and web extras, installed from
# the source tree in the current directory. The test suite runs the same script on the host.
# pip keeps its cache unless told not to: the image's build says PIP_NO_CACHE_DIR=1 (no cache in
# its layer); the suite's run on the host reuses the host's cache (the wheels pyspark's sdist
# builds to), which changes what is downloaded and built, not what is installed.
set -eu
VENV="${1:?usage: install-python.sh VENV}"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet ".[spark,web]"
