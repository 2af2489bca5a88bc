"""The README's example runs as written and does what it says (loss < 1e-3, and the sibling
forward program predicts sin on points it never trained on)."""
import math
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_example_trains_and_predicts(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    assert ns["loss"] < 1e-3
    pred = ns["predict"].run({"x": [[0.0], [0.5], [1.0], [1.5]]})
    for x, p in zip([0.0, 0.5, 1.0, 1.5], pred.reshape(-1).tolist()):
        assert abs(p - math.sin(x)) < 0.05, (x, p)
    assert "writeback step" in capsys.readouterr().out  # print(c.ir) showed the IR text


def test_no_merge_conflict_markers_in_tracked_text():
    """A merge that kept both sides' markers once reached the README; none may land again."""
    import subprocess
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    assert len(files) > 50, "git ls-files listed too little: not a checkout?"
    bad = []
    for name in files:
        if not name.endswith((".py", ".md", ".mjs", ".js", ".html", ".css", ".sh", ".toml",
                              ".json", ".ipynb", ".txt")):
            continue
        try:
            lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        bad += [f"{name}:{i}" for i, ln in enumerate(lines, 1)
                if ln.startswith(("<<<<<<< ", ">>>>>>> ")) or ln == "======="]
    assert not bad, f"merge conflict markers left in: {bad}"
