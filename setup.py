from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aiocudasem._notify",
            sources=["aiocudasem/_notify.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
        )
    ]
)
