"""Everything a test, a script or the package needs lives in this repository: nothing names a path outside it.

A machine without the design notes' shared folder (CI's clean machine) must run the whole suite; a test that read
an absolute path outside the checkout would pass here and fail there. Fixtures copied in say where they came from
(``batch_pipeline_tests/fixtures/README.md``).
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the patterns are assembled, so that this file does not name them itself
WORK, SHARED, HOME = "/" + "work/", "shared", "~" + "/"
OUTSIDE = re.compile(
    r"(?<![\w.])("
    + "|".join([re.escape(WORK), r"\.\./" + SHARED + r"\b", "/" + SHARED + "/specs", re.escape(HOME)])
    + ")"
)
CHECKED = (".py", ".sh", ".yaml", ".yml", ".toml", ".json", ".cfg", ".ini")


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / f for f in out if f.endswith(CHECKED) and (REPO / f).is_file()]


def test_no_file_reads_outside_the_repository():
    files = tracked_files()
    assert len(files) > 100  # the listing works
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert hits == [], "paths outside the repository:\n" + "\n".join(hits)


def test_the_check_sees_an_outside_path():
    assert OUTSIDE.search(f'SPEC = Path("{WORK}{SHARED}/specs/openai.json")')
    assert OUTSIDE.search(f"cat ../{SHARED}/DESIGN.md")
    assert not OUTSIDE.search("parents[1] / 'fixtures' / 'openai-files-batches.openapi.json'")
