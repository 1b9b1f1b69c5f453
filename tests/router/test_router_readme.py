"""The README's "Routing a fleet" example runs as written and prints what it says."""

from __future__ import annotations

import ast
import contextlib
import io

from paths import ROOT


def test_the_readme_router_example_prints_its_comment() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Routing a fleet", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    expected = code.rstrip().splitlines()[-1].removeprefix("# ")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert ast.literal_eval(out.getvalue().strip()) == ast.literal_eval(expected)
