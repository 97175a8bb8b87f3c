"""The README's commands work as written: its two setup commands (`.ci/run` runs the second on a
fresh clone), and its "Call it" block, run here against the session's live server (the default
model, Gemma 3 270M) with only the address changed."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def block(heading: str, lang: str) -> str:
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def test_the_readme_starts_with_the_two_commands():
    first = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first[0].startswith("bash scripts/setup && .venv/bin/tailgate serve ")
    assert first[1].startswith("bash scripts/setup && .venv/bin/python -m pytest -x -q ")
    assert "bash scripts/setup --browser" in Path(README.parent / ".ci" / "run").read_text()


def test_the_readme_call_it_block_runs_against_a_live_server(server):
    code = block("Call it", "python").replace("http://127.0.0.1:8000/v1", server[0] + "/v1")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert len(lines) >= 4, out.getvalue()
    assert isinstance(ast.literal_eval(lines[-2])["city"], str)  # the schema-held answer, parsed
    assert "name='get_weather'" in lines[-1] and ("Paris" in lines[-1] or "Oslo" in lines[-1])
