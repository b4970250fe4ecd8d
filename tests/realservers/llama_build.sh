#!/usr/bin/env bash
# Builds the two real llama.cpp servers the suite tests the gateway against, from PyPI's
# llama-cpp-python sdist (which vendors llama.cpp): `llama-server` (C++) and the llama-cpp-python
# server (`python -m llama_cpp.server`). llama.cpp is compiled once, as shared libraries plus the
# llama-server binary; the Python package is installed without compiling and loads those libraries.
# The result is cached outside the clone, keyed by version; a stamp file marks a finished build,
# so a second run is a no-op. About 10 minutes on 2 cores.
#
#   tests/native/llama_build.sh          # build (or nothing, if cached)
#   LLAMA_CPP_PYTHON_SDIST=/path/llama_cpp_python-X.tar.gz tests/native/llama_build.sh   # offline sdist
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root="${XDG_CACHE_HOME:-$HOME/.cache}/completions-gateway/llama-cpp-${version}"
stamp="$root/.complete"
# Two runs at once (a session's and a CI run's) take turns: the second finds the first's stamp.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
if [ -f "$stamp" ]; then
  exit 0
fi
jobs="${LLAMA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
python="${PYTHON:-python3}"
mkdir -p "$root"
rm -rf "$root/src" "$root/venv"

# The sdist, from PyPI (or a file given); no git clones.
mkdir -p "$root/src"
if [ -n "${LLAMA_CPP_PYTHON_SDIST:-}" ]; then
  sdist="$LLAMA_CPP_PYTHON_SDIST"
else
  "$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$root/dl" "llama-cpp-python==${version}"
  sdist="$(ls "$root"/dl/llama_cpp_python-"${version}".tar.gz)"
fi
tar xzf "$sdist" -C "$root/src" --strip-components=1
llama="$root/src/vendor/llama.cpp"

# llama.cpp: portable code (no -march=native, so the cache serves any x86-64 machine), shared
# libraries, no network at build time (no prebuilt web UI download, no curl/openssl).
cmake -S "$llama" -B "$root/build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF \
  -DGGML_OPENMP=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_CURL=OFF >"$root/cmake-configure.log"
cmake --build "$root/build" --target llama-server llama mtmd -j "$jobs"

# llama-cpp-python: the Python package and its server extras, without compiling llama.cpp again;
# its ctypes loader finds the libraries in llama_cpp/lib.
"$python" -m venv "$root/venv"
"$root/venv/bin/pip" install --quiet --upgrade pip
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
  "$root/venv/bin/pip" install --quiet "$root/src[server]"
libdir="$("$root/venv/bin/python" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llama_cpp")
print(pathlib.Path(spec.origin).parent / "lib")
PY
)"
mkdir -p "$libdir"
find "$root/build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$libdir"/ \;

"$root/build/bin/llama-server" --version
"$root/venv/bin/python" -c "import llama_cpp, llama_cpp.server.app; print('llama_cpp', llama_cpp.__version__)"
touch "$stamp"
