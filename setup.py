from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

setup(
    ext_modules=[
        Extension(f"aiocudasem.{name}", sources=[f"aiocudasem/{name}.c"], extra_compile_args=_FLAGS)
        for name in ("_notify", "_cucalls", "_hostword", "_hotpath")
    ]
)
