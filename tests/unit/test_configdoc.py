"""docs/config.md is generated from the typed config (gateway/ops/configdoc.py); it must never drift from it.

Stale when a key is added, removed or retyped, a default changes, or a provider kind is added, until
`make docs` is run. The checks here do not trust the generator's walk alone: the config structs are
also read directly, and the CLI's `--check` is run as operators and CI run it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec

from gateway import config as cfgmod
from gateway.ops import configdoc
from providers import registry

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "config.md"


def test_docs_config_md_is_current() -> None:
    current = DOC.read_text(encoding="utf-8")
    assert configdoc.render(current) == current, "docs/config.md is stale: run `make docs`"


def test_every_key_has_a_meaning_and_every_meaning_a_key() -> None:
    assert configdoc.undocumented() == []


def _documented() -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), re.MULTILINE))


def test_every_field_of_every_config_struct_is_in_the_doc() -> None:
    """Read from the structs themselves: each field name is a part of a documented key."""
    leaves = {part.removesuffix("[]") for path in _documented() for part in path.split(".")}
    structs = [cfgmod.GatewayConfig, cfgmod.ProviderConfig, cfgmod.DeploymentConfig, cfgmod.PriceConfig]
    structs += [cfgmod.LimitsConfig, cfgmod.RetriesConfig, cfgmod.TimeoutsConfig, cfgmod.AliasConfig]
    for struct in structs:
        missing = set(struct.__struct_fields__) - leaves
        assert not missing, (struct.__name__, missing)
    # The two the issue found missing from the hand-written table, by their full paths.
    assert {"redis.refresh_ms", "providers.<name>.default_max_tokens"} <= _documented()


def test_every_provider_kind_is_listed() -> None:
    kinds = tuple(registry.kinds())
    assert configdoc.provider_kinds() == kinds
    assert len(kinds) >= 17
    text = DOC.read_text(encoding="utf-8")
    (listed,) = re.findall(r"`providers\.<name>\.kind` is one of these (\d+): (.*?)\. ", text)
    assert int(listed[0]) == len(kinds)
    assert re.findall(r"`([^`]+)`", listed[1]) == list(kinds)


def test_a_documented_default_is_the_default_the_config_loads() -> None:
    """The default column against `parse_config` of an empty file, for every plain top-level block."""
    loaded = cfgmod.parse_config("", env={}).config
    rows = {r.path: r for r in configdoc.rows()}
    checked = 0
    for block in ("server", "redis", "timeouts", "retries", "cooldown", "caps", "discovery", "logging"):
        for name, value in msgspec.structs.asdict(getattr(loaded, block)).items():
            row = rows[f"{block}.{name}"]
            if value is None or row.path in configdoc.DEFAULTS:
                continue
            shown = str(value).lower() if isinstance(value, bool) else str(value) if value != "" else '""'
            assert row.default.startswith(f"`{shown}`"), (row.path, row.default, value)
            checked += 1
    assert checked > 30


def test_a_removed_row_makes_the_doc_stale_and_the_generator_restores_it() -> None:
    current = DOC.read_text(encoding="utf-8")
    (row,) = [line for line in current.splitlines() if line.startswith("| `redis.refresh_ms` |")]
    broken = current.replace(row + "\n", "")
    assert configdoc.render(broken) != broken
    assert configdoc.render(broken) == current


def test_hand_written_prose_outside_the_markers_is_kept() -> None:
    current = DOC.read_text(encoding="utf-8")
    assert current.startswith("# Config reference")
    assert "## Environment references" in current.split(configdoc.BEGIN)[0]
    assert "## Model strings" in current.split(configdoc.END)[1]
    edited = current.replace("## Model strings", "## Model strings, edited by hand")
    assert configdoc.render(edited) == edited


def test_the_cli_checks_and_rewrites(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "docs", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert run("--check").returncode == 0
    stale = tmp_path / "config.md"
    stale.write_text(DOC.read_text(encoding="utf-8").replace("| `redis.refresh_ms` |", "| `redis.refresh` |"))
    result = run("--check", "--path", str(stale))
    assert (result.returncode, result.stderr) == (1, f"{stale} is stale: run `make docs`\n")
    assert run("--path", str(stale)).returncode == 0
    assert stale.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")
