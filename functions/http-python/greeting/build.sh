#!/bin/sh
# Builds greeting.wasm from app.py with componentize-py and spin-sdk (pip
# install -r requirements.txt in the active virtual environment: the build
# finds spin-sdk's WIT through VIRTUAL_ENV). spin-sdk's world, intersected
# with wit/world.wit: only what Laurel provides is imported.
set -eu
cd "$(dirname "$0")"
: "${VIRTUAL_ENV:?activate the virtual environment that has requirements.txt installed}"
exec componentize-py -d wit -w spin:up/http-trigger@4.1.0 \
    componentize -i laurel:http-python/http app -o greeting.wasm
