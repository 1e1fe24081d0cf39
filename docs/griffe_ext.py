"""A griffe extension for the API reference: the package's docstrings as mkdocstrings renders
them.

The package writes its docstrings in reStructuredText's inline style (``:class:`Stream```,
double-backquoted literals) and documents attributes with ``#:`` comments above them, as Sphinx
reads them. Griffe reads neither, so this extension, run by mkdocstrings while it loads the
package from source:

- gives an attribute without a docstring the ``#:`` comment lines just above it;
- turns each ``:role:`target``` into a cross-reference to the target when the reference
  renders it, and into plain code otherwise (an optional reference, so that a role naming a
  private helper does not fail the strict build).

Nothing is imported: the package is read statically, so the site builds without CUDA and
without building the C extensions.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj|const):`(~?)([^`]+)`")


def _comment_above(attr: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines just above the attribute, joined, or ``None``."""
    filepath = attr.filepath
    if not attr.lineno or not isinstance(filepath, Path) or filepath not in attr.lines_collection:
        return None
    source = attr.lines_collection[filepath]
    found: list[str] = []
    index = attr.lineno - 2  # the line above, 0-based
    while index >= 0:
        text = source[index].strip()
        if not text.startswith("#:"):
            break
        found.append(text[2:].strip())
        index -= 1
    return " ".join(reversed(found)) or None


def _resolve(scope: griffe.Object, name: str) -> str | None:
    if isinstance(scope, griffe.Class) and name in scope.members:
        return scope.members[name].path
    try:
        return scope.resolve(name)
    except (griffe.NameResolutionError, AttributeError):
        return None


def _target(obj: griffe.Object, name: str) -> str | None:
    """The path that ``name`` names in ``obj``'s scope (its own, then its parent's), or
    ``None``."""
    head, _, rest = name.partition(".")
    for scope in (obj, obj.parent):
        path = None if scope is None else _resolve(scope, head)
        if path is not None:
            return f"{path}.{rest}" if rest else path
    return name if name.startswith("aiocudasem.") else None


def _crossrefs(obj: griffe.Object, text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        short, name = match.groups()
        shown = name.rsplit(".", 1)[-1] if short else name
        code = f"<code>{html.escape(shown)}</code>"
        path = _target(obj, name)
        if path is None:
            return code
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    return _ROLE.sub(replace, text)


class SphinxStyle(griffe.Extension):
    """Reads ``#:`` comments and reStructuredText roles (see the module's docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg, set())

    def _visit(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if isinstance(obj, griffe.Attribute) and obj.docstring is None:
            comment = _comment_above(obj)
            if comment is not None:
                obj.docstring = griffe.Docstring(comment, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = _crossrefs(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._visit(member, seen)
