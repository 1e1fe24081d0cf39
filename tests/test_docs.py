"""The documentation site: its API reference pages document exactly the public API, every page
is in the site's navigation, and the README's links to the documentation resolve.

The site build itself (`bash scripts/docs.sh`, strict) checks links, anchors and that every
reference entry resolves; it needs the documentation toolchain, so it is not run here.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

import aiocudasem
import aiocudasem.lowlevel
import aiocudasem.testing
import aiocudasem.vulkan

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"

# The public modules and their reference pages. No name is exported by two of them
# (tests/test_public_names.py), so each is documented once, on its module's page.
PAGES: dict[ModuleType, str] = {
    aiocudasem: "api.md",
    aiocudasem.lowlevel: "api-lowlevel.md",
    aiocudasem.testing: "api-testing.md",
    aiocudasem.vulkan: "api-vulkan.md",
}


def directives(page: str) -> set[str]:
    """The objects that a page renders with mkdocstrings (`::: path`)."""
    return set(re.findall(r"^::: ([\w.]+)\s*$", (DOCS / page).read_text(), re.MULTILINE))


def documented(module: ModuleType) -> set[str]:
    """The names of `module` that its reference page renders."""
    prefix = module.__name__ + "."
    return {d.removeprefix(prefix) for d in directives(PAGES[module]) if d.startswith(prefix)}


@pytest.mark.parametrize("module", list(PAGES), ids=[m.__name__ for m in PAGES])
def test_the_reference_documents_exactly_the_public_names(module: ModuleType) -> None:
    public = set(module.__all__)
    rendered = documented(module)
    missing = public - rendered
    assert not missing, f"{PAGES[module]}: add `::: {module.__name__}.NAME` for {missing}"
    extra = rendered - public
    assert not extra, f"{PAGES[module]}: renders {extra}, which are not in __all__"


def test_every_reference_entry_names_a_module_with_a_page() -> None:
    modules = {m.__name__ for m in PAGES}
    for page in PAGES.values():
        for path in directives(page):
            assert path in modules or path.rsplit(".", 1)[0] in modules, (page, path)


def nav_pages() -> list[str]:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.MULTILINE)


def test_every_page_is_in_the_navigation_once() -> None:
    pages = nav_pages()
    assert len(pages) == len(set(pages))
    assert set(pages) == {p.name for p in DOCS.glob("*.md")}


def test_readme_links_to_the_documentation_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)(?:#[^)]*)?\)", readme)
    assert "docs/api.md" in links
    for link in links:
        assert (ROOT / link).is_file(), link
