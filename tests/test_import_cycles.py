"""The rooms' layering holds: no module imports another in a loop, and no room imports what
docs/ARCHITECTURE.md says it knows nothing of.

Imports are read with `ast` (nothing is executed), so imports inside functions and under
`if TYPE_CHECKING:` count: they are still a dependency, only a hidden one.

The "knows nothing of" column of the doc's rooms table is mirrored here (`RULES`), phrase by
phrase, and each phrase is given a meaning in imports (`PHRASES`). A test parses the doc's
table and checks that it says what `RULES` says, so the doc and the check cannot drift apart.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {
    "sluice.codec": "codec",
    "sluice.crypto": "crypto",
    "sluice.filters": "filters",
    "sluice.proxy": "proxy",
    "sluice.spark_audit": "spark_audit",
    "sluice.telemetry_schema": "telemetry_schema",
    "sluice.transforms": "transforms",
    "sluice": "sluice",
}
SKIP = {"tests", ".venv", "venv", "build", ".git", "node_modules", "fuzz", "bench"}
DOC = ROOT / "docs" / "ARCHITECTURE.md"


@dataclass(frozen=True)
class Rule:
    """What a phrase of the doc forbids: imports under `forbid`, unless under `allow`; files
    in `exempt` (relative to the root) are the rule's stated exceptions."""

    forbid: tuple[str, ...]
    allow: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()


PHRASES: dict[str, Rule] = {
    "sockets": Rule(("socket", "ssl", "selectors")),
    "asyncio": Rule(("asyncio",)),
    "filters": Rule(("sluice.filters",)),
    "the proxy": Rule(("sluice.proxy",)),
    "the transforms": Rule(("sluice.transforms",)),
    "the rest of Sluice": Rule(("sluice",), allow=("sluice.telemetry_schema",)),
    "the proxy's rooms": Rule(
        ("sluice.proxy.net", "sluice.proxy.paths", "sluice.proxy.ops", "sluice.proxy.telemetry")
    ),
    # net drives the paths through the contract and the router only; the server assembles
    # the router (the catalog of paths) and the quotas.
    "what any API means": Rule(
        ("sluice.proxy.paths", "sluice.proxy.ops.quotas"),
        allow=("sluice.proxy.paths.base", "sluice.proxy.paths.registry"),
        exempt=("proxy/net/server.py",),
    ),
    "the server and the rest of `net`": Rule(("sluice.proxy.net",)),
    "the paths": Rule(("sluice.proxy.paths",)),
    "the proxy's data path": Rule(("sluice.proxy.net", "sluice.proxy.paths", "sluice.proxy.ops")),
}

# The doc's "knows nothing of" column, room by room (folders as the doc's first column names
# them; a file belongs to the longest folder that holds it).
RULES: dict[str, tuple[str, ...]] = {
    "codec/": ("sockets", "asyncio", "filters", "the proxy"),
    "filters/": ("sockets", "asyncio", "the proxy"),
    "crypto/": ("sockets", "asyncio", "the proxy"),
    "telemetry_schema/": ("the rest of Sluice",),
    "proxy/": ("the proxy's rooms",),
    "proxy/net/": ("what any API means",),
    "proxy/paths/": ("sockets", "the server and the rest of `net`"),
    "proxy/ops/": ("the paths",),
    "proxy/telemetry/": ("the paths",),
    "spark_audit/": ("the proxy", "filters", "the transforms"),
    "transforms/": ("the proxy's data path",),
    "sluice/": (),
    "fuzz/": (),
    "bench/": (),
    "tests/": (),
}


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


def imported_names(path: Path) -> set[str]:
    """Every module name the file imports, absolute; `from m import a` gives `m.a`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join([*up, base]) if base else ".".join(up)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _imports(path: Path) -> set[Path]:
    found: set[Path] = set()
    for name in imported_names(path):
        for candidate in (name, name.rpartition(".")[0]):
            target = _file_of(candidate)
            if target is not None and target != path:
                found.add(target)
                break
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
    # os.walk, pruning as it goes: rglob also entered hidden folders such as .hypothesis/tmp,
    # which a test on another worker may delete mid-walk (FileNotFoundError in CI). os.walk
    # skips a folder that vanished, and hidden folders hold no project module.
    found: list[Path] = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith("."))
        found.extend(Path(folder) / f for f in sorted(files) if f.endswith(".py"))
    return found


def room_of(path: Path) -> str | None:
    rel = path.relative_to(ROOT).as_posix()
    rooms = [room for room in RULES if rel.startswith(room)]
    return max(rooms, key=len) if rooms else None


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rel: str, room: str, names: set[str]) -> list[str]:
    """The imports of the file `rel` (in `room`) that its room's rules forbid."""
    found = []
    for phrase in RULES[room]:
        rule = PHRASES[phrase]
        if rel in rule.exempt:
            continue
        for name in sorted(names):
            if _under(name, rule.forbid) and not _under(name, rule.allow):
                found.append(f"{rel} imports {name} ({room} knows nothing of {phrase})")
    return found


def doc_rules() -> dict[str, tuple[str, ...]]:
    """The rooms table of docs/ARCHITECTURE.md: folder -> the phrases of "knows nothing of"
    (remarks in parentheses left out, phrases separated by commas)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Rooms\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, ...]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"a rooms row of {DOC.name} without three cells: {line[:80]}"
        folder = re.match(r"`([^`]+)`", cells[0])
        assert folder is not None, line[:80]
        cell = cells[2]
        while True:
            stripped = re.sub(r" ?\([^()]*\)", "", cell)
            if stripped == cell:
                break
            cell = stripped
        rows[folder.group(1)] = tuple(p.strip() for p in cell.split(",") if p.strip())
    return rows


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


def test_the_doc_and_the_rules_name_the_same_rooms_and_phrases() -> None:
    assert doc_rules() == RULES
    assert {p for phrases in RULES.values() for p in phrases} <= set(PHRASES)


def test_every_module_is_in_a_room_of_the_doc() -> None:
    homeless = [str(p.relative_to(ROOT)) for p in project_files() if room_of(p) is None]
    assert homeless == [], f"modules in no room of {DOC.name}: {homeless}"


def test_no_room_imports_what_it_knows_nothing_of() -> None:
    found = []
    for path in project_files():
        room = room_of(path)
        if room is not None:
            rel = path.relative_to(ROOT).as_posix()
            found += violations(rel, room, imported_names(path))
    assert found == [], "\n".join(found)


def test_the_rules_catch_a_forbidden_import() -> None:
    assert violations("spark_audit/x.py", "spark_audit/", {"sluice.proxy.telemetry.sinks"})
    assert violations("proxy/net/connection.py", "proxy/net/", {"sluice.proxy.paths.fetch.F"})
    assert not violations("proxy/net/connection.py", "proxy/net/", {"sluice.proxy.paths.base.X"})
    assert not violations("proxy/net/server.py", "proxy/net/", {"sluice.proxy.paths.catalog.c"})
    assert violations("telemetry_schema/x.py", "telemetry_schema/", {"sluice.filters.host.H"})
    assert not violations("telemetry_schema/x.py", "telemetry_schema/", {"pyarrow.compute"})
