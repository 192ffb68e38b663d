"""python -m minicb grade: a folder or a zip, a scorecard, Gradescope's JSON, a batch into CSV."""

from __future__ import annotations

import csv
import json
import shutil
import zipfile
from pathlib import Path

from mutation import write_mutant

from minicb.tools import grade

ROOT = Path(__file__).resolve().parents[2]


def copy_solutions(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for source in (ROOT / "solutions").glob("ch*.py"):
        shutil.copy(source, folder / source.name)
    return folder


def test_a_zip_is_graded_into_gradescope_json(tmp_path, capsys):
    student = tmp_path / "mutant" / "exercises"
    student.mkdir(parents=True)
    write_mutant("ch06_nearest_rank", student)
    archive = tmp_path / "submission.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in student.iterdir():
            handle.write(path, f"exercises/{path.name}")
    results = tmp_path / "results.json"
    status = grade.main([str(archive), "--chapter", "06", "--json", str(results)])
    card = capsys.readouterr().out.splitlines()
    assert status == 1, "a submission with a failing check should exit 1"
    assert card[0].startswith("ch06  ") and card[1].startswith("  FAIL  worked_examples: "), card
    report = json.loads(results.read_text())
    tests = report["tests"]
    assert tests and all(set(t) == {"name", "score", "max_score", "output"} for t in tests)
    assert all(t["name"].startswith("ch06 ") and t["max_score"] == 1.0 for t in tests)
    failed = [t for t in tests if t["score"] == 0]
    assert failed and all("passed" != t["output"] for t in failed)
    assert report["score"] == sum(t["score"] for t in tests) < len(tests)


def test_a_folder_of_submissions_becomes_one_csv(tmp_path, capsys):
    submissions = tmp_path / "submissions"
    copy_solutions(submissions / "ada")
    (submissions / "bob").mkdir(parents=True)
    write_mutant("ch06_tpot_over_tokens", submissions / "bob")
    (submissions / "carol").mkdir()                  # handed in nothing
    out = tmp_path / "grades.csv"
    assert grade.main(["--batch", str(submissions), "--csv", str(out), "--chapter", "06"]) == 0
    rows = {row["submission"]: row for row in csv.DictReader(out.open())}
    assert set(rows) == {"ada", "bob", "carol"}
    assert rows["ada"]["percent"] == "100.0" and rows["ada"]["ch06"].split("/")[0] == \
        rows["ada"]["ch06"].split("/")[1]
    assert float(rows["bob"]["percent"]) < 100
    assert "no chapter file" in rows["carol"]["problem"]


def test_each_chapter_is_graded_on_its_own_and_says_why_first(tmp_path):
    """A submission with a chapter that does not parse, one that fails on import, stubs, and
    most files missing: every chapter that can be graded is, and each other one's first line
    says why; untouched stubs give one line saying where to start."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    for number in ("00", "06", "07"):
        name = f"{grade.CHAPTERS[number]}.py"
        shutil.copy(ROOT / "solutions" / name, folder / name)
    with open(folder / "ch07_prefix_cache.py", "a") as handle:
        handle.write("\ndef unfinished(:\n")
    with open(folder / "ch00_load_test.py", "a") as handle:
        handle.write("\nimport not_a_module_of_this_course\n")
    shutil.copy(ROOT / "exercises" / "ch09_routing.py", folder / "ch09_routing.py")
    checks, _ = grade.run_checks(folder)
    card = grade.scorecard(checks, folder=folder).splitlines()
    heads = {line[2:4]: line for line in card if line.startswith("ch")}
    assert set(heads) == set(grade.CHAPTERS), card
    syntax_line = len((ROOT / "solutions" / "ch07_prefix_cache.py").read_text().splitlines()) + 2
    assert heads["07"] == (f"ch07  not graded: SyntaxError in ch07_prefix_cache.py line "
                           f"{syntax_line}: invalid syntax: def unfinished(:"), heads["07"]
    assert heads["00"].startswith("ch00  not graded: could not import: ModuleNotFoundError: "
                                  "No module named 'not_a_module_of_this_course' "
                                  "(ch00_load_test.py line "), heads["00"]
    assert heads["01"] == ("ch01  not graded: file is missing: ch01_kv_loop.py is not in the "
                           "submission")
    graded = [c for c in checks if c.chapter == "06"]
    assert len(graded) > 3 and all(c.passed for c in graded), heads["06"]
    assert heads["06"] == f"ch06  {len(graded)}/{len(graded)} checks passed"
    assert heads["09"].startswith("ch09  0/") and "not started; write common_prefix_length " \
        "first (ch09_routing.py line " in heads["09"], heads["09"]
    todo = card.index(heads["09"]) + 1
    assert card[todo].startswith("  TODO  ") and not card[todo + 1].startswith("  FAIL"), card
    report = grade.gradescope(checks)
    assert report["score"] == len(graded)
    assert "ch07: SyntaxError" in grade.problems(checks)
