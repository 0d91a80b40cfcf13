"""No module of the project imports another in a loop, hidden imports included.

Imports are read with `ast` (nothing is executed), so imports inside functions and under
`if TYPE_CHECKING:` count: they are still a dependency, only a hidden one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {
    "sluice.codec": "codec",
    "sluice.crypto": "crypto",
    "sluice.filters": "filters",
    "sluice.proxy": "proxy",
    "sluice.spark_audit": "spark_audit",
    "sluice": "sluice",
}
SKIP = {"tests", ".venv", "venv", "build", ".git", "node_modules", "fuzz", "bench"}


def _file_of(module: str) -> Path | None:
    for prefix in sorted(ROOMS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            rest = module[len(prefix) :].lstrip(".")
            base = ROOT / ROOMS[prefix]
            if rest:
                base = base.joinpath(*rest.split("."))
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    for prefix, folder in ROOMS.items():
        if parts[0] == folder:
            name = ".".join([prefix, *parts[1:]])
            return name.removesuffix(".__init__")
    return ".".join(parts)


def _imports(path: Path) -> set[Path]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[Path] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join([*up, base]) if base else ".".join(up)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            target = _file_of(name)
            if target is not None and target != path:
                found.add(target)
    return found


def _cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[Path]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def project_files() -> list[Path]:
    return [
        p for p in ROOT.rglob("*.py") if not any(part in SKIP for part in p.relative_to(ROOT).parts)
    ]


def test_no_module_imports_another_in_a_loop() -> None:
    graph = {f: _imports(f) for f in project_files()}
    loops = [sorted(str(p.relative_to(ROOT)) for p in c) for c in _cycles(graph)]
    assert loops == [], f"import cycles: {loops}"


def test_the_check_sees_hidden_imports() -> None:
    # reload.py names ProxyServer only under `if TYPE_CHECKING:`; it still depends on it.
    reload = ROOT / "proxy" / "ops" / "reload.py"
    assert "TYPE_CHECKING" in reload.read_text(encoding="utf-8")
    assert ROOT / "proxy" / "net" / "server.py" in _imports(reload)
    a, b = ROOT / "proxy" / "net" / "server.py", ROOT / "proxy" / "net" / "session.py"
    assert _cycles({a: {b}, b: {a}}) != []
