#!/usr/bin/env bash
# A virtualenv holding lm-evaluation-harness as PyPI ships it (its `api` extra: the OpenAI-compatible
# `local-completions` and `local-chat-completions` models; no torch, no transformers), for
# tests/clients/test_lm_eval_run.py, which runs its `lm_eval` command against the gateway. Cached outside
# the clone, keyed by version; a stamp file marks a finished install, so a second run is a no-op. About 90 s
# and 760 MB (datasets, pyarrow, pandas, scikit-learn) the first time.
set -euo pipefail

version="${LM_EVAL_VERSION:-0.4.13}"
root="${XDG_CACHE_HOME:-$HOME/.cache}/completions-gateway/lm-eval-${version}"
stamp="$root/.complete"
# Two runs at once (a session's and a CI run's) take turns: the second finds the first's stamp.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
if [ -f "$stamp" ]; then
  exit 0
fi
python="${PYTHON:-python3}"
rm -rf "$root"
"$python" -m venv "$root"
"$root/bin/python" -m pip install --quiet --disable-pip-version-check "lm-eval[api]==${version}"
"$root/bin/lm_eval" --help >/dev/null
touch "$stamp"
