import posixpath
import re
from pathlib import Path

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

# _hotpath is one module made of several files by concern (see aiocudasem/_hotpath.h).
_HOTPATH = ["loopcheck", "finder", "history", "state", "wait", "spin", "crowd"]
_SOURCES = {
    "_hotpath": ["aiocudasem/_hotpath.c"] + [f"aiocudasem/_hotpath_{part}.c" for part in _HOTPATH],
}

# ---------------------------------------------------------------- the long description
# The package index shows README.md as the project's page, where a link relative to the
# repository (docs/semantics.md, examples/, #a-heading) leads nowhere: the long description is
# the README with every relative link made absolute, to the file in the repository.
_REPOSITORY = "https://github.com/aiocudasem/aiocudasem"
_RAW = "https://raw.githubusercontent.com/aiocudasem/aiocudasem"
_BRANCH = "main"
# A target with no scheme (https:, mailto:) and not from the host's root.
_TARGET = r"(?![a-zA-Z][a-zA-Z0-9+.-]*:|/)(?P<target>[^\s()<>\"']+)"
# [text](target), [text](<target>), [text](target "title"), and ![alt](target), an image;
# "[label]: target", a link reference definition; src="target" and href="target", HTML.
_INLINE = re.compile(r"(?P<image>!?)\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?" + _TARGET)
_DEFINITION = re.compile(r"(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?" + _TARGET)
_HTML = re.compile(r"""\b(?:(?P<image>src)|href)=["']""" + _TARGET)
# Fenced code blocks, whose text is code, not links.
_FENCE = re.compile(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$")


def absolute_url(target: str, *, image: bool = False, root: Path | None = None) -> str:
    """The URL of ``target``, a path relative to the repository's root with an optional
    ``#anchor``: a folder's listing, a file's page, for an image the file itself, and for an
    anchor alone the README's heading on the repository's page."""
    path, sep, anchor = target.partition("#")
    if not path:
        return f"{_REPOSITORY}{sep}{anchor}"
    folder = path.endswith("/") or (root is not None and (root / path).is_dir())
    path = posixpath.normpath(path)
    path = "" if path == "." else path
    if image:
        return f"{_RAW}/{_BRANCH}/{path}{sep}{anchor}"
    return f"{_REPOSITORY}/{'tree' if folder else 'blob'}/{_BRANCH}/{path}{sep}{anchor}"


def absolute_links(text: str, root: Path | None = None) -> str:
    """``text``, Markdown, with its relative links and images made absolute
    (:func:`absolute_url`), outside fenced code blocks; ``root``: the repository's root, to
    tell folders from files."""

    def sub(m: re.Match[str]) -> str:
        image = bool(m.groupdict().get("image"))
        url = absolute_url(m["target"], image=image, root=root)
        return m[0][: m.start("target") - m.start()] + url

    def prose(part: str) -> str:
        # Twice: an image inside a link's text ([![alt](img.svg)](page.md)) is inside the
        # first pass's match of the link.
        for _ in range(2):
            part = _INLINE.sub(sub, part)
        return _HTML.sub(sub, _DEFINITION.sub(sub, part))

    out, at = [], 0
    for fence in _FENCE.finditer(text):
        out += [prose(text[at : fence.start()]), fence[0]]
        at = fence.end()
    return "".join([*out, prose(text[at:])])


def long_description() -> str:
    """README.md, next to this file, with absolute links."""
    root = Path(__file__).resolve().parent
    return absolute_links((root / "README.md").read_text(encoding="utf-8"), root)


setup(
    long_description=long_description(),
    long_description_content_type="text/markdown",
    # The C sources and headers are the sdist's, to build from; the wheel has the modules.
    exclude_package_data={"aiocudasem": ["*.c", "*.h"]},
    ext_modules=[
        Extension(
            f"aiocudasem.{name}",
            sources=_SOURCES.get(name, [f"aiocudasem/{name}.c"]),
            depends=["aiocudasem/_acs.h", "aiocudasem/_hotpath.h"],
            extra_compile_args=_FLAGS,
        )
        for name in ("_notify", "_cucalls", "_hostword", "_hotpath")
    ],
)
