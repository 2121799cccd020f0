"""The README's example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs():
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    namespace = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["Y"].shape == namespace["X"].shape
    assert namespace["part"].count[0] == namespace["X"].size // 64
