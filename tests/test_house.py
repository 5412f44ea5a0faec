"""The house rules, checked on the source (ARCHITECTURE.md says why they matter).

No import circles; no package over 15 modules, each package's docstring a map of its modules; no
module over 600 lines, no function over 60 lines or 8 parameters; no private tfdist name used
outside its module; no runner probed for a capability and no strategy class tested in training
code; Keras and TF internals only under ``tfdist/_compat/``; no tfdist attributes
set on TF objects. All static (``ast``), so this module runs in well under a second.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdist"
#: A package is a room: at most this many modules (``__init__`` included), each named in the
#: package's docstring. Splits follow concepts into packages, not a file's line count.
MAX_PACKAGE_MODULES = 15
#: A ceiling, not the shape: ~300 lines typical (DESIGN.md); a module over this does two jobs.
MAX_LINES = 600
#: No function inside the library takes more (self/cls not counted, ``*args``/``**kwargs`` one
#: each). Public entry points whose keywords mirror Keras or the command line are exempt below.
MAX_PARAMETERS = 8
#: Public entry points: their keywords are the public API (Keras's ``fit`` and ``Trainer``;
#: ``tfdist launch``'s flags), so they keep them, check them, and pass one options object on.
MANY_KEYWORDS = {
    "tfdist.training.trainer:Trainer.__init__",
    "tfdist.training.trainer:Trainer.fit",
    "tfdist.training.fit.inference:EvaluateAndPredict.evaluate",
    "tfdist.training.fit.inference:EvaluateAndPredict.predict",
    "tfdist.launch.local:launch",
    "tfdist.launch.notebook:notebook_launcher",
    "tfdist.launch.ray.engine:ray_fit",
    "tfdist.launch.manifests.slurm:slurm_script",
}
MAX_FUNCTION_LINES = 60  # signature and body, without the docstring
INTERNALS = re.compile(
    r"\bkeras\.src\b|\btensorflow\.python\b|\btf\.__internal__\b"
    r"|\b(?:get|has|set)attr\([^)]*[\"']_[a-z]"  # a private attribute reached by its name
)


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _owner(name: str) -> str:
    """The tfdist module that defines ``name`` (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _top_level_imports(tree: ast.Module):
    """Imports run when the module loads, plus ``if TYPE_CHECKING:`` ones (a circle for readers)."""
    for node in tree.body:
        if isinstance(node, ast.If):
            yield from (n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom)))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _imported(module: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative import
        package = module.split(".")
        if not MODULES[module].name == "__init__.py":
            package = package[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{a.name}" for a in node.names] or [base]


def _all_imports(tree: ast.Module):
    """Every import, in functions too (lazy ones close a circle when they run)."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


#: A ``"tfdist.module:function"`` string, as dispatch tables resolved by importlib hold.
DISPATCH_TARGET = re.compile(r"(tfdist(?:\.\w+)+):\w+")


def _dispatch_targets(tree: ast.Module) -> list[str]:
    """The modules named by ``"module:function"`` strings (loaded by importlib when they run)."""
    return [
        m.group(1)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
        for m in [DISPATCH_TARGET.fullmatch(n.value)]
        if m
    ]


def _graph(*, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the tfdist modules it imports when it loads (``lazy``: ever, by any path)."""
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        names = [
            name
            for node in (_all_imports(tree) if lazy else _top_level_imports(tree))
            for name in _imported(module, node)
        ]
        if lazy:
            names += _dispatch_targets(tree)
        edges = set()
        for name in names:
            if name.startswith("tfdist"):
                target = _owner(name)
                if target and target != module and not module.startswith(target + "."):
                    edges.add(target)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """Lazy imports count (in functions, or in ``"module:function"`` tables): they close circles."""
    assert _cycles(_graph(lazy=True)) == []


def test_the_circle_check_reads_lazy_imports_and_dispatch_tables():
    graph = _graph(lazy=True)
    assert "tfdist.strategies.factory" in graph["tfdist.bench.harness.common"]  # inside a function
    assert "tfdist.bench.scaling.worker" in graph["tfdist.bench.harness.workers"]  # KINDS
    assert "tfdist.bench.scaling.worker" not in _graph()["tfdist.bench.harness.workers"]


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by job"


def _packages() -> dict[str, pathlib.Path]:
    return {name: path for name, path in MODULES.items() if path.name == "__init__.py"}


@pytest.mark.parametrize("package", sorted(_packages()))
def test_packages_stay_small_and_their_docstring_maps_every_module(package):
    """A package's ``__init__`` docstring is its map: every module and subpackage, by name."""
    folder = _packages()[package].parent
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    subpackages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) + 1 <= MAX_PACKAGE_MODULES, (
        f"{package} holds {len(modules) + 1} modules: give a concept a package of its own"
    )
    doc = ast.get_docstring(ast.parse(_packages()[package].read_text())) or ""
    unnamed = [name for name in modules + subpackages if not re.search(rf"\b{name}\b", doc)]
    assert unnamed == [], f"{package}'s docstring does not name {unnamed}"


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _qualified_functions(tree: ast.Module):
    """``(qualified name, node)`` of every function, methods as ``Class.method``."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item
    nested = {
        id(n) for top in tree.body for n in (top.body if isinstance(top, ast.ClassDef) else [top])
    }
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(node) not in nested:
            yield f"<nested>.{node.name}", node


def test_functions_take_at_most_eight_parameters():
    """Options travel whole: a function with more takes an options object (ISSUE 46)."""
    many = [
        f"{module}:{name} takes {_parameters(node)}"
        for module, path in sorted(MODULES.items())
        for name, node in _qualified_functions(ast.parse(path.read_text()))
        if _parameters(node) > MAX_PARAMETERS and f"{module}:{name}" not in MANY_KEYWORDS
    ]
    assert many == []


def test_the_public_entry_points_with_many_keywords_exist():
    missing = []
    for entry in sorted(MANY_KEYWORDS):
        module, name = entry.split(":")
        names = {n for n, _ in _qualified_functions(ast.parse(MODULES[module].read_text()))}
        missing += [] if name in names else [entry]
    assert missing == []


#: A runner's optional capabilities are protocols (``tfdist.strategies.base``), checked with
#: ``isinstance`` against them; training code never probes attributes or tests a strategy class.
PROBE = re.compile(
    r"\b(?:get|has)attr\(\s*(?:self\.)?_?runner\b"
    r"|isinstance\([^)]*(?:Strategy|\bSyncRunner|\bPSRunner)\b"
)


def test_training_code_declares_capabilities_instead_of_probing():
    offenders = [
        f"{name}: {m.group(0)}"
        for name, path in sorted(MODULES.items())
        if name.startswith("tfdist.training")
        for m in PROBE.finditer(path.read_text())
    ]
    assert offenders == []


def test_tests_mirror_the_training_packages():
    """``tests/training/<package>/`` holds the tests of ``tfdist/training/<package>/``."""
    tests = ROOT / "tests" / "training"
    strays = [
        p.name
        for p in tests.iterdir()
        if p.is_dir() and p.name != "__pycache__" and not (PACKAGE / "training" / p.name).is_dir()
    ]
    assert strays == []


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of the signature and body, the docstring left out (nested functions included)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            lines -= first.end_lineno - first.lineno + 1
    return lines


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_stay_short(module):
    # DESIGN.md: a function does one job, readable on one screen (at most ~60 lines).
    long = [
        f"{node.name} (line {node.lineno}): {_function_lines(node)} lines"
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _function_lines(node) > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: split by job: {long}"


def _private_imports(path: pathlib.Path, module: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdist"):
            for alias in node.names:
                if alias.name.startswith("_") and alias.name != "_compat":
                    yield f"from {node.module} import {alias.name}"


@pytest.mark.parametrize("tree", ["tfdist", "tests"])
def test_no_private_tfdist_names_across_modules(tree):
    offenders = []
    for path in sorted((ROOT / tree).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        offenders += [f"{module}: {line}" for line in _private_imports(path, module)]
        # ``tfdist_module._name`` after ``from tfdist import module`` / ``import tfdist.x as m``.
        tree_ = ast.parse(path.read_text())
        aliases = {
            a.asname or a.name
            for n in ast.walk(tree_)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tfdist")
            for a in n.names
            if _owner(f"{n.module}.{a.name}") == f"{n.module}.{a.name}" and a.name != "_compat"
        }
        aliases |= {
            a.asname
            for n in ast.walk(tree_)
            if isinstance(n, ast.Import)
            for a in n.names
            if a.name.startswith("tfdist") and a.asname
        }
        offenders += [
            f"{module}: {n.value.id}.{n.attr}"
            for n in ast.walk(tree_)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in aliases
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
        ]
    assert offenders == []


def test_keras_and_tf_internals_only_under_compat():
    offenders = [
        str(p.relative_to(ROOT))
        for p in MODULES.values()
        if "_compat" not in p.parts and INTERNALS.search(p.read_text())
    ]
    assert offenders == []


def test_docstrings_cross_reference_in_markdown_not_sphinx_roles():
    """The docs site renders Markdown: a Sphinx role or a reST ``Example::`` shows as text."""
    role = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj):`|^\s*Examples?::$", re.M)
    offenders = [name for name, path in MODULES.items() if role.search(path.read_text())]
    assert offenders == []


def test_no_tfdist_attributes_on_tf_objects():
    offenders = [str(p.relative_to(ROOT)) for p in MODULES.values() if "._tfdist_" in p.read_text()]
    assert offenders == []


#: What each part of tfdist may import when it loads (ARCHITECTURE.md, "Layers"). Lazy imports
#: inside functions are not counted: the CLI reaches the Trainer that way without loading TF.
LAYERS = {
    "_lazy": set(),
    "config": set(),
    "logs": set(),
    "quiet": set(),
    "_compat": {"config"},
    "cluster": {"config"},
    "data": {"config", "_compat"},
    "models": {"config", "_compat"},
    "strategies": {"config", "logs", "_compat", "cluster", "data"},
    "training": {"_lazy", "config", "logs", "_compat", "cluster", "data", "models", "strategies"},
    "callbacks": {"training"},
    "launch": {"_lazy", "config", "logs", "quiet", "cluster"},
    "bench": {"config", "logs", "_compat", "cluster", "data", "models", "strategies", "training"},
    "cli": {"config", "quiet"},
}

#: The parts from the bottom up. No import, lazy ones included, reaches a part above its own:
#: ``cli`` starts ``launch`` and ``bench``, and ``bench`` starts its workers through ``launch``.
ORDER = [
    "_lazy",
    "config",
    "logs",
    "quiet",
    "_compat",
    "cluster",
    "data",
    "models",
    "strategies",
    "training",
    "callbacks",
    "launch",
    "bench",
    "cli",
]


def test_each_layer_imports_only_those_below_it():
    def part(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    wrong = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if part(a) in LAYERS and part(b) != part(a) and part(b) not in LAYERS[part(a)]
    )
    assert wrong == []


def test_no_import_reaches_a_part_above_its_own():
    def rank(module: str) -> int:
        part = module.split(".")[1] if "." in module else ""
        return ORDER.index(part) if part in ORDER else len(ORDER)  # tfdist/__init__, __main__

    upward = sorted(
        f"{a} -> {b}"
        for a, targets in _graph(lazy=True).items()
        for b in targets
        if rank(b) > rank(a)
    )
    assert upward == []


def test_the_scheduler_names_existing_test_modules():
    """tests/conftest.py orders xdist's scopes by name: a renamed module would drop out silently."""
    from tests.conftest import FIRST_SCOPES

    missing = [scope for scope in FIRST_SCOPES if not (ROOT / scope).is_file()]
    assert missing == []
