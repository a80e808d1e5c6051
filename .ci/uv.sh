# Sourced by the scripts in .ci/ and requirements/: puts the uv that requirements/lock.txt pins
# into a tool environment in the cache (outside the checkout) and sets UV to its path, so that
# every resolve and install uses the same uv, whatever else the machine has. Also defines
# install_locked, the one way the scripts install an environment from a constraints file.
CACHE="${CRL_CACHE_DIR:-$HOME/.cache/coderepairrl}"
export CRL_CACHE_DIR="$CACHE" UV_CACHE_DIR="$CACHE/uv" PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
_uv_version=$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../requirements/lock.txt")
UV="$CACHE/tools/uv-$_uv_version/bin/uv"
if [ ! -x "$UV" ]; then
    "${PYTHON:-python3}" -m venv "$CACHE/tools/uv-$_uv_version"
    "$CACHE/tools/uv-$_uv_version/bin/python" -m pip install --quiet "uv==$_uv_version"
fi
export UV

# install_locked PYTHON CONSTRAINTS: the project with every extra the tests need, the build tools,
# then DeepSpeed (built against the torch just installed), all at the versions CONSTRAINTS pins.
install_locked() {
    "$UV" pip install --quiet --python "$1" -c "$2" --build-constraints "$2" \
        -e ".[dev,operator,worker,train]" pip setuptools wheel
    "$UV" pip install --quiet --python "$1" -c "$2" --no-build-isolation deepspeed
}
