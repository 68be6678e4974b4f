"""deploy/argocd/health.lua, Argo CD's health check of a BatchedModel, run on Lua 5.1 (lupa's, the language of Argo
CD's gopher-lua) the way Argo CD runs it: the object as the global ``obj``, a table ``{status, message}`` back
(https://argo-cd.readthedocs.io/en/stable/operator-manual/health/#custom-health-checks)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEALTH_LUA = Path(__file__).resolve().parents[1] / "deploy" / "argocd" / "health.lua"
#: The statuses an Argo CD health check may return.
STATUSES = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")


def _to_lua(lua: Any, value: Any) -> Any:
    """JSON-shaped ``value`` as Lua values: objects and arrays become tables (arrays 1-based), as Argo CD decodes."""
    if isinstance(value, Mapping):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def argocd_health(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(status, message) that the health check gives ``obj`` (a BatchedModel as the API server returns it)."""
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime(register_eval=False)
    lua.globals().obj = _to_lua(lua, obj)
    result = lua.execute(HEALTH_LUA.read_text())
    status, message = result["status"], result["message"]
    assert status in STATUSES, f"not an Argo CD health status: {status!r}"
    return str(status), str(message)


def trimmed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the health check reads of ``obj`` (a fixture saved from a cluster test keeps only this)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {"name": meta.get("name"), "generation": meta.get("generation")},
        "status": obj.get("status") or {},
    }
