"""Render a kustomization without kubectl: the subset deploy/kubernetes uses, and nothing else.

`resources` (YAML files and directories with their own kustomization.yaml), `configMapGenerator` with
`files`, `secretGenerator` with `envs`, and `generatorOptions.disableNameSuffixHash: true`. Any other key
is refused, so the manifests cannot start using a feature this renderer would silently ignore. Where
kubectl is installed, tests/ops/test_kubernetes.py checks this renderer against `kubectl kustomize`.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "configMapGenerator", "secretGenerator", "generatorOptions"}


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


def _inside(root: Path, name: str) -> Path:
    # kustomize's default load restrictor: no file outside the kustomization's directory.
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()):
        raise Unsupported(f"{name}: outside {root} (kustomize refuses it by default)")
    return path


def _env_file(path: Path) -> dict[str, str]:
    """kustomize's env-file rules: `KEY=value` lines; blank lines and `#` comments skipped; no quoting."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise Unsupported(f"{path}: {line!r} is not KEY=value")
        out[key.strip()] = value
    return out


def render(root: Path) -> list[dict[str, Any]]:
    """The resources `kubectl kustomize root` would print, in no particular order."""
    spec = yaml.safe_load((root / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise Unsupported(f"kustomization keys not implemented here: {sorted(unknown)}")
    options = spec.get("generatorOptions", {})
    if options != {"disableNameSuffixHash": True}:
        # A hash suffix would need every reference renamed, which this renderer does not do.
        raise Unsupported(f"generatorOptions {options!r}: only disableNameSuffixHash: true is implemented")
    out: list[dict[str, Any]] = []
    for name in spec.get("resources", []):
        path = _inside(root, name)
        if path.is_dir():
            out.extend(render(path))
        else:
            out.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    for gen in spec.get("configMapGenerator", []):
        if set(gen) != {"name", "files"}:
            raise Unsupported(f"configMapGenerator {gen.get('name')}: only name and files are implemented")
        data: dict[str, str] = {}
        for entry in gen["files"]:
            key, sep, file = entry.partition("=")
            path = _inside(root, file if sep else key)
            data[key if sep else path.name] = path.read_text()
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for gen in spec.get("secretGenerator", []):
        if set(gen) - {"name", "envs", "type"}:
            raise Unsupported(f"secretGenerator {gen.get('name')}: only name, envs and type are implemented")
        values: dict[str, str] = {}
        for file in gen.get("envs", []):
            values.update(_env_file(_inside(root, file)))
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": gen["name"]},
                "type": gen.get("type", "Opaque"),
                "data": encoded,
            }
        )
    return out
