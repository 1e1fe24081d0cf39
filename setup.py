from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

# _hotpath is one module made of several files by concern (see aiocudasem/_hotpath.h).
_HOTPATH = ["loopcheck", "finder", "history", "state", "wait", "spin", "crowd"]
_SOURCES = {
    "_hotpath": ["aiocudasem/_hotpath.c"] + [f"aiocudasem/_hotpath_{part}.c" for part in _HOTPATH],
}

setup(
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
