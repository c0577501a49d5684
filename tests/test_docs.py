"""Citations point into the repository: every "MODEL.md §N" names a section of docs/MODEL.md, the
performance record is docs/PERFORMANCE.md, and no code, help or document cites a tracker's issue
number or a development machine's path."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:   # not a git checkout (an sdist): the package and the docs
        files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()]
    else:
        files = out.stdout.split()
    return [ROOT / f for f in files
            if f.endswith(suffixes) and not f.startswith(("bench/", "golden/", ".venv"))
            and (ROOT / f).is_file()]


def test_model_sections_cited_exist():
    heads = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "MODEL.md").read_text(),
                           re.M))
    assert {"1", "1.1", "1.2", "2", "3", "4", "4.1", "4.2", "5", "6", "7", "8", "8.1", "8.2",
            "8.3"} <= heads
    bad = []
    for p in tracked(".py", ".md", ".cuh", ".sh"):
        for cite in re.findall(r"MODEL\.md §([\d.–\-, §/]+)", p.read_text()):
            for n in re.findall(r"\d+(?:\.\d+)?", cite):
                if n not in heads:
                    bad.append((p.relative_to(ROOT).as_posix(), n))
    assert not bad


def test_no_outside_citations():
    perf = "PERF" + ".md"
    pats = [re.compile(rf"(?<![\w/]){re.escape(perf)}"), re.compile(r"\bissue \d|\(" + r"issue\b(?!-)"),
            re.compile("/" + "work/" + r"\w"), re.compile("shared/" + "device/")]
    bad = [(p.relative_to(ROOT).as_posix(), m.group(0))
           for p in tracked(".py", ".md", ".sh", ".cfg", ".toml")
           for pat in pats for m in pat.finditer(p.read_text())]
    assert not bad


def test_readme_layout_names_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("\n## ", readme.index("## Layout") + 3)]
    words = set(re.findall(r"[\w.]+\.py|\w+/", layout))
    missing = [p.relative_to(ROOT).as_posix() for p in (ROOT / "qwen38gen").rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts
               and p.name not in words]
    folders = {p.parent.name + "/" for p in (ROOT / "qwen38gen").rglob("__init__.py")} - {"qwen38gen/"}
    assert not missing and folders <= words, (missing, folders - words)
