"""The documentation site builds, and its API reference covers the public API.

``mkdocs build --strict`` fails on a broken link or anchor between the pages, a snippet
(``--8<--``) whose file or section is gone, and an API reference entry (``::: name``) that no
longer names a tfdist object. mkdocstrings reads the source statically (griffe), so the build
imports no TensorFlow and takes a few seconds. Nothing is fetched: the theme is MkDocs' own.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import tfdist

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HEADING = re.compile(r"^## `tfdist\.(\w+)`$", re.M)
ENTRY = re.compile(r"^::: ([\w.]+)$", re.M)


def test_mkdocs_build_strict(tmp_path):
    """The site builds with no warning, without TensorFlow; the API page covers the public API.

    A ``tensorflow`` that fails to import comes first on the path: the API reference must be
    read from the source, not by importing tfdist (which would load TensorFlow, seconds more).
    """
    guard = tmp_path / "guard" / "tensorflow"
    guard.mkdir(parents=True)
    (guard / "__init__.py").write_text('raise ImportError("the docs build imported TensorFlow")\n')
    path = [str(guard.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    api = (site / "api" / "index.html").read_text()
    for name in public_names():
        assert f'id="tfdist{name.lower()}"' in api, (
            f"no entry for tfdist.{name} in the built API page"
        )
    assert "make train" in (site / "index.html").read_text()
    # Docstrings cross-reference in Markdown, which the site renders: no Sphinx role or
    # reST literal block is left to show as text; signatures show; no option's check().
    roles = re.findall(r":(?:mod|func|class|meth|attr|data|exc|obj):(?:<code>|`)[^<`]*", api)
    assert not roles, f"Sphinx roles shown literally in the API page: {roles}"
    assert "Example::" not in api
    assert re.search(r'Trainer</span>\s*<span class="p">\(', api), "no Trainer(...) signature"
    assert not re.search(r'id="tfdist\.[\w.]+Options\.check"', api)


def public_names() -> list[str]:
    return [name for name in tfdist.__all__ if name != "__version__"]


def sections() -> dict[str, list[str]]:
    """The API page's ``## `tfdist.NAME``` sections, each with its ``::: identifier`` entries."""
    text = (DOCS / "api.md").read_text()
    parts = HEADING.split(text)[1:]
    return {name: ENTRY.findall(body) for name, body in zip(parts[::2], parts[1::2])}


def test_api_reference_has_one_section_per_public_name():
    """Adding, removing or renaming a name in ``tfdist.__all__`` needs the reference to follow."""
    assert sorted(sections()) == sorted(public_names())


def test_each_section_documents_its_own_name():
    """A class or function entry ends in the section's name; a module entry is the module."""
    for name, entries in sections().items():
        assert entries, f"tfdist.{name}: no '::: identifier' entry"
        first = entries[0]
        assert first == f"tfdist.{name}" or first.endswith(f".{name}"), (name, first)


def test_readme_links_to_docs_pages_that_exist():
    """The README's map: every relative link names a file of the repository."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert [p for p in pages if p not in nav] == []
