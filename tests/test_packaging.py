"""What the package index and pip see: the extras that install the event loops, the project's
metadata, and a long description (the README) whose links all work away from the repository."""

from __future__ import annotations

import importlib.metadata
import re
import runpy
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/aiocudasem/aiocudasem"
DOCS = "https://aiocudasem.github.io/aiocudasem/"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def _setup(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run setup.py with a stand-in for setuptools: the keywords it passes to ``setup()``, and
    its globals."""
    kwargs: dict[str, Any] = {}
    fake = types.ModuleType("setuptools")
    fake.Extension = lambda *args, **kw: (args, kw)  # type: ignore[attr-defined]
    fake.setup = kwargs.update  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "setuptools", fake)
    namespace = runpy.run_path(str(ROOT / "setup.py"))
    return kwargs, namespace


# ---------------------------------------------------------------- extras


@pytest.mark.parametrize("extra", ["trio", "uvloop"])
def test_each_event_loop_has_an_extra_that_installs_it(extra: str) -> None:
    """``pip install 'aiocudasem[trio]'`` is what makes ``anyio.run(main, backend="trio")`` of
    the README work; ``[uvloop]`` the same for asyncio+uvloop."""
    declared = _pyproject()["optional-dependencies"]
    assert any(re.match(rf"{extra}\b", req) for req in declared[extra])
    # The test extra runs the suite on every loop, so it needs them too.
    assert any(re.match(rf"{extra}\b", req) for req in declared["test"])
    installed = importlib.metadata.metadata("aiocudasem")
    assert extra in installed.get_all("Provides-Extra", [])
    requires = installed.get_all("Requires-Dist", [])
    assert any(
        req.startswith(extra) and re.search(rf"extra\s*==\s*['\"]{extra}['\"]", req)
        for req in requires
    ), requires


# ---------------------------------------------------------------- metadata


def test_the_metadata_names_its_authors_and_links() -> None:
    project = _pyproject()
    assert project["authors"] == [{"name": "The aiocudasem authors"}]
    urls = project["urls"]
    assert urls == {
        "Homepage": REPOSITORY,
        "Documentation": DOCS,
        "Source": REPOSITORY,
        "Issues": f"{REPOSITORY}/issues",
        "Changelog": f"{REPOSITORY}/blob/main/CHANGELOG.md",
    }
    classifiers = project["classifiers"]
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert "Environment :: GPU :: NVIDIA CUDA" in classifiers
    assert len(set(classifiers)) == len(classifiers)
    installed = importlib.metadata.metadata("aiocudasem")
    assert installed["Author"] == "The aiocudasem authors"
    assert set(installed.get_all("Project-URL", [])) == {f"{k}, {v}" for k, v in urls.items()}


# ---------------------------------------------------------------- the CUDA C headers


def test_the_kernel_headers_are_package_data() -> None:
    """The headers that ``aiocudasem.lowlevel.include_dir()`` names are package data, which
    setuptools puts in the wheel and in the sdist alike."""
    from fnmatch import fnmatch

    from aiocudasem.lowlevel import include_dir

    package = ROOT / "aiocudasem"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["aiocudasem"]
    headers = [p.relative_to(package).as_posix() for p in (package / "include").rglob("*.cuh")]
    assert "include/aiocudasem/progress.cuh" in headers
    for header in headers:
        assert any(fnmatch(header, pattern) for pattern in patterns), header
    assert (Path(include_dir()) / "aiocudasem" / "progress.cuh").is_file()


# ---------------------------------------------------------------- the long description

# Where a Markdown or HTML link or image points: [text](target), ![alt](target),
# "[label]: target", src="target", href="target".
_TARGETS = re.compile(
    r"\]\(\s*<?(?P<a>[^)\s>]+)|^ {0,3}\[[^\]]+\]:[ \t]*<?(?P<b>\S+?)>?$"
    r"|\b(?:src|href)=[\"'](?P<c>[^\"']+)",
    re.MULTILINE,
)
_FENCE = re.compile(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$")


def _relative_links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` (outside fenced code) that name no scheme."""
    prose = _FENCE.sub("", markdown)
    targets = [next(t for t in m.groups() if t) for m in _TARGETS.finditer(prose)]
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def test_the_readme_has_the_links_this_test_looks_for() -> None:
    """The check below would pass on a README it cannot read: this one has relative links."""
    assert _relative_links((ROOT / "README.md").read_text())


def test_the_long_description_is_the_readme_with_absolute_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kwargs, _ = _setup(monkeypatch)
    description = kwargs["long_description"]
    assert kwargs["long_description_content_type"] == "text/markdown"
    assert _relative_links(description) == []
    readme = (ROOT / "README.md").read_text()
    # The same text, but for the links.
    assert description.splitlines()[0] == readme.splitlines()[0]
    assert len(description.splitlines()) == len(readme.splitlines())
    for target in _relative_links(readme):
        path = target.partition("#")[0]
        assert f"{REPOSITORY}/" in description
        assert path == "" or f"/main/{path.rstrip('/').removeprefix('./')}" in description


def test_the_installed_metadata_has_no_relative_links() -> None:
    """The description the wheel or the editable install carries: what the index shows."""
    installed = importlib.metadata.metadata("aiocudasem")
    description = installed.get_payload()  # type: ignore[attr-defined]
    assert isinstance(description, str) and description.strip()
    assert installed["Description-Content-Type"].startswith("text/markdown")
    assert _relative_links(description) == []


def test_relative_links_become_links_into_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    _, setup = _setup(monkeypatch)
    absolute_links = setup["absolute_links"]
    text = """\
See [the semantics](docs/semantics.md#cancellation), [examples](examples/), [home](#install),
[the changelog](<./CHANGELOG.md> "changes") and [PyPI](https://pypi.org/project/aiocudasem/).
[![a badge](docs/badge.svg)](docs/stability.md) ![a plot](benchmarks/latency.png)
<img src="docs/plot.png"> <a href="LICENSE">licence</a> <a href="mailto:a@example.org">mail</a>

[ref]: docs/api.md

```python
handlers[0](docs)
```
"""
    out = absolute_links(text, ROOT)
    blob, tree = f"{REPOSITORY}/blob/main", f"{REPOSITORY}/tree/main"
    raw = "https://raw.githubusercontent.com/aiocudasem/aiocudasem/main"
    assert f"[the semantics]({blob}/docs/semantics.md#cancellation)" in out
    assert f"[examples]({tree}/examples)" in out
    assert f"[home]({REPOSITORY}#install)" in out
    assert f'[the changelog](<{blob}/CHANGELOG.md> "changes")' in out
    assert "[PyPI](https://pypi.org/project/aiocudasem/)" in out
    assert f"[![a badge]({raw}/docs/badge.svg)]({blob}/docs/stability.md)" in out
    assert f"![a plot]({raw}/benchmarks/latency.png)" in out
    assert f'<img src="{raw}/docs/plot.png">' in out
    assert f'<a href="{blob}/LICENSE">' in out
    assert '<a href="mailto:a@example.org">' in out
    assert f"[ref]: {blob}/docs/api.md" in out
    assert "handlers[0](docs)" in out  # code is left alone
    assert _relative_links(out) == []
    assert absolute_links(out, ROOT) == out
