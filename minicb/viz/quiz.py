"""The book's interview questions as data, and a self-quiz that hides each answer until asked.

Every chapter notebook (notebooks/NN_*.ipynb), and every appendix (notebooks/appendix_*.ipynb),
ends with a section

    ## Interview questions

    **The question?**
    The answer, over one or more lines.
    *A common wrong answer:* "what to avoid", and why.

`book_interview` reads those sections, so the interview notebook gathers the questions from the
chapters themselves and never holds a second copy. The interview notebook's own worked classics
are answers rendered from their cells ("**Answer.** ... *A common wrong answer:* ..."):
`worked_question` turns each into a question of the same kind as it is displayed, so the
self-quiz draws on them too. `quiz_card` renders one question (the widget's callback: a plain
function); `quiz_widget` wires it to two buttons.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WRONG_ANSWER = "*A common wrong answer:*"


@dataclass(frozen=True)
class InterviewQuestion:
    chapter: str        # the chapter's title, "03 · Continuous batching"
    question: str
    answer: str
    wrong_answer: str


def parse_interview(markdown: str, chapter: str) -> list[InterviewQuestion]:
    """The questions of the '## Interview questions' section of one markdown text (none if it has
    no such section). Each is a paragraph: a bold line, the answer, then the common wrong answer."""
    text = textwrap.dedent(markdown)
    start = text.find("## Interview questions")
    if start < 0:
        return []
    section = text[start:].split("\n", 1)[1] if "\n" in text[start:] else ""
    section = re.split(r"\n## |\n\*\*Next:\*\*", section)[0]
    questions = []
    for paragraph in re.split(r"\n\s*\n", section.strip()):
        lines = [line.strip() for line in paragraph.strip().splitlines()]
        if not lines or not (lines[0].startswith("**") and lines[0].endswith("**")):
            continue
        body = " ".join(lines[1:])
        if WRONG_ANSWER not in body:
            raise ValueError(f"{chapter}: the interview question {lines[0]} has no "
                             f"'{WRONG_ANSWER}' line.")
        answer, wrong = body.split(WRONG_ANSWER, 1)
        questions.append(InterviewQuestion(chapter, lines[0].strip("*").strip(), answer.strip(),
                                           wrong.strip()))
    return questions


def worked_question(question: str, answer_markdown: str,
                    chapter: str = "Interview classics") -> InterviewQuestion:
    """A worked answer as displayed ("**Answer.** ... *A common wrong answer:* ...", the bold
    lead-in optional) as a quiz question."""
    body = re.sub(r"^\s*\*\*Answer[^*]*\*\*\s*", "", answer_markdown)
    # each paragraph on one line, paragraphs kept apart
    body = "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", body) if p.strip())
    if WRONG_ANSWER not in body:
        raise ValueError(f"the worked answer to {question!r} has no '{WRONG_ANSWER}' part.")
    answer, wrong = body.split(WRONG_ANSWER, 1)
    return InterviewQuestion(chapter, question.strip(), answer.strip(), wrong.strip())


def _markdown_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in cells if cell["cell_type"] == "markdown"]


def book_interview(chapters_dir: str | Path) -> list[InterviewQuestion]:
    """Every chapter's interview questions, in chapter order, then the appendices', read from the
    notebooks."""
    sources = sorted(Path(chapters_dir).glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no chapter notebooks (NN_*.ipynb) in {chapters_dir}; pass "
                                "the book's notebooks/ folder.")
    sources += sorted(Path(chapters_dir).glob("appendix_*.ipynb"))
    questions = []
    for path in sources:
        cells = _markdown_cells(path)
        title = next((line[2:].strip() for cell in cells for line in cell.strip().splitlines()
                      if line.startswith("# ")), path.stem)
        # one section may span several markdown cells (a long one is split to fit a screen)
        questions += parse_interview("\n\n".join(cell.strip() for cell in cells), title)
    return questions


def quiz_card(question: InterviewQuestion, number: int, total: int, reveal: bool) -> str:
    """One question as markdown; the answer and the wrong answer only when `reveal` is True."""
    lines = [f"**Question {number} of {total}** · chapter {question.chapter}", "",
             f"### {question.question}", ""]
    if reveal:
        lines += [question.answer, "", f"{WRONG_ANSWER} {question.wrong_answer}"]
    else:
        lines += ["*Answer it aloud first, then press \u201cShow the answer\u201d.*"]
    return "\n".join(lines)


def interview_markdown(questions: Sequence[InterviewQuestion]) -> str:
    """All questions as markdown, each answer folded in a <details> block (click to open)."""
    lines: list[str] = []
    for question in questions:
        lines += [f"**{question.question}**", "", "<details><summary>answer</summary>", "",
                  question.answer, "", f"{WRONG_ANSWER} {question.wrong_answer}", "", "</details>",
                  ""]
    return "\n".join(lines).strip()


def quiz_widget(questions: Sequence[InterviewQuestion], seed: int = 0):
    """A card with two buttons: "Show the answer" reveals it, "Next question" moves on (in a
    seeded shuffled order) with the answer hidden again."""
    import ipywidgets as widgets
    from IPython.display import Markdown

    if not questions:
        raise ValueError("the quiz needs at least one question.")
    order = np.random.default_rng(seed).permutation(len(questions)).tolist()
    position = {"at": 0}
    card = widgets.Output()

    def draw(reveal: bool) -> None:
        card.outputs = ()
        at = position["at"]
        card.append_display_data(Markdown(quiz_card(questions[order[at]], at + 1, len(questions),
                                                    reveal)))

    def advance(_button=None) -> None:
        position["at"] = (position["at"] + 1) % len(order)
        draw(False)

    show = widgets.Button(description="Show the answer", button_style="info",
                          tooltip="reveal the answer and a common wrong one")
    show.on_click(lambda _button: draw(True))
    following = widgets.Button(description="Next question",
                               tooltip="the next question, answer hidden")
    following.on_click(advance)
    draw(False)
    return widgets.VBox([card, widgets.HBox([show, following])])
