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
