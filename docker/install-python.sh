#!/bin/sh
# The image's Python side: a venv at $1 with tickwire and its Spark and web extras, installed from
# the source tree in the current directory. The test suite runs the same script on the host.
set -eu
VENV="${1:?usage: install-python.sh VENV}"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-cache-dir --upgrade pip
"$VENV/bin/python" -m pip install --quiet --no-cache-dir ".[spark,web]"
